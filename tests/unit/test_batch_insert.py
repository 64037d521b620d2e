"""``mdq.store.batch_insert``: one declarative list of columns generates the statement, its
arrays and its COPY rows, in the same order, so no value is tied to a placeholder by hand."""

from __future__ import annotations

from typing import NamedTuple

import pytest

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
