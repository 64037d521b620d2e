"""The budget of a service's log lines: a burst of each kind, then a few a second, the lines
held back counted in the next one logged; and the logging filter every service installs."""

from __future__ import annotations

import logging

import pytest

from mdq.bus.runtime import BUDGET_KEY, LineBudgetFilter
from mdq.core.line_budget import LineBudget

# (kind, seconds) asked in order -> what each ``take`` answers; burst 2, one line a second
CASES: dict[str, tuple[list[tuple[str, float]], list[int | None]]] = {
    "a burst goes through": ([("a", 0.0), ("a", 0.0)], [0, 0]),
    "past the burst, lines are held back": ([("a", 0.0)] * 4, [0, 0, None, None]),
    "the next line let through counts those held back": (
        [("a", 0.0), ("a", 0.0), ("a", 0.1), ("a", 0.2), ("a", 1.0), ("a", 1.1)],
        [0, 0, None, None, 2, None],
    ),
    "kinds have budgets of their own": (
        [("a", 0.0), ("a", 0.0), ("a", 0.0), ("b", 0.0), ("b", 0.0)],
        [0, 0, None, 0, 0],
    ),
    "a quiet kind refills up to its burst, no more": (
        [("a", 0.0), ("a", 0.0), ("a", 100.0), ("a", 100.0), ("a", 100.0)],
        [0, 0, 0, 0, None],
    ),
    "a clock going back refills nothing": (
        [("a", 5.0), ("a", 5.0), ("a", 1.0)],
        [0, 0, None],
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_take(case: str) -> None:
    asked, expected = CASES[case]
    budget = LineBudget(burst=2, per_s=1.0)
    assert [budget.take(kind, now) for kind, now in asked] == expected


def test_memory_is_bounded_and_the_quietest_kind_is_forgotten_first() -> None:
    budget = LineBudget(burst=1, per_s=0.001, max_kinds=3)
    for kind in "abc":
        assert budget.take(kind, 0.0) == 0
    assert budget.take("a", 0.0) is None  # "a" spent, and now the latest
    assert budget.take("d", 0.0) == 0  # "b", the quietest, is forgotten
    assert len(budget) == 3
    assert budget.take("b", 0.0) == 0  # a full burst again
    assert budget.take("a", 0.0) is None  # still remembered as spent


@pytest.mark.parametrize(
    ("burst", "per_s", "max_kinds"), [(0, 1.0, 1), (1, 0.0, 1), (1, 1.0, 0), (1, -1.0, 1)]
)
def test_a_budget_that_lets_nothing_through_is_refused(
    burst: int, per_s: float, max_kinds: int
) -> None:
    with pytest.raises(ValueError, match="burst"):
        LineBudget(burst=burst, per_s=per_s, max_kinds=max_kinds)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_filter_holds_back_a_flood_and_says_so_in_the_next_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A thousand refusals of one tenant in a second: the burst of them, and after a second
    one line that counts the rest. Another tenant's refusal, the same template, and another
    template of the same logger are not held back by that flood."""
    clock = Clock()
    logger = logging.getLogger("test.line_budget")
    budget_filter = LineBudgetFilter(LineBudget(burst=5, per_s=1.0), clock=clock)
    caplog.handler.addFilter(budget_filter)
    try:
        with caplog.at_level(logging.INFO, logger="test.line_budget"):
            for number in range(1000):
                logger.info("refused %s: %s", f"flood.{number}", "rate", extra={BUDGET_KEY: "a"})
            logger.info("refused %s: %s", "calm.1", "rate", extra={BUDGET_KEY: "b"})
            logger.warning("something else %d", 1)
            clock.now = 1.0
            logger.info("refused %s: %s", "flood.last", "rate", extra={BUDGET_KEY: "a"})
    finally:
        caplog.handler.removeFilter(budget_filter)
    lines = [record.getMessage() for record in caplog.records]
    assert lines[:5] == [f"refused flood.{number}: rate" for number in range(5)]
    assert lines[5:] == [
        "refused calm.1: rate",
        "something else 1",
        "refused flood.last: rate [995 more like this held back]",
    ]
