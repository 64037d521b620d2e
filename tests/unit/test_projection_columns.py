"""The projection's column lists are generated from the tables of ``mdq.store.models``: each
names every column of its model (and nothing else), once, in the table's order, with the
array type and cast its column's type calls for, so that the generated SQL, the row tuples,
the arrays of a batched insert and the select list read back cannot drift from the schema."""

from __future__ import annotations

import pytest
from sqlalchemy.dialects import postgresql
from sqlalchemy.dialects.postgresql.base import PGDialect

from mdq.store.batch_insert import BatchInsert
from mdq.store.models import (
    Attempt,
    Base,
    CheckpointRecord,
    EventRecord,
    Job,
    Placement,
    ProgressRecord,
    Rejection,
)
from mdq.store.projection import PROGRESS_COLUMNS, facts, rows

ARRAY_OF = {
    "TEXT": ("text", ""),
    "BIGINT": ("bigint", ""),
    "INTEGER": ("int", ""),
    "DOUBLE PRECISION": ("float8", ""),
    "TIMESTAMP WITH TIME ZONE": ("timestamptz", ""),
    "BOOLEAN": ("bool", ""),
    "JSONB": ("text", "::jsonb"),
}
"""How a column of each PostgreSQL type travels in a batched insert: as an array of what."""
POSTGRESQL = PGDialect()  # type: ignore[no-untyped-call]  # SQLAlchemy's dialects are untyped


def table_columns(model: type[Base]) -> list[str]:
    return [column.name for column in model.__table__.columns]


@pytest.mark.parametrize(
    ("name", "columns", "model"),
    [
        ("jobs", rows.JOB_TABLE, Job),
        ("attempts", rows.ATTEMPT_TABLE, Attempt),
    ],
)
def test_the_column_table_is_every_column_of_the_model_in_order(
    name: str, columns: tuple[rows.Column[object], ...], model: type[Base]
) -> None:
    assert [column.name for column in columns] == table_columns(model), name
    for column in columns:
        is_json = isinstance(model.__table__.columns[column.name].type, postgresql.JSONB)
        assert column.cast == ("::jsonb" if is_json else ""), column.name
        assert column.read == (f"{column.name}::text AS {column.name}" if is_json else "")


@pytest.mark.parametrize(
    ("name", "insert", "model"),
    [
        ("job_events", facts.EVENTS, EventRecord),
        ("progress", facts.PROGRESS, ProgressRecord),
        ("checkpoints", facts.CHECKPOINTS, CheckpointRecord),
        ("placements", facts.PLACEMENTS, Placement),
        ("rejections", facts.REJECTIONS, Rejection),
    ],
)
def test_each_batched_insert_is_every_column_of_its_model_in_order(
    name: str, insert: BatchInsert[object], model: type[Base]
) -> None:
    assert insert.table == name
    assert list(insert.names) == table_columns(model), name
    for column in insert.columns:
        sql_type = model.__table__.columns[column.name].type.compile(dialect=POSTGRESQL)
        assert (column.sql_type, column.into) == ARRAY_OF[sql_type], column.name


def test_progress_columns_are_the_progress_table_s() -> None:
    assert list(PROGRESS_COLUMNS) == table_columns(ProgressRecord)


def test_the_columns_written_once_are_columns_of_jobs() -> None:
    assert set(table_columns(Job)) >= rows.JOB_FIXED
    assert "job_id" not in rows.JOB_FIXED


def test_placeholders_follow_the_table_order() -> None:
    values = rows.INSERT_JOB.split("VALUES (", 1)[1].split(")", 1)[0].split(", ")
    assert values == [
        f"${i}::jsonb" if column.name in ("spec", "control") else f"${i}"
        for i, column in enumerate(rows.JOB_TABLE, 1)
    ]
    assert rows.UPDATE_JOBS.endswith("WHERE jobs.job_id = u.job_id")
    assert "state = u.state," in rows.UPDATE_JOBS
    assert "control = u.control::jsonb" in rows.UPDATE_JOBS
    assert "unnest($1::text[], $2::text[], $3::int[]" in rows.UPDATE_JOBS  # job_id, state, attempt
    assert "job_id = EXCLUDED" not in rows.UPSERT_ATTEMPTS.sql  # the key is not updated
    assert "attempt = EXCLUDED" not in rows.UPSERT_ATTEMPTS.sql
    assert rows.UPDATE_ATTEMPTS.endswith(
        "WHERE attempts.job_id = u.job_id AND attempts.attempt = u.attempt"
    )
    assert " job_id = u." not in rows.UPDATE_ATTEMPTS  # the key is matched, not written
    assert "last_step = u.last_step," in rows.UPDATE_ATTEMPTS
    for name in rows.JOB_FIXED:  # written once
        assert f" {name} = u." not in rows.UPDATE_JOBS
