"""mdq.testing.runner_files.retry_table_problem: what a retry's energy table must show."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from mdq.testing.runner_files import retry_table_problem


def rows(*steps: int, tag: str = "a") -> list[tuple[int, str]]:
    return [(step, f"{step},{tag}\n") for step in steps]


@dataclass(frozen=True)
class Case:
    name: str
    now: list[tuple[int, str]]
    resumed: int
    problem: str | None
    """A fragment of the problem named (None: the table is right)."""


KILLED = rows(10, 20, 30, 40, 50)
CASES = [
    Case(
        "kept to the resume, the retry's rows after", rows(10, 20) + rows(30, 40, tag="b"), 20, None
    ),
    Case("started over", rows(10, 20, tag="b"), 0, None),
    Case("a step twice", rows(10, 20, 30) + rows(30, tag="b"), 20, "one trajectory"),
    Case("a step missing", rows(10, 20) + rows(40, tag="b"), 20, "one trajectory"),
    Case("a kept row changed", rows(10) + rows(20, 30, tag="b"), 20, "are not those"),
    Case("rows past the resume dropped too early", rows(10) + rows(20, tag="b"), 20, "not those"),
    Case("no row of the retry yet", rows(10, 20), 20, "no row of the retry"),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_retry_table(case: Case) -> None:
    problem = retry_table_problem(KILLED, case.now, case.resumed, 10)
    if case.problem is None:
        assert problem is None
    else:
        assert problem is not None and case.problem in problem
