"""Read-only queries of the projection for the CLI (``mdq ls``, ``mdq show``, timelines) and
the read models other readers share: ``JobSummary`` is a job's line in ``mdq ls`` and in the
console's lists (``services.console.reads``), selected with ``JOB_SUMMARY_COLUMNS`` and made by
``job_summary`` whatever query filters and pages the jobs.

Every function takes a SQLAlchemy ``AsyncEngine`` (see ``mdq.store.engine.create_engine``) and
returns plain frozen dataclasses, so callers never hold a session or a row object. The tables
are described in docs/history.md.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from typing import Any

from google.protobuf import json_format
from sqlalchemy import ColumnElement, Row, Select, func, select, text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from mdq.contracts import pb
from mdq.core import ids
from mdq.core.recommend import CostFingerprint, UsageGroup, UsageHistory, fingerprint_of
from mdq.store.models import EVENTS, Attempt, CheckpointRecord, Job, ProgressRecord


@dataclass(frozen=True, slots=True)
class JobSummary:
    """A job's summary line: one line of ``mdq ls``, of the console's jobs list and of its
    campaign, nodes and confirmation pages."""

    job_id: str
    name: str
    task: str
    state: str
    attempt: int
    priority_class: str
    node: str | None
    submitted_at: datetime
    updated_at: datetime
    target_steps: int
    last_step: int
    last_ns_per_day: float | None
    labels: dict[str, str]
    """The spec's labels (a campaign's, for one)."""
    done_reason: str | None
    """Why its runner says the run is done (``steps_reached``, ``converged``...); None until
    one says so."""
    final_reason: str | None
    """Why it failed for good (a ``FailureReason`` name); None unless it has."""

    @property
    def tenant(self) -> str:
        """Whose job it is: the tenant its id carries, "" for the operator's."""
        return ids.tenant_of(self.job_id)

    @property
    def reason(self) -> str:
        """The reason a line shows: why it failed for good, else why its run is done, else ""."""
        return self.final_reason or self.done_reason or ""

    @property
    def fraction_done(self) -> float:
        """Progress towards the step target, 0..1."""
        if self.target_steps <= 0:
            return 0.0
        return min(1.0, self.last_step / self.target_steps)


JOB_SUMMARY_COLUMNS = (
    Job.job_id,
    Job.name,
    Job.task,
    Job.state,
    Job.attempt,
    Job.priority_class,
    Job.node,
    Job.submitted_at,
    Job.updated_at,
    Job.target_steps,
    Job.last_step,
    Job.last_ns_per_day,
    Job.spec["labels"].label("labels"),
    Job.done_reason,
    Job.final_reason,
)
"""The columns of ``jobs`` a ``JobSummary`` is made of, by the names ``job_summary`` reads."""


def job_summary(row: Row[Any]) -> JobSummary:
    """A job's summary line from a row that selected ``JOB_SUMMARY_COLUMNS`` (read by name,
    so the row may carry more columns, or come from a subquery of them)."""
    return JobSummary(
        job_id=row.job_id,
        name=row.name,
        task=row.task,
        state=row.state,
        attempt=row.attempt,
        priority_class=row.priority_class,
        node=row.node,
        submitted_at=row.submitted_at,
        updated_at=row.updated_at,
        target_steps=row.target_steps,
        last_step=row.last_step,
        last_ns_per_day=row.last_ns_per_day,
        labels=dict(row.labels or {}),
        done_reason=row.done_reason,
        final_reason=row.final_reason,
    )


@dataclass(frozen=True, slots=True)
class JobRecord:
    """Every column of a job."""

    job_id: str
    request_id: str
    name: str
    task: str
    state: str
    attempt: int
    priority_class: str
    node: str | None
    pod_name: str | None
    spec: dict[str, Any]
    depends_on: tuple[str, ...]
    submitted_by: str | None
    submitted_at: datetime
    updated_at: datetime
    target_steps: int
    last_step: int
    last_potential_kj_mol: float | None
    last_temperature_k: float | None
    last_ns_per_day: float | None
    last_progress_at: datetime | None
    done_reason: str | None
    final_reason: str | None
    final_message: str | None
    latest_checkpoint_step: int | None
    control: dict[str, Any] | None = None
    """Job control in force (``JobView.control_dict``): hold, stop, who asked; None: none."""
    units: str | None = None
    """Units of the reported figures: None as the field names say; "lj": reduced LJ units."""


@dataclass(frozen=True, slots=True)
class AttemptInfo:
    """One attempt of a job."""

    attempt: int
    node: str | None
    pod_name: str | None
    bound_at: datetime | None
    started_at: datetime | None
    ended_at: datetime | None
    exit_code: int | None
    failure_reason: str | None
    failure_message: str | None
    resumed_from_step: int
    steps_lost: int
    last_step: int
    resumed_from_copy: bool = False
    """It resumed from a checkpoint fetched from the store every cluster shares."""
    copy_lag_steps: int = 0
    """Of ``steps_lost``, the steps the copy its retry resumed from lagged its latest
    checkpoint (after its cluster was lost)."""


@dataclass(frozen=True, slots=True)
class ProgressPoint:
    """One progress report."""

    attempt: int
    step: int
    time: datetime
    time_ps: float
    potential_kj_mol: float
    kinetic_kj_mol: float
    temperature_k: float
    ns_per_day: float
    target_steps: int
    eta_s: float
    done_reason: str


PROGRESS_POINT = (
    ProgressRecord.attempt,
    ProgressRecord.step,
    ProgressRecord.time,
    ProgressRecord.time_ps,
    ProgressRecord.potential_kj_mol,
    ProgressRecord.kinetic_kj_mol,
    ProgressRecord.temperature_k,
    ProgressRecord.ns_per_day,
    ProgressRecord.target_steps,
    ProgressRecord.eta_s,
    ProgressRecord.done_reason,
)


@dataclass(frozen=True, slots=True)
class CheckpointInfo:
    """One verified checkpoint."""

    attempt: int
    step: int
    path: str
    sha256: str
    size_bytes: int
    time_ps: float
    time: datetime


@dataclass(frozen=True, slots=True)
class JobDetail:
    """What ``mdq show JOB`` prints."""

    job: JobRecord
    attempts: tuple[AttemptInfo, ...]
    last_progress: ProgressPoint | None
    latest_checkpoint: CheckpointInfo | None


@dataclass(frozen=True, slots=True)
class TimelineEntry:
    """One event of a job, as stored."""

    event_id: str
    stream: str
    stream_seq: int
    kind: str
    attempt: int
    time: datetime
    producer: str
    body: dict[str, Any]


async def list_jobs(
    engine: AsyncEngine, *, limit: int = 50, state: str | None = None
) -> list[JobSummary]:
    """``mdq ls``: the most recently submitted jobs first (optionally only those in ``state``).
    The console pages its own list with filters of its own (``services.console.reads``)."""
    query = select(*JOB_SUMMARY_COLUMNS)
    if state is not None:
        query = query.where(Job.state == state)
    query = query.order_by(Job.submitted_at.desc(), Job.job_id).limit(limit)
    async with engine.connect() as connection:
        result = await connection.execute(query)
        return [job_summary(row) for row in result]


def job_rows_since(job_id: str) -> ColumnElement[Any]:
    """From when ``job_id``'s rows in ``progress`` and ``job_events`` can exist
    (``mdq_job_since``): a per-job read that adds ``time >= job_rows_since(job_id)`` reads only the
    months since the job's submission, not every monthly partition."""
    return func.mdq_job_since(job_id)


ACTIVE_STATES = ("WAITING", "PENDING", "BOUND", "RUNNING", "RECOVERING")


async def active_job_ids(engine: AsyncEngine, *, limit: int = 200) -> list[str]:
    """Jobs not finished yet (waiting, queued, running or being recovered), oldest first."""
    query = (
        select(Job.job_id)
        .where(Job.state.in_(ACTIVE_STATES))
        .order_by(Job.submitted_at, Job.job_id)
        .limit(limit)
    )
    async with engine.connect() as connection:
        return list((await connection.scalars(query)).all())


Reader = AsyncEngine | AsyncConnection
"""What a read runs on: an engine (a connection of its pool for the read), or a connection
already in hand (a page that reads several things reads them on one)."""


@asynccontextmanager
async def connected(reader: Reader) -> AsyncIterator[AsyncConnection]:
    """A connection to read on: ``reader`` itself, or one of its pool for the block."""
    if isinstance(reader, AsyncConnection):
        yield reader
        return
    async with reader.connect() as connection:
        yield connection


async def job_detail(engine: Reader, job_id: str) -> JobDetail | None:
    """A job with its attempts, last progress report and latest checkpoint; None if unknown."""
    async with connected(engine) as connection:
        job_row = (
            await connection.execute(select(Job.__table__).where(Job.job_id == job_id))
        ).first()
        if job_row is None:
            return None
        job_values = job_row._asdict()
        job_values["depends_on"] = tuple(job_values["depends_on"] or ())
        attempts = await connection.execute(
            select(Attempt.__table__).where(Attempt.job_id == job_id).order_by(Attempt.attempt)
        )
        progress_row = (
            await connection.execute(
                select(*PROGRESS_POINT)
                .where(ProgressRecord.job_id == job_id)
                .where(ProgressRecord.time >= job_rows_since(job_id))
                .order_by(ProgressRecord.attempt.desc(), ProgressRecord.step.desc())
                .limit(1)
            )
        ).first()
        checkpoint_row = (
            await connection.execute(
                select(CheckpointRecord.__table__)
                .where(CheckpointRecord.job_id == job_id)
                .order_by(CheckpointRecord.step.desc(), CheckpointRecord.attempt.desc())
                .limit(1)
            )
        ).first()
    return JobDetail(
        job=JobRecord(**job_values),
        attempts=tuple(AttemptInfo(**_without(row._asdict(), "job_id")) for row in attempts),
        last_progress=(None if progress_row is None else ProgressPoint(**progress_row._asdict())),
        latest_checkpoint=(
            None
            if checkpoint_row is None
            else CheckpointInfo(**_without(checkpoint_row._asdict(), "job_id"))
        ),
    )


def job_timeline_query(job_id: str) -> Select[*tuple[Any, ...]]:
    """``job_timeline``'s query: the job's events since its submission (partitions pruned)."""
    events = EVENTS.c
    return (
        select(
            events.event_id,
            events.stream,
            events.stream_seq,
            events.kind,
            events.attempt,
            events.time,
            events.producer,
            events.body,
        )
        .where(events.job_id == job_id, events.time >= job_rows_since(job_id))
        .order_by(events.time, events.stream, events.stream_seq)
    )


async def job_timeline(engine: Reader, job_id: str) -> list[TimelineEntry]:
    """Every stored event of a job in the order it happened (time, then stream order)."""
    async with connected(engine) as connection:
        result = await connection.execute(job_timeline_query(job_id))
        return [TimelineEntry(**row._asdict()) for row in result]


def progress_trace_query(job_id: str, *, attempt: int | None = None) -> Select[*tuple[Any, ...]]:
    """``progress_trace``'s query: the job's reports since its submission (partitions pruned)."""
    query = select(*PROGRESS_POINT).where(
        ProgressRecord.job_id == job_id, ProgressRecord.time >= job_rows_since(job_id)
    )
    if attempt is not None:
        query = query.where(ProgressRecord.attempt == attempt)
    return query.order_by(ProgressRecord.attempt, ProgressRecord.step)


async def progress_trace(
    engine: Reader, job_id: str, *, attempt: int | None = None
) -> list[ProgressPoint]:
    """The progress reports of a job (for energy plots), by attempt then step."""
    async with connected(engine) as connection:
        result = await connection.execute(progress_trace_query(job_id, attempt=attempt))
        return [ProgressPoint(**row._asdict()) for row in result]


def _without(values: dict[str, Any], *names: str) -> dict[str, Any]:
    return {key: value for key, value in values.items() if key not in names}


USAGE_HISTORY = text(
    """
    SELECT cpu_limit, oom_killed, spec,
           CASE WHEN oom_killed THEN memory_limit_mb ELSE peak_memory_mb END AS figures,
           CASE WHEN NOT oom_killed THEN mean_cores END AS cores
    FROM usage_summaries
    WHERE newest >= now() - make_interval(days => :days) AND spec IS NOT NULL
    ORDER BY newest DESC LIMIT :kinds
    """
)
"""The kinds of job with a sample in the last ``:days`` days, newest first, at most
``:kinds``: one row each, with its fingerprint inputs and its newest samples as arrays
(``usage_summaries``), only those the recommender reads: a measured kind's peak
memory and mean cores, an OOM-killed kind's memory limits."""


@lru_cache(maxsize=65_536)
def _parsed_inputs(inputs: str) -> pb.JobSpec:
    """A spec's fingerprint inputs (JSON) as a spec, parsed once per process however often the
    history is read again (intake reads it every few minutes). Callers do not modify it."""
    return json_format.Parse(inputs, pb.JobSpec(), ignore_unknown_fields=True)


@lru_cache(maxsize=65_536)
def _fingerprint(inputs: str, threads: int) -> CostFingerprint:
    """The cost fingerprint of a spec's fingerprint inputs at ``threads`` (frozen: shared)."""
    return fingerprint_of(_parsed_inputs(inputs), threads=threads)


async def usage_history(
    engine: AsyncEngine, *, days: int = 90, kinds: int = 20_000
) -> UsageHistory:
    """What the resource recommender learns from (``mdq.core.recommend``): for each kind of
    job with an attempt in the last ``days`` days (at most ``kinds`` kinds, the most recently
    run), its newest measured attempts and its newest OOM-killed ones with the memory limit
    they were bound with (``usage_summaries``: ``SAMPLES_PER_KIND`` of each), as
    one group per kind. An attempt's threads are those of the CPU it ran with. The kind's spec
    fields are parsed and fingerprinted once per process (a kind whose spec was not found yet
    is left out)."""
    async with engine.connect() as connection:
        rows = (await connection.execute(USAGE_HISTORY, {"days": days, "kinds": kinds})).all()
    groups: list[UsageGroup] = []
    for cpu_limit, oom_killed, inputs, figures, cores in rows:
        cpu = cpu_limit or _parsed_inputs(inputs).resources.cpu
        fingerprint = _fingerprint(inputs, max(1, math.ceil(cpu)))
        count = len(figures)
        if oom_killed:  # no measured figures: the limits they were killed at
            zeros = [0.0] * count
            groups.append(UsageGroup(fingerprint, cpu, zeros, zeros, figures, [True] * count))
        else:  # the limits of measured attempts teach the recommender nothing
            groups.append(
                UsageGroup(fingerprint, cpu, figures, cores, [0.0] * count, [False] * count)
            )
    return UsageHistory(groups)
