"""mdq's own history as a workload: ``mdq simulate --from-history`` (docs/simulate.md, "From
mdq's history").

Reads the projection in PostgreSQL (read-only: the tables ``jobs`` and ``attempts`` and the view
``attempt_usage``) and turns what happened into what the simulator replays: each job's arrival
(its submit), requests, priority, tenant and dependencies; its speed (the steps its successful
attempt ran over that attempt's run time, runner start-up included), its measured peak memory
and cores; the crashes it met (at the step they happened) and the nodes lost under it (the node
down until its next attempt began there). The pod start-up (bound to started) is the median
over the attempts, for the configuration to use.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from google.protobuf import json_format
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from mdq.contracts import pb
from mdq.core.ids import tenant_of
from mdq.core.recommend import estimate_atoms, fingerprint_of
from mdq.sim.model import NodeOutage, SimJob, SimNode, Workload

JOBS = text(
    """
    SELECT job_id, submitted_at, spec, depends_on, priority_class, target_steps, state
    FROM jobs
    WHERE submitted_at >= now() - make_interval(days => :days)
    ORDER BY submitted_at, job_id
    LIMIT :limit
    """
)
ATTEMPTS = text(
    """
    SELECT a.job_id, a.attempt, a.node, a.bound_at, a.started_at, a.ended_at,
           a.failure_reason, a.resumed_from_step, a.last_step,
           u.peak_memory_mb, u.mean_cores
    FROM attempts a
    JOIN jobs j ON j.job_id = a.job_id
    LEFT JOIN attempt_usage u ON u.job_id = a.job_id AND u.attempt = a.attempt
    WHERE j.submitted_at >= now() - make_interval(days => :days)
    ORDER BY a.job_id, a.attempt
    """
)
DEFAULT_STEPS_PER_S = 100.0
"""The speed of a job none of whose attempts ran long enough to measure one."""
DEFAULT_DOWN_S = 600.0
"""How long a lost node stays down when no later attempt ran on it."""


@dataclass(frozen=True, slots=True)
class HistoryOptions:
    """What the history does not say: the nodes' capacity (node loads are not projected)."""

    days: int = 30
    node_cpu: float = 2.0
    node_memory_mb: int = 4096
    extra_nodes: int = 0
    """Nodes to add to those the history names ("what if we had N more?")."""


class HistoryTooLarge(ValueError):
    """The window holds more jobs than the reader was allowed to read."""


@dataclass(frozen=True, slots=True)
class HistoryRows:
    """The rows of ``JOBS`` and ``ATTEMPTS`` as mappings: what ``project`` turns into a
    workload (plain values, so they can be handed to another process)."""

    jobs: list[dict[str, Any]]
    attempts: list[dict[str, Any]]


@dataclass(slots=True)
class _Attempt:
    number: int
    node: str
    bound_at: datetime | None
    started_at: datetime | None
    ended_at: datetime | None
    failure: str
    resumed_from_step: int
    last_step: int
    peak_memory_mb: float
    mean_cores: float


@dataclass(slots=True)
class _Row:
    job_id: str
    submitted_at: datetime
    spec: pb.JobSpec
    depends_on: list[str]
    priority_class: str
    steps: int
    attempts: list[_Attempt] = field(default_factory=list)


def _seconds(start: datetime | None, end: datetime | None) -> float:
    return (end - start).total_seconds() if start is not None and end is not None else 0.0


def project(
    jobs: list[dict[str, Any]], attempts: list[dict[str, Any]], options: HistoryOptions
) -> Workload:
    """The workload of these rows (``JOBS`` and ``ATTEMPTS``, as mappings): pure."""
    rows: dict[str, _Row] = {}
    for job in jobs:
        spec = json_format.ParseDict(job["spec"], pb.JobSpec(), ignore_unknown_fields=True)
        rows[job["job_id"]] = _Row(
            job_id=job["job_id"],
            submitted_at=job["submitted_at"],
            spec=spec,
            depends_on=list(job["depends_on"] or []),
            priority_class=job["priority_class"] or "normal",
            steps=int(job["target_steps"] or spec.steps or 1),
        )
    for record in attempts:
        row = rows.get(record["job_id"])
        if row is None:
            continue
        row.attempts.append(
            _Attempt(
                number=record["attempt"],
                node=record["node"] or "",
                bound_at=record["bound_at"],
                started_at=record["started_at"],
                ended_at=record["ended_at"],
                failure=record["failure_reason"] or "",
                resumed_from_step=int(record["resumed_from_step"] or 0),
                last_step=int(record["last_step"] or 0),
                peak_memory_mb=float(record["peak_memory_mb"] or 0.0),
                mean_cores=float(record["mean_cores"] or 0.0),
            )
        )
    if not rows:
        raise ValueError("history: no job was submitted in the window (--days)")
    t0 = min(row.submitted_at for row in rows.values())
    node_names: set[str] = set()
    delays: list[float] = []
    losses: list[tuple[str, datetime]] = []
    starts: dict[str, list[datetime]] = {}
    sim_jobs: list[SimJob] = []
    unmeasured = 0
    for row in rows.values():
        spec = row.spec
        cpu = spec.resources.cpu or 1.0
        memory_mb = int(spec.resources.memory_mb or 1024)
        rate = 0.0
        crashes: list[int] = []
        peaks = [a.peak_memory_mb for a in row.attempts if a.peak_memory_mb > 0]
        cores = [a.mean_cores for a in row.attempts if a.mean_cores > 0]
        for attempt in row.attempts:
            if attempt.node:
                node_names.add(attempt.node)
            if attempt.started_at is not None:
                starts.setdefault(attempt.node, []).append(attempt.started_at)
                if attempt.bound_at is not None:
                    delays.append(_seconds(attempt.bound_at, attempt.started_at))
            ran = _seconds(attempt.started_at, attempt.ended_at)
            steps = attempt.last_step - attempt.resumed_from_step
            if not attempt.failure and ran > 0 and steps > 0:
                rate = steps / ran
            if attempt.failure == "FAILURE_CRASHED":
                crashes.append(attempt.last_step)
            if attempt.failure == "FAILURE_NODE_LOST" and attempt.ended_at is not None:
                losses.append((attempt.node, attempt.ended_at))
        if rate <= 0:
            measured = [
                (a.last_step - a.resumed_from_step) / _seconds(a.started_at, a.ended_at)
                for a in row.attempts
                if _seconds(a.started_at, a.ended_at) > 0 and a.last_step > a.resumed_from_step
            ]
            rate = max(measured, default=DEFAULT_STEPS_PER_S)
            unmeasured += not measured
        fingerprint = fingerprint_of(spec, threads=max(1, round(cpu)))
        sim_jobs.append(
            SimJob(
                job_id=row.job_id,
                arrival_s=_seconds(t0, row.submitted_at),
                cpu=cpu,
                memory_mb=memory_mb,
                steps=row.steps,
                steps_per_s=rate,
                peak_memory_mb=max(peaks, default=0.5 * memory_mb),
                cores_used=min(cpu, statistics.mean(cores)) if cores else cpu,
                tenant=tenant_of(row.job_id),
                priority_class=row.priority_class,
                depends_on=tuple(dep for dep in row.depends_on if dep in rows),
                checkpoint_every_steps=int(spec.checkpoint_interval_steps),
                crash_at_steps=tuple(crashes),
                max_retries=spec.max_retries if spec.HasField("max_retries") else 3,
                kind=f"{fingerprint.coarse()!r}",
                atoms=estimate_atoms(spec),
                memory_ramp_s=0.0,
            )
        )
    outages = []
    for node, at in losses:
        later = sorted(t for t in starts.get(node, []) if t > at)
        down = _seconds(at, later[0]) if later else DEFAULT_DOWN_S
        outages.append(NodeOutage(node, _seconds(t0, at), down))
    names = sorted(node_names) + [f"extra-{i}" for i in range(options.extra_nodes)]
    if not names:
        raise ValueError("history: no attempt ran on any node in the window")
    nodes = tuple(SimNode(name, options.node_cpu, options.node_memory_mb) for name in names)
    return Workload(
        nodes=nodes,
        jobs=tuple(sim_jobs),
        outages=tuple(outages),
        name="mdq history",
        notes={
            "source": "history",
            "start_delay_s": f"{statistics.median(delays) if delays else 0.0:.3f}",
            "jobs_without_measured_speed": str(unmeasured),
        },
    )


async def read_history(
    engine: AsyncEngine, options: HistoryOptions, *, max_jobs: int | None = None
) -> HistoryRows:
    """The rows of the last ``options.days`` days of mdq's history in PostgreSQL. With
    ``max_jobs``, no more than that many jobs are read: a window that holds more raises
    ``HistoryTooLarge`` before its attempts are read."""
    limit = None if max_jobs is None else max_jobs + 1
    async with engine.connect() as connection:
        jobs = await connection.execute(JOBS, {"days": options.days, "limit": limit})
        job_rows = [dict(row) for row in jobs.mappings()]
        if max_jobs is not None and len(job_rows) > max_jobs:
            raise HistoryTooLarge(
                f"history: the last {options.days} days hold more than {max_jobs:,} jobs"
            )
        attempts = await connection.execute(ATTEMPTS, {"days": options.days})
        attempt_rows = [dict(row) for row in attempts.mappings()]
    return HistoryRows(job_rows, attempt_rows)


async def export_history(engine: AsyncEngine, options: HistoryOptions) -> Workload:
    """The workload of the last ``options.days`` days of mdq's history in PostgreSQL."""
    rows = await read_history(engine, options)
    return project(rows.jobs, rows.attempts, options)
