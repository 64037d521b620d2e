"""``mdq.store.batch_insert``: one declarative list of columns generates the statement, its
arrays and its COPY rows, in the same order, so no value is tied to a placeholder by hand;
``BatchInsert.of`` takes that list's names, order and types from a SQLAlchemy model."""

from __future__ import annotations

from datetime import datetime
from typing import Any, NamedTuple

import pytest
from sqlalchemy import BigInteger, DateTime, Double, Integer, Interval, Text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from mdq.store.batch_insert import BatchColumn, BatchInsert


class Reading(NamedTuple):
    sensor: str
    value: float
    document: dict[str, int]


READINGS: BatchInsert[Reading] = BatchInsert(
    "readings",
    (
        BatchColumn("sensor", "text", lambda r: r.sensor),
        BatchColumn("value", "float8", lambda r: r.value),
        BatchColumn("document", "text", lambda r: str(r.document), into="::jsonb"),
    ),
    returning=("sensor",),
)
FACTS = [Reading("a", 1.5, {"x": 1}), Reading("b", -2.0, {})]


@pytest.mark.parametrize(
    ("name", "generated", "expected"),
    [
        ("column names in order", READINGS.names, ("sensor", "value", "document")),
        (
            "unnest numbers one placeholder per column, typed as arrays",
            READINGS.unnest("u"),
            "unnest($1::text[], $2::float8[], $3::text[]) AS u(sensor, value, document)",
        ),
        (
            "with ordinality the position is named after the columns",
            READINGS.unnest("e", ordinality="n"),
            "unnest($1::text[], $2::float8[], $3::text[]) WITH ORDINALITY"
            " AS e(sensor, value, document, n)",
        ),
        (
            "the select list casts on the way in",
            READINGS.select_list("f"),
            "f.sensor, f.value, f.document::jsonb",
        ),
        (
            "the statement",
            READINGS.sql,
            "INSERT INTO readings (sensor, value, document) SELECT u.sensor, u.value,"
            " u.document::jsonb FROM unnest($1::text[], $2::float8[], $3::text[])"
            " AS u(sensor, value, document) ON CONFLICT DO NOTHING RETURNING sensor",
        ),
        (
            "one array per column",
            READINGS.arrays(FACTS),
            [["a", "b"], [1.5, -2.0], ["{'x': 1}", "{}"]],
        ),
        ("one row per fact", READINGS.rows(FACTS), [("a", 1.5, "{'x': 1}"), ("b", -2.0, "{}")]),
        (
            "arrays from rows equal arrays from facts",
            READINGS.arrays_of_rows(READINGS.rows(FACTS)),
            READINGS.arrays(FACTS),
        ),
        ("no facts: one empty array per column", READINGS.arrays([]), [[], [], []]),
        ("no rows: one empty array per column", READINGS.arrays_of_rows([]), [[], [], []]),
    ],
)
def test_batch_insert(name: str, generated: object, expected: object) -> None:
    assert generated == expected, name


class Model(DeclarativeBase):
    """A metadata of this test's own, apart from mdq's tables, typed as theirs are."""

    type_annotation_map = {
        str: Text(),
        int: BigInteger(),
        float: Double(),
        datetime: DateTime(timezone=True),
    }


class ReadingRecord(Model):
    __tablename__ = "readings"

    sensor: Mapped[str] = mapped_column(primary_key=True)
    value: Mapped[float]
    document: Mapped[dict[str, Any]] = mapped_column(JSONB)
    count: Mapped[int] = mapped_column(Integer)
    total: Mapped[int]
    seen: Mapped[bool]
    at: Mapped[datetime | None]


class IntervalRecord(Model):
    __tablename__ = "intervals"

    key: Mapped[str] = mapped_column(primary_key=True)
    took: Mapped[Any] = mapped_column(Interval)


class NaiveRecord(Model):
    __tablename__ = "naive"

    key: Mapped[str] = mapped_column(primary_key=True)
    took: Mapped[datetime] = mapped_column(DateTime(timezone=False))


VALUES = {
    "at": lambda r: None,
    "document": lambda r: str(r.document),
    "sensor": lambda r: r.sensor,
    "value": lambda r: r.value,
    "count": lambda r: 1,
    "total": lambda r: 2,
    "seen": lambda r: True,
}


def test_of_a_model_takes_its_columns_order_and_types() -> None:
    insert: BatchInsert[Reading] = BatchInsert.of(ReadingRecord, VALUES, returning=("sensor",))
    assert insert.table == "readings"
    assert insert.names == ("sensor", "value", "document", "count", "total", "seen", "at")
    assert insert.unnest("u") == (
        "unnest($1::text[], $2::float8[], $3::text[], $4::int[], $5::bigint[], $6::bool[],"
        " $7::timestamptz[]) AS u(sensor, value, document, count, total, seen, at)"
    )
    assert (
        insert.select_list("f")
        == "f.sensor, f.value, f.document::jsonb, f.count, f.total, f.seen, f.at"
    )
    assert insert.rows(FACTS[:1]) == [("a", 1.5, "{'x': 1}", 1, 2, True, None)]


@pytest.mark.parametrize(
    ("name", "values", "error"),
    [
        ("a column without a value", {k: v for k, v in VALUES.items() if k != "seen"}, "seen"),
        ("a value for no column", {**VALUES, "colour": lambda r: "red"}, "colour"),
    ],
)
def test_of_a_model_wants_a_value_for_every_column_and_no_other(
    name: str, values: dict[str, Any], error: str
) -> None:
    with pytest.raises(ValueError, match=error):
        BatchInsert.of(ReadingRecord, values)


@pytest.mark.parametrize("model", [IntervalRecord, NaiveRecord], ids=["interval", "naive time"])
def test_of_a_model_refuses_a_type_it_has_no_array_for(model: type[Model]) -> None:
    with pytest.raises(TypeError, match="took"):
        BatchInsert.of(model, {"key": lambda r: "k", "took": lambda r: None})
