"""The job state machine: transitions and fencing, as a table of named event histories."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from google.protobuf.message import Message

from mdq.contracts import pb
from mdq.core.events import make_event
from mdq.core.state import JobBook, JobState, attempt_lives
from tests.tables import named_cases

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def ev(kind: str, body: Message, attempt: int, job: str = "r-a") -> pb.Event:
    return make_event(kind, body, job_id=job, attempt=attempt, producer="test", at=NOW)


SUBMIT = ev("submitted", pb.JobSubmitted(spec=pb.JobSpec(name="a"), request_id="r"), 0)
SUBMIT_WAITING = ev(
    "submitted",
    pb.JobSubmitted(spec=pb.JobSpec(name="a"), request_id="r", depends_on_ids=["r-x"]),
    0,
)
BOUND1 = ev("bound", pb.JobBound(node="n1", pod_name="mdq-r-a-1"), 1)
STARTED1 = ev("started", pb.JobStarted(node="n1"), 1)
FAILED1 = ev("attempt_failed", pb.AttemptFailed(reason=pb.FAILURE_CRASHED), 1)
REQUEUED2 = ev("requeued", pb.JobRequeued(resume_from=pb.Checkpoint(step=500)), 2)
BOUND2 = ev("bound", pb.JobBound(node="n2"), 2)
SUCCEEDED1 = ev("succeeded", pb.JobSucceeded(final_step=1000), 1)
SUCCEEDED2 = ev("succeeded", pb.JobSucceeded(final_step=1000), 2)
FINAL = ev("failed", pb.JobFailed(reason=pb.FAILURE_RETRIES_EXHAUSTED), 1)

CASES = [
    ("submitted without dependencies is pending", [SUBMIT], JobState.PENDING, 1),
    ("submitted with dependencies waits", [SUBMIT_WAITING], JobState.WAITING, 1),
    (
        "released waiting job is pending",
        [SUBMIT_WAITING, ev("released", pb.JobReleased(), 0)],
        JobState.PENDING,
        1,
    ),
    ("bound", [SUBMIT, BOUND1], JobState.BOUND, 1),
    ("started", [SUBMIT, BOUND1, STARTED1], JobState.RUNNING, 1),
    ("succeeded", [SUBMIT, BOUND1, STARTED1, SUCCEEDED1], JobState.SUCCEEDED, 1),
    (
        "attempt failure awaits recovery",
        [SUBMIT, BOUND1, STARTED1, FAILED1],
        JobState.RECOVERING,
        1,
    ),
    ("requeue starts attempt 2", [SUBMIT, BOUND1, FAILED1, REQUEUED2], JobState.PENDING, 2),
    (
        "stale attempt-1 success after requeue is ignored",
        [SUBMIT, BOUND1, FAILED1, REQUEUED2, BOUND2, SUCCEEDED1],
        JobState.BOUND,
        2,
    ),
    (
        "attempt 2 succeeds",
        [SUBMIT, BOUND1, FAILED1, REQUEUED2, BOUND2, SUCCEEDED2],
        JobState.SUCCEEDED,
        2,
    ),
    (
        "terminal state accepts nothing",
        [SUBMIT, BOUND1, SUCCEEDED1, FAILED1, REQUEUED2],
        JobState.SUCCEEDED,
        1,
    ),
    ("final failure", [SUBMIT, BOUND1, FAILED1, FINAL], JobState.FAILED, 1),
    ("requeue without a failure is ignored", [SUBMIT, BOUND1, REQUEUED2], JobState.BOUND, 1),
    ("duplicate bound is ignored", [SUBMIT, BOUND1, BOUND1], JobState.BOUND, 1),
]


@named_cases(("history", "state", "attempt"), CASES)
def test_history(history: list[pb.Event], state: JobState, attempt: int) -> None:
    book = JobBook()
    for sequence, event in enumerate(history, start=1):
        book.apply(sequence, event)
    view = book.jobs["r-a"]
    assert (view.state, view.attempt) == (state, attempt)


def test_requeue_resumes_from_checkpoint_step() -> None:
    book = JobBook()
    for sequence, event in enumerate([SUBMIT, BOUND1, FAILED1, REQUEUED2], start=1):
        book.apply(sequence, event)
    view = book.jobs["r-a"]
    assert view.resume_from is not None and view.last_step == 500
    assert view.attempts[2].resumed_from_step == 500


def test_replayed_sequence_is_ignored() -> None:
    book = JobBook()
    book.apply(1, SUBMIT)
    book.apply(2, BOUND1)
    assert book.apply(2, BOUND1) is None


def _at(event: pb.Event, seconds: int) -> pb.Event:
    moved = pb.Event()
    moved.CopyFrom(event)
    moved.time.FromDatetime(NOW.replace(second=seconds))
    return moved


REPORT1 = ev("progress", pb.Progress(step=100), 1)


@pytest.mark.parametrize(
    "history",
    [
        [SUBMIT, BOUND1, _at(STARTED1, 5), _at(REPORT1, 9)],
        [SUBMIT, BOUND1, _at(REPORT1, 9), _at(STARTED1, 5)],
    ],
    ids=["started, then the first report", "the first report, then started"],
)
def test_start_time_does_not_depend_on_stream_interleaving(history: list[pb.Event]) -> None:
    """The progress and job streams are folded independently; either order gives the same."""
    book = JobBook()
    for sequence, event in enumerate(history, start=1):
        book.apply(sequence, event)
    view = book.jobs["r-a"]
    assert view.state is JobState.RUNNING
    assert view.attempts[1].started_at == NOW.replace(second=5)
    assert view.last_step == 100


@pytest.mark.parametrize(
    ("name", "asked", "last_bound", "last_failed", "last_ended", "live"),
    [
        ("bound, this attempt", 2, 2, None, None, True),
        ("bound again after an earlier attempt failed", 2, 2, 1, None, True),
        ("never bound", 1, None, None, None, False),
        ("an earlier attempt than the one bound", 1, 2, 1, None, False),
        ("a later attempt than the one bound", 3, 2, None, None, False),
        ("this attempt failed", 2, 2, 2, None, False),
        ("the job ended in this attempt", 2, 2, None, 2, False),
        ("the job ended in a later attempt", 2, 2, None, 3, False),
        ("extended: succeeded in attempt 1, attempt 2 bound", 2, 2, None, 1, True),
        ("extended after a failed attempt and a success", 3, 3, 1, 2, True),
    ],
)
def test_which_attempt_is_live(
    name: str,
    asked: int,
    last_bound: int | None,
    last_failed: int | None,
    last_ended: int | None,
    live: bool,
) -> None:
    """Whose runner gets and renews credentials (``attempt_lives``, from the jobs log)."""
    got = attempt_lives(
        asked, last_bound=last_bound, last_failed=last_failed, last_ended=last_ended
    )
    assert got is live, name
