"""``mdq.memory``: survivors are frozen out of the collector's walks, and a reference cycle
frozen while alive is still collected by the periodic full pass — decided on a clock the test
moves, so nothing waits for time to pass."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import weakref
from collections.abc import Iterator

import pytest

from mdq.memory import GcKeeper, keep_state_out_of_gc


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def dropped_cycle() -> weakref.ref[Node]:
    """A reference cycle that nothing outside it references any more."""
    cycle = Node()
    cycle.other = Node()
    cycle.other.other = cycle
    return weakref.ref(cycle)


@pytest.fixture(autouse=True)
def unfrozen() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()
    gc.collect()


def test_a_frozen_cycle_waits_for_the_full_pass_and_is_collected_by_it() -> None:
    clock = Clock()
    keeper = GcKeeper(full_every_s=60.0, clock=clock)
    gc.disable()  # no automatic collection between the steps below
    try:
        alive = dropped_cycle()  # unreachable, but not collected yet
        keeper.freeze()
        assert gc.get_freeze_count() > 0
        gc.collect()
        assert alive() is not None, "frozen: an ordinary collection does not see it"
        clock.now += 59.0
        assert keeper.tick() is None, "the full pass is not due yet"
        assert alive() is not None
        clock.now += 1.0
        found = keeper.tick()
        assert found is not None and found >= 2, "the full pass ran and found the cycle"
        assert alive() is None
        assert gc.get_freeze_count() > 0, "survivors are frozen again after the pass"
        clock.now += 30.0
        assert keeper.tick() is None, "the next full pass is a whole period later"
    finally:
        gc.enable()


def test_a_tick_freezes_what_survived_since_the_last_one() -> None:
    keeper = GcKeeper(full_every_s=60.0, clock=Clock())
    keeper.freeze()
    before = gc.get_freeze_count()
    survivors = [Node() for _ in range(1000)]
    keeper.tick()
    assert gc.get_freeze_count() >= before + len(survivors)


async def test_the_task_freezes_at_once_and_runs_its_full_passes() -> None:
    gc.disable()  # only the task's passes collect
    try:
        alive = dropped_cycle()
        gc.freeze()  # frozen while the cycle was still there: only a full pass finds it
        gc.collect()
        assert alive() is not None
        task = asyncio.create_task(keep_state_out_of_gc(interval_s=0, full_every_s=0))
        try:
            await asyncio.sleep(0)  # the task freezes at once
            assert gc.get_freeze_count() > 0
            for _ in range(100):  # each turn of the loop gives the task one tick
                if alive() is None:
                    break
                await asyncio.sleep(0)
            assert alive() is None
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    finally:
        gc.enable()
