"""The command line's rich tables: a table made from its titled, justified columns."""

from __future__ import annotations

from collections.abc import Iterable

from rich.console import JustifyMethod
from rich.table import Table


def columns_table(
    title: str,
    columns: Iterable[tuple[str, JustifyMethod]],
    *,
    title_justify: JustifyMethod = "center",
) -> Table:
    """An empty table titled ``title`` with ``columns`` (header, justification), in order."""
    table = Table(title=title, title_justify=title_justify)
    for column, justify in columns:
        table.add_column(column, justify=justify)
    return table
