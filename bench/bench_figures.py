"""Arithmetic and timing that several benches' figures share."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def no_collector_pauses() -> Iterator[None]:
    """Keep the bench's own garbage collector from pausing it while it times something: what
    the process holds is frozen out of collection (``gc.freeze``) and no collection runs until
    the block ends. A full collection of a bench process holding thousands of pending requests
    takes about 20 ms, which showed in the p99 it measured, of mdq and of the raw loops alike."""
    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.unfreeze()


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0 to 1) of ``values``, any order: the value of nearest rank, the rank
    ``q`` of the way from the smallest to the largest rounded to a whole one."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]
