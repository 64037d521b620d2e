"""The projection's column tables are the one description of every row it writes: they must
name every column of the models (and nothing else), once, so that the generated SQL, the row
tuples, the arrays of a batched insert and the select list read back cannot drift from the
schema."""

from __future__ import annotations

import pytest

from mdq.store import projection
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


@pytest.mark.parametrize(
    ("name", "columns", "model"),
    [
        ("jobs", projection._JOB_TABLE, Job),
        ("attempts", projection._ATTEMPT_TABLE, Attempt),
    ],
)
def test_the_column_table_names_every_column_of_the_model_once(
    name: str, columns: tuple[projection.Column[object], ...], model: type[Base]
) -> None:
    names = [column.name for column in columns]
    assert len(names) == len(set(names)), f"{name}: a column twice"
    assert set(names) == {column.name for column in model.__table__.columns}


@pytest.mark.parametrize(
    ("name", "names", "model"),
    [
        ("job_events", projection._EVENTS.names, EventRecord),
        ("progress", projection._PROGRESS.names, ProgressRecord),
        ("checkpoints", projection._CHECKPOINTS.names, CheckpointRecord),
        ("placements", projection._PLACEMENTS.names, Placement),
        ("rejections", projection._REJECTIONS.names, Rejection),
    ],
)
def test_each_batched_insert_names_every_column_of_its_model_once(
    name: str, names: tuple[str, ...], model: type[Base]
) -> None:
    assert len(names) == len(set(names)), f"{name}: a column twice"
    assert set(names) == {column.name for column in model.__table__.columns}, name


def test_placeholders_follow_the_table_order() -> None:
    values = projection._INSERT_JOB.split("VALUES (", 1)[1].split(")", 1)[0].split(", ")
    assert values == [
        f"${i}::jsonb" if column.name in ("spec", "control") else f"${i}"
        for i, column in enumerate(projection._JOB_TABLE, 1)
    ]
    assert projection._UPDATE_JOB.endswith("WHERE job_id = $1")
    assert "state = $2" in projection._UPDATE_JOB
    assert "job_id = EXCLUDED" not in projection._UPSERT_ATTEMPT  # the key is not updated
