"""The fair queue of intake's waiting requests: turns between owners, FIFO within one."""

from __future__ import annotations

import pytest

from mdq.core.fair_queue import FairQueue

CASES = {
    "one owner keeps its order": ([("a", 1), ("a", 2), ("a", 3)], [2, 2], [[1, 2], [3]]),
    "a flood waits its turns": (
        [("a", 1), ("a", 2), ("a", 3), ("a", 4), ("b", 10)],
        [2, 10],
        [[1, 10], [2, 3, 4]],
    ),
    "the owner served last goes to the back": (
        [("a", 1), ("a", 2), ("b", 10), ("b", 11), ("c", 20)],
        [1, 1, 1, 1, 1],
        [[1], [10], [20], [2], [11]],
    ),
    "a new owner's turn comes after those waiting": (
        [("a", 1), ("a", 2), ("b", 10)],
        [1, 3],
        [[1], [10, 2]],
    ),
    "nothing to take": ([], [3], [[]]),
    "take none": ([("a", 1)], [0, 1], [[], [1]]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_take(case: str) -> None:
    appended, counts, expected = CASES[case]
    queue: FairQueue[int] = FairQueue()
    for owner, item in appended:
        queue.append(owner, item)
    assert len(queue) == len(appended)
    assert [queue.take(count) for count in counts] == expected
    assert not queue and len(queue) == 0


def test_an_owner_arriving_between_takes_is_served_in_the_next_round() -> None:
    queue: FairQueue[str] = FairQueue()
    for number in range(100):
        queue.append("flood", f"f{number}")
    assert queue.take(3) == ["f0", "f1", "f2"]
    queue.append("calm", "c0")
    assert queue.take(2) == ["f3", "c0"]
