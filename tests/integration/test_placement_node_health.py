"""Placement cordons a node whose environment fails (it says so in its load report) or on which
several jobs failed (from the log alone), never every node."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext

from mdq.bus.publisher import EventPublisher
from mdq.bus.subjects import Subjects
from mdq.contracts import pb
from services.placement.app import Placement
from tests.helpers import (
    event,
    events_of,
    node_load,
    placement_of,
    publisher,
    running,
    submitted,
    wait_for_events,
)


async def test_node_where_jobs_keep_failing_gets_no_new_work(
    js: JetStreamContext, bus: EventPublisher, subjects: Subjects
) -> None:
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
    placement = placement_of(js, subjects)
    async with running(placement.run()):
        await wait_for_events(js, subjects, "bound", "r8-new", count=1, what="the new job bound")
    decision = (await events_of(js, subjects, "bound", "r8-new"))[0].bound
    assert decision.node == "n2"
    assert any(c.node == "n1" and c.filtered == "cordoned" for c in decision.candidates)


async def fail_jobs_on(bus: EventPublisher, node: str, prefix: str, reason: int) -> None:
    """Three distinct jobs bound to ``node`` whose attempt failed there for ``reason``."""
    for name in (f"{prefix}-a", f"{prefix}-b", f"{prefix}-c"):
        await bus.publish(submitted(name))
        await bus.publish(event("bound", pb.JobBound(node=node), job=name, attempt=1))
        failure = pb.AttemptFailed(reason=reason, node=node, exit_code=1)  # type: ignore[arg-type]
        await bus.publish(event("attempt_failed", failure, job=name, attempt=1))
        await bus.publish(event("failed", pb.JobFailed(reason=reason), job=name, attempt=1))  # type: ignore[arg-type]


async def bind_one(nc: Client, subjects: Subjects, job: str) -> tuple[pb.JobBound, Placement]:
    """Start placement on the log as it is; return the binding of ``job`` and the placement."""
    js = nc.jetstream()
    await publisher(js, subjects).publish(submitted(job))
    placement = placement_of(js, subjects)
    async with running(placement.run()):
        await wait_for_events(js, subjects, "bound", job, count=1, what=f"{job} bound")
    return (await events_of(js, subjects, "bound", job))[0].bound, placement


async def test_crashes_on_both_of_two_nodes_cordon_only_one(
    nc: Client, subjects: Subjects, caplog: pytest.LogCaptureFixture
) -> None:
    """Both nodes qualify; the budget cordons one (the most recent), never the last node, and
    says so once however often placement looks."""
    caplog.set_level(logging.WARNING, logger="mdq.placement")
    bus = publisher(nc.jetstream(), subjects)
    await bus.publish_all([node_load("n1"), node_load("n2")])
    await fail_jobs_on(bus, "n1", "r9-one", pb.FAILURE_CRASHED)
    await fail_jobs_on(bus, "n2", "r9-two", pb.FAILURE_CRASHED)
    decision, placement = await bind_one(nc, subjects, "r9-new")
    assert decision.node == "n1"
    cordoned = {c.node for c in decision.candidates if c.filtered == "cordoned"}
    assert cordoned == {"n2"}
    for _ in range(3):
        assert set(placement.failure_cordons(datetime.now(UTC))) == {"n2"}
    messages = [r.getMessage() for r in caplog.records if r.name == "mdq.placement"]
    assert len([m for m in messages if m.startswith("node n2 cordoned until")]) == 1
    held = [m for m in messages if "cordon budget is exhausted" in m]
    assert len(held) == 1 and held[0].startswith("node n1 would be cordoned")


async def test_node_lost_on_both_nodes_cordons_neither(nc: Client, subjects: Subjects) -> None:
    """What kill -9 of the agent of both nodes leaves in the log: NodeLost failures. They are
    infrastructure, not evidence against the nodes."""
    bus = publisher(nc.jetstream(), subjects)
    await bus.publish_all([node_load("n1"), node_load("n2", cpu_load=0.6)])
    await fail_jobs_on(bus, "n1", "r10-one", pb.FAILURE_NODE_LOST)
    await fail_jobs_on(bus, "n2", "r10-two", pb.FAILURE_NODE_LOST)
    # The nodes are back and report again (until then, a node lost since its last report
    # counts as not ready: test_placement_moves); what is left to decide is the cordons.
    await bus.publish_all([node_load("n1"), node_load("n2", cpu_load=0.6)])
    decision, _ = await bind_one(nc, subjects, "r10-new")
    assert decision.node == "n1"
    assert not [c.node for c in decision.candidates if c.filtered]


FULL = "data disk full (ENOSPC): No space left on device"


async def test_a_node_that_reports_a_problem_gets_no_new_work_until_it_is_healthy(
    nc: Client, subjects: Subjects, caplog: pytest.LogCaptureFixture
) -> None:
    """n1 is the idle, obvious choice but its data disk is full: the job goes to n2, and n1's
    filter reason names the problem; with n1 healthy again, the next job goes to n1."""
    caplog.set_level(logging.WARNING, logger="mdq.placement")
    bus = publisher(nc.jetstream(), subjects)
    await bus.publish_all([node_load("n1", problem=FULL), node_load("n2", cpu_load=0.6)])
    decision, _ = await bind_one(nc, subjects, "r11-a")
    assert decision.node == "n2"
    assert any(c.node == "n1" and c.filtered == f"cordoned: {FULL}" for c in decision.candidates)
    assert any(f"node n1 takes no new pods: {FULL}" in r.getMessage() for r in caplog.records)

    await bus.publish_all([node_load("n1"), node_load("n2", cpu_load=0.6)])
    healed, _ = await bind_one(nc, subjects, "r11-b")
    assert healed.node == "n1"


async def test_a_problem_on_every_node_never_takes_them_all(nc: Client, subjects: Subjects) -> None:
    """A shared data disk fills for both nodes at once: one is cordoned, the other keeps taking
    work (its pods may fail to start, which charges no job), so nothing waits for ever on
    mdq's own verdict."""
    bus = publisher(nc.jetstream(), subjects)
    await bus.publish_all([node_load("n1", problem=FULL), node_load("n2", problem=FULL)])
    decision, placement = await bind_one(nc, subjects, "r12-a")
    cordoned = {c.node for c in decision.candidates if c.filtered.startswith("cordoned")}
    assert len(cordoned) == 1 and decision.node not in cordoned
    assert set(placement.failure_cordons(datetime.now(UTC))) == cordoned
