"""Placement cordons a node on which several jobs failed, from the log alone."""

from __future__ import annotations

from pathlib import Path

from nats.aio.client import Client

from mdq.bus.subjects import Subjects
from mdq.contracts import pb
from tests.helpers import (
    RecordingBackend,
    event,
    events_of,
    node_load,
    publisher,
    running,
    submitted,
    wait_for,
)
from tests.integration.test_placement import make_placement


async def test_node_where_jobs_keep_failing_gets_no_new_work(
    nc: Client, subjects: Subjects, data_dir: Path
) -> None:
    js = nc.jetstream()
    bus = publisher(js, subjects)
    # n1 is the idle, obvious choice; n2 is busy.
    await bus.publish_all([node_load("n1", cpu_load=0.0), node_load("n2", cpu_load=0.6)])
    for name in ("r8-a", "r8-b", "r8-c"):
        await bus.publish(submitted(name))
        await bus.publish(event("bound", pb.JobBound(node="n1"), job=name, attempt=1))
        failure = pb.AttemptFailed(reason=pb.FAILURE_CRASHED, node="n1", exit_code=1)
        await bus.publish(event("attempt_failed", failure, job=name, attempt=1))
        await bus.publish(
            event("failed", pb.JobFailed(reason=pb.FAILURE_CRASHED), job=name, attempt=1)
        )
    await bus.publish(submitted("r8-new"))
    placement = make_placement(nc, subjects, RecordingBackend(), data_dir)
    async with running(placement.run()):

        async def bound() -> bool:
            return len(await events_of(js, subjects, "bound", "r8-new")) == 1

        await wait_for(bound, what="the new job bound")
    decision = (await events_of(js, subjects, "bound", "r8-new"))[0].bound
    assert decision.node == "n2"
    assert any(c.node == "n1" and c.filtered == "cordoned" for c in decision.candidates)
