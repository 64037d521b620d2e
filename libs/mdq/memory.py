"""Keeping the cyclic garbage collector's pauses short in services that hold a large, growing
state in memory (placement's and recovery's fold of the job log) or many long-lived objects
(the console's web stack): ``keep_state_out_of_gc`` freezes what survived, so a collection
walks only what is new, and unfreezes and collects everything once in a while (``GcKeeper``).

Why and how: docs/architecture.md, "Short garbage-collector pauses".
"""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger("mdq.gc")

_PERMANENT_GENERATION = threading.Lock()
"""Held while the permanent generation is changed: a freeze, or an unfreeze and its collection."""


class GcKeeper:
    """Freezes survivors on every ``tick`` and, once ``full_every_s`` has passed on ``clock``
    since the last full pass (or since it was made), unfreezes and collects everything."""

    def __init__(self, *, full_every_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._full_every_s = full_every_s
        self._clock = clock
        self._last_full = clock()

    def freeze(self) -> None:
        """Move every object tracked now into the permanent generation."""
        with _PERMANENT_GENERATION:
            gc.freeze()

    def tick(self) -> int | None:
        """Freeze survivors; first run the full pass if it is due. Returns the number of
        unreachable objects the full pass found, None when none ran."""
        found: int | None = None
        if self._clock() - self._last_full >= self._full_every_s:
            started = time.perf_counter()
            with _PERMANENT_GENERATION:
                gc.unfreeze()
                found = gc.collect()
            self._last_full = self._clock()
            log.info(
                "full collection: %d unreachable objects, %.0f ms",
                found,
                1000 * (time.perf_counter() - started),
            )
        self.freeze()
        return found


async def keep_state_out_of_gc(*, interval_s: float = 10.0, full_every_s: float = 3600.0) -> None:
    """Run forever (as a task): freeze survivors every ``interval_s``, full pass every
    ``full_every_s``."""
    keeper = GcKeeper(full_every_s=full_every_s)
    keeper.freeze()
    while True:
        await asyncio.sleep(interval_s)
        keeper.tick()
