"""Recovery's state (``RecoveryState``): what it holds after named histories, that ended jobs
are forgotten at once, and that its snapshot restores the same state."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from google.protobuf.message import Message

from mdq.contracts import pb
from mdq.core.events import make_event
from mdq.core.recovery_state import RecoveryState

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def ev(kind: str, body: Message, job: str, attempt: int = 1) -> pb.Event:
    return make_event(kind, body, job_id=job, attempt=attempt, producer="test", at=T0)


def submitted(job: str) -> pb.Event:
    spec = pb.JobSpec(name=job.rsplit("-", 1)[-1])
    spec.resources.cpu, spec.resources.memory_mb = 1, 1024
    return ev("submitted", pb.JobSubmitted(spec=spec, request_id=job.rsplit("-", 1)[0]), job, 0)


def bound(job: str, attempt: int = 1) -> pb.Event:
    return ev("bound", pb.JobBound(node="n1", pod_name=f"mdq-{job}-{attempt}"), job, attempt)


def started(job: str, attempt: int = 1) -> pb.Event:
    return ev("started", pb.JobStarted(node="n1"), job, attempt)


def crashed(job: str, attempt: int = 1) -> pb.Event:
    return ev("attempt_failed", pb.AttemptFailed(reason=pb.FAILURE_CRASHED), job, attempt)


def requeued(job: str, attempt: int) -> pb.Event:
    return ev("requeued", pb.JobRequeued(after=pb.FAILURE_CRASHED), job, attempt)


def succeeded(job: str, attempt: int = 1) -> pb.Event:
    return ev("succeeded", pb.JobSucceeded(final_step=100), job, attempt)


def failed(job: str, attempt: int = 1) -> pb.Event:
    return ev("failed", pb.JobFailed(reason=pb.FAILURE_CRASHED, message="gave up"), job, attempt)


def ran(job: str) -> list[pb.Event]:
    return [submitted(job), bound(job), started(job)]


CASES: dict[str, tuple[list[pb.Event], set[str], list[str], int]] = {
    # name: (history, jobs held, RECOVERING jobs, jobs forgotten)
    "nothing yet": ([], set(), [], 0),
    "a running job is held": (ran("r-a"), {"r-a"}, [], 0),
    "a crashed attempt waits for a decision": ([*ran("r-a"), crashed("r-a")], {"r-a"}, ["r-a"], 0),
    "a requeued job no longer waits": (
        [*ran("r-a"), crashed("r-a"), requeued("r-a", 2)],
        {"r-a"},
        [],
        0,
    ),
    "a job that succeeded is forgotten": ([*ran("r-a"), succeeded("r-a")], set(), [], 1),
    "a job that failed for good is forgotten": (
        [*ran("r-a"), crashed("r-a"), failed("r-a")],
        set(),
        [],
        1,
    ),
    "an event after the end changes nothing": (
        [*ran("r-a"), succeeded("r-a"), crashed("r-a")],
        set(),
        [],
        1,
    ),
    "ended and live side by side": (
        [*ran("r-a"), *ran("r-b"), succeeded("r-a"), crashed("r-b"), submitted("r-c")],
        {"r-b", "r-c"},
        ["r-b"],
        1,
    ),
    "a stale attempt's crash is fenced": (
        [*ran("r-a"), crashed("r-a"), requeued("r-a", 2), crashed("r-a", 1)],
        {"r-a"},
        [],
        0,
    ),
}


def fold(history: list[pb.Event]) -> RecoveryState:
    state = RecoveryState()
    for sequence, event in enumerate(history, start=1):
        state.apply(sequence, event)
    return state


@pytest.mark.parametrize("history,held,recovering,forgotten", CASES.values(), ids=CASES.keys())
def test_what_the_state_holds(
    history: list[pb.Event], held: set[str], recovering: list[str], forgotten: int
) -> None:
    state = fold(history)
    assert set(state.book.jobs) == held
    assert [view.job_id for view in state.recovering()] == recovering
    assert state.forgotten == forgotten
    assert state.last_sequence == len(history)


@pytest.mark.parametrize("history,held,recovering,forgotten", CASES.values(), ids=CASES.keys())
def test_the_snapshot_restores_the_same_state(
    history: list[pb.Event], held: set[str], recovering: list[str], forgotten: int
) -> None:
    state = fold(history)
    restored = RecoveryState.from_snapshot(json.loads(json.dumps(state.snapshot())))
    assert restored.snapshot() == state.snapshot()
    assert [view.job_id for view in restored.recovering()] == recovering
    # the tail folds on top of it the same way
    tail = [crashed(job) for job in sorted(held)]
    for sequence, event in enumerate(tail, start=state.last_sequence + 1):
        state.apply(sequence, event)
        restored.apply(sequence, event)
    assert restored.snapshot() == state.snapshot()


def test_memory_holds_the_live_jobs_only_whatever_the_history() -> None:
    state = RecoveryState()
    sequence = 0
    for index in range(2000):
        job = f"r-j{index}"
        for event in [*ran(job), crashed(job), requeued(job, 2), bound(job, 2), succeeded(job, 2)]:
            sequence += 1
            state.apply(sequence, event)
    sequence += 1
    state.apply(sequence, submitted("r-live"))
    assert state.sizes() == {"jobs": 1, "recovering": 0}
    assert state.forgotten == 2000
    assert len(json.dumps(state.snapshot())) < 2000


def test_a_snapshot_of_another_layout_is_refused() -> None:
    content = fold(ran("r-a")).snapshot()
    with pytest.raises(ValueError, match="version"):
        RecoveryState.from_snapshot(content | {"version": 99})


def test_a_snapshot_that_holds_an_ended_job_is_refused() -> None:
    state = fold([*ran("r-a"), succeeded("r-a")])
    live = fold(ran("r-a"))
    view = live.book.jobs["r-a"]
    view.apply(succeeded("r-a"))
    content = state.snapshot() | {"jobs": [view.to_dict()]}
    with pytest.raises(ValueError, match="ended job r-a"):
        RecoveryState.from_snapshot(content)


def test_a_decision_the_service_applied_itself_is_indexed() -> None:
    state = fold([*ran("r-a"), crashed("r-a")])
    view = state.get("r-a")
    assert view is not None and view.apply(requeued("r-a", 2))
    state.note(view)
    assert state.recovering() == []
    assert state.get("r-a") is view
