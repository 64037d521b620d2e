"""A batch of deliveries in stream order, each sequence once, whatever order they came in."""

from __future__ import annotations

import pytest

from mdq.store.projection.projector import each_once_in_order

CASES = {
    "in order: as it is": ([(1, "a"), (2, "b"), (5, "c")], [(1, "a"), (2, "b"), (5, "c")]),
    "empty": ([], []),
    "a redelivery of a sequence: its first copy": (
        [(1, "a"), (2, "b"), (2, "b again"), (3, "c")],
        [(1, "a"), (2, "b"), (3, "c")],
    ),
    "out of order: sorted": ([(3, "c"), (1, "a"), (2, "b")], [(1, "a"), (2, "b"), (3, "c")]),
    "out of order and repeated": (
        [(3, "c"), (1, "a"), (3, "c again"), (2, "b")],
        [(1, "a"), (2, "b"), (3, "c")],
    ),
}


@pytest.mark.parametrize(("delivered", "expected"), CASES.values(), ids=CASES)
def test_each_sequence_once_in_stream_order(
    delivered: list[tuple[int, str]], expected: list[tuple[int, str]]
) -> None:
    assert each_once_in_order(delivered) == expected
