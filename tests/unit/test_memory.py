"""``mdq.memory.keep_state_out_of_gc``: survivors are frozen out of the collector's walks, and
a reference cycle frozen while alive is still collected by the periodic full pass."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import weakref

from mdq.memory import keep_state_out_of_gc
from tests.helpers import wait_for


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


async def test_survivors_are_frozen_and_frozen_cycles_still_collected() -> None:
    cycle = Node()
    cycle.other = Node()
    cycle.other.other = cycle
    alive = weakref.ref(cycle)
    task = asyncio.create_task(keep_state_out_of_gc(interval_s=0.02, full_every_s=0.15))
    try:
        await asyncio.sleep(0)  # the task freezes at once
        assert gc.get_freeze_count() > 0  # the cycle (alive then) is frozen with the rest
        del cycle
        gc.collect()
        assert alive() is not None  # frozen: an ordinary collection does not see it

        async def collected() -> bool:
            return alive() is None

        await wait_for(collected, timeout=5, interval=0.01, what="the full pass")
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        gc.unfreeze()
