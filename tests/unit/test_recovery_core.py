"""Recovery core: failure classification and the policy per class, as tables of named cases."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from mdq.contracts import pb
from mdq.core.events import make_event
from mdq.core.exit_codes import RunnerExit
from mdq.core.recovery import GiveUp, RecoveryPolicy, Requeue, Wait, classify, decide, requeued_body
from mdq.core.state import JobState, JobView
from tests.tables import named_cases

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)

CLASSIFY_CASES = [
    ("runner crashed", "Error", 1, pb.FAILURE_CRASHED),
    ("killed by signal 9", "Error", 137, pb.FAILURE_CRASHED),
    ("kernel OOM killer", "OOMKilled", 137, pb.FAILURE_OOM_KILLED),
    ("runner MemoryError", "Error", RunnerExit.OUT_OF_MEMORY, pb.FAILURE_OOM_KILLED),
    ("evicted", "Evicted", 0, pb.FAILURE_EVICTED),
    ("preempted by SIGTERM", "Error", RunnerExit.PREEMPTED, pb.FAILURE_EVICTED),
    ("node lost", "NodeLost", 0, pb.FAILURE_NODE_LOST),
    ("whole cluster lost", "ClusterLost", 0, pb.FAILURE_CLUSTER_LOST),
    ("NaN energy", "Error", RunnerExit.UNSTABLE, pb.FAILURE_UNSTABLE),
    ("bad input", "Error", RunnerExit.INVALID_INPUT, pb.FAILURE_INVALID_INPUT),
    ("data disk full", "Error", RunnerExit.NO_SPACE, pb.FAILURE_ENVIRONMENT),
    ("data disk failing", "Error", RunnerExit.DISK_FAILED, pb.FAILURE_ENVIRONMENT),
    ("agent could not create the pod's folder", "StartError", 126, pb.FAILURE_ENVIRONMENT),
    ("agent found no runner to start", "StartError", 127, pb.FAILURE_ENVIRONMENT),
    ("kubelet could not create the container", "StartError", 128, pb.FAILURE_ENVIRONMENT),
    ("exit 126 of the runner itself", "Error", 126, pb.FAILURE_CRASHED),
]


@named_cases(("reason", "code", "expected"), CLASSIFY_CASES)
def test_classify(reason: str, code: int, expected: int) -> None:
    assert classify(pod_reason=reason, exit_code=code) == expected


def view_with_failures(
    *reasons: pb.FailureReason, max_retries: int = 3, checkpoint_step: int = 0
) -> JobView:
    spec = pb.JobSpec(name="md", steps=10_000, max_retries=max_retries)
    spec.resources.cpu, spec.resources.memory_mb = 1, 1000
    submitted = make_event(
        "submitted",
        pb.JobSubmitted(spec=spec, request_id="r"),
        job_id="r-md",
        attempt=0,
        producer="test",
        at=NOW,
    )
    view = JobView.from_submitted(submitted)
    for index, reason in enumerate(reasons):
        attempt = index + 1
        assert view.apply(
            make_event(
                "bound",
                pb.JobBound(node=f"n{attempt}"),
                job_id="r-md",
                attempt=attempt,
                producer="t",
                at=NOW,
            )
        )
        if checkpoint_step:
            view.apply(
                make_event(
                    "checkpoint",
                    pb.Checkpoint(step=checkpoint_step, path="c", sha256="x"),
                    job_id="r-md",
                    attempt=attempt,
                    producer="t",
                    at=NOW,
                )
            )
        failure = pb.AttemptFailed(
            reason=reason, node=f"n{attempt}", last_step=checkpoint_step + 700
        )
        assert view.apply(
            make_event(
                "attempt_failed", failure, job_id="r-md", attempt=attempt, producer="t", at=NOW
            )
        )
        if attempt < len(reasons):
            decision = decide(view)
            assert isinstance(decision, Requeue)
            assert view.apply(
                make_event(
                    "requeued",
                    requeued_body(decision, view, NOW),
                    job_id="r-md",
                    attempt=attempt + 1,
                    producer="t",
                    at=NOW,
                )
            )
    assert view.state is JobState.RECOVERING
    return view


def test_crash_backs_off_exponentially_and_counts() -> None:
    first = decide(view_with_failures(pb.FAILURE_CRASHED))
    second = decide(view_with_failures(pb.FAILURE_CRASHED, pb.FAILURE_CRASHED))
    assert isinstance(first, Requeue) and first.delay_s == 5.0 and first.avoid_nodes == ()
    assert isinstance(second, Requeue) and second.delay_s == 10.0


def test_crashes_beyond_max_retries_give_up_with_every_attempt() -> None:
    decision = decide(view_with_failures(*[pb.FAILURE_CRASHED] * 4, max_retries=3))
    assert isinstance(decision, GiveUp) and decision.reason == pb.FAILURE_RETRIES_EXHAUSTED
    assert all(f"attempt {n}" in decision.message for n in range(1, 5))


def test_a_full_disk_backs_off_without_counting_against_the_job() -> None:
    """Five full-disk failures in a row, without progress, with one retry allowed: the job is
    neither out of retries nor quarantined; it waits longer each time, away from that node."""
    delays = [
        decide(view_with_failures(*[pb.FAILURE_ENVIRONMENT] * n, max_retries=1)) for n in (1, 5)
    ]
    assert all(isinstance(d, Requeue) for d in delays)
    assert [d.delay_s for d in delays] == [5.0, 80.0]  # type: ignore[union-attr]
    assert delays[1].avoid_nodes == ("n5",)  # type: ignore[union-attr]
    assert delays[1].after == pb.FAILURE_ENVIRONMENT  # type: ignore[union-attr]


ENVIRONMENT_BACKOFF_CASES = [
    ("first full disk", (pb.FAILURE_ENVIRONMENT,), 5.0),
    ("third in a row", (pb.FAILURE_ENVIRONMENT,) * 3, 20.0),
    (
        "a crash between two bad spells starts the count again",
        (pb.FAILURE_ENVIRONMENT,) * 4 + (pb.FAILURE_CRASHED, pb.FAILURE_ENVIRONMENT),
        5.0,
    ),
    ("many in a row stop at the longest delay", (pb.FAILURE_ENVIRONMENT,) * 12, 300.0),
]


@named_cases(("reasons", "delay"), ENVIRONMENT_BACKOFF_CASES)
def test_an_environment_failure_backs_off_by_its_streak(
    reasons: tuple[pb.FailureReason, ...], delay: float
) -> None:
    decision = decide(view_with_failures(*reasons, max_retries=1))
    assert isinstance(decision, Requeue) and decision.delay_s == delay


@pytest.mark.parametrize(
    "reason",
    [pb.FAILURE_ENVIRONMENT, pb.FAILURE_EVICTED, pb.FAILURE_NODE_LOST, pb.FAILURE_CLUSTER_LOST],
    ids=["environment", "evicted", "node lost", "cluster lost"],
)
def test_failures_not_the_jobs_own_never_end_it(reason: pb.FailureReason) -> None:
    """However many there are, without progress and with no retry allowed: a bad week on the
    nodes costs time, never the job."""
    decision = decide(_no_progress(*[reason] * 30, max_retries=0), now=NOW)
    assert isinstance(decision, Requeue), decision


def _ended(view: JobView, *ended: datetime) -> JobView:
    for number, at in zip(sorted(view.attempts), ended, strict=True):
        view.attempts[number].ended_at = at
    return view


DEADLINE = RecoveryPolicy(disruption_deadline_s=3600.0)
DEADLINE_CASES = [
    (
        "disk full for two hours, no progress: past the operator's hour",
        (pb.FAILURE_ENVIRONMENT,) * 3,
        (NOW - timedelta(hours=2), NOW - timedelta(hours=1), NOW),
        True,
        True,
    ),
    (
        "disk full for half an hour",
        (pb.FAILURE_ENVIRONMENT,) * 3,
        (NOW - timedelta(minutes=30), NOW - timedelta(minutes=10), NOW),
        True,
        False,
    ),
    (
        "two hours of trouble, but the latest attempt made progress",
        (pb.FAILURE_ENVIRONMENT,) * 3,
        (NOW - timedelta(hours=2), NOW - timedelta(hours=1), NOW),
        False,
        False,
    ),
    (
        "the job's own crash ends the streak",
        (pb.FAILURE_ENVIRONMENT, pb.FAILURE_NODE_LOST, pb.FAILURE_CRASHED),
        (NOW - timedelta(hours=3), NOW - timedelta(hours=2), NOW),
        True,
        False,
    ),
]


@named_cases(("reasons", "ended", "stalled", "gives_up"), DEADLINE_CASES)
def test_the_operators_deadline_ends_a_job_the_environment_keeps_failing(
    reasons: tuple[pb.FailureReason, ...],
    ended: tuple[datetime, ...],
    stalled: bool,
    gives_up: bool,
) -> None:
    view = view_with_failures(*reasons, max_retries=5)
    if stalled:
        view = _no_progress(*reasons, max_retries=5)
    decision = decide(_ended(view, *ended), DEADLINE, now=NOW)
    assert isinstance(decision, GiveUp) is gives_up, decision
    if gives_up:
        assert decision.reason == pb.FAILURE_RETRIES_EXHAUSTED  # type: ignore[union-attr]
        assert "MDQ_RECOVERY_DISRUPTION_DEADLINE_S" in decision.message  # type: ignore[union-attr]
    assert isinstance(decide(_ended(view, *ended), RecoveryPolicy(), now=NOW), Requeue)


def test_oom_retries_with_more_memory() -> None:
    decision = decide(view_with_failures(pb.FAILURE_OOM_KILLED))
    assert isinstance(decision, Requeue) and decision.memory_mb == 1500
    body = requeued_body(decision, view_with_failures(pb.FAILURE_OOM_KILLED), NOW)
    assert body.resources.memory_mb == 1500


@pytest.mark.parametrize(
    "reason",
    [pb.FAILURE_EVICTED, pb.FAILURE_NODE_LOST, pb.FAILURE_CLUSTER_LOST],
    ids=["evicted", "node lost", "cluster lost"],
)
def test_disruptions_retry_at_once_elsewhere_without_counting(reason: pb.FailureReason) -> None:
    decision = decide(view_with_failures(*[reason] * 5, max_retries=1))
    assert isinstance(decision, Requeue)
    assert decision.delay_s == 0 and decision.avoid_nodes == ("n5",)


@pytest.mark.parametrize(
    "reason",
    [pb.FAILURE_UNSTABLE, pb.FAILURE_INVALID_INPUT, pb.FAILURE_EXPIRED],
    ids=["unstable", "invalid input", "lived as long as the jobs log keeps"],
)
def test_hopeless_failures_give_up_at_once(reason: pb.FailureReason) -> None:
    decision = decide(view_with_failures(reason))
    assert isinstance(decision, GiveUp) and decision.reason == reason


def test_retry_resumes_from_latest_checkpoint_and_counts_lost_steps() -> None:
    decision = decide(view_with_failures(pb.FAILURE_CRASHED, checkpoint_step=4000))
    assert isinstance(decision, Requeue)
    assert decision.resume_from is not None and decision.resume_from.step == 4000
    assert decision.steps_lost == 700


def _copied(step: int, slot: str = "1.a") -> pb.Event:
    return make_event(
        "copied",
        pb.CheckpointCopied(
            checkpoint=pb.Checkpoint(step=step, path="c", sha256=f"s{step}", copy_slot=slot)
        ),
        job_id="r-md",
        attempt=1,
        producer="t",
        at=NOW,
    )


def _failed_after(reason: pb.FailureReason, *, checkpoint: int, copies: tuple[int, ...]) -> JobView:
    """One attempt that checkpointed at ``checkpoint``, had ``copies`` copied, reached
    ``checkpoint + 700`` and failed with ``reason``."""
    view = view_with_failures(pb.FAILURE_CRASHED, checkpoint_step=checkpoint)
    for step in copies:
        view.apply(_copied(step))
    view.attempts[1].failure = pb.AttemptFailed(
        reason=reason, node="lab1/n1", last_step=checkpoint + 700
    )
    return view


# (name, failure, latest checkpoint, copied steps, resumed step, its copy slot, lost, copy lag)
RESUME_CASES = [
    ("cluster lost: the latest copy, its lag counted", pb.FAILURE_CLUSTER_LOST, 4000,
     (2000, 3000), 3000, "1.a", 1700, 1000),
    ("cluster lost, the latest checkpoint copied: nothing lags", pb.FAILURE_CLUSTER_LOST, 4000,
     (3000, 4000), 4000, "1.a", 700, 0),
    ("cluster lost, nothing copied yet: the latest checkpoint (a shared folder may hold it)",
     pb.FAILURE_CLUSTER_LOST, 4000, (), 4000, "", 700, 0),
    ("crash, the latest checkpoint copied: resumed as its copy, fetchable elsewhere",
     pb.FAILURE_CRASHED, 4000, (4000,), 4000, "1.a", 700, 0),
    ("node lost, the copy behind: the latest checkpoint on the cluster's volume",
     pb.FAILURE_NODE_LOST, 4000, (3000,), 4000, "", 700, 0),
]  # fmt: skip


@named_cases(("reason", "checkpoint", "copies", "step", "slot", "lost", "lag"), RESUME_CASES)
def test_where_a_retry_resumes_with_copies(
    reason: pb.FailureReason,
    checkpoint: int,
    copies: tuple[int, ...],
    step: int,
    slot: str,
    lost: int,
    lag: int,
) -> None:
    view = _failed_after(reason, checkpoint=checkpoint, copies=copies)
    decision = decide(view)
    assert isinstance(decision, Requeue)
    assert decision.resume_from is not None
    assert (decision.resume_from.step, decision.resume_from.copy_slot) == (step, slot)
    assert (decision.steps_lost, decision.copy_lag_steps) == (lost, lag)
    body = requeued_body(decision, view, NOW)
    assert (body.steps_lost, body.copy_lag_steps) == (lost, lag)
    assert view.apply(make_event("requeued", body, job_id="r-md", attempt=2, producer="t", at=NOW))
    assert (view.attempts[1].steps_lost, view.attempts[1].copy_lag_steps) == (lost, lag)
    assert view.attempts[2].resumed_from_step == step
    # Only the runner knows whether it used the copy: its folder may hold the file itself.
    assert not view.attempts[2].resumed_from_copy
    if slot:
        fetched = pb.CopyFetched(checkpoint=decision.resume_from, bytes=1, fetch_s=0.1)
        assert not view.apply(
            make_event("fetched", fetched, job_id="r-md", attempt=1, producer="runner", at=NOW)
        )
        assert view.apply(
            make_event("fetched", fetched, job_id="r-md", attempt=2, producer="runner", at=NOW)
        )
        assert not view.apply(
            make_event("fetched", fetched, job_id="r-md", attempt=2, producer="runner", at=NOW)
        )
        assert view.attempts[2].resumed_from_copy
        assert JobView.from_dict(view.to_dict()).attempts[2].resumed_from_copy


def test_an_older_copy_never_replaces_a_newer_one() -> None:
    view = view_with_failures(pb.FAILURE_CRASHED, checkpoint_step=4000)
    assert view.apply(_copied(3000, "1.b"))
    assert not view.apply(_copied(2000, "1.a"))
    assert not view.apply(_copied(5000, ""))  # no slot: not a copy at all
    assert view.latest_copy is not None and view.latest_copy.copy_slot == "1.b"
    restored = JobView.from_dict(view.to_dict())
    assert restored.latest_copy == view.latest_copy


def _lost_view(*, pod_stopped: bool) -> JobView:
    view = view_with_failures(pb.FAILURE_CRASHED)
    view.attempts[1].failure = pb.AttemptFailed(reason=pb.FAILURE_LOST, node="n1", last_step=700)
    view.attempts[1].ended_at = NOW
    view.attempts[1].pod_phase = pb.POD_FAILED if pod_stopped else pb.POD_RUNNING
    return view


FENCING_CASES = [
    ("lost attempt still running waits", False, NOW, "Wait"),
    ("lost attempt whose pod stopped is retried", True, NOW, "Requeue"),
    (
        "lost attempt unconfirmed past the fence timeout is retried",
        False,
        NOW + timedelta(minutes=5),
        "Requeue",
    ),
]


@named_cases(("stopped", "now", "expected"), FENCING_CASES)
def test_lost_attempt_is_fenced_before_the_retry(
    stopped: bool, now: datetime, expected: str
) -> None:
    decision = decide(_lost_view(pod_stopped=stopped), RecoveryPolicy(), now)
    assert type(decision).__name__ == expected
    if isinstance(decision, Wait):
        assert decision.until == NOW + timedelta(seconds=RecoveryPolicy().fence_timeout_s)


def _no_progress(*reasons: pb.FailureReason, max_retries: int = 10) -> JobView:
    view = view_with_failures(*reasons, max_retries=max_retries)
    for record in view.attempts.values():
        if record.failure is not None:
            record.failure.last_step = record.resumed_from_step
    return view


QUARANTINE_CASES = [
    ("three identical crashes without progress", (pb.FAILURE_CRASHED,) * 3, True),
    ("two identical crashes are not yet a loop", (pb.FAILURE_CRASHED,) * 2, False),
    ("three full disks are the machine's trouble", (pb.FAILURE_ENVIRONMENT,) * 3, False),
    ("three evictions are the cluster's doing", (pb.FAILURE_EVICTED,) * 3, False),
    ("three lost nodes are the nodes' trouble", (pb.FAILURE_NODE_LOST,) * 3, False),
    (
        "a full disk between crashes neither counts nor breaks the loop",
        (pb.FAILURE_CRASHED, pb.FAILURE_ENVIRONMENT, pb.FAILURE_CRASHED, pb.FAILURE_CRASHED),
        True,
    ),
    (
        "different failures are not a loop",
        (pb.FAILURE_CRASHED, pb.FAILURE_EVICTED, pb.FAILURE_CRASHED),
        False,
    ),
]


@named_cases(("reasons", "quarantined"), QUARANTINE_CASES)
def test_crash_loops_are_quarantined(
    reasons: tuple[pb.FailureReason, ...], quarantined: bool
) -> None:
    decision = decide(_no_progress(*reasons))
    is_quarantined = isinstance(decision, GiveUp) and decision.reason == pb.FAILURE_QUARANTINED
    assert is_quarantined is quarantined
    if quarantined:
        assert "quarantined" in decision.message and "no progress" in decision.message  # type: ignore[union-attr]
