"""Placement moves a job that recovery requeued off the node it failed on: a lost node that
is not ready, and (the avoid-list alone) a node that is ready and otherwise the best choice; and
a node whose last report still says ready takes no job after one was lost with it, until it
reports again."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from nats.js import JetStreamContext

from mdq.bus.publisher import EventPublisher
from mdq.bus.subjects import Subjects
from mdq.contracts import pb
from mdq.core.placement import AVOIDED
from tests.helpers import (
    RecordingBackend,
    event,
    events_of,
    node_load,
    placement_of,
    running,
    submitted,
    wait_for,
    wait_for_events,
)


async def test_requeued_job_moves_off_a_lost_node_that_is_not_ready(
    js: JetStreamContext, bus: EventPublisher, backend: RecordingBackend, subjects: Subjects
) -> None:
    await bus.publish_all([node_load("n1"), node_load("n2")])
    await bus.publish(submitted("r7-a"))
    async with running(placement_of(js, subjects, backend).run()):
        await wait_for_events(js, subjects, "bound", "r7-a", count=1, what="attempt 1 bound")
        first = (await events_of(js, subjects, "bound", "r7-a"))[0].bound.node
        other = "n2" if first == "n1" else "n1"
        await bus.publish(node_load(first, ready=False))
        await bus.publish(event("started", pb.JobStarted(node=first), job="r7-a", attempt=1))
        pod = pb.PodStatus(
            pod_name="mdq-r7-a-1", node=first, phase=pb.POD_FAILED, reason="NodeLost"
        )
        await bus.publish(event("pod", pod, job="r7-a", attempt=1, detail="POD_FAILED"))
        failure = pb.AttemptFailed(reason=pb.FAILURE_NODE_LOST, node=first)
        await bus.publish(event("attempt_failed", failure, job="r7-a", attempt=1))
        requeue = pb.JobRequeued(avoid_nodes=[first], after=pb.FAILURE_NODE_LOST)
        requeue.resources.cpu, requeue.resources.memory_mb = 1, 512
        await bus.publish(event("requeued", requeue, job="r7-a", attempt=2))

        await wait_for_events(
            js, subjects, "bound", "r7-a", count=2, what="attempt 2 bound elsewhere"
        )
    second = (await events_of(js, subjects, "bound", "r7-a"))[1]
    assert (second.attempt, second.bound.node) == (2, other)


@pytest.mark.parametrize(
    ("avoid", "expected"),
    [
        pytest.param(["big"], "small", id="avoided-goes-elsewhere"),
        pytest.param([], "big", id="control-without-avoid-list-goes-back"),
    ],
)
async def test_the_avoid_list_alone_keeps_a_requeued_job_off_the_best_node(
    js: JetStreamContext,
    bus: EventPublisher,
    backend: RecordingBackend,
    subjects: Subjects,
    avoid: list[str],
    expected: str,
) -> None:
    """ "big" stays ready, idle and by far the best score; after an eviction there, only the
    requeue's avoid-list sends attempt 2 to "small" (the control, with an empty avoid-list,
    shows it would otherwise go back to "big")."""
    await bus.publish_all(
        [node_load("big", cpu_capacity=16), node_load("small", cpu_capacity=4, cpu_load=0.5)]
    )
    await bus.publish(submitted("r8-a"))
    async with running(placement_of(js, subjects, backend).run()):

        async def bound(n: int) -> list[pb.Event]:
            events = await events_of(js, subjects, "bound", "r8-a")
            return events if len(events) == n else []

        async def bound1() -> bool:
            return bool(await bound(1))

        await wait_for(bound1, what="attempt 1 bound")
        assert (await bound(1))[0].bound.node == "big"
        await bus.publish(event("started", pb.JobStarted(node="big"), job="r8-a", attempt=1))
        pod = pb.PodStatus(pod_name="mdq-r8-a-1", node="big", phase=pb.POD_FAILED, reason="Evicted")
        await bus.publish(event("pod", pod, job="r8-a", attempt=1, detail="POD_FAILED"))
        failure = pb.AttemptFailed(reason=pb.FAILURE_EVICTED, node="big")
        await bus.publish(event("attempt_failed", failure, job="r8-a", attempt=1))
        requeue = pb.JobRequeued(avoid_nodes=avoid, after=pb.FAILURE_EVICTED)
        requeue.resources.cpu, requeue.resources.memory_mb = 1, 512
        await bus.publish(event("requeued", requeue, job="r8-a", attempt=2))

        async def bound2() -> bool:
            return bool(await bound(2))

        await wait_for(bound2, what="attempt 2 bound")
    second = (await bound(2))[1]
    assert (second.attempt, second.bound.node) == (2, expected)
    why = {c.node: c.filtered for c in second.bound.candidates}
    assert why == {"big": AVOIDED if avoid else "", "small": ""}


async def test_a_node_lost_after_its_last_report_takes_nothing_until_it_reports_again(
    js: JetStreamContext, bus: EventPublisher, backend: RecordingBackend, subjects: Subjects
) -> None:
    """The only node's latest report says ready, but a job was lost with it since: the retry
    (whose avoid-list cannot be honoured, there being no other node) waits for the node's next
    report instead of going straight back to what may be a dead node."""
    await bus.publish(node_load("only"))
    await bus.publish(submitted("r9-a"))
    placement = placement_of(js, subjects, backend)
    async with running(placement.run()):

        async def bound(n: int) -> list[pb.Event]:
            events = await events_of(js, subjects, "bound", "r9-a")
            return events if len(events) == n else []

        async def bound1() -> bool:
            return bool(await bound(1))

        await wait_for(bound1, what="attempt 1 bound")
        await bus.publish(event("started", pb.JobStarted(node="only"), job="r9-a", attempt=1))
        failure = pb.AttemptFailed(reason=pb.FAILURE_NODE_LOST, node="only")
        await bus.publish(event("attempt_failed", failure, job="r9-a", attempt=1))
        requeue = pb.JobRequeued(avoid_nodes=["only"], after=pb.FAILURE_NODE_LOST)
        requeue.resources.cpu, requeue.resources.memory_mb = 1, 512
        await bus.publish(event("requeued", requeue, job="r9-a", attempt=2))

        async def requeued() -> bool:
            view = placement.book.jobs.get("r9-a")
            return view is not None and view.attempt == 2

        await wait_for(requeued, what="placement to fold the requeue")
        [only] = placement.snapshot(datetime.now(UTC))
        assert not only.ready, "a stale 'ready' outlived the node's loss"
        assert not backend.pods.get("mdq-r9-a-2")
        reported_again = datetime.now(UTC)
        await bus.publish(node_load("only"))

        async def bound2() -> bool:
            return bool(await bound(2))

        await wait_for(bound2, what="attempt 2 bound once the node reported again")
    second = (await bound(2))[1]
    assert (second.attempt, second.bound.node) == (2, "only")
    assert second.time.ToDatetime(tzinfo=UTC) >= reported_again
