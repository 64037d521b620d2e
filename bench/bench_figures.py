"""Arithmetic that several benches' figures share."""

from __future__ import annotations


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0 to 1) of ``values``, any order: the value of nearest rank, the rank
    ``q`` of the way from the smallest to the largest rounded to a whole one."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]
