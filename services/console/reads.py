"""What the console reads from PostgreSQL, as the read-only role: one function per page.

Every function takes the engine and returns plain values (the ``mdq.store.queries`` dataclasses
where they exist), so the pages never hold a connection. A job's line in the lists is
``mdq.store.queries.JobSummary``, the one ``mdq ls`` prints, of the same columns; the filters and
paging are the console's own. The jobs list pages by keyset (the last row's submit time and id,
``services.console.filters.Cursor``): each page is an index range scan, however deep into a year
of history it is.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from google.protobuf import json_format
from sqlalchemy import (
    Select,
    case,
    cast,
    func,
    literal,
    select,
    text,
    true,
    tuple_,
    type_coerce,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, aggregate_order_by
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.types import NullType

from mdq.contracts import pb
from mdq.core import ids
from mdq.core.state import TERMINAL_STATES
from mdq.store import queries
from mdq.store.models import Attempt, CheckpointRecord, Job, Placement, ProgressRecord
from services.console.filters import OPERATOR, Cursor, JobFilter

ACTIVE_ON_A_NODE = ("BOUND", "RUNNING")
"""The states of a job that holds a node now."""


@dataclass(frozen=True, slots=True)
class JobsPage:
    """A page of the jobs list and where the next one starts (None: this is the last)."""

    rows: list[queries.JobSummary]
    next_cursor: Cursor | None


AnySelect = Select[*tuple[Any, ...]]
"""A select of any columns (the label path selects from a CTE, the other from the table)."""


def _jobs_query(chosen: JobFilter, limit: int) -> AnySelect:
    """The first ``limit`` jobs ``chosen`` admits, newest submit first."""
    query: AnySelect = select(*queries.JOB_SUMMARY_COLUMNS)
    conditions: list[Any] = []
    if chosen.state:
        conditions.append(Job.state == chosen.state)
    if chosen.tenant == OPERATOR:
        conditions.append(~Job.job_id.contains(ids.TENANT_SEPARATOR, autoescape=True))
    elif chosen.tenant:
        conditions.append(
            Job.job_id.startswith(chosen.tenant + ids.TENANT_SEPARATOR, autoescape=True)
        )
    if chosen.priority_class:
        conditions.append(Job.priority_class == chosen.priority_class)
    if chosen.label is not None:
        key, value = chosen.label
        labels = Job.spec.op("->", return_type=JSONB)(literal("labels"))  # as ix_jobs_labels
        conditions.append(labels.op("@>")(cast(literal(json.dumps({key: value})), JSONB)))
    if chosen.name:
        conditions.append(Job.name.icontains(chosen.name, autoescape=True))
    if chosen.since is not None:
        conditions.append(Job.submitted_at >= chosen.since)
    if chosen.until is not None:
        conditions.append(Job.submitted_at < chosen.until)
    if chosen.after is not None:
        conditions.append(
            tuple_(Job.submitted_at, Job.job_id)
            < tuple_(chosen.after.submitted_at, chosen.after.job_id)
        )
    if chosen.label is None:
        query = (
            query.where(*conditions)
            .order_by(Job.submitted_at.desc(), Job.job_id.desc())
            .limit(limit)
        )
    else:
        # PostgreSQL guesses that a label matches 0.1 % of the jobs whatever it is, so it walks
        # the newest-first index hoping to meet a page of them soon; a campaign's jobs are
        # spread over the year, and it read every job (80 ms at 100,000). The jobs of a label
        # come from its index first (a campaign: hundreds), then are sorted.
        matched = query.where(*conditions).cte("matched").prefix_with("MATERIALIZED")
        query = (
            select(matched)
            .order_by(matched.c.submitted_at.desc(), matched.c.job_id.desc())
            .limit(limit)
        )
    return query


async def list_jobs(engine: AsyncEngine, chosen: JobFilter) -> JobsPage:
    """The jobs ``chosen`` admits, newest submit first, one page of them."""
    async with engine.connect() as connection:  # one more than a page: is there a next one
        result = list(await connection.execute(_jobs_query(chosen, chosen.size + 1)))
    rows = [queries.job_summary(row) for row in result[: chosen.size]]
    more = len(result) > chosen.size
    last = rows[-1] if rows else None
    return JobsPage(
        rows=rows,
        next_cursor=Cursor(last.submitted_at, last.job_id) if more and last else None,
    )


@dataclass(frozen=True, slots=True)
class PlacementRecord:
    """Why one attempt went where it went: every node's score or the filter that excluded it
    (the ``bound`` event's ``NodeScore`` list, stored in the protobuf JSON mapping)."""

    attempt: int
    node: str
    candidates: list[pb.NodeScore]
    time: datetime

    @property
    def scored(self) -> list[pb.NodeScore]:
        """The candidates, the chosen node first, then by score."""
        return sorted(
            (c for c in self.candidates if not c.filtered),
            key=lambda c: (c.node != self.node, -c.score),
        )

    @property
    def filtered(self) -> list[pb.NodeScore]:
        """The nodes a filter excluded, with its reason."""
        return [c for c in self.candidates if c.filtered]


def _node_scores(stored: list[Any]) -> list[pb.NodeScore]:
    return [
        json_format.ParseDict(score, pb.NodeScore(), ignore_unknown_fields=True)
        for score in stored or ()
    ]


@dataclass(frozen=True, slots=True)
class OutputFile:
    """One file a job's runner reported at its end (the view ``job_outputs``)."""

    attempt: int
    kind: str
    path: str
    format: str
    size_bytes: int
    sha256: str

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[-1]


@dataclass(frozen=True, slots=True)
class JobPage:
    """Everything the job page shows."""

    detail: queries.JobDetail
    timeline: list[queries.TimelineEntry]
    progress: list[queries.ProgressPoint]
    checkpoints: list[queries.CheckpointInfo]
    placements: list[PlacementRecord]
    outputs: list[OutputFile]


async def job_page(engine: AsyncEngine, job_id: str) -> JobPage | None:
    """A job with its history; None if PostgreSQL has never heard of it. Every part is read on
    one connection (one checkout of the pool, one liveness check)."""
    async with engine.connect() as connection:
        detail = await queries.job_detail(connection, job_id)
        if detail is None:
            return None
        timeline = await queries.job_timeline(connection, job_id)
        progress = await queries.progress_trace(connection, job_id)
        checkpoint_rows = await connection.execute(
            select(CheckpointRecord.__table__)
            .where(CheckpointRecord.job_id == job_id)
            .order_by(CheckpointRecord.attempt, CheckpointRecord.step)
        )
        checkpoints = [
            queries.CheckpointInfo(**{k: v for k, v in row._asdict().items() if k != "job_id"})
            for row in checkpoint_rows
        ]
        placement_rows = await connection.execute(
            select(Placement.attempt, Placement.node, Placement.candidates, Placement.time)
            .where(Placement.job_id == job_id)
            .order_by(Placement.attempt)
        )
        placements = [
            PlacementRecord(
                attempt=row.attempt,
                node=row.node,
                candidates=_node_scores(row.candidates),
                time=row.time,
            )
            for row in placement_rows
        ]
        outputs = await job_outputs(connection, job_id)
    return JobPage(
        detail=detail,
        timeline=timeline,
        progress=progress,
        checkpoints=checkpoints,
        placements=placements,
        outputs=outputs,
    )


JOB_OUTPUTS = (
    "SELECT attempt, kind, path, format, size_bytes, sha256 FROM job_outputs "
    "WHERE job_id = :job AND time >= mdq_job_since(:job) ORDER BY attempt, path"
)
"""A job's files, from the months since its submission only (``mdq.store.queries.
job_rows_since``)."""


async def job_outputs(engine: queries.Reader, job_id: str) -> list[OutputFile]:
    """The files a job's runners reported (the view ``job_outputs``), by attempt and path: the
    order the job page numbers its download links in."""
    async with queries.connected(engine) as connection:
        rows = await connection.execute(
            text(JOB_OUTPUTS),
            {"job": job_id},
        )
        return [OutputFile(**row._asdict()) for row in rows]


@dataclass(frozen=True, slots=True)
class CampaignJob:
    """One job of a campaign with its energy curve (every attempt, by step)."""

    row: queries.JobSummary
    steps: list[int]
    potential_kj_mol: list[float]
    temperature_k: list[float]


CAMPAIGN_LIMIT = 200
"""Most jobs a campaign page overlays (the newest)."""
CLOCK_MARGIN = timedelta(days=1)
"""How much earlier than its job's submit a progress report's time may be (runner clocks)."""
CURVE_POINTS = 2_000
"""Most points of one job's curve on the campaign page (evenly thinned beyond)."""


async def campaign(engine: AsyncEngine, key: str, value: str) -> list[CampaignJob]:
    """The jobs labelled ``key=value`` (the newest ``CAMPAIGN_LIMIT``), each with its curve.

    One statement: the label's jobs from its index, then each job's curve in one lateral
    probe of ``progress`` limited to when the job's reports can have been made — a clock
    margin before its submit to a clock margin after its last event if it has ended — so
    run-time pruning reads only the one or two monthly partitions of each job, whatever the
    year holds (``job_id = ANY(...)`` over the campaign's whole span probed every partition
    from its first submit on, for every job). Each curve comes as three arrays: one row a job.
    """
    newest = _jobs_query(JobFilter(label=(key, value)), CAMPAIGN_LIMIT).subquery()
    order = (ProgressRecord.attempt, ProgressRecord.step)
    ended = newest.c.state.in_(sorted(state.name for state in TERMINAL_STATES))

    def aggregated(column: Any, name: str) -> Any:
        # typed as an array of no particular type: asyncpg's lists are handed on as they are,
        # not walked item by item in Python by SQLAlchemy's float processor
        return type_coerce(
            func.array_agg(aggregate_order_by(column, *order)), ARRAY(NullType())
        ).label(name)

    curve = (
        select(
            aggregated(ProgressRecord.step, "steps"),
            aggregated(ProgressRecord.potential_kj_mol, "potentials"),
            aggregated(ProgressRecord.temperature_k, "temperatures"),
        )
        .where(ProgressRecord.job_id == newest.c.job_id)
        .where(ProgressRecord.time >= newest.c.submitted_at - CLOCK_MARGIN)
        .where(
            ProgressRecord.time
            <= case((ended, newest.c.updated_at + CLOCK_MARGIN), else_=literal(INFINITY))
        )
        .lateral("curve")
    )
    query = (
        select(newest, curve.c.steps, curve.c.potentials, curve.c.temperatures)
        .select_from(newest.join(curve, true()))
        .order_by(newest.c.submitted_at, newest.c.job_id)
    )
    async with engine.connect() as connection:
        result = list(await connection.execute(query))
    return [
        CampaignJob(
            row=queries.job_summary(row),
            steps=_thinned(row.steps or []),
            potential_kj_mol=_thinned(row.potentials or []),
            temperature_k=_thinned(row.temperatures or []),
        )
        for row in result
    ]


Point = TypeVar("Point", int, float)

INFINITY = datetime.max.replace(tzinfo=UTC)
"""No end yet: the upper bound of a running job's progress window."""


def _thinned(points: list[Point]) -> list[Point]:
    """A curve of more points than a chart is wide, thinned evenly with its last point kept
    (window functions in SQL did the same 10 times slower on the partitioned table)."""
    if len(points) <= CURVE_POINTS:
        return points
    every = -(-len(points) // CURVE_POINTS)
    kept = points[0 : len(points) - 1 : every]
    kept.append(points[-1])
    return kept


async def jobs_on_nodes(engine: AsyncEngine) -> dict[str, list[queries.JobSummary]]:
    """Every job bound or running now, by node."""
    by_node: dict[str, list[queries.JobSummary]] = {}
    for state in ACTIVE_ON_A_NODE:
        page = await list_jobs(engine, JobFilter(state=state, size=200))
        for row in page.rows:
            by_node.setdefault(row.node or "", []).append(row)
    return by_node


def node_attempts_last_hour_query(now: datetime) -> Select[str | None, int]:
    """Per node, the attempts started in the hour before ``now`` (``ix_attempts_started_at``)."""
    return (
        select(Attempt.node, func.count())
        .where(Attempt.started_at >= now - timedelta(hours=1))
        .group_by(Attempt.node)
    )


async def node_attempts_last_hour(engine: AsyncEngine, now: datetime) -> dict[str, int]:
    """How many attempts each node started in the last hour."""
    query = node_attempts_last_hour_query(now)
    async with engine.connect() as connection:
        return {node or "": count for node, count in await connection.execute(query)}
