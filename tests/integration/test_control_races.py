"""Job control's races against a real JetStream (docs/control.md, "Races"): what a service
killed between a request and its effect left is finished by the next one, a cancel that raced
an attempt's failure or a requeue still ends the job CANCELLED, a stopped attempt fails
FAILURE_STOPPED, a run past its max_wall_s is stopped, and a pod of a cancelled job is deleted
wherever it shows up. Exactly one terminal event each."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from nats.aio.client import Client
from nats.js import JetStreamContext

from mdq.bus.publisher import EventPublisher
from mdq.bus.subjects import Subjects
from mdq.contracts import pb
from mdq.core.recovery import RecoveryPolicy
from mdq.sdk.client import MdqClient
from services.recovery.app import Recovery
from services.watcher.lifecycle import Lifecycle, LostRunPolicy
from tests.helpers import (
    RecordingBackend,
    event,
    events_of,
    node_load,
    publisher,
    recovery_of,
    running,
    submitted,
    wait_for,
    wait_for_events,
)
from tests.integration.test_control import placement_running
from tests.integration.test_watcher_lifecycle import pod

ORIGIN = pb.ControlOrigin(control_id="c1", requested_by="ann", reason="typo")
TERMINAL = ("succeeded", "failed", "cancelled")


async def terminal_events(nc: Client, subjects: Subjects, job: str) -> list[str]:
    found = []
    for kind in TERMINAL:
        found += [kind for _ in await events_of(nc.jetstream(), subjects, kind, job)]
    return found


def cancel_requested(job: str) -> pb.Event:
    """The control service's ``cancel_requested`` (control ``c1``, by ann) for attempt 1 of
    ``job``."""
    return event(
        "cancel_requested", pb.CancelRequested(origin=ORIGIN), job=job, attempt=1, detail="c1"
    )


def attempt_failed(job: str, reason: pb.FailureReason) -> pb.Event:
    """Attempt 1 of ``job`` failed on node n1 for ``reason``."""
    return event("attempt_failed", pb.AttemptFailed(reason=reason, node="n1"), job=job, attempt=1)


async def crashed_once(nc: Client, subjects: Subjects, job: str) -> None:
    """Node n1, and ``job`` submitted, bound there and crashed in its first attempt: what a
    requeue follows."""
    bus = publisher(nc.jetstream(), subjects)
    await bus.publish(node_load("n1"))
    await bus.publish(submitted(job))
    await bus.publish(event("bound", pb.JobBound(node="n1"), job=job, attempt=1))
    await bus.publish(attempt_failed(job, pb.FAILURE_CRASHED))


def make_recovery(nc: Client, subjects: Subjects) -> Recovery:
    return recovery_of(nc.jetstream(), subjects, RecoveryPolicy(fence_timeout_s=3600))


async def test_placement_killed_after_the_request_event_finishes_the_effect(
    nc: Client,
    subjects: Subjects,
    js: JetStreamContext,
    bus: EventPublisher,
    backend: RecordingBackend,
) -> None:
    """A placement killed -9 after publishing ``cancel_requested`` (for a running job) or a
    cancel that landed after the job's attempt ended (a PENDING job with a cancel): the next
    leader deletes the pod and ends the pending one CANCELLED."""
    await bus.publish(node_load("n1", cpu_capacity=1))
    await bus.publish(submitted("r1-running", cpu=1))
    await bus.publish(event("bound", pb.JobBound(node="n1", pod_name="mdq-r1-running-1"),
                            job="r1-running", attempt=1))  # fmt: skip
    await bus.publish(event("started", pb.JobStarted(node="n1"), job="r1-running", attempt=1))
    await bus.publish(cancel_requested("r1-running"))
    await bus.publish(submitted("r1-pending", cpu=8))  # fits nowhere
    await bus.publish(cancel_requested("r1-pending"))
    async with placement_running(nc, subjects, backend):

        async def settled() -> bool:
            cancelled = await events_of(js, subjects, "cancelled", "r1-pending")
            return bool(cancelled) and "mdq-r1-running-1" in backend.deleted

        await wait_for(settled, what="the pod deleted and the pending job cancelled")
    [cancelled] = await events_of(js, subjects, "cancelled", "r1-pending")
    assert cancelled.cancelled.message == "cancelled by ann: typo"
    assert backend.deleted.count("mdq-r1-running-1") == 1
    assert await terminal_events(nc, subjects, "r1-running") == []  # recovery's, once stopped
    assert backend.pods == {}  # nothing (re)created for either


async def test_recovery_ends_a_stopped_or_recovering_cancel_once(
    nc: Client, subjects: Subjects, js: JetStreamContext, bus: EventPublisher
) -> None:
    """Recovery decides an attempt stopped for a cancel (CANCELLED) and a cancel that reached a
    job whose attempt had failed on its own and was waiting out a lost run's fence
    (CANCELLED at once, not after the fence); a second recovery changes nothing."""
    for job in ("r2-stopped", "r2-lost"):
        await bus.publish(submitted(job))
        await bus.publish(event("bound", pb.JobBound(node="n1"), job=job, attempt=1))
        await bus.publish(event("started", pb.JobStarted(node="n1"), job=job, attempt=1))
    await bus.publish(cancel_requested("r2-stopped"))
    await bus.publish(attempt_failed("r2-stopped", pb.FAILURE_STOPPED))
    await bus.publish(attempt_failed("r2-lost", pb.FAILURE_LOST))
    recovery = make_recovery(nc, subjects)
    async with running(recovery.run()):
        await wait_for_events(
            js, subjects, "cancelled", "r2-stopped", what="the stopped job cancelled"
        )
        assert await terminal_events(nc, subjects, "r2-lost") == []  # waiting for its fence
        await bus.publish(cancel_requested("r2-lost"))
        await wait_for_events(
            js, subjects, "cancelled", "r2-lost", what="the recovering job cancelled at once"
        )
    again = make_recovery(nc, subjects)
    async with running(again.run()):

        async def caught_up() -> bool:
            return again.state.last_sequence > 0 and not again.state.book.jobs

        await wait_for(caught_up, what="a second recovery caught up")
    assert again.decisions == 0
    for job in ("r2-stopped", "r2-lost"):
        assert await terminal_events(nc, subjects, job) == ["cancelled"]
    assert await events_of(js, subjects, "requeued") == []


async def test_a_cancel_that_raced_a_requeue_still_ends_the_job(
    nc: Client,
    subjects: Subjects,
    js: JetStreamContext,
    bus: EventPublisher,
    backend: RecordingBackend,
) -> None:
    """Recovery requeued a crashed attempt before it read the cancel: the cancel stays with
    the job, and placement ends it CANCELLED instead of binding it."""
    await crashed_once(nc, subjects, "r3-md")
    await bus.publish(cancel_requested("r3-md"))
    await bus.publish(event("requeued", pb.JobRequeued(), job="r3-md", attempt=2))
    async with placement_running(nc, subjects, backend):
        await wait_for_events(js, subjects, "cancelled", "r3-md", what="the requeued job cancelled")
    assert backend.pods == {}
    assert await events_of(js, subjects, "bound", "r3-md") != []  # attempt 1's only
    assert [e.attempt for e in await events_of(js, subjects, "bound", "r3-md")] == [1]
    assert await terminal_events(nc, subjects, "r3-md") == ["cancelled"]


async def test_the_watcher_fails_a_stopped_attempt_stopped_and_deletes_a_cancelled_jobs_pod(
    js: JetStreamContext, bus: EventPublisher, backend: RecordingBackend, subjects: Subjects
) -> None:
    for job in ("r4-held", "r4-cancelled"):
        await bus.publish(submitted(job))
        await bus.publish(event("bound", pb.JobBound(node="n1"), job=job, attempt=1))
    await bus.publish(
        event("held", pb.JobHeld(origin=ORIGIN), job="r4-held", attempt=1, detail="c1")
    )
    # a cancel that raced a binding: the job ended while its pod was being made
    await bus.publish(
        event("cancelled", pb.JobCancelled(origin=ORIGIN), job="r4-cancelled", attempt=1)
    )
    lifecycle = Lifecycle(
        js=js, subjects=subjects, publisher=bus, backend=backend, check_interval_s=0.2
    )
    async with running(lifecycle.run()):
        await backend.updates.put(pod("r4-held", 1, pb.POD_RUNNING))
        await backend.updates.put(pod("r4-held", 1, pb.POD_FAILED, reason="Deleted", exit_code=5))
        await backend.updates.put(pod("r4-cancelled", 1, pb.POD_RUNNING))

        async def done() -> bool:
            failed = await events_of(js, subjects, "attempt_failed", "r4-held")
            return bool(failed) and "mdq-r4-cancelled-1" in backend.deleted

        await wait_for(done, what="the stopped attempt failed and the orphan pod deleted")
    [failed] = await events_of(js, subjects, "attempt_failed", "r4-held")
    assert failed.attempt_failed.reason == pb.FAILURE_STOPPED
    assert failed.attempt_failed.message.startswith("stopped for a hold")


async def test_a_run_past_its_max_wall_s_is_stopped_and_fails_for_good(
    nc: Client,
    subjects: Subjects,
    js: JetStreamContext,
    bus: EventPublisher,
    backend: RecordingBackend,
) -> None:
    job = "r5-long"
    long_ago = datetime.now(UTC) - timedelta(seconds=120)
    submit = submitted(job)
    submit.submitted.spec.max_wall_s = 60
    await bus.publish(submit)
    await bus.publish(event("bound", pb.JobBound(node="n1"), job=job, attempt=1))
    started = event("started", pb.JobStarted(node="n1"), job=job, attempt=1)
    started.time.FromDatetime(long_ago)
    await bus.publish(started)
    checkpoint = pb.Checkpoint(step=300, path="/c/300", sha256="ab")
    await bus.publish(event("checkpoint", checkpoint, job=job, attempt=1, detail=300))
    lifecycle = Lifecycle(
        js=js,
        subjects=subjects,
        publisher=bus,
        backend=backend,
        check_interval_s=0.2,
        lost=LostRunPolicy(min_silence_s=3600),  # silent for 2 min, but not lost: too long
    )
    recovery = make_recovery(nc, subjects)
    async with running(lifecycle.run()), running(recovery.run()):

        async def stopped() -> bool:
            return f"mdq-{job}-1" in backend.deleted

        await wait_for(stopped, what="the run stopped")
        [limit] = await events_of(js, subjects, "limit_exceeded", job)
        assert limit.limit_exceeded.limit == "max_wall_s"
        assert limit.limit_exceeded.used >= 120
        # the runner checkpoints and exits on the deletion
        await backend.updates.put(pod(job, 1, pb.POD_FAILED, reason="Deleted", exit_code=5))
        await wait_for_events(js, subjects, "failed", job, what="the job failed for good")
    [final] = await events_of(js, subjects, "failed", job)
    assert final.failed.reason == pb.FAILURE_LIMIT_EXCEEDED
    assert "its max_wall_s is 60 s" in final.failed.message
    assert await events_of(js, subjects, "requeued", job) == []


async def test_a_cancel_during_a_recovery_backoff_ends_the_job_at_once(
    nc: Client,
    subjects: Subjects,
    bus: EventPublisher,
    backend: RecordingBackend,
) -> None:
    """A crashed job waiting out its backoff (PENDING, not before two seconds from now) is
    cancelled at once, and is never bound once the backoff is over."""
    await crashed_once(nc, subjects, "dddddddddd06-md")
    backoff = pb.JobRequeued(after=pb.FAILURE_CRASHED)
    until = datetime.now(UTC) + timedelta(seconds=2)
    backoff.not_before.FromDatetime(until)
    await bus.publish(event("requeued", backoff, job="dddddddddd06-md", attempt=2))
    client = MdqClient(nc=nc, subjects=subjects)
    async with placement_running(nc, subjects, backend) as placement:
        reply = await client.cancel(["dddddddddd06-md"])
        [outcome] = reply.outcomes
        assert (outcome.result, outcome.state, outcome.attempt) == (
            pb.CONTROL_DONE,
            "CANCELLED",
            2,
        )
        passes: list[int] = []

        async def passes_after_the_backoff() -> bool:
            if datetime.now(UTC) > until:
                passes.append(placement.passes_total)
            return len(passes) > 1 and passes[-1] >= passes[0] + 2

        await wait_for(passes_after_the_backoff, what="two placement passes after the backoff")
    assert await terminal_events(nc, subjects, "dddddddddd06-md") == ["cancelled"]
    assert backend.pods == {}
