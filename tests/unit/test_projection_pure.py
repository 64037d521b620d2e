"""Pure parts of the history tooling: the sparkline of ``mdq show``."""

from __future__ import annotations

import pytest

from mdq.cli.sparkline import BLOCKS, sparkline


@pytest.mark.parametrize(
    ("values", "width", "expected"),
    [
        ([], 10, ""),
        ([5.0, 5.0, 5.0], 10, BLOCKS[0] * 3),
        ([0.0, 1.0], 10, BLOCKS[0] + BLOCKS[-1]),
        ([-10.0, -5.0, 0.0], 10, BLOCKS[0] + BLOCKS[4] + BLOCKS[-1]),
        ([0.0, 0.0, 1.0, 1.0], 2, BLOCKS[0] + BLOCKS[-1]),  # averaged into two buckets
    ],
    ids=["empty", "flat", "two", "three", "bucketed"],
)
def test_sparkline(values: list[float], width: int, expected: str) -> None:
    assert sparkline(values, width=width) == expected


def test_sparkline_is_never_wider_than_asked() -> None:
    line = sparkline([float(i % 17) for i in range(1000)], width=40)
    assert len(line) == 40 and set(line) <= set(BLOCKS)
