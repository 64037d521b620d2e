"""A one-line chart of a series in block characters (``mdq show``'s energy trace); pure."""

from __future__ import annotations

from collections.abc import Sequence

BLOCKS = "▁▂▃▄▅▆▇█"


def sparkline(values: Sequence[float], *, width: int = 60) -> str:
    """``values`` as at most ``width`` blocks, low to high; averaged into buckets when longer.

    A flat series is a row of the lowest block; an empty one is "".
    """
    if not values or width < 1:
        return ""
    if len(values) > width:
        buckets: list[float] = []
        for index in range(width):
            start = index * len(values) // width
            end = max(start + 1, (index + 1) * len(values) // width)
            chunk = values[start:end]
            buckets.append(sum(chunk) / len(chunk))
        values = buckets
    low, high = min(values), max(values)
    span = high - low
    if span <= 0:
        return BLOCKS[0] * len(values)
    top = len(BLOCKS) - 1
    return "".join(BLOCKS[round((value - low) / span * top)] for value in values)
