"""What the metrics service shows of each running job (``ProgressBoard``, ``JobCounts.is_over``)
and the speed over a report interval (``mdq.core.speed``), as tables of named cases. Pure."""

from __future__ import annotations

import pytest

from mdq.contracts import pb
from mdq.core.speed import interval_ns_per_day
from services.metrics.folding import JobCounts, ProgressBoard
from tests.tables import named_cases

T0 = 1_764_417_600
JOB = "0123456789ab-md"

SPEEDS: list[tuple[str, tuple[float, float, float, float], float | None]] = [
    # (time_ps, at_s, previous_time_ps, previous_at_s) -> ns/day
    ("one-ns-in-one-day", (1000.0, 86_400.0, 0.0, 0.0), 1.0),
    ("2-ps-in-a-second", (12.0, 101.0, 10.0, 100.0), 172.8),
    ("no-simulated-time-a-minimisation", (0.0, 101.0, 0.0, 100.0), None),
    ("no-wall-time", (12.0, 100.0, 10.0, 100.0), None),
    ("time-going-back-a-resumed-attempt", (8.0, 101.0, 10.0, 100.0), None),
]


@named_cases(("times", "expected"), SPEEDS)
def test_speed_over_an_interval(
    times: tuple[float, float, float, float], expected: float | None
) -> None:
    time_ps, at_s, previous_time_ps, previous_at_s = times
    speed = interval_ns_per_day(
        time_ps=time_ps, at_s=at_s, previous_time_ps=previous_time_ps, previous_at_s=previous_at_s
    )
    assert speed == (pytest.approx(expected) if expected is not None else None)


Report = tuple[int, int, float, float, float]
"""(attempt, step, time_ps, the runner's ns/day, seconds after T0)."""


def progress(attempt: int, step: int, time_ps: float, ns_per_day: float, at: float) -> pb.Event:
    event = pb.Event(job_id=JOB, attempt=attempt)
    event.progress.CopyFrom(
        pb.Progress(
            step=step,
            time_ps=time_ps,
            ns_per_day=ns_per_day,
            temperature_k=299.5,
            potential_kj_mol=-100.0,
        )
    )
    event.time.FromNanoseconds(int((T0 + at) * 1e9))
    return event


BOARD: list[tuple[str, list[Report], float | None]] = [
    # the reports one attempt sends, in order -> ns/day shown after the last
    ("the-first-report-shows-the-runners-figure", [(1, 500, 1.0, 40.0, 10)], 40.0),
    (
        "later-reports-show-the-last-interval-not-the-average",
        [(1, 500, 1.0, 40.0, 10), (1, 1000, 2.0, 60.0, 11)],
        86.4,
    ),
    (
        "a-report-seen-again-changes-nothing",
        [(1, 500, 1.0, 40.0, 10), (1, 1000, 2.0, 60.0, 11), (1, 1000, 2.0, 60.0, 30)],
        86.4,
    ),
    (
        "a-new-attempt-starts-over-from-its-first-report",
        [(1, 500, 1.0, 40.0, 10), (2, 600, 1.2, 35.0, 50)],
        35.0,
    ),
    ("a-minimisation-has-no-speed", [(1, 20, 0.0, 0.0, 10), (1, 40, 0.0, 0.0, 11)], None),
    ("an-analysis-has-no-speed", [(1, 1, 0.0, 0.0, 10)], None),
]


@named_cases(("reports", "expected"), BOARD)
def test_the_speed_a_running_job_shows(reports: list[Report], expected: float | None) -> None:
    board = ProgressBoard()
    for report in reports:
        board.apply(progress(*report))
    shown = board.jobs[JOB]
    speed = None if expected is None else pytest.approx(expected)
    assert (shown.ns_per_day, shown.temperature_k) == (speed, 299.5)


def test_a_stale_report_is_not_shown() -> None:
    board = ProgressBoard()
    board.apply(progress(2, 600, 1.2, 35.0, 50))
    assert board.apply(progress(1, 900, 1.8, 40.0, 60)) == (None, None)
    assert board.jobs[JOB].attempt == 2


def job_event(kind: str, attempt: int) -> pb.Event:
    event = pb.Event(job_id=JOB, attempt=attempt, producer="test")
    bodies = {
        "submitted": pb.JobSubmitted(spec=pb.JobSpec(name="md", steps=1000), request_id="r"),
        "bound": pb.JobBound(node="n1", pod_name=f"mdq-{JOB}-{attempt}"),
        "started": pb.JobStarted(node="n1"),
        "attempt_failed": pb.AttemptFailed(reason=pb.FAILURE_OOM_KILLED, node="n1"),
        "requeued": pb.JobRequeued(after=pb.FAILURE_OOM_KILLED),
        "succeeded": pb.JobSucceeded(final_step=1000, reason="steps_reached"),
        "failed": pb.JobFailed(reason=pb.FAILURE_OOM_KILLED),
    }
    getattr(event, kind).CopyFrom(bodies[kind])
    return event


OVER: list[tuple[str, list[tuple[str, int]], int, bool]] = [
    # the job's events so far, an attempt -> whether its series go
    ("not-met-yet", [], 1, False),
    ("before-its-bound-a-report-may-come", [("submitted", 0)], 1, False),
    ("running", [("submitted", 0), ("bound", 1), ("started", 1)], 1, False),
    (
        "failed",
        [("submitted", 0), ("bound", 1), ("started", 1), ("attempt_failed", 1)],
        1,
        True,
    ),
    (
        "requeued",
        [("submitted", 0), ("bound", 1), ("attempt_failed", 1), ("requeued", 2)],
        1,
        True,
    ),
    (
        "the-next-attempt-runs",
        [("submitted", 0), ("bound", 1), ("attempt_failed", 1), ("requeued", 2), ("bound", 2)],
        2,
        False,
    ),
    ("succeeded", [("submitted", 0), ("bound", 1), ("started", 1), ("succeeded", 1)], 1, True),
    ("failed-for-good", [("submitted", 0), ("bound", 1), ("failed", 1)], 1, True),
]


@named_cases(("events", "attempt", "over"), OVER)
def test_when_an_attempts_series_go(
    events: list[tuple[str, int]], attempt: int, over: bool
) -> None:
    counts = JobCounts()
    for sequence, (kind, event_attempt) in enumerate(events, start=1):
        counts.apply(sequence, job_event(kind, event_attempt))
    assert counts.is_over(JOB, attempt) is over
