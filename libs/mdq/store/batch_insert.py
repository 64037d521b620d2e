"""Batched inserts generated from one declarative list of columns.

The watcher writes each batch of facts (progress reports, lifecycle events, checkpoints,
placements, rejections) with one statement: every column travels as one array and the rows come
back out of ``unnest``. A ``BatchInsert`` names the table and its columns — each with the SQL
type of its array, how one fact in memory gives its value, and an optional cast on the way in
— and from that single list generates the statement's column list, its ``unnest($1::type[],
…)`` placeholders, the arrays they take, and the plain rows a COPY takes. Nothing ties a value
to a placeholder number by hand: adding, removing or reordering a column is one line.

``BatchInsert.of`` takes the columns, their order and their types from a table of
``mdq.store.models``, so a batched insert only says how a fact gives each column's value.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Generic, TypeVar

from sqlalchemy import BigInteger, Boolean, DateTime, Double, Integer, Text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase
from sqlalchemy.sql.elements import KeyedColumnElement

T = TypeVar("T")

_ARRAY_TYPES: dict[type[Any], tuple[str, str]] = {
    Text: ("text", ""),
    BigInteger: ("bigint", ""),
    Integer: ("int", ""),
    Double: ("float8", ""),
    Boolean: ("bool", ""),
    JSONB: ("text", "::jsonb"),  # JSON text, cast as it goes in
}
"""The element type of a column's array parameter, and its cast on the way in, by the
column's SQLAlchemy type (exactly: ``BigInteger`` is an ``Integer`` too)."""


def model_columns(
    model: type[DeclarativeBase], values: Mapping[str, Callable[[T], Any]]
) -> list[tuple[KeyedColumnElement[Any], Callable[[T], Any]]]:
    """Each column of ``model``'s table, in the table's order, with its value in ``values``,
    which must name every column of the table and nothing else."""
    columns = list(model.__table__.columns)
    names = {column.name for column in columns}
    if missing := names - values.keys():
        raise ValueError(f"{model.__tablename__}: no value for {sorted(missing)}")
    if unknown := values.keys() - names:
        raise ValueError(f"{model.__tablename__}: no such columns {sorted(unknown)}")
    return [(column, values[column.name]) for column in columns]


def array_type(column: KeyedColumnElement[Any]) -> tuple[str, str]:
    """``(element type, cast)`` of the array that carries ``column`` (``_ARRAY_TYPES``)."""
    sql_type = column.type
    if isinstance(sql_type, DateTime):
        if not sql_type.timezone:
            raise TypeError(f"column {column.name}: a timestamp without a time zone")
        return ("timestamptz", "")
    try:
        return _ARRAY_TYPES[type(sql_type)]
    except KeyError:
        raise TypeError(f"column {column.name}: no array type for {sql_type!r}") from None


@dataclass(frozen=True, slots=True)
class BatchColumn(Generic[T]):
    """One column of a batched insert."""

    name: str
    sql_type: str
    """The element type of the column's array parameter (``text``, ``bigint``, …)."""
    value: Callable[[T], Any]
    """The column's value for one fact."""
    into: str = ""
    """A cast applied to the unnested value before it is inserted, e.g. ``::jsonb`` for JSON
    text."""


@dataclass(frozen=True)
class BatchInsert(Generic[T]):
    """``INSERT INTO table (columns) SELECT … FROM unnest(one array per column)``."""

    table: str
    columns: tuple[BatchColumn[T], ...]
    conflict: str = "ON CONFLICT DO NOTHING"
    returning: tuple[str, ...] = ()
    """Columns the statement returns (read back by name)."""

    @classmethod
    def of(
        cls,
        model: type[DeclarativeBase],
        values: Mapping[str, Callable[[T], Any]],
        *,
        conflict: str = "ON CONFLICT DO NOTHING",
        returning: tuple[str, ...] = (),
    ) -> BatchInsert[T]:
        """Every column of ``model``'s table, in its order and with its type's array;
        ``values`` says how one fact gives each column (every column, no other)."""
        columns = []
        for column, value in model_columns(model, values):
            sql_type, into = array_type(column)
            columns.append(BatchColumn(str(column.name), sql_type, value, into=into))
        return cls(str(model.__tablename__), tuple(columns), conflict, returning)

    @property
    def names(self) -> tuple[str, ...]:
        """The column names, in the order of the arrays and of ``rows``."""
        return tuple(column.name for column in self.columns)

    def unnest(self, alias: str, *, ordinality: str = "") -> str:
        """``unnest($1::type[], …) AS alias(columns)``, numbered from $1 in column order; with
        ``ordinality``, ``WITH ORDINALITY`` and that name for the row's position."""
        arrays = ", ".join(f"${i}::{c.sql_type}[]" for i, c in enumerate(self.columns, 1))
        names = list(self.names) + ([ordinality] if ordinality else [])
        with_ordinality = " WITH ORDINALITY" if ordinality else ""
        return f"unnest({arrays}){with_ordinality} AS {alias}({', '.join(names)})"

    def select_list(self, alias: str) -> str:
        """Each column of the unnested row ``alias``, cast as it goes in."""
        return ", ".join(f"{alias}.{c.name}{c.into}" for c in self.columns)

    @cached_property
    def sql(self) -> str:
        """The statement: every fact's row once, conflicts as ``conflict`` says."""
        returning = f" RETURNING {', '.join(self.returning)}" if self.returning else ""
        return (
            f"INSERT INTO {self.table} ({', '.join(self.names)}) "
            f"SELECT {self.select_list('u')} FROM {self.unnest('u')} {self.conflict}{returning}"
        )

    def rows(self, facts: Iterable[T]) -> list[tuple[Any, ...]]:
        """One tuple per fact, the columns in order (what a COPY takes)."""
        return [tuple(column.value(fact) for column in self.columns) for fact in facts]

    def arrays(self, facts: Sequence[T]) -> list[list[Any]]:
        """One array per column, the parameters of ``sql`` in order."""
        return [[column.value(fact) for fact in facts] for column in self.columns]

    def arrays_of_rows(self, rows: Sequence[tuple[Any, ...]]) -> list[list[Any]]:
        """The parameters of ``sql`` from rows already made by ``rows``."""
        return [[row[i] for row in rows] for i in range(len(self.columns))]
