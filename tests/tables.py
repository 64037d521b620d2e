"""Tables of named test cases: rows whose first column is the case's name, turned into
``pytest.mark.parametrize`` cases that carry that name as their id."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import pytest


def named_cases(
    argnames: Sequence[str], table: Iterable[Sequence[Any]], **options: Any
) -> pytest.MarkDecorator:
    """``parametrize`` over ``argnames`` with each row's other columns; its name is the id."""
    cases = [pytest.param(*row[1:], id=str(row[0])) for row in table]
    return pytest.mark.parametrize(list(argnames), cases, **options)
