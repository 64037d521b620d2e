"""The projection's fold of a batch: skipping superseded reports changes no row.

``fold_batch`` skips a progress report that the job's next event in the batch supersedes
(``superseded_reports``) while its attempt runs (``JobRow.runs``). These tests fold the same
histories with and without the skip, and with the reports' keys read from the rows the COPY
writes, and compare everything the rows hold (and so everything written to ``jobs`` and
``attempts``): named cases for each condition, then random batches of reports and lifecycle
events."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from google.protobuf.message import Message
from hypothesis import given, settings
from hypothesis import strategies as st

from mdq.contracts import pb
from mdq.core.events import make_event
from mdq.store.projection.fold import JobRow, fold_batch, superseded_reports
from tests.tables import named_cases

T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
JOBS = ("r-a", "r-b")


def ev(kind: str, body: Message, attempt: int, second: float = 0, job: str = "r-a") -> pb.Event:
    return make_event(
        kind,
        body,
        job_id=job,
        attempt=attempt,
        producer="test",
        at=T0 + timedelta(seconds=second),
        detail=f"{second}",
    )


def report(
    step: int,
    *,
    attempt: int = 1,
    job: str = "r-a",
    second: float | None = None,
    done: str = "",
    units: str = "",
    target: int = 1000,
) -> pb.Event:
    body = pb.Progress(
        step=step,
        target_steps=target,
        potential_kj_mol=-step * 0.5,
        temperature_k=300 + step % 7,
        ns_per_day=10 + step % 3,
        done_reason=done,
        units=units,
    )
    return ev("progress", body, attempt, step / 10 if second is None else second, job)


def submitted(job: str) -> pb.Event:
    spec = pb.JobSpec(name=job.split("-", 1)[1], steps=1000)
    return ev("submitted", pb.JobSubmitted(spec=spec, request_id="r"), 0, job=job)


RUNNING = [
    ev("bound", pb.JobBound(node="n1", pod_name="p1"), 1),
    ev("started", pb.JobStarted(node="n1"), 1, 0.05),
]
PREFIXES = {
    "pending": [],
    "bound": RUNNING[:1],
    "running": RUNNING,
    "running with reports": [*RUNNING, report(300)],
    "attempt ended": [
        *RUNNING,
        report(300),
        ev("attempt_failed", pb.AttemptFailed(reason=pb.FAILURE_CRASHED, last_step=300), 1, 40),
    ],
    "requeued and bound again": [
        *RUNNING,
        report(300),
        ev("attempt_failed", pb.AttemptFailed(reason=pb.FAILURE_CRASHED, last_step=300), 1, 40),
        ev("requeued", pb.JobRequeued(resume_from=pb.Checkpoint(step=200)), 2, 41),
        ev("bound", pb.JobBound(node="n2", pod_name="p2"), 2, 42),
    ],
    "succeeded": [*RUNNING, report(500), ev("succeeded", pb.JobSucceeded(final_step=500), 1, 60)],
}


def rows_after(prefix: list[pb.Event]) -> dict[str, JobRow]:
    """Each job's row after ``prefix`` (the same for every job), folded event by event."""
    rows = {}
    for job in JOBS:
        row = JobRow.from_submitted(submitted(job))
        for event in prefix:
            copy = pb.Event()
            copy.CopyFrom(event)
            copy.job_id = job
            row.apply(copy)
        row.ended_now.clear()
        rows[job] = row
    return rows


def fold_every_event(rows: dict[str, JobRow], events: list[pb.Event]) -> None:
    """The fold without the skip: every event applied to its job's row."""
    for event in events:
        if (row := rows.get(event.job_id)) is not None:
            row.apply(event)


def assert_same_fold(prefix: list[pb.Event], batch: list[pb.Event]) -> None:
    expected, skipping = rows_after(prefix), rows_after(prefix)
    fold_every_event(expected, batch)
    fold_batch(skipping, batch, {})
    assert skipping == expected


CASES = [
    ("reports in step order", [report(10), report(20), report(30)], 2),
    ("a report lower than the one before", [report(30), report(20), report(40)], 1),
    ("equal steps", [report(20), report(20, second=9)], 1),
    ("a lower report after", [report(30), report(20)], 0),
    ("a done reason the next one drops", [report(10, done="steps_reached"), report(20)], 0),
    ("a done reason the next one keeps", [report(10, done="a"), report(20, done="b")], 1),
    ("units the next one drops", [report(10, units="lj"), report(20)], 0),
    ("a target the next one drops", [report(10), report(20, target=0)], 0),
    ("another attempt's report", [report(10, attempt=2), report(20)], 0),
    ("two jobs interleaved", [report(10), report(10, job="r-b"), report(20)], 1),
    (
        "a checkpoint between",
        [report(10), ev("checkpoint", pb.Checkpoint(step=10), 1, 1.5), report(20)],
        0,
    ),
]


@named_cases(("batch", "skipped"), CASES)
def test_skipping_superseded_reports_leaves_the_same_rows(
    batch: list[pb.Event], skipped: int
) -> None:
    assert sum(superseded_reports(batch)) == skipped
    assert_same_fold(PREFIXES["running"], batch)


@pytest.mark.parametrize("prefix", PREFIXES, ids=list(PREFIXES))
def test_no_report_is_skipped_unless_its_attempt_runs(prefix: str) -> None:
    rows = rows_after(PREFIXES[prefix])
    first, second = report(10), report(20)
    assert superseded_reports([first, second]) == [True, False]
    assert rows["r-a"].runs(1) is (prefix in ("running", "running with reports"))
    assert_same_fold(PREFIXES[prefix], [first, second])


LIFECYCLE = [
    ev("checkpoint", pb.Checkpoint(step=100), 1, 5),
    ev("attempt_failed", pb.AttemptFailed(reason=pb.FAILURE_OOM_KILLED, last_step=150), 1, 20),
    ev("succeeded", pb.JobSucceeded(final_step=1000), 1, 30),
    ev("requeued", pb.JobRequeued(resume_from=pb.Checkpoint(step=100)), 2, 21),
    ev("bound", pb.JobBound(node="n3", pod_name="p3"), 2, 22),
    ev("started", pb.JobStarted(node="n3"), 2, 23),
]


@st.composite
def batches(draw: st.DrawFn) -> tuple[str, list[pb.Event]]:
    prefix = draw(st.sampled_from(list(PREFIXES)))
    events: list[pb.Event] = []
    for _ in range(draw(st.integers(1, 30))):
        job = draw(st.sampled_from(JOBS))
        if draw(st.integers(0, 9)) == 0:
            event = pb.Event()
            event.CopyFrom(draw(st.sampled_from(LIFECYCLE)))
            event.job_id = job
        else:
            event = report(
                draw(st.integers(0, 60)) * 10,
                attempt=draw(st.sampled_from([1, 1, 1, 2])),
                job=job,
                second=draw(st.floats(0, 60, allow_nan=False)),
                done=draw(st.sampled_from(["", "", "", "steps_reached", "converged"])),
                units=draw(st.sampled_from(["", "", "", "lj"])),
                target=draw(st.sampled_from([1000, 1000, 0, 2000])),
            )
        events.append(event)
    return prefix, events


@settings(max_examples=400, deadline=None)
@given(batches())
def test_random_batches_fold_the_same_with_and_without_the_skip(
    case: tuple[str, list[pb.Event]],
) -> None:
    prefix, batch = case
    assert_same_fold(PREFIXES[prefix], batch)
