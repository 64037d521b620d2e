"""Recovery policy: classify a failed attempt and decide what happens next (pure).

``classify`` names why an attempt failed from its pod's reason and exit code; ``decide`` says
what follows: a requeue (when, where, with what memory, from which checkpoint), a wait, a final
failure or a cancel. Which failure gets which policy, and why a job fails for good only for its
own reasons: docs/recovery.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta

from mdq.contracts import pb
from mdq.core.exit_codes import RunnerExit
from mdq.core.state import JobView, Stop
from mdq.core.timestamps import set_timestamp

NOT_THE_JOBS_FAULT = frozenset(
    {
        pb.FAILURE_EVICTED,
        pb.FAILURE_NODE_LOST,
        pb.FAILURE_CLUSTER_LOST,
        pb.FAILURE_ENVIRONMENT,
        pb.FAILURE_STOPPED,
    }
)
BACKED_OFF = frozenset({pb.FAILURE_CRASHED, pb.FAILURE_ENVIRONMENT})
"""Failures retried after an exponential backoff (per class): a crash, or a full disk that
needs time to free."""
NOT_WORTH_RETRYING = frozenset(
    {pb.FAILURE_UNSTABLE, pb.FAILURE_INVALID_INPUT, pb.FAILURE_EXPIRED, pb.FAILURE_LIMIT_EXCEEDED}
)
MOVE_TO_ANOTHER_NODE = frozenset(
    {
        pb.FAILURE_EVICTED,
        pb.FAILURE_NODE_LOST,
        pb.FAILURE_CLUSTER_LOST,
        pb.FAILURE_LOST,
        pb.FAILURE_ENVIRONMENT,
    }
)
"""Failures whose retry avoids the node they happened on (a preference: placement drops it
when no other node fits)."""
START_ERROR_REASON = "StartError"
"""The pod reason of an attempt whose pod never started (the node agent could not create its
folder or process; Kubernetes could not pull the image or create the container): the node's
failure, whatever the exit code."""
ENVIRONMENT_EXITS = frozenset({RunnerExit.NO_SPACE, RunnerExit.DISK_FAILED})
"""Runner exits that say its data folder failed under it."""
STOP_SIGNAL_EXITS = frozenset({128 + 15, 128 + 9})
"""Exit codes of a container ended by the signals a pod's deletion sends (SIGTERM, then
SIGKILL after the grace period)."""
CLUSTER_LOST_REASON = "ClusterLost"
"""The pod reason of an attempt whose whole cluster was declared lost
(``mdq.backends.clusters``)."""


NOT_CHARGED = "not charged to the job"
"""What the history says of a failure in ``NOT_THE_JOBS_FAULT`` (``mdq show``, the console)."""


def charged_to_the_job(reason_name: str) -> bool:
    """Whether a failure of this class (its name, as PostgreSQL ``attempts.failure_reason``
    holds it) spends the job's retries; an unknown name does."""
    try:
        reason = pb.FailureReason.Value(reason_name)
    except ValueError:
        return True
    return reason not in NOT_THE_JOBS_FAULT


def classify(*, pod_reason: str, exit_code: int) -> pb.FailureReason:
    """The failure class of a terminated pod, from its reason and the runner's exit code."""
    reason = pod_reason.lower()
    if reason == "oomkilled" or exit_code == RunnerExit.OUT_OF_MEMORY:
        return pb.FAILURE_OOM_KILLED
    if reason in ("evicted", "preempted", "disruptiontarget") or exit_code == RunnerExit.PREEMPTED:
        return pb.FAILURE_EVICTED
    if reason in ("nodelost", "nodenotready"):
        return pb.FAILURE_NODE_LOST
    if reason == CLUSTER_LOST_REASON.lower():
        return pb.FAILURE_CLUSTER_LOST
    if exit_code == RunnerExit.UNSTABLE:
        return pb.FAILURE_UNSTABLE
    if exit_code == RunnerExit.INVALID_INPUT:
        return pb.FAILURE_INVALID_INPUT
    if reason == START_ERROR_REASON.lower() or exit_code in ENVIRONMENT_EXITS:
        return pb.FAILURE_ENVIRONMENT
    if exit_code == RunnerExit.LIMIT_EXCEEDED:
        return pb.FAILURE_LIMIT_EXCEEDED
    return pb.FAILURE_CRASHED


def classify_stopped(*, pod_reason: str, exit_code: int, stopping: bool) -> pb.FailureReason:
    """``classify``, for an attempt whose job may be being stopped on request (``stopping``):
    a runner that stopped on the request was STOPPED, not evicted or crashed: it exited
    PREEMPTED, its pod was deleted or evicted, or it died of the stop's own signals (a container
    that ends on SIGTERM exits 143, one killed after the grace period 137); every other end (an
    OOM kill, a blow-up on the way) is what it was."""
    reason = classify(pod_reason=pod_reason, exit_code=exit_code)
    if stopping and (
        reason == pb.FAILURE_EVICTED
        or (
            reason == pb.FAILURE_CRASHED
            and (pod_reason.lower() == "deleted" or exit_code in STOP_SIGNAL_EXITS)
        )
    ):
        return pb.FAILURE_STOPPED
    return reason


@dataclass(frozen=True, slots=True)
class RecoveryPolicy:
    """Tunables of recovery."""

    backoff_base_s: float = 5.0
    backoff_factor: float = 2.0
    backoff_max_s: float = 300.0
    oom_memory_factor: float = 1.5
    oom_memory_cap_mb: int = 65536
    disruption_deadline_s: float = 0.0
    """The operator's deadline: a job whose latest attempts all failed for reasons not its own
    (``NOT_THE_JOBS_FAULT``), without progress, for longer than this since the first of them
    fails for good (FAILURE_RETRIES_EXHAUSTED, saying so). 0: never; such a job waits."""
    quarantine_after: int = 3
    """Identical failures in a row, without progress between them, that make a crash loop."""
    fence_timeout_s: float = 60.0
    """How long a lost attempt's pod may go unconfirmed before it counts as unreachable."""


@dataclass(frozen=True, slots=True)
class Requeue:
    """Run the job again."""

    attempt: int
    resume_from: pb.Checkpoint | None
    memory_mb: int | None
    """New memory limit, or None to keep the current one."""
    avoid_nodes: tuple[str, ...]
    delay_s: float
    steps_lost: int
    after: pb.FailureReason
    copy_lag_steps: int = 0
    """Of ``steps_lost``, those between the latest checkpoint and the copy resumed from."""


@dataclass(frozen=True, slots=True)
class Wait:
    """Not yet: the failed attempt may still be running (lost, not fenced); decide again when
    its pod is reported stopped, or at ``until`` at the latest."""

    until: datetime


@dataclass(frozen=True, slots=True)
class GiveUp:
    """Fail the job for good."""

    reason: pb.FailureReason
    message: str


@dataclass(frozen=True, slots=True)
class Cancel:
    """End the job CANCELLED: its attempt was stopped for a cancel."""

    origin: pb.ControlOrigin
    message: str


def failure_history(view: JobView) -> list[tuple[int, pb.AttemptFailed]]:
    """(attempt, failure) for every failed attempt of the run in force (since the job was
    submitted or extended), oldest first."""
    return [
        (record.attempt, record.failure)
        for record in view.run_attempts()
        if record.failure is not None
    ]


def describe_attempts(view: JobView) -> str:
    """One line per failed attempt, for the final failure message."""
    return "; ".join(
        f"attempt {number} on {failure.node or '?'}: {pb.FailureReason.Name(failure.reason)}"
        f" (exit {failure.exit_code}) {failure.message}".rstrip()
        for number, failure in failure_history(view)
    )


def crash_loop(view: JobView, policy: RecoveryPolicy) -> int:
    """How many of the latest attempts failed identically without progress (0 if the latest
    streak is shorter than the policy's threshold)."""
    streak: list[tuple[int, int]] = []
    for record in reversed(view.run_attempts()):
        failure = record.failure
        if failure is None or failure.last_step > record.resumed_from_step:
            break
        if failure.reason == pb.FAILURE_STOPPED:
            break  # a stop was asked for: what came before it is not this streak
        if failure.reason in NOT_THE_JOBS_FAULT:
            continue  # the node's or the cluster's doing: neither part of a loop nor a break
        signature = (failure.reason, failure.exit_code)
        if streak and signature != streak[0]:
            break
        streak.append(signature)
    return len(streak) if len(streak) >= policy.quarantine_after else 0


def cancel_message(origin: pb.ControlOrigin) -> str:
    """How a cancel reads in the job's history: "cancelled by alice: wrong temperature"."""
    who = origin.requested_by or (f"tenant {origin.tenant}" if origin.tenant else "the operator")
    return f"cancelled by {who}" + (f": {origin.reason}" if origin.reason else "")


def in_a_row(view: JobView, reason: pb.FailureReason) -> int:
    """How many of the latest attempts failed with ``reason``, one after the other: an
    environment failure backs off by its own streak, so a bad hour last week does not make
    today's first full disk wait the longest delay."""
    count = 0
    for number in sorted(view.attempts, reverse=True):
        failure = view.attempts[number].failure
        if failure is None or failure.reason != reason:
            break
        count += 1
    return count


def disrupted_since(view: JobView) -> datetime | None:
    """When the latest run of failures that are not the job's own began (the end of the first
    of them), if its attempts made no progress; None when the latest failure is the job's own
    or one of them made progress."""
    since: datetime | None = None
    for number in sorted(view.attempts, reverse=True):
        record = view.attempts[number]
        failure = record.failure
        if failure is None or failure.reason not in NOT_THE_JOBS_FAULT:
            break
        if failure.reason == pb.FAILURE_STOPPED:
            break  # a stop was asked for: no disruption runs across it
        if failure.last_step > record.resumed_from_step:
            return since
        since = record.ended_at or since
    return since


def past_deadline(since: datetime, policy: RecoveryPolicy, now: datetime | None) -> bool:
    """Whether the operator's ``disruption_deadline_s`` (if any) has passed since ``since``."""
    if policy.disruption_deadline_s <= 0 or now is None:
        return False
    return now - since > timedelta(seconds=policy.disruption_deadline_s)


def decide(
    view: JobView, policy: RecoveryPolicy = RecoveryPolicy(), now: datetime | None = None
) -> Requeue | GiveUp | Wait | Cancel:
    """What to do with a job whose current attempt failed."""
    failure = view.current.failure
    if failure is None:
        raise ValueError(f"job {view.job_id} attempt {view.attempt} has not failed")
    if view.stop is Stop.CANCEL:
        origin = view.stop_origin or pb.ControlOrigin()
        return Cancel(origin, cancel_message(origin))
    if view.stop is Stop.LIMIT:
        return GiveUp(
            pb.FAILURE_LIMIT_EXCEEDED,
            f"{view.stop_message or 'a runaway limit was crossed'}: {describe_attempts(view)}",
        )
    reason = failure.reason
    history = failure_history(view)
    if reason in NOT_WORTH_RETRYING:
        return GiveUp(reason, f"{pb.FailureReason.Name(reason)}: {describe_attempts(view)}")
    if looping := crash_loop(view, policy):
        return GiveUp(
            pb.FAILURE_QUARANTINED,
            f"quarantined: {looping} attempts in a row failed with "
            f"{pb.FailureReason.Name(reason)} (exit {failure.exit_code}) and no progress: "
            f"{describe_attempts(view)}",
        )
    counted = [f for _, f in history if f.reason not in NOT_THE_JOBS_FAULT]
    if reason == pb.FAILURE_STOPPED:
        pass  # a stop was asked for: decided by the request (above), never a retry spent
    elif reason in NOT_THE_JOBS_FAULT:
        if (since := disrupted_since(view)) is not None and past_deadline(since, policy, now):
            return GiveUp(
                pb.FAILURE_RETRIES_EXHAUSTED,
                f"failures not its own kept it from any progress since "
                f"{since.isoformat(timespec='seconds')}, longer than the operator's deadline of "
                f"{policy.disruption_deadline_s:g} s (MDQ_RECOVERY_DISRUPTION_DEADLINE_S): "
                f"{describe_attempts(view)}",
            )
    elif len(counted) > view.spec.max_retries:
        return GiveUp(
            pb.FAILURE_RETRIES_EXHAUSTED,
            f"{len(counted) - 1} retries exhausted: {describe_attempts(view)}",
        )
    if reason == pb.FAILURE_LOST and not view.current.pod_terminated:
        # Fencing: the silent attempt may still run; wait for its pod to be stopped.
        failed_at = view.current.ended_at
        if failed_at is not None and now is not None:
            deadline = failed_at + timedelta(seconds=policy.fence_timeout_s)
            if now < deadline:
                return Wait(until=deadline)
    checkpoint, copy_lag_steps = resume_point(view, cluster_lost=reason == pb.FAILURE_CLUSTER_LOST)
    resumed_step = checkpoint.step if checkpoint else 0
    steps_lost = max(0, max(failure.last_step, view.last_step) - resumed_step)
    memory: int | None = None
    delay = 0.0
    if reason == pb.FAILURE_OOM_KILLED:
        memory = min(
            policy.oom_memory_cap_mb,
            math.ceil(view.resources.memory_mb * policy.oom_memory_factor),
        )
        if memory <= view.resources.memory_mb:
            return GiveUp(reason, f"out of memory at the cap: {describe_attempts(view)}")
    if reason in BACKED_OFF:
        alike = (
            in_a_row(view, reason)
            if reason == pb.FAILURE_ENVIRONMENT
            else sum(1 for _, f in history if f.reason == reason)
        )
        delay = min(
            policy.backoff_max_s, policy.backoff_base_s * policy.backoff_factor ** (alike - 1)
        )
    moved = reason in MOVE_TO_ANOTHER_NODE or (
        reason == pb.FAILURE_STOPPED and view.stop is Stop.REQUEUE  # placed anew, off the node
    )
    avoid = (failure.node,) if moved and failure.node else ()
    return Requeue(
        attempt=view.attempt + 1,
        resume_from=checkpoint,
        memory_mb=memory,
        avoid_nodes=avoid,
        delay_s=delay,
        steps_lost=steps_lost,
        after=reason,
        copy_lag_steps=copy_lag_steps,
    )


def resume_point(view: JobView, *, cluster_lost: bool) -> tuple[pb.Checkpoint | None, int]:
    """The checkpoint a retry resumes from, and the steps it is behind the latest one.

    After a cluster loss, the latest checkpoint *copied* to the shared store (``copy_slot``
    set): the lost cluster's files are out of reach; with no copy at all, the latest
    checkpoint still (a cluster sharing the lost one's data folder may hold it). Otherwise the
    latest checkpoint, given as its copy when that is copied too, so a retry placed on another
    cluster can fetch it."""
    latest, copy = view.latest_checkpoint, view.latest_copy
    if cluster_lost and copy is not None:
        lag = max(0, latest.step - copy.step) if latest is not None else 0
        return copy, lag
    if latest is not None and copy is not None and copy.step == latest.step:
        return copy, 0
    return latest, 0


def requeued_body(decision: Requeue, view: JobView, now: datetime) -> pb.JobRequeued:
    """The ``requeued`` event body for a decision."""
    body = pb.JobRequeued(
        avoid_nodes=list(decision.avoid_nodes),
        after=decision.after,
        steps_lost=decision.steps_lost,
        copy_lag_steps=decision.copy_lag_steps,
    )
    if decision.resume_from is not None:
        body.resume_from.CopyFrom(decision.resume_from)
    body.resources.CopyFrom(view.resources)
    if decision.memory_mb is not None:
        body.resources.memory_mb = decision.memory_mb
    if decision.delay_s > 0:
        set_timestamp(body.not_before, now + timedelta(seconds=decision.delay_s))
    return body
