"""Load reports from a clock that is off: placement judges their age on its own clock.

The metrics service (or a node agent) stamps each load report with its host's time, which may
be minutes off placement's (a host whose time service failed). A report placement receives
live counts as made when it arrives; one read while catching up counts from its stamp, never
later than now. Behind, every node looked silent and nothing was bound; ahead, a node that had
stopped reporting looked alive until its clock's lead ran out.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from nats.js import JetStreamContext

from mdq.bus.publisher import EventPublisher
from mdq.bus.subjects import Subjects
from mdq.contracts import pb
from tests.helpers import events_of, node_load, placement_of, running, submitted, wait_for

SKEW = timedelta(minutes=10)


def stamped(load: pb.Event, at: datetime) -> pb.Event:
    load.time.FromDatetime(at)
    return load


async def bound_while_reporting(
    js: JetStreamContext,
    bus: EventPublisher,
    subjects: Subjects,
    job: str,
    report: Callable[[], pb.Event],
) -> pb.JobBound:
    """Submit ``job`` while a node publishes ``report()`` every half second, as the metrics
    service would; its ``bound`` once placement binds it."""

    async def keep_reporting() -> None:
        while True:
            await bus.publish(report())
            await asyncio.sleep(0.5)

    reporting = asyncio.create_task(keep_reporting())
    try:
        await bus.publish(submitted(job))

        async def bound() -> bool:
            return bool(await events_of(js, subjects, "bound", job))

        await wait_for(bound, what=f"{job} bound")
    finally:
        reporting.cancel()
    return (await events_of(js, subjects, "bound", job))[0].bound


async def test_a_node_reporting_from_a_clock_behind_gets_jobs(
    js: JetStreamContext, bus: EventPublisher, subjects: Subjects
) -> None:
    placement = placement_of(js, subjects, None, load_timeout_s=5.0)
    async with running(placement.run()):

        async def caught_up() -> bool:
            return placement.service_loop.nodes_ready.is_set()

        await wait_for(caught_up, what="placement caught up with the nodes log")
        decision = await bound_while_reporting(
            js,
            bus,
            subjects,
            "cs1-job",
            lambda: stamped(node_load("behind"), datetime.now(UTC) - SKEW),
        )
    assert decision.node == "behind"


async def test_a_silent_node_whose_clock_was_ahead_is_too_old_once_its_timeout_passes(
    js: JetStreamContext, bus: EventPublisher, subjects: Subjects
) -> None:
    # its last report, stamped ten minutes "from now", was made before placement started
    await bus.publish_all(
        [stamped(node_load("ahead"), datetime.now(UTC) + SKEW), node_load("fresh")]
    )
    placement = placement_of(js, subjects, None, load_timeout_s=2.0)
    async with running(placement.run()):
        await asyncio.sleep(2.5)  # the timeout, counted from no later than placement's start
        decision = await bound_while_reporting(
            js, bus, subjects, "cs2-job", lambda: node_load("fresh")
        )
    reasons = {candidate.node: candidate.filtered for candidate in decision.candidates}
    assert decision.node == "fresh"
    assert reasons["ahead"] == "load report too old"
