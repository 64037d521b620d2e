"""The ``jobs`` and ``attempts`` rows the projection writes: their columns and statements.

The columns, their order and their casts are those of the tables in ``mdq.store.models``;
this module says how a ``JobRow`` in memory gives each column's value and which columns of a
job are written once, at its insert. From that come the INSERT, UPDATE and UPSERT statements,
the tuples they take, and the select lists ``JobRow.from_record`` reads back (by name).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, NamedTuple, TypeVar

from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase

from mdq.contracts import pb
from mdq.core.state import AttemptRecord, JobView
from mdq.store.batch_insert import BatchInsert, array_type, model_columns
from mdq.store.models import Attempt, Job
from mdq.store.projection.fold import JobRow, blank

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Column(Generic[T]):
    """One column of a projected table: its name, how a row in memory gives its value, and
    how it is written (a cast on its placeholder) and read back (a select expression)."""

    name: str
    value: Callable[[T], Any]
    cast: str = ""
    """Appended to the column's placeholder, e.g. ``::jsonb``."""
    read: str = ""
    """How the column is selected for ``from_record`` (default: its name)."""


def table_columns(
    model: type[DeclarativeBase], values: Mapping[str, Callable[[T], Any]]
) -> tuple[Column[T], ...]:
    """Every column of ``model``'s table, in its order, with its value from ``values``; a
    ``jsonb`` column is written from JSON text and read back as text."""
    columns = []
    for column, value in model_columns(model, values):
        name = str(column.name)
        if isinstance(column.type, JSONB):
            columns.append(Column(name, value, cast="::jsonb", read=f"{name}::text AS {name}"))
        else:
            columns.append(Column(name, value))
    return tuple(columns)


def _key(model: type[DeclarativeBase]) -> frozenset[str]:
    return frozenset(str(column.name) for column in model.__table__.primary_key)


class AttemptOf(NamedTuple):
    """One attempt of a job row (what an attempts column is computed from)."""

    row: JobRow
    number: int

    @property
    def record(self) -> AttemptRecord:
        return self.row.view.attempts[self.number]


def _failure(of: AttemptOf) -> pb.AttemptFailed | None:
    return of.record.failure


def _control_json(view: JobView) -> str | None:
    """The job control in force (``JobView.control_dict``) as JSON text, None when none."""
    control = view.control_dict()
    return json.dumps(control, sort_keys=True) if control else None


def _checkpoint_step(row: JobRow) -> int | None:
    checkpoint = row.view.latest_checkpoint
    return None if checkpoint is None else checkpoint.step


def _spec_json(row: JobRow) -> str:
    if row.spec_json is None:
        raise ValueError(f"job {row.view.job_id}: a row read back has no spec to insert")
    return row.spec_json


JOB_TABLE: tuple[Column[JobRow], ...] = table_columns(
    Job,
    {
        "job_id": lambda row: row.view.job_id,
        "request_id": lambda row: row.view.request_id,
        "name": lambda row: row.name,
        "task": lambda row: row.task,
        "state": lambda row: row.view.state.value,
        "attempt": lambda row: row.view.attempt,
        "priority_class": lambda row: row.priority_class,
        "node": lambda row: blank(row.view.node),
        "pod_name": lambda row: blank(row.view.pod_name),
        "spec": _spec_json,
        "depends_on": lambda row: list(row.view.depends_on_ids),
        "submitted_by": lambda row: blank(row.submitted_by),
        "submitted_at": lambda row: row.view.submitted_at,
        "updated_at": lambda row: row.updated_at,
        "target_steps": lambda row: row.target_steps,
        "last_step": lambda row: row.view.last_step,
        "last_potential_kj_mol": lambda row: row.view.last_potential,
        "last_temperature_k": lambda row: row.last_temperature_k,
        "last_ns_per_day": lambda row: row.last_ns_per_day,
        "last_progress_at": lambda row: row.view.last_progress_at,
        "done_reason": lambda row: blank(row.view.done_reason),
        "final_reason": lambda row: blank(row.view.final_reason),
        "final_message": lambda row: blank(row.view.final_message),
        "latest_checkpoint_step": _checkpoint_step,
        "control": lambda row: _control_json(row.view),
        "units": lambda row: blank(row.units),
    },
)
JOB_FIXED = frozenset(
    {"request_id", "name", "task", "spec", "depends_on", "submitted_by", "submitted_at"}
)
"""Written once, when the job's row is inserted; every other column is updated."""
_JOB_KEY = tuple(column for column in JOB_TABLE if column.name in _key(Job))
_JOB_MUTABLE = tuple(c for c in JOB_TABLE if c.name not in _key(Job) | JOB_FIXED)
_JOB_UPDATED = (*_JOB_KEY, *_JOB_MUTABLE)

ATTEMPT_TABLE: tuple[Column[AttemptOf], ...] = table_columns(
    Attempt,
    {
        "job_id": lambda of: of.row.view.job_id,
        "attempt": lambda of: of.number,
        "node": lambda of: blank(of.record.node),
        "pod_name": lambda of: blank(of.record.pod_name),
        "bound_at": lambda of: of.row.bound_at.get(of.number),
        "started_at": lambda of: of.record.started_at,
        "ended_at": lambda of: of.record.ended_at,
        "exit_code": lambda of: None if (f := _failure(of)) is None else f.exit_code,
        "failure_reason": (
            lambda of: None if (f := _failure(of)) is None else pb.FailureReason.Name(f.reason)
        ),
        "failure_message": lambda of: None if (f := _failure(of)) is None else blank(f.message),
        "resumed_from_step": lambda of: of.record.resumed_from_step,
        "steps_lost": lambda of: of.record.steps_lost,
        "last_step": lambda of: of.row.attempt_last_step.get(of.number, 0),
        "resumed_from_copy": lambda of: of.record.resumed_from_copy,
        "copy_lag_steps": lambda of: of.record.copy_lag_steps,
    },
)
_ATTEMPT_KEY = tuple(column for column in ATTEMPT_TABLE if column.name in _key(Attempt))


def _names(columns: Sequence[Column[Any]]) -> str:
    return ", ".join(column.name for column in columns)


def _placeholders(columns: Sequence[Column[Any]]) -> str:
    return ", ".join(f"${i}{column.cast}" for i, column in enumerate(columns, 1))


def _select_list(columns: Sequence[Column[Any]]) -> str:
    return ", ".join(column.read or column.name for column in columns)


JOB_COLUMNS = _select_list([column for column in JOB_TABLE if column.name != "spec"])
"""What ``JobRow.from_record`` reads of a job: every column but the spec, which a fold never
reads and an update never writes (``JOB_FIXED``), and which may be large (an inline input)."""
ATTEMPT_COLUMNS = _select_list(ATTEMPT_TABLE)


def _update_jobs() -> str:
    """``UPDATE jobs ... FROM unnest(one array per column)``: every changed job of a batch in
    one statement, the columns of ``job_update`` in order."""
    updated = {column.name for column in _JOB_UPDATED}
    types = {
        str(column.name): array_type(column)
        for column in Job.__table__.columns
        if column.name in updated
    }
    arrays = ", ".join(f"${i}::{types[c.name][0]}[]" for i, c in enumerate(_JOB_UPDATED, 1))
    sets = ", ".join(f"{c.name} = u.{c.name}{types[c.name][1]}" for c in _JOB_MUTABLE)
    key = " AND ".join(f"jobs.{c.name} = u.{c.name}" for c in _JOB_KEY)
    return f"UPDATE jobs SET {sets} FROM unnest({arrays}) AS u({_names(_JOB_UPDATED)}) WHERE {key}"


UPDATE_JOBS = _update_jobs()
"""A batch's changed jobs (the columns of ``job_update_arrays``) in one statement."""
INSERT_JOB = (
    f"INSERT INTO jobs ({_names(JOB_TABLE)}) VALUES ({_placeholders(JOB_TABLE)}) "
    f"ON CONFLICT ({_names(_JOB_KEY)}) DO NOTHING"
)
UPSERT_ATTEMPTS: BatchInsert[AttemptOf] = BatchInsert.of(
    Attempt,
    {column.name: column.value for column in ATTEMPT_TABLE},
    conflict=f"ON CONFLICT ({_names(_ATTEMPT_KEY)}) DO UPDATE SET "
    + ", ".join(
        f"{c.name} = EXCLUDED.{c.name}" for c in ATTEMPT_TABLE if c.name not in _key(Attempt)
    ),
)
"""A batch's changed attempts in one statement (``arrays_of_rows`` of ``attempt_row``s): the
triggers on ``attempts`` (the tallies') run once per batch, not once per row."""
if UPSERT_ATTEMPTS.names != tuple(column.name for column in ATTEMPT_TABLE):
    raise AssertionError("attempt_row's order is not the upsert's")


def _update_attempts() -> str:
    """``UPDATE attempts ... FROM unnest(one array per column)``: the parameters of
    ``UPSERT_ATTEMPTS``, for rows that exist."""
    keys = _key(Attempt)
    sets = ", ".join(
        f"{c.name} = u.{c.name}{c.into}" for c in UPSERT_ATTEMPTS.columns if c.name not in keys
    )
    match = " AND ".join(
        f"attempts.{c.name} = u.{c.name}" for c in UPSERT_ATTEMPTS.columns if c.name in keys
    )
    return f"UPDATE attempts SET {sets} FROM {UPSERT_ATTEMPTS.unnest('u')} WHERE {match}"


UPDATE_ATTEMPTS = _update_attempts()
"""A batch's changed attempts, rows the job's lock shows exist, in one statement: an
``INSERT ... ON CONFLICT DO UPDATE`` would also fire the insert triggers on ``attempts``
(each a function over its transition table), for rows it never inserts."""


def job_update(row: JobRow) -> tuple[Any, ...]:
    """The job's key and mutable columns, in the order of ``UPDATE_JOBS``."""
    return tuple(column.value(row) for column in _JOB_UPDATED)


def job_update_arrays(updates: Sequence[tuple[Any, ...]]) -> list[list[Any]]:
    """The parameters of ``UPDATE_JOBS``: one array per column of the ``job_update`` tuples."""
    return [[update[i] for update in updates] for i in range(len(_JOB_UPDATED))]


def job_insert(row: JobRow) -> tuple[Any, ...]:
    """Every column, in the order of ``INSERT_JOB``."""
    return tuple(column.value(row) for column in JOB_TABLE)


def attempt_row(row: JobRow, number: int) -> tuple[Any, ...]:
    """One attempts row, in the order of ``UPSERT_ATTEMPTS``."""
    of = AttemptOf(row, number)
    return tuple(column.value(of) for column in ATTEMPT_TABLE)
