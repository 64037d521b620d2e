"""Recovery against a real JetStream: one decision per failure, surviving restarts."""

from __future__ import annotations

from nats.aio.client import Client

from mdq.bus.subjects import Subjects
from mdq.contracts import pb
from services.recovery.app import Recovery
from tests.helpers import (
    event,
    events_of,
    publisher,
    recovery_of,
    running,
    submitted,
    wait_for,
    wait_for_events,
)


def make_recovery(nc: Client, subjects: Subjects) -> Recovery:
    return recovery_of(nc.jetstream(), subjects)


async def fail_attempt(
    nc: Client, subjects: Subjects, job: str, reason: int, *, checkpoint_step: int = 0
) -> None:
    bus = publisher(nc.jetstream(), subjects)
    await bus.publish(submitted(job))
    await bus.publish(event("bound", pb.JobBound(node="n1"), job=job, attempt=1))
    if checkpoint_step:
        checkpoint = pb.Checkpoint(step=checkpoint_step, path=f"/c/{checkpoint_step}", sha256="ab")
        await bus.publish(
            event("checkpoint", checkpoint, job=job, attempt=1, detail=checkpoint_step)
        )
    failure = pb.AttemptFailed(reason=reason, node="n1", last_step=checkpoint_step + 300)  # type: ignore[arg-type]
    await bus.publish(event("attempt_failed", failure, job=job, attempt=1))


async def test_crash_is_requeued_once_from_the_checkpoint(nc: Client, subjects: Subjects) -> None:
    js = nc.jetstream()
    await fail_attempt(nc, subjects, "r1-md", pb.FAILURE_CRASHED, checkpoint_step=2000)
    async with running(make_recovery(nc, subjects).run()):
        await wait_for_events(js, subjects, "requeued", "r1-md", count=1, what="requeued")
    # A second incarnation folds the same log and must not decide again.
    second = make_recovery(nc, subjects)
    async with running(second.run()):

        async def caught_up() -> bool:
            view = second.state.get("r1-md")
            return view is not None and view.attempt == 2

        await wait_for(caught_up, what="second recovery caught up")
    events = await events_of(js, subjects, "requeued", "r1-md")
    assert len(events) == 1 and second.decisions == 0
    body = events[0].requeued
    assert events[0].attempt == 2
    assert body.resume_from.step == 2000 and body.steps_lost == 300
    assert body.HasField("not_before") and body.after == pb.FAILURE_CRASHED


async def test_decision_left_unpublished_by_a_crash_is_made_after_restart(
    nc: Client, subjects: Subjects
) -> None:
    js = nc.jetstream()
    await fail_attempt(nc, subjects, "r2-md", pb.FAILURE_NODE_LOST)
    recovery = make_recovery(nc, subjects)
    async with running(recovery.run()):
        await wait_for_events(
            js,
            subjects,
            "requeued",
            "r2-md",
            count=1,
            what="requeued after starting on an existing backlog",
        )
    body = (await events_of(js, subjects, "requeued", "r2-md"))[0].requeued
    assert list(body.avoid_nodes) == ["n1"] and not body.HasField("not_before")


async def test_unstable_job_fails_for_good(nc: Client, subjects: Subjects) -> None:
    js = nc.jetstream()
    async with running(make_recovery(nc, subjects).run()):
        await fail_attempt(nc, subjects, "r3-md", pb.FAILURE_UNSTABLE)

        await wait_for_events(js, subjects, "failed", "r3-md", count=1, what="final failure")
    assert await events_of(js, subjects, "requeued", "r3-md") == []
    final = (await events_of(js, subjects, "failed", "r3-md"))[0].failed
    assert final.reason == pb.FAILURE_UNSTABLE and "attempt 1 on n1" in final.message
