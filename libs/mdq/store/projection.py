"""The projection of the event log into PostgreSQL (docs/architecture.md, invariants 1 and 2).

The watcher service runs it as the single writer of the database (``services.watcher``);
``mdq replay --rebuild`` runs the same code into a fresh database, so a rebuilt projection
equals the live one. Two durable pull consumers read the JOBS
stream (every ``job.<id>.<kind>`` event and ``rejected.<request>``) and the PROGRESS stream in
batches (up to ``batch_size`` messages, or what arrived within ``batch_wait_s``, fetched by
``mdq.bus.fetch.BatchFetcher``). Each batch is applied in ONE transaction that also moves the
consumer's offset, and only acknowledged after the commit:

* ``job_events``: every event but progress reports once, by its deterministic event id (looked
  up before the insert, ``... RETURNING``: the table is partitioned by month, so the id alone is
  no key); an event whose id is already stored (a republished copy) has no other effect, so
  replays and republishes change nothing.
* ``progress``: every progress report once, keyed by (job, attempt, step, time), with its envelope;
  one COPY per batch, falling back to ``INSERT ... ON CONFLICT DO NOTHING RETURNING`` when the
  batch holds a republished copy of a stored report (``_store_progress``). The view ``events``
  (migration 0003) shows both tables as one.
* ``jobs`` / ``attempts``: the rows of the jobs touched by the batch are locked, turned back
  into ``mdq.core.state.JobView`` objects, the batch's events are folded in stream order with
  ``JobView.apply`` (the same state machine as placement, recovery and ``mdq replay``: fencing
  by attempt, terminal states accept nothing), and the changed rows are written back with
  absolute values. Times come from the events, so the projection is deterministic: a database
  rebuilt from the log is identical.
* ``checkpoints``, ``placements``, ``rejections``: multi-row ``INSERT ... SELECT FROM
  unnest(...) ON CONFLICT DO NOTHING``.
* ``consumer_offsets``: the last stream sequence, locked at the start of the transaction, with
  the digest of the message there (``last_digest``) and the stream's creation time
  (``stream_created``, recorded when the consumer is opened).

Messages at or below the stored offset are skipped (redeliveries). Delivery must be gap-free
for the offset to be a cursor, so a gap (a message delivered to a process that was killed
before committing it, then acknowledged implicitly by a later ``AckAll``) is never papered
over: on start, and whenever a gap shows up, the durable consumer is recreated to start right
after the stored offset. After a kill -9 mid-batch the transaction is rolled back and the
restarted projector resumes exactly after the last committed batch.

Skipping what is at or below the offset is only right if the log is the one the offset was
taken from. When the consumer is opened, when a batch holds sequences at or below the offset,
and every ``continuity_check_s`` while running, the stored offset is compared with the stream
as the server holds it now (``mdq.core.log_continuity.check``: creation time, first and last
sequence, the message at the offset). A stream that was recreated, lost its tail (power cut,
restored volume) or had unprojected messages removed raises ``LogContinuityError``: the
projector stops and stores nothing more, rather than skip new events that reuse sequence
numbers it already projected. It is not transient and must not be retried; the operator
rebuilds the projection from the log as it is (``mdq replay --rebuild``, docs/durability.md).

PostgreSQL may be away when the projector starts or go away while it runs: a connection-class
error (``mdq.store.engine.DATABASE_NOT_READY``: refused, reset, shutting down, disk full) drops
the pool's connections and waits (a full disk is named as such in one ERROR line per try:
"PostgreSQL at <host> is out of disk space (...): the projection stalls ..."), with backoff and
one log line per try ("PostgreSQL at <host> not reachable (...); retrying in 2.0 s"), until the
server answers; then the batch in hand is tried again. It was never acknowledged, and a
transaction cut off before its commit left the offset where it was (one cut off during its
commit may have committed: the offset it moved makes the retry skip those messages), so nothing
is lost or stored twice, however long the outage. Only the projection waits: the watcher's
lifecycle half needs NATS alone. A database without the mdq tables yet (the migrations run
beside the watcher) is waited for on start as well. Any other error while opening a consumer
(``LogContinuityError`` above, a database that does not exist) is not retried: it stops the
projector, and the watcher.

Why asyncpg and not a SQLAlchemy engine for the writer: every write here is one set-based
statement with array parameters per table per batch (the hot path is progress events, compared
in bench/ against raw asyncpg COPY); asyncpg binds typed arrays directly, caches the prepared
statements and adds no per-row cost, and the ORM's unit of work has nothing to offer to an
idempotent projection. Readers (``mdq.store.queries``) use SQLAlchemy.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, NamedTuple, TypeVar

import asyncpg
import nats.errors
from google.protobuf import json_format
from google.protobuf.message import DecodeError, Message
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, ConsumerInfo, DeliverPolicy
from nats.js.errors import NotFoundError
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase

from mdq.backoff import DEFAULT_BACKOFF, Backoff, describe_error
from mdq.bus.codec import decode_event, foreign_reason
from mdq.bus.fetch import BatchFetcher
from mdq.bus.log import delivery_position
from mdq.bus.subjects import Subjects
from mdq.contracts import pb
from mdq.core.log_continuity import Continuity, ServerLog, StoredOffset, check, message_digest
from mdq.core.state import AttemptRecord, JobState, JobView, event_time
from mdq.core.text import scrub_nul
from mdq.core.timestamps import set_timestamp
from mdq.store.batch_insert import BatchInsert, model_columns
from mdq.store.engine import SCHEMA_NOT_READY, connection_lost, out_of_space
from mdq.store.models import (
    Attempt,
    CheckpointRecord,
    EventRecord,
    Job,
    Placement,
    ProgressRecord,
    Rejection,
)

log = logging.getLogger("mdq.store.projection")

MIN_EVENT_SECONDS = -62_135_596_800  # 0001-01-01T00:00:00Z, the first time a datetime holds
MAX_EVENT_SECONDS = 253_402_300_799  # 9999-12-31T23:59:59Z, the last
JOBS_CONSUMER = "watcher-jobs"
PROGRESS_CONSUMER = "watcher-progress"
SCHEMA_RETRY_S = 2.0


class LogContinuityError(RuntimeError):
    """The log is not the one the stored offset was projected from: stop, do not retry.

    Raised out of ``Projector.run()``; whoever runs the projector must exit non-zero with this
    message (the watcher does), never retry it as a transient failure: nothing changes until an
    operator acts.
    """

    def __init__(self, *, consumer: str, stored: StoredOffset, continuity: Continuity) -> None:
        self.consumer = consumer
        self.stored = stored
        self.continuity = continuity
        super().__init__(
            f"log continuity broken for consumer {consumer} of stream {stored.stream} "
            f"(stored offset {stored.offset}; {continuity.verdict}): {continuity.explanation}. "
            "The projector stopped and projected nothing of it. Events at or below the offset "
            "would be skipped as already projected, so resuming would silently lose them. To "
            "recover, rebuild the projection from the log as it is now: `mdq replay --rebuild "
            "--compare` into a fresh database, then point DATABASE_URL at it "
            "(docs/durability.md)."
        )


@dataclass(frozen=True, slots=True)
class ConsumerLag:
    """How far one of the projector's consumers is behind its stream."""

    consumer: str
    stream: str
    pending: int
    """Messages in the stream not yet delivered to the projector."""
    ack_pending: int
    """Messages delivered but not yet committed and acknowledged."""
    projected_seq: int
    """Last stream sequence committed to PostgreSQL by this process (0 before the first)."""

    @property
    def total(self) -> int:
        return self.pending + self.ack_pending


@dataclass(slots=True)
class _Feed:
    """One stream, its durable consumer and where the projection of it stands."""

    stream: str
    consumer: str
    subscription: BatchFetcher | None = None
    trusted_start: int = 0
    """Set after (re)creating the consumer at this sequence: the first message delivered is
    the first one that exists at or after it, so a jump there is not a gap."""
    projected_seq: int = 0
    verified_at: float = 0.0
    """When (``loop.time()``) the log's continuity was last checked."""


def _blank(text: str) -> str | None:
    return text or None


def _json(message: Message) -> str:
    return json_format.MessageToJson(message, preserving_proto_field_name=True, indent=None)


# -- the jobs and attempts rows in memory --------------------------------------------------


@dataclass(slots=True)
class _JobRow:
    """A job being projected: its ``JobView`` plus the columns the view does not track."""

    view: JobView
    name: str
    task: str
    priority_class: str
    spec_json: str
    submitted_by: str
    target_steps: int
    updated_at: datetime
    last_temperature_k: float | None = None
    last_ns_per_day: float | None = None
    units: str = ""
    """``Progress.units`` of the job's reports ("" as the column names say, "lj")."""
    bound_at: dict[int, datetime] = field(default_factory=dict)
    attempt_last_step: dict[int, int] = field(default_factory=dict)
    ended_now: dict[int, int] = field(default_factory=dict)
    is_new: bool = False
    stored: tuple[Any, ...] | None = None
    stored_attempts: dict[int, tuple[Any, ...]] = field(default_factory=dict)

    @classmethod
    def from_submitted(cls, event: pb.Event) -> _JobRow:
        body = event.submitted
        return cls(
            view=JobView.from_submitted(event),
            name=body.spec.name,
            task=pb.Task.Name(body.spec.task or pb.TASK_MD),  # unset means MD (the proto)
            priority_class=body.spec.priority_class or "normal",
            spec_json=_json(body.spec),
            submitted_by=body.submitted_by,
            target_steps=body.spec.steps,
            updated_at=event_time(event),
            is_new=True,
        )

    @classmethod
    def from_record(cls, job: asyncpg.Record, attempts: Sequence[asyncpg.Record]) -> _JobRow:
        # The fold never reads the spec (placement does) and the row keeps its JSON as stored,
        # so it is not parsed here: that parse was the most expensive part of a batch.
        spec = pb.JobSpec()
        checkpoint_step = job["latest_checkpoint_step"]
        view = JobView(
            job_id=job["job_id"],
            spec=spec,
            request_id=job["request_id"],
            depends_on_ids=tuple(job["depends_on"]),
            submitted_at=job["submitted_at"],
            state=JobState(job["state"]),
            attempt=job["attempt"],
            node=job["node"] or "",
            pod_name=job["pod_name"] or "",
            last_step=job["last_step"],
            last_progress_at=job["last_progress_at"],
            last_potential=job["last_potential_kj_mol"],
            done_reason=job["done_reason"] or "",
            latest_checkpoint=(
                None if checkpoint_step is None else pb.Checkpoint(step=checkpoint_step)
            ),
            final_reason=job["final_reason"] or "",
            final_message=job["final_message"] or "",
        )
        spec.priority_class = job["priority_class"]  # what a reprioritize compares with
        if job["control"]:
            view.apply_control_dict(json.loads(job["control"]))
        row = cls(
            view=view,
            name=job["name"],
            task=job["task"],
            priority_class=job["priority_class"],
            spec_json=job["spec"],
            submitted_by=job["submitted_by"] or "",
            target_steps=job["target_steps"],
            updated_at=job["updated_at"],
            last_temperature_k=job["last_temperature_k"],
            last_ns_per_day=job["last_ns_per_day"],
            units=job["units"] or "",
        )
        for attempt in attempts:
            number = attempt["attempt"]
            failure = None
            if attempt["failure_reason"] is not None:
                failure = pb.AttemptFailed(
                    reason=attempt["failure_reason"],
                    exit_code=attempt["exit_code"] or 0,
                    message=attempt["failure_message"] or "",
                    node=attempt["node"] or "",
                )
            view.attempts[number] = AttemptRecord(
                attempt=number,
                node=attempt["node"] or "",
                pod_name=attempt["pod_name"] or "",
                resumed_from_step=attempt["resumed_from_step"],
                started_at=attempt["started_at"],
                ended_at=attempt["ended_at"],
                failure=failure,
                steps_lost=attempt["steps_lost"],
                copy_lag_steps=attempt["copy_lag_steps"],
                resumed_from_copy=attempt["resumed_from_copy"],
            )
            if attempt["bound_at"] is not None:
                row.bound_at[number] = attempt["bound_at"]
            row.attempt_last_step[number] = attempt["last_step"]
        row.stored = row.job_update()
        row.stored_attempts = {number: row.attempt_row(number) for number in view.attempts}
        return row

    def _late_report(self, event: pb.Event) -> None:
        """A report the fold fenced because its attempt had ended, but made before that end
        (a runner cut off from the bus, its reports published late, after the job was even
        requeued): it counts toward that attempt's last step, as it does when the PROGRESS
        stream is folded first (a rebuild, ``_settle_ended``); one made after the end counts
        in neither order. A report of the job's last attempt also gives its done reason, as
        when it is folded before the end (a runner that reached its target while a cancel was
        on its way: the job ends CANCELLED, its last report said ``steps_reached``)."""
        if event.WhichOneof("body") != "progress":
            return
        record = self.view.attempts.get(event.attempt)
        if record is None or record.ended_at is None or event_time(event) > record.ended_at:
            return
        known = self.attempt_last_step.get(event.attempt, 0)
        self.attempt_last_step[event.attempt] = max(known, event.progress.step)
        if event.attempt == self.view.attempt:
            self.view.done_reason = event.progress.done_reason or self.view.done_reason

    def apply(self, event: pb.Event) -> None:
        """Fold one event with the core state machine; record what the view does not keep."""
        was_open = self.view.current.ended_at is None
        if event.progress.units:  # a job's units: whichever of its reports is folded (a rebuild)
            self.units = event.progress.units
        if not self.view.apply(event):
            self._late_report(event)
            return
        at = event_time(event)
        self.updated_at = at
        attempt = self.view.attempt
        if was_open and self.view.current.ended_at is not None:
            terminal = event.succeeded.final_step or event.attempt_failed.last_step
            self.ended_now[attempt] = terminal  # settled by _settle_ended
        match event.WhichOneof("body"):
            case "bound":
                self.bound_at[attempt] = at
            case "progress":
                body = event.progress
                self.last_temperature_k = body.temperature_k
                self.last_ns_per_day = body.ns_per_day
                self.target_steps = body.target_steps or self.target_steps
                self.attempt_last_step[attempt] = body.step
            case "succeeded":
                previous = self.attempt_last_step.get(attempt, 0)
                self.attempt_last_step[attempt] = max(previous, event.succeeded.final_step)
            case "attempt_failed":
                previous = self.attempt_last_step.get(attempt, 0)
                self.attempt_last_step[attempt] = max(previous, event.attempt_failed.last_step)
            case "requeued":
                self.attempt_last_step[attempt] = self.view.last_step
                # the new attempt has reported nothing yet (whichever stream came first)
                self.last_temperature_k = self.last_ns_per_day = None
            case "reprioritized":
                self.priority_class = event.reprioritized.priority_class
            case "extended":
                self.target_steps = event.extended.spec.steps
                self.priority_class = event.extended.spec.priority_class or self.priority_class
                self.attempt_last_step[attempt] = self.view.last_step
                self.last_temperature_k = self.last_ns_per_day = None
            case _:
                pass

    def catch_up(self, latest: dict[tuple[str, int], pb.Event]) -> None:
        """Fold the latest stored progress report of the current attempt, if not yet seen."""
        report = latest.get((self.view.job_id, self.view.attempt))
        if report is None:
            return
        if self.view.last_progress_at is None or report.progress.step > self.view.last_step:
            self.apply(report)

    def job_update(self) -> tuple[Any, ...]:
        """The job's key and mutable columns, in the order of ``_UPDATE_JOB``."""
        return tuple(column.value(self) for column in _JOB_UPDATED)

    def job_insert(self) -> tuple[Any, ...]:
        """Every column, in the order of ``_INSERT_JOB``."""
        return tuple(column.value(self) for column in _JOB_TABLE)

    def attempt_row(self, number: int) -> tuple[Any, ...]:
        """One attempts row, in the order of ``_UPSERT_ATTEMPT``."""
        of = _AttemptOf(self, number)
        return tuple(column.value(of) for column in _ATTEMPT_TABLE)


# -- the jobs and attempts columns, in the order of their tables in mdq.store.models: one table
# -- each generates the SQL, the row tuples and the select list read back by
# -- ``_JobRow.from_record`` (which reads records by column name) ------------------------------


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


class _AttemptOf(NamedTuple):
    """One attempt of a job row (what an attempts column is computed from)."""

    row: _JobRow
    number: int

    @property
    def record(self) -> AttemptRecord:
        return self.row.view.attempts[self.number]


def _failure(of: _AttemptOf) -> pb.AttemptFailed | None:
    return of.record.failure


def _control_json(view: JobView) -> str | None:
    """The job control in force (``JobView.control_dict``) as JSON text, None when none."""
    control = view.control_dict()
    return json.dumps(control, sort_keys=True) if control else None


def _checkpoint_step(row: _JobRow) -> int | None:
    checkpoint = row.view.latest_checkpoint
    return None if checkpoint is None else checkpoint.step


_JOB_TABLE: tuple[Column[_JobRow], ...] = table_columns(
    Job,
    {
        "job_id": lambda row: row.view.job_id,
        "request_id": lambda row: row.view.request_id,
        "name": lambda row: row.name,
        "task": lambda row: row.task,
        "state": lambda row: row.view.state.value,
        "attempt": lambda row: row.view.attempt,
        "priority_class": lambda row: row.priority_class,
        "node": lambda row: _blank(row.view.node),
        "pod_name": lambda row: _blank(row.view.pod_name),
        "spec": lambda row: row.spec_json,
        "depends_on": lambda row: list(row.view.depends_on_ids),
        "submitted_by": lambda row: _blank(row.submitted_by),
        "submitted_at": lambda row: row.view.submitted_at,
        "updated_at": lambda row: row.updated_at,
        "target_steps": lambda row: row.target_steps,
        "last_step": lambda row: row.view.last_step,
        "last_potential_kj_mol": lambda row: row.view.last_potential,
        "last_temperature_k": lambda row: row.last_temperature_k,
        "last_ns_per_day": lambda row: row.last_ns_per_day,
        "last_progress_at": lambda row: row.view.last_progress_at,
        "done_reason": lambda row: _blank(row.view.done_reason),
        "final_reason": lambda row: _blank(row.view.final_reason),
        "final_message": lambda row: _blank(row.view.final_message),
        "latest_checkpoint_step": _checkpoint_step,
        "control": lambda row: _control_json(row.view),
        "units": lambda row: _blank(row.units),
    },
)
_JOB_FIXED = frozenset(
    {"request_id", "name", "task", "spec", "depends_on", "submitted_by", "submitted_at"}
)
"""Written once, when the job's row is inserted; every other column is updated."""
_JOB_KEY = tuple(column for column in _JOB_TABLE if column.name in _key(Job))
_JOB_MUTABLE = tuple(c for c in _JOB_TABLE if c.name not in _key(Job) | _JOB_FIXED)
_JOB_UPDATED = (*_JOB_KEY, *_JOB_MUTABLE)

_ATTEMPT_TABLE: tuple[Column[_AttemptOf], ...] = table_columns(
    Attempt,
    {
        "job_id": lambda of: of.row.view.job_id,
        "attempt": lambda of: of.number,
        "node": lambda of: _blank(of.record.node),
        "pod_name": lambda of: _blank(of.record.pod_name),
        "bound_at": lambda of: of.row.bound_at.get(of.number),
        "started_at": lambda of: of.record.started_at,
        "ended_at": lambda of: of.record.ended_at,
        "exit_code": lambda of: None if (f := _failure(of)) is None else f.exit_code,
        "failure_reason": (
            lambda of: None if (f := _failure(of)) is None else pb.FailureReason.Name(f.reason)
        ),
        "failure_message": lambda of: None if (f := _failure(of)) is None else _blank(f.message),
        "resumed_from_step": lambda of: of.record.resumed_from_step,
        "steps_lost": lambda of: of.record.steps_lost,
        "last_step": lambda of: of.row.attempt_last_step.get(of.number, 0),
        "resumed_from_copy": lambda of: of.record.resumed_from_copy,
        "copy_lag_steps": lambda of: of.record.copy_lag_steps,
    },
)
_ATTEMPT_KEY = tuple(column for column in _ATTEMPT_TABLE if column.name in _key(Attempt))


def _names(columns: Sequence[Column[Any]]) -> str:
    return ", ".join(column.name for column in columns)


def _placeholders(columns: Sequence[Column[Any]]) -> str:
    return ", ".join(f"${i}{column.cast}" for i, column in enumerate(columns, 1))


def _select_list(columns: Sequence[Column[Any]]) -> str:
    return ", ".join(column.read or column.name for column in columns)


_JOB_COLUMNS = _select_list(_JOB_TABLE)
_ATTEMPT_COLUMNS = _select_list(_ATTEMPT_TABLE)
_UPDATE_JOB = (
    "UPDATE jobs SET "
    + ", ".join(f"{c.name} = ${i}{c.cast}" for i, c in enumerate(_JOB_MUTABLE, len(_JOB_KEY) + 1))
    + " WHERE "
    + " AND ".join(f"{c.name} = ${i}" for i, c in enumerate(_JOB_KEY, 1))
)
_INSERT_JOB = (
    f"INSERT INTO jobs ({_names(_JOB_TABLE)}) VALUES ({_placeholders(_JOB_TABLE)}) "
    f"ON CONFLICT ({_names(_JOB_KEY)}) DO NOTHING"
)
_UPSERT_ATTEMPT = (
    f"INSERT INTO attempts ({_names(_ATTEMPT_TABLE)}) VALUES ({_placeholders(_ATTEMPT_TABLE)}) "
    f"ON CONFLICT ({_names(_ATTEMPT_KEY)}) DO UPDATE SET "
    + ", ".join(
        f"{c.name} = EXCLUDED.{c.name}" for c in _ATTEMPT_TABLE if c.name not in _key(Attempt)
    )
)


class _Stored(NamedTuple):
    """A fact of the batch with the stream it was read from."""

    stream: str
    fact: _Fact


def _body_json(stored: _Stored) -> str:
    return _json(getattr(stored.fact.event, stored.fact.kind))


_EVENTS: BatchInsert[_Stored] = BatchInsert.of(
    EventRecord,
    {
        "event_id": lambda s: s.fact.event.event_id,
        "stream": lambda s: s.stream,
        "stream_seq": lambda s: s.fact.sequence,
        "job_id": lambda s: s.fact.event.job_id or None,
        "attempt": lambda s: s.fact.event.attempt,
        "kind": lambda s: s.fact.kind,
        "time": lambda s: s.fact.at,
        "producer": lambda s: s.fact.event.producer,
        "body": _body_json,
    },
)
_INSERT_EVENTS = f"""
WITH incoming AS (
    SELECT * FROM {_EVENTS.unnest("e", ordinality="n")}
), fresh AS (
    SELECT DISTINCT ON (i.event_id) i.* FROM incoming i
    WHERE NOT EXISTS (SELECT FROM job_events j WHERE j.event_id = i.event_id)
    ORDER BY i.event_id, i.n
)
INSERT INTO job_events ({", ".join(_EVENTS.names)})
SELECT {_EVENTS.select_list("f")}
FROM fresh f
ON CONFLICT DO NOTHING
RETURNING event_id
"""
"""Every event id once: ``job_events`` is partitioned by time, so its key is (event_id, time)
and a republished copy with a new time would not conflict; the ids are looked up first (one
writer per stream, under the consumer offset's lock)."""


def _report(stored: _Stored) -> pb.Progress:
    return stored.fact.event.progress


_PROGRESS: BatchInsert[_Stored] = BatchInsert.of(
    ProgressRecord,
    {
        "job_id": lambda s: s.fact.event.job_id,
        "attempt": lambda s: s.fact.event.attempt,
        "step": lambda s: _report(s).step,
        "time": lambda s: s.fact.at,
        "time_ps": lambda s: _report(s).time_ps,
        "potential_kj_mol": lambda s: _report(s).potential_kj_mol,
        "kinetic_kj_mol": lambda s: _report(s).kinetic_kj_mol,
        "temperature_k": lambda s: _report(s).temperature_k,
        "ns_per_day": lambda s: _report(s).ns_per_day,
        "event_id": lambda s: s.fact.event.event_id,
        "stream": lambda s: s.stream,
        "stream_seq": lambda s: s.fact.sequence,
        "producer": lambda s: s.fact.event.producer,
        "target_steps": lambda s: _report(s).target_steps,
        "eta_s": lambda s: _report(s).eta_s,
        "done_reason": lambda s: _report(s).done_reason,
        "units": lambda s: _blank(_report(s).units),
    },
    returning=("job_id", "attempt", "step"),
)
PROGRESS_COLUMNS = _PROGRESS.names
"""The columns of ``progress`` in the order the watcher's COPY writes them."""


def _progress_rows(stream: str, facts: Iterable[_Fact]) -> list[tuple[Any, ...]]:
    """``_PROGRESS.rows`` of ``facts`` read from ``stream``, each tuple built at once (the
    hot path of the watcher: a call per column per report was a fifth of its CPU); the same
    tuples, which ``tests/unit/test_projection_rows.py`` checks."""
    rows = []
    for fact in facts:
        event = fact.event
        report = event.progress
        rows.append(
            (
                event.job_id,
                event.attempt,
                report.step,
                fact.at,
                report.time_ps,
                report.potential_kj_mol,
                report.kinetic_kj_mol,
                report.temperature_k,
                report.ns_per_day,
                event.event_id,
                stream,
                fact.sequence,
                event.producer,
                report.target_steps,
                report.eta_s,
                report.done_reason,
                report.units or None,
            )
        )
    return rows


_CHECKPOINTS: BatchInsert[_Fact] = BatchInsert.of(
    CheckpointRecord,
    {
        "job_id": lambda f: f.event.job_id,
        "attempt": lambda f: f.event.attempt,
        "step": lambda f: f.event.checkpoint.step,
        "path": lambda f: f.event.checkpoint.path,
        "sha256": lambda f: f.event.checkpoint.sha256,
        "size_bytes": lambda f: f.event.checkpoint.size_bytes,
        "time_ps": lambda f: f.event.checkpoint.time_ps,
        "time": lambda f: f.at,
    },
)


def _placement_candidates(fact: _Fact) -> str:
    candidates = [
        json_format.MessageToDict(c, preserving_proto_field_name=True)
        for c in fact.event.bound.candidates
    ]
    return json.dumps(candidates, sort_keys=True)


_PLACEMENTS: BatchInsert[_Fact] = BatchInsert.of(
    Placement,
    {
        "job_id": lambda f: f.event.job_id,
        "attempt": lambda f: f.event.attempt,
        "node": lambda f: f.event.bound.node,
        "candidates": _placement_candidates,
        "time": lambda f: f.at,
    },
)
_REJECTIONS: BatchInsert[_Fact] = BatchInsert.of(
    Rejection,
    {
        "request_id": lambda f: f.event.rejected.request_id,
        "idempotency_key": lambda f: _blank(f.event.rejected.idempotency_key),
        "field": lambda f: _blank(f.event.rejected.error.field),
        "message": lambda f: f.event.rejected.error.message,
        "time": lambda f: f.at,
    },
)
_FACT_TABLES: dict[str, BatchInsert[_Fact]] = {
    "checkpoint": _CHECKPOINTS,
    "bound": _PLACEMENTS,
    "rejected": _REJECTIONS,
}
"""The append-only facts: the event kind that makes a row, and its table."""
_LOCK_OFFSET = """
INSERT INTO consumer_offsets (consumer, stream, last_seq, updated_at)
VALUES ($1, $2, 0, now()) ON CONFLICT (consumer) DO NOTHING
"""
_READ_OFFSET = "SELECT last_seq FROM consumer_offsets WHERE consumer = $1 FOR UPDATE"
_WRITE_OFFSET = """
UPDATE consumer_offsets SET last_seq = GREATEST(last_seq, $2), stream = $3, updated_at = now(),
    last_digest = $4
WHERE consumer = $1
"""
_READ_STORED = """
SELECT last_seq, stream_created, last_digest FROM consumer_offsets WHERE consumer = $1
"""
_RECORD_STREAM = """
INSERT INTO consumer_offsets (consumer, stream, last_seq, updated_at, stream_created)
VALUES ($1, $2, 0, now(), $3)
ON CONFLICT (consumer) DO UPDATE SET stream_created = EXCLUDED.stream_created
"""


_LATEST_REPORTS = """
SELECT t.job_id, t.attempt, p.step, p.time, p.potential_kj_mol, p.temperature_k, p.ns_per_day,
    p.units
FROM unnest($1::text[], $2::int[], $3::timestamptz[]) AS t(job_id, attempt, until)
CROSS JOIN LATERAL (
    SELECT step, time, potential_kj_mol, temperature_k, ns_per_day, units FROM progress p
    WHERE p.job_id = t.job_id AND p.attempt = t.attempt AND (t.until IS NULL OR p.time <= t.until)
    ORDER BY p.step DESC LIMIT 1  -- the primary key (job_id, attempt, step), read backwards
) AS p
"""


_FIRST_REPORTS = """
SELECT t.job_id, t.attempt, p.time
FROM unnest($1::text[], $2::int[]) AS t(job_id, attempt)
CROSS JOIN LATERAL (
    SELECT time FROM progress p WHERE p.job_id = t.job_id AND p.attempt = t.attempt
    ORDER BY p.step LIMIT 1  -- the primary key (job_id, attempt, step)
) AS p
"""


async def _settle_starts(connection: asyncpg.Connection, rows: dict[str, _JobRow]) -> None:
    """Make every attempt's ``started_at`` the earliest of its facts, whatever the order.

    An attempt started at its ``started`` event or at its first progress report, whichever is
    earlier. The fold sees the two in an order that depends on how the streams interleaved:
    a report folded before its ``bound`` is caught up later (the latest report, not the
    first), and a report folded after the attempt ended (a runner that went on) is fenced. So
    the first stored report of each attempt is read back and lowers ``started_at`` if earlier;
    the live projection and one rebuilt from the log then agree (the chaos campaign found an
    attempt that crashed before its ``started`` was published: started in one, NULL in the
    other)."""
    wanted = [
        (job_id, number)
        for job_id, row in rows.items()
        for number, record in row.view.attempts.items()
        if record.node  # bound: a pod that may have run
    ]
    if not wanted:
        return
    for record in await connection.fetch(_FIRST_REPORTS, *_columns(wanted, 2)):
        attempt = rows[record["job_id"]].view.attempts[record["attempt"]]
        first = record["time"]
        if attempt.started_at is None or first < attempt.started_at:
            attempt.started_at = first


async def _settle_ended(connection: asyncpg.Connection, rows: dict[str, _JobRow]) -> None:
    """Give each attempt that ended in this batch the last step it had reached by its end.

    That is the larger of the step its terminal event names and its last stored report up to
    the moment it ended. Reports after the end (a runner that went on before it was stopped)
    are fenced when the fold sees them after the end, but folded when the PROGRESS stream ran
    ahead of JOBS (a rebuild): so the value is computed afresh here from stored facts, not
    carried from whatever the fold saw first, and the live and rebuilt projections agree.
    """
    wanted = [
        (job_id, number, row.view.attempts[number].ended_at)
        for job_id, row in rows.items()
        for number in row.ended_now
    ]
    if not wanted:
        return
    for row in rows.values():
        for number, terminal in row.ended_now.items():
            row.attempt_last_step[number] = terminal
    for record in await connection.fetch(_LATEST_REPORTS, *_columns(wanted, 3)):
        row = rows[record["job_id"]]
        row.units = record["units"] or row.units
        view, number = row.view, record["attempt"]
        step = max(row.attempt_last_step[number], record["step"])
        row.attempt_last_step[number] = step
        if number == view.attempt:  # not requeued yet: the job's own columns end there too
            view.last_step = step
            view.last_potential = record["potential_kj_mol"]
            view.last_progress_at = record["time"]
            row.last_temperature_k = record["temperature_k"]
            row.last_ns_per_day = record["ns_per_day"]


async def _settle_progress(connection: asyncpg.Connection, rows: dict[str, _JobRow]) -> None:
    """Make the "last progress" columns independent of how the two streams interleaved.

    The JOBS and PROGRESS streams are consumed independently, so the fold may see a job's
    reports before its ``bound``/``started`` (``started`` then sets ``last_progress_at`` to
    its own, older time) or after its terminal event (which accepts nothing). Either way the
    answer must be the same, or a projection rebuilt from the log would differ from the live
    one: the latest stored report (highest step) of the job's current attempt, up to the
    attempt's end, sets the progress columns unless the fold already holds a later report.
    """
    wanted = [
        (job_id, row.view.attempt, row.view.current.ended_at)
        for job_id, row in rows.items()
        if row.view.state.value not in ("WAITING", "PENDING", "HELD")
    ]
    if not wanted:
        return
    for record in await connection.fetch(_LATEST_REPORTS, *_columns(wanted, 3)):
        row = rows[record["job_id"]]
        row.units = record["units"] or row.units
        view, at = row.view, record["time"]
        if view.last_progress_at is not None and at < view.last_progress_at:
            continue
        view.last_step = max(view.last_step, record["step"])
        view.last_potential = record["potential_kj_mol"]
        view.last_progress_at = at
        row.last_temperature_k = record["temperature_k"]
        row.last_ns_per_day = record["ns_per_day"]
        row.updated_at = max(row.updated_at, at)
        attempt = view.attempt
        row.attempt_last_step[attempt] = max(row.attempt_last_step.get(attempt, 0), record["step"])


_LATEST_PROGRESS = """
SELECT p.job_id, p.attempt, p.event_id, p.time, p.producer, p.step, p.target_steps, p.time_ps,
    p.potential_kj_mol, p.kinetic_kj_mol, p.temperature_k, p.ns_per_day, p.eta_s, p.done_reason,
    p.units
FROM unnest($1::text[], $2::int[]) AS t(job_id, attempt)
CROSS JOIN LATERAL (
    SELECT * FROM progress p WHERE p.job_id = t.job_id AND p.attempt = t.attempt
    ORDER BY p.step DESC LIMIT 1  -- the primary key, read backwards
) AS p
"""


def progress_event(record: asyncpg.Record) -> pb.Event:
    """A stored progress row as the event it was projected from."""
    event = pb.Event(
        event_id=record["event_id"],
        job_id=record["job_id"],
        attempt=record["attempt"],
        producer=record["producer"],
        progress=pb.Progress(
            step=record["step"],
            target_steps=record["target_steps"],
            time_ps=record["time_ps"],
            potential_kj_mol=record["potential_kj_mol"],
            kinetic_kj_mol=record["kinetic_kj_mol"],
            temperature_k=record["temperature_k"],
            ns_per_day=record["ns_per_day"],
            eta_s=record["eta_s"],
            done_reason=record["done_reason"],
            units=record["units"] or "",
        ),
    )
    set_timestamp(event.time, record["time"])
    return event


async def _latest_progress(
    connection: asyncpg.Connection, attempts: dict[str, int]
) -> dict[tuple[str, int], pb.Event]:
    """The highest-step stored report of attempts 1 to ``attempts[job]`` of every job."""
    pairs = [(job, number) for job, last in attempts.items() for number in range(1, last + 1)]
    if not pairs:
        return {}
    records = await connection.fetch(_LATEST_PROGRESS, *_columns(pairs, 2))
    return {(record["job_id"], record["attempt"]): progress_event(record) for record in records}


async def _cancel(task: asyncio.Task[list[Msg]] | None) -> None:
    """Cancel a fetch running ahead and wait for it to end (its messages are dropped). A
    cancellation of the caller while it waits is not swallowed (``asyncio.wait`` raises it)."""
    if task is not None:
        task.cancel()
        await asyncio.wait([task])
        if not task.cancelled():
            task.exception()  # retrieved: a fetch that failed as it was dropped is no news


def _columns(rows: Sequence[tuple[Any, ...]], width: int) -> list[list[Any]]:
    """Key tuples to columns, for the lookups' ``unnest($1::type[], ...)``."""
    if not rows:
        return [[] for _ in range(width)]
    return [list(column) for column in zip(*rows, strict=True)]


class _Fact(NamedTuple):
    """An event of the batch with what every table needs of it, computed once."""

    sequence: int
    event: pb.Event
    kind: str
    at: datetime


@dataclass(slots=True)
class _BatchOutcome:
    """What one transaction did: the highest sequence it covers and where to rewind, if any."""

    covered_seq: int
    rewind_at: int | None
    projected: int
    stale: bool = False
    """The batch held sequences at or below the stored offset (redeliveries, or a log that
    went backwards: checked before they are acknowledged)."""


async def _store_progress(
    connection: asyncpg.Connection, stream: str, reports: list[_Fact]
) -> list[_Fact]:
    """Store progress reports in ``progress``; return the ones not stored before.

    The fast path is one COPY: the batch holds only messages after the committed offset, so
    its reports are new unless the log holds a republished copy of an older report (same job,
    attempt and step). Then the COPY fails on the primary key, its savepoint is rolled back and
    the batch is stored again with ``INSERT ... ON CONFLICT DO NOTHING``, which says which
    reports were new. Copies within the batch are dropped first (the first one counts).
    """
    unique: dict[tuple[str, int, int], _Fact] = {}
    for fact in reports:
        key = (fact.event.job_id, fact.event.attempt, fact.event.progress.step)
        unique.setdefault(key, fact)
    rows = _progress_rows(stream, unique.values())
    try:
        async with connection.transaction():  # a savepoint
            await connection.copy_records_to_table(
                _PROGRESS.table, records=rows, columns=_PROGRESS.names
            )
    except asyncpg.UniqueViolationError:
        stored = await connection.fetch(_PROGRESS.sql, *_PROGRESS.arrays_of_rows(rows))
        new = {(record["job_id"], record["attempt"], record["step"]) for record in stored}
        return [fact for key, fact in unique.items() if key in new]
    return list(unique.values())


class Projector:
    """Consumes the JOBS and PROGRESS streams and projects them into PostgreSQL."""

    def __init__(
        self,
        *,
        js: JetStreamContext,
        subjects: Subjects,
        pool: asyncpg.Pool,
        batch_size: int = 500,
        batch_wait_s: float = 0.2,
        ack_wait_s: float = 60.0,
        jobs_consumer: str = JOBS_CONSUMER,
        progress_consumer: str = PROGRESS_CONSUMER,
        max_retry_delay_s: float = 5.0,
        continuity_check_s: float = 10.0,
        database: str = "the database",
        reconnect: Backoff = DEFAULT_BACKOFF,
    ) -> None:
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        self._js = js
        self._subjects = subjects
        self._pool = pool
        self.foreign_events = 0
        """Events skipped as not what they claim to be (``mdq.bus.codec.foreign_reason``)."""
        self._batch_size = batch_size
        self._batch_wait_s = batch_wait_s
        self._ack_wait_s = ack_wait_s
        self._max_retry_delay_s = max_retry_delay_s
        self._continuity_check_s = continuity_check_s
        self._feeds = (
            _Feed(stream=subjects.jobs_stream, consumer=jobs_consumer),
            _Feed(stream=subjects.progress_stream, consumer=progress_consumer),
        )
        self._database = database
        self._reconnect = reconnect
        self._stopping = asyncio.Event()
        self._write_lock = asyncio.Lock()
        self._database_lock = asyncio.Lock()
        self.events_projected = 0
        """Events applied (not counting skipped redeliveries and duplicates), for metrics."""
        self.continuity_checks = 0
        """Checks of the log's continuity passed (``_verify``), for tests and logs."""

    # -- life cycle ------------------------------------------------------------------------
    async def run(self) -> None:
        """Project both streams until ``stop()`` is called; raise ``LogContinuityError`` (not
        in an exception group) when a stream is not the log the offsets were projected from."""
        self._stopping.clear()
        try:
            async with asyncio.TaskGroup() as group:
                for feed in self._feeds:
                    group.create_task(self._follow_or_stop(feed), name=f"projector-{feed.consumer}")
        except BaseExceptionGroup as group:
            broken = group.subgroup(LogContinuityError)
            if broken is None:
                raise
            first = broken.exceptions[0]
            while isinstance(first, BaseExceptionGroup):
                first = first.exceptions[0]
            raise first from group
        finally:
            for feed in self._feeds:
                await self._unsubscribe(feed)

    async def _follow_or_stop(self, feed: _Feed) -> None:
        """``_follow``; when it fails, the other feed is asked to stop as well as cancelled. A
        cancellation alone can be lost on Python 3.11 (``asyncio.timeout`` turns one that
        lands as its deadline expires into a TimeoutError), which left the other feed running
        and ``run()`` waiting on it for ever."""
        try:
            await self._follow(feed)
        except BaseException:
            self._stopping.set()
            raise

    def stop(self) -> None:
        """Ask ``run()`` to return after the batch in hand is committed (or abandoned)."""
        self._stopping.set()

    async def lag(self) -> list[ConsumerLag]:
        """How far each consumer is behind its stream (for metrics and logs)."""
        lags = []
        for feed in self._feeds:
            try:
                info = await self._js.consumer_info(feed.stream, feed.consumer)
                pending, ack_pending = info.num_pending or 0, info.num_ack_pending or 0
            except NotFoundError:
                stream = await self._js.stream_info(feed.stream)
                pending, ack_pending = max(0, stream.state.last_seq - feed.projected_seq), 0
            lags.append(
                ConsumerLag(
                    consumer=feed.consumer,
                    stream=feed.stream,
                    pending=pending,
                    ack_pending=ack_pending,
                    projected_seq=feed.projected_seq,
                )
            )
        return lags

    # -- consuming -------------------------------------------------------------------------
    async def _follow(self, feed: _Feed) -> None:
        """Fetch and project batches until stopped; any unexpected error reopens the consumer
        from the stored offset, which is always a correct place to resume.

        The next batch is fetched while the current one is written (the two overlap: NATS
        parsing in this process, the transaction in PostgreSQL); it is only projected after
        the current one committed, and dropped, unacknowledged, when the consumer is reopened.
        """
        ahead: asyncio.Task[list[Msg]] | None = None
        try:
            while not self._stopping.is_set():
                subscription = feed.subscription
                if subscription is None:
                    try:
                        await self._open(feed)
                    except LogContinuityError:
                        raise  # not transient: stops the watcher
                    except nats.errors.Error as error:
                        log.warning("cannot open consumer %s (%r); retrying", feed.consumer, error)
                        await self._sleep(1.0)
                    except SCHEMA_NOT_READY as error:
                        log.warning(
                            "PostgreSQL at %s has no mdq tables yet (%s): waiting for the "
                            "migrations (mdq.store.migrate); retrying in %.1f s",
                            self._database,
                            describe_error(error),
                            SCHEMA_RETRY_S,
                        )
                        await self._sleep(SCHEMA_RETRY_S)
                    except Exception as error:
                        if not connection_lost(error):
                            raise  # not an outage: stops the watcher
                        await self._reach_database(error)
                    continue
                fetching = ahead or asyncio.create_task(self._fetch(subscription))
                ahead = None
                try:
                    messages = await fetching
                except nats.errors.Error as error:
                    log.warning("fetch from %s failed, reopening: %r", feed.consumer, error)
                    await self._unsubscribe(feed)  # reopened at the stored offset
                    await self._sleep(1.0)
                    continue
                if not messages and not self._verify_due(feed):
                    continue
                if messages:
                    ahead = asyncio.create_task(self._fetch(subscription))
                try:
                    if self._verify_due(feed):
                        await self._verify(feed)
                    if messages:
                        await self._handle(feed, messages)
                except (asyncio.CancelledError, LogContinuityError):
                    raise
                except Exception as error:
                    if connection_lost(error):  # the periodic check met an outage
                        await self._reach_database(error)
                    else:
                        log.exception(
                            "consumer %s failed; reopening at the stored offset", feed.consumer
                        )
                        await self._unsubscribe(feed)
                        await self._sleep(1.0)
                if feed.subscription is not subscription:  # rewound or reopened
                    await _cancel(ahead)
                    ahead = None
        finally:
            await _cancel(ahead)

    async def _fetch(self, subscription: BatchFetcher) -> list[Msg]:
        """Up to ``batch_size`` messages, or what arrived within ``batch_wait_s`` (maybe none)."""
        return await subscription.fetch(self._batch_size, self._batch_wait_s)

    async def _open(self, feed: _Feed) -> None:
        """Check that the log continues the stored offset, then bind to the durable consumer;
        recreate it if it is not right after the offset."""
        offset = await self._verify(feed)
        try:
            info: ConsumerInfo | None = await self._js.consumer_info(feed.stream, feed.consumer)
        except NotFoundError:
            info = None
        feed.projected_seq = offset
        delivered = info.delivered.stream_seq if info and info.delivered else 0
        if info is None or info.config.ack_policy != AckPolicy.ALL or (delivered or 0) != offset:
            await self._rewind(feed, offset + 1)
            return
        await self._subscribe(feed)
        feed.trusted_start = 0

    async def _rewind(self, feed: _Feed, start_seq: int) -> None:
        """(Re)create the durable consumer so its next message is ``start_seq``."""
        log.info("consumer %s starts at stream sequence %d", feed.consumer, start_seq)
        await self._unsubscribe(feed)
        with contextlib.suppress(NotFoundError):
            await self._js.delete_consumer(feed.stream, feed.consumer)
        config = ConsumerConfig(
            durable_name=feed.consumer,
            description="mdq watcher: projection of the log into PostgreSQL",
            ack_policy=AckPolicy.ALL,
            ack_wait=self._ack_wait_s,
            max_ack_pending=max(1000, 4 * self._batch_size),
            deliver_policy=(
                DeliverPolicy.ALL if start_seq <= 1 else DeliverPolicy.BY_START_SEQUENCE
            ),
            opt_start_seq=None if start_seq <= 1 else start_seq,
        )
        await self._js.add_consumer(feed.stream, config=config)
        await self._subscribe(feed)
        feed.trusted_start = start_seq

    async def _subscribe(self, feed: _Feed) -> None:
        await self._unsubscribe(feed)
        fetcher = BatchFetcher(self._js, stream=feed.stream, consumer=feed.consumer)
        feed.subscription = await fetcher.start()

    async def _unsubscribe(self, feed: _Feed) -> None:
        subscription, feed.subscription = feed.subscription, None
        if subscription is not None:
            with contextlib.suppress(Exception):
                await subscription.close()

    async def _reach_database(self, error: BaseException) -> None:
        """After a connection-class error: drop the pool's connections and wait, with backoff
        and one log line per try, until PostgreSQL answers again (or ``stop()``).

        Both feeds may call it at once; the lock makes the second wait behind the first, and
        its first try then succeeds. Nothing is lost meanwhile: the batch in hand was not
        acknowledged and its transaction, if it did not commit, left the offset where it was.
        """
        async with self._database_lock:
            if out_of_space(error):
                log.error(
                    "PostgreSQL at %s is out of disk space (%s): the projection stalls, storing "
                    "and acknowledging nothing, and catches up once the disk has room again "
                    "(mdq_consumer_lag_messages shows what waits)",
                    self._database,
                    describe_error(error),
                )
            else:
                log.warning(
                    "PostgreSQL at %s unavailable (%s); reconnecting",
                    self._database,
                    describe_error(error),
                )
            await self._pool.expire_connections()  # the next acquire opens fresh ones
            delays = self._reconnect.delays()
            failures = 0
            while not self._stopping.is_set():
                try:
                    async with self._pool.acquire() as connection:
                        await connection.fetchval("SELECT 1")
                except Exception as retry_error:
                    if not connection_lost(retry_error):
                        raise
                    failures += 1
                    delay = next(delays)
                    log.warning(
                        "PostgreSQL at %s not reachable (%s); retrying in %.1f s",
                        self._database,
                        describe_error(retry_error),
                        delay,
                    )
                    await self._sleep(delay)
                    continue
                if failures:
                    log.info(
                        "PostgreSQL at %s reachable again after %d failed tries",
                        self._database,
                        failures,
                    )
                return

    async def _sleep(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._stopping.wait()

    async def _handle(self, feed: _Feed, messages: list[Msg]) -> None:
        """Project one batch (retrying the same batch until it commits), then acknowledge."""
        batch: dict[int, tuple[Msg, pb.Event | None]] = {}
        for message in messages:
            # from the reply subject directly: nats-py's ``Msg.metadata`` builds dataclasses
            # and a datetime per message, a tenth of the projector's CPU
            sequence = delivery_position(message.reply)[0]
            if sequence not in batch:
                batch[sequence] = (message, self._decode(feed, sequence, message))
        ordered = sorted(batch.items())
        delay = 0.05
        scrubbed = False
        while True:
            try:
                async with self._write_lock:
                    outcome = await self._project(feed, ordered)
                break
            except asyncio.CancelledError:
                raise
            except Exception as error:
                if isinstance(error, LogContinuityError):
                    raise
                if connection_lost(error):
                    await self._reach_database(error)
                    if self._stopping.is_set():
                        return  # not acknowledged: the next start resumes after the offset
                    # then the same batch again, not at once: a server that answers a ping
                    # but refuses the batch (a full disk) must not be hammered
                    await self._sleep(delay)
                    delay = min(delay * 2, self._max_retry_delay_s)
                    continue
                if isinstance(error, asyncpg.DataError) and not scrubbed:
                    # Text PostgreSQL refuses (a NUL, e.g. in a pod's termination message):
                    # store the batch with U+FFFD in its place rather than stop on it.
                    scrubbed = True
                    changed = [scrub_nul(e) for _, (_, e) in ordered if e is not None]
                    if any(changed):
                        log.error(
                            "a batch of %s was refused (%s); %d event(s) scrubbed of NULs",
                            feed.consumer,
                            error,
                            sum(changed),
                        )
                        continue
                log.exception("projecting a batch from %s failed; retrying", feed.consumer)
                if self._stopping.is_set():
                    return  # not acknowledged: the next start resumes after the offset
                await self._sleep(delay)
                delay = min(delay * 2, self._max_retry_delay_s)
        feed.projected_seq = max(feed.projected_seq, outcome.covered_seq)
        self.events_projected += outcome.projected
        if outcome.stale:
            # Redeliveries, or new events reusing sequence numbers of a log that went
            # backwards: not acknowledged (nor skipped) before the log is known to be the same.
            await self._verify(feed)
        if outcome.rewind_at is not None:
            log.warning(
                "gap in %s before stream sequence %d; rewinding", feed.consumer, outcome.rewind_at
            )
            await self._rewind(feed, outcome.rewind_at)
            return
        feed.trusted_start = 0
        last_message = ordered[-1][1][0]
        with contextlib.suppress(Exception):
            await last_message.ack()  # AckAll: covers the whole batch

    def _decode(self, feed: _Feed, sequence: int, message: Msg) -> pb.Event | None:
        try:
            event = decode_event(message.data)
        except DecodeError:
            log.error(
                "undecodable message %s:%d on %s skipped", feed.stream, sequence, message.subject
            )
            return None
        if (reason := foreign_reason(event, message.subject)) is not None:
            self.foreign_events += 1
            log.error("%s:%d skipped: %s", feed.stream, sequence, reason)
            return None
        if not MIN_EVENT_SECONDS <= event.time.seconds <= MAX_EVENT_SECONDS:
            log.error("event with an impossible time %s:%d skipped", feed.stream, sequence)
            return None
        if not event.event_id:
            event.event_id = f"{feed.stream}:{sequence}"
        return event

    # -- the stored offset and the log's continuity ----------------------------------------
    async def _read_offset(self, feed: _Feed) -> StoredOffset:
        async with self._pool.acquire() as connection:
            row = await connection.fetchrow(_READ_STORED, feed.consumer)
        if row is None:
            return StoredOffset(feed.stream, 0, None, None)
        return StoredOffset(
            feed.stream, int(row["last_seq"]), row["stream_created"], row["last_digest"]
        )

    def _verify_due(self, feed: _Feed) -> bool:
        return asyncio.get_running_loop().time() - feed.verified_at >= self._continuity_check_s

    async def _verify(self, feed: _Feed) -> int:
        """Compare the stored offset with the stream on the server; return the offset, or raise
        ``LogContinuityError`` if the log is not the one it was projected from. Records the
        stream's creation time with the offset when it was not recorded yet."""
        stored = await self._read_offset(feed)  # before the server: the offset only grows
        info = await self._js.stream_info(feed.stream)
        if info.created is None:
            raise RuntimeError(f"the server gave no creation time for stream {feed.stream}")
        server_digest: str | None = None
        if 0 < stored.offset <= (info.state.last_seq or 0):
            with contextlib.suppress(NotFoundError):  # expired, purged or deleted
                held = await self._js.get_msg(feed.stream, seq=stored.offset)
                server_digest = message_digest(held.subject or "", held.data or b"")
        server = ServerLog(
            created=info.created,
            first_seq=info.state.first_seq or 0,
            last_seq=info.state.last_seq or 0,
            offset_digest=server_digest,
        )
        continuity = check(stored, server)
        if not continuity.ok:
            error = LogContinuityError(consumer=feed.consumer, stored=stored, continuity=continuity)
            log.critical("%s", error)
            raise error
        if stored.stream_created != info.created:  # not recorded yet, or nothing projected
            async with self._pool.acquire() as connection:
                await connection.execute(_RECORD_STREAM, feed.consumer, feed.stream, info.created)
        feed.verified_at = asyncio.get_running_loop().time()
        self.continuity_checks += 1
        return stored.offset

    # -- one transaction -------------------------------------------------------------------

    async def _project(
        self, feed: _Feed, ordered: list[tuple[int, tuple[Msg, pb.Event | None]]]
    ) -> _BatchOutcome:
        async with self._pool.acquire() as connection, connection.transaction():
            await connection.execute(_LOCK_OFFSET, feed.consumer, feed.stream)
            offset = int(await connection.fetchval(_READ_OFFSET, feed.consumer))
            expected = offset + 1
            accepted: list[tuple[int, pb.Event | None]] = []
            rewind_at: int | None = None
            stale = False
            last_message: Msg | None = None
            for sequence, (message, event) in ordered:
                if sequence <= offset:
                    stale = True
                    continue
                if sequence != expected and expected != feed.trusted_start:
                    rewind_at = expected
                    break
                accepted.append((sequence, event))
                last_message = message
                expected = sequence + 1
            if not accepted or last_message is None:
                return _BatchOutcome(offset, rewind_at, projected=0, stale=stale)
            if stale:
                # Apply nothing of a batch that may come from a log that went backwards: once
                # the log is verified, it is delivered again from right after the offset.
                return _BatchOutcome(offset, rewind_at=offset + 1, projected=0, stale=True)
            projected = await self._apply(connection, feed, accepted)
            covered = accepted[-1][0]
            digest = message_digest(last_message.subject, last_message.data)
            await connection.execute(_WRITE_OFFSET, feed.consumer, covered, feed.stream, digest)
        return _BatchOutcome(covered_seq=covered, rewind_at=rewind_at, projected=projected)

    async def _apply(
        self,
        connection: asyncpg.Connection,
        feed: _Feed,
        accepted: list[tuple[int, pb.Event | None]],
    ) -> int:
        """Write the effects of ``accepted`` (in stream order); return how many were new.

        Progress reports go to ``progress`` only (by COPY), every other event to
        ``job_events``; an event already stored (a republished copy) has no other effect.
        """
        reports: list[_Fact] = []
        others: list[_Fact] = []
        for sequence, event in accepted:
            if event is None:
                continue
            kind = event.WhichOneof("body") or ""
            fact = _Fact(sequence, event, kind, event_time(event))
            # a report without a job id has no key in ``progress``: it is kept as an event
            (reports if kind == "progress" and event.job_id else others).append(fact)
        facts: list[_Fact] = []
        if others:
            stored = [_Stored(feed.stream, fact) for fact in others]
            inserted = await connection.fetch(_INSERT_EVENTS, *_EVENTS.arrays(stored))
            new_ids = {record["event_id"] for record in inserted}
            for fact in others:
                if fact.event.event_id in new_ids:
                    new_ids.discard(fact.event.event_id)  # a second copy in the batch: duplicate
                    facts.append(fact)
            await self._insert_facts(connection, facts)
        if reports:
            new_reports = await _store_progress(connection, feed.stream, reports)
            facts = sorted(facts + new_reports, key=lambda fact: fact.sequence)
        if not facts:
            return 0
        await self._fold_jobs(
            connection, [fact.event for fact in facts], catch_up=feed is self._feeds[0]
        )
        return len(facts)

    @staticmethod
    async def _insert_facts(connection: asyncpg.Connection, facts: list[_Fact]) -> None:
        """Checkpoint, placement and rejection rows (append-only facts)."""
        for kind, table in _FACT_TABLES.items():
            if rows := [fact for fact in facts if fact.kind == kind]:
                await connection.execute(table.sql, *table.arrays(rows))

    @staticmethod
    async def _fold_jobs(
        connection: asyncpg.Connection, events: list[pb.Event], *, catch_up: bool = False
    ) -> None:
        """Fold the events into the rows of the jobs they are about, with ``JobView.apply``.

        With ``catch_up`` (batches of the JOBS stream), the latest stored progress report of
        the job's current attempt is folded in before each lifecycle event and at the end, if
        the job has not seen it: the two streams are consumed independently, so a report may
        have been projected while the job row did not exist yet or was fenced to the
        previous attempt.
        """
        job_ids = sorted({event.job_id for event in events if event.job_id})
        if not job_ids:
            return
        records = await connection.fetch(
            f"SELECT {_JOB_COLUMNS} FROM jobs WHERE job_id = ANY($1::text[]) "
            "ORDER BY job_id FOR UPDATE",
            job_ids,
        )
        attempt_records: dict[str, list[asyncpg.Record]] = {}
        if records:
            for record in await connection.fetch(
                f"SELECT {_ATTEMPT_COLUMNS} FROM attempts WHERE job_id = ANY($1::text[])",
                [record["job_id"] for record in records],
            ):
                attempt_records.setdefault(record["job_id"], []).append(record)
        rows = {
            record["job_id"]: _JobRow.from_record(record, attempt_records.get(record["job_id"], []))
            for record in records
        }
        latest: dict[tuple[str, int], pb.Event] = {}
        if catch_up:
            last_attempt = {job: row.view.attempt for job, row in rows.items()}
            for event in events:
                if event.job_id:
                    known = last_attempt.get(event.job_id, 1)
                    last_attempt[event.job_id] = max(known, event.attempt)
            latest = await _latest_progress(connection, last_attempt)
        for event in events:
            if event.WhichOneof("body") == "submitted":
                if event.job_id and event.job_id not in rows:
                    rows[event.job_id] = _JobRow.from_submitted(event)
                continue
            row = rows.get(event.job_id)
            if row is not None:
                row.catch_up(latest)
                row.apply(event)
        for row in rows.values():
            row.catch_up(latest)
        await _settle_ended(connection, rows)
        await _settle_progress(connection, rows)
        await _settle_starts(connection, rows)
        inserts, updates, attempts = [], [], []
        for row in rows.values():
            if row.is_new:
                inserts.append(row.job_insert())
            elif (update := row.job_update()) != row.stored:
                updates.append(update)
            for number in row.view.attempts:
                attempt = row.attempt_row(number)
                if attempt != row.stored_attempts.get(number):
                    attempts.append(attempt)
        if inserts:
            await connection.executemany(_INSERT_JOB, inserts)
        if updates:
            await connection.executemany(_UPDATE_JOB, updates)
        if attempts:
            await connection.executemany(_UPSERT_ATTEMPT, attempts)
