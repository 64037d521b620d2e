"""What every service's fold reads (``follow_log``) skips events that are not what they claim."""

from __future__ import annotations

import asyncio
import contextlib

from nats.js import JetStreamContext

from mdq.bus.codec import encode
from mdq.bus.log import FOREIGN_EVENTS, follow_log
from mdq.bus.subjects import Subjects
from mdq.contracts import pb
from tests.helpers import event


async def test_forged_producers_and_misplaced_events_are_not_fed(
    js: JetStreamContext, subjects: Subjects
) -> None:
    good = event("succeeded", pb.JobSucceeded(final_step=10), job="job-a", attempt=1)
    forged = event("succeeded", pb.JobSucceeded(final_step=10), job="job-b", attempt=1)
    forged.producer = "intake"  # intake may not say that a job succeeded
    await js.publish(subjects.for_event(forged), encode(forged))
    misplaced = event("succeeded", pb.JobSucceeded(final_step=10), job="job-c", attempt=1)
    await js.publish(subjects.job("job-d", "succeeded"), encode(misplaced))  # another job's
    await js.publish(subjects.for_event(good), encode(good))
    before = sum(FOREIGN_EVENTS.values())

    fed: list[str] = []
    caught_up = asyncio.Event()

    async def on_event(sequence: int, received: pb.Event) -> None:
        fed.append(received.job_id)

    async def on_caught_up() -> None:
        caught_up.set()

    following = asyncio.create_task(
        follow_log(js, subjects.job_all(), on_event=on_event, on_caught_up=on_caught_up)
    )
    try:
        await asyncio.wait_for(caught_up.wait(), timeout=30)
    finally:
        following.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await following
    assert fed == ["job-a"]
    assert sum(FOREIGN_EVENTS.values()) - before == 2
