"""Reading the history back from PostgreSQL (the watcher's projection) and printing it.

The queries are the store's (``mdq.store.queries``: ``list_jobs``, ``job_detail``,
``job_timeline``, which return frozen dataclasses); this module only opens an engine, waits for
the projection where needed and turns the results into rich tables.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any

from rich.console import Group
from rich.panel import Panel
from rich.table import Table
from sqlalchemy.ext.asyncio import AsyncEngine

from mdq.cli.live import format_energy, state_text, steps_label
from mdq.cli.sparkline import sparkline
from mdq.cli.tables import columns_table
from mdq.core.ids import tenant_of
from mdq.core.recovery import NOT_CHARGED, charged_to_the_job
from mdq.core.state import JobState
from mdq.store import queries
from mdq.store.engine import create_engine

TERMINAL_STATES = frozenset(state.value for state in JobState if state.terminal)


@asynccontextmanager
async def open_engine(database_url: str) -> AsyncIterator[AsyncEngine]:
    """A small async engine for reading, disposed afterwards."""
    engine = create_engine(database_url, pool_size=2)
    try:
        yield engine
    finally:
        await engine.dispose()


def format_time(value: datetime | None) -> str:
    return "-" if value is None else value.isoformat(timespec="seconds")


def _reason(done: str | None, final: str | None, message: str | None = None) -> str:
    if final:
        return f"{final}: {message}" if message else final
    return done or ""


def _attempt_failure(reason: str | None, message: str | None) -> str:
    """An attempt's failure, saying so when it is not charged to the job (the node's or the
    cluster's doing: a full disk, a lost node, an eviction)."""
    if not reason:
        return "-"
    text = _reason(None, reason, message)
    return text if charged_to_the_job(reason) else f"{text} ({NOT_CHARGED})"


def _maybe(value: float | int | None, pattern: str) -> str:
    return "-" if value is None else pattern.format(value)


def _temperature_format(units: str | None) -> str:
    """A temperature's format: kelvin, or the reduced ε/k_B of a job in LJ units."""
    return "{:.2f} ε/k_B (lj)" if units == "lj" else "{:.1f} K"


def _speed_format(units: str | None) -> str:
    """A speed's format: ns/day, or thousands of reduced time units τ a day in LJ units."""
    return "{:.1f} kτ/day (lj)" if units == "lj" else "{:.1f} ns/day"


def submitted_label(at: datetime | None, by: str | None) -> str:
    """When a job was submitted, and by whom when the submit said (``submitted_by``)."""
    return f"{format_time(at)} by {by}" if by else format_time(at)


# -- queries -------------------------------------------------------------------------------
async def list_jobs(database_url: str, *, limit: int) -> list[queries.JobSummary]:
    """The most recently submitted jobs."""
    async with open_engine(database_url) as engine:
        return await queries.list_jobs(engine, limit=limit)


async def active_job_ids(database_url: str, *, limit: int) -> list[str]:
    async with open_engine(database_url) as engine:
        return await queries.active_job_ids(engine, limit=limit)


async def job_detail(
    database_url: str, job_id: str
) -> tuple[queries.JobDetail | None, list[queries.TimelineEntry]]:
    """One job and its timeline (events in order); (None, []) if unknown."""
    async with open_engine(database_url) as engine:
        detail = await queries.job_detail(engine, job_id)
        timeline = await queries.job_timeline(engine, job_id) if detail is not None else []
    return detail, timeline


async def wait_for_projection(
    database_url: str, job_ids: Sequence[str], *, within_s: float = 30.0
) -> list[queries.JobDetail]:
    """The jobs once the projection shows them all terminal (the watcher writes in batches, a
    moment after the log); after ``within_s`` seconds whatever it shows."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    async with open_engine(database_url) as engine:
        while True:
            found = [await queries.job_detail(engine, job) for job in job_ids]
            details = [detail for detail in found if detail is not None]
            done = len(details) == len(job_ids) and all(
                detail.job.state in TERMINAL_STATES for detail in details
            )
            if done or loop.time() >= deadline:
                return details
            await asyncio.sleep(0.5)


# -- tables --------------------------------------------------------------------------------
OPERATOR_LABEL = "(operator)"
"""The tenant column of a job the operator's own identity submitted."""


def tenant_label(job_id: str) -> str:
    """Whose a job is: its tenant (the server-enforced subject it was submitted on, which its
    id carries), or the operator's."""
    return tenant_of(job_id) or OPERATOR_LABEL


def summary_table(jobs: Iterable[queries.JobSummary], *, title: str) -> Table:
    """``mdq ls``: job, tenant, state, attempt, node, steps, speed, reason."""
    table = columns_table(
        title,
        (
            ("job", "left"),
            ("tenant", "left"),
            ("state", "left"),
            ("attempt", "right"),
            ("node", "left"),
            ("steps", "right"),
            ("ns/day", "right"),
            ("submitted", "left"),
            ("reason", "left"),
        ),
    )
    for job in jobs:
        table.add_row(
            job.job_id,
            tenant_label(job.job_id),
            state_text(job.state),
            str(job.attempt),
            job.node or "-",
            steps_label(job.last_step, job.target_steps),
            _maybe(job.last_ns_per_day or None, "{:.1f}"),  # 0: no MD, no speed
            format_time(job.submitted_at),
            job.reason,
        )
    return table


def detail_table(details: Iterable[queries.JobDetail], *, title: str) -> Table:
    """The demo's history: job, state, attempts, node, steps, last energy, reason."""
    table = columns_table(
        title,
        (
            ("job", "left"),
            ("state", "left"),
            ("attempts", "right"),
            ("node", "left"),
            ("steps", "right"),
            ("last energy", "right"),
            ("reason", "left"),
        ),
    )
    for detail in details:
        job = detail.job
        table.add_row(
            job.job_id,
            state_text(job.state),
            str(max(job.attempt, len(detail.attempts))),
            job.node or "-",
            steps_label(job.last_step, job.target_steps),
            "-" if job.task == "TASK_ANALYZE" else format_energy(job.last_potential_kj_mol),
            _reason(job.done_reason, job.final_reason, job.final_message),
        )
    return table


def show_panel(detail: queries.JobDetail, timeline: Sequence[queries.TimelineEntry]) -> Group:
    """``mdq show JOB``: the job, its attempts, its last progress, an energy sparkline of the
    current attempt and its timeline."""
    job = detail.job
    summary = Table.grid(padding=(0, 2))
    summary.add_column(style="bold")
    summary.add_column()
    last = detail.last_progress
    checkpoint = detail.latest_checkpoint
    for label, value in (
        ("job", job.job_id),
        ("tenant", tenant_label(job.job_id)),
        ("task", job.task),
        ("state", state_text(job.state)),
        ("attempt", str(job.attempt)),
        ("node", job.node or "-"),
        ("steps", steps_label(job.last_step, job.target_steps)),
        ("last energy", format_energy(job.last_potential_kj_mol, job.units or "")),
        ("temperature", _maybe(job.last_temperature_k or None, _temperature_format(job.units))),
        ("speed", _maybe(job.last_ns_per_day or None, _speed_format(job.units))),
        ("last progress", format_time(job.last_progress_at)),
        (
            "checkpoint",
            f"step {checkpoint.step} ({checkpoint.path})" if checkpoint is not None else "-",
        ),
        ("depends on", ", ".join(job.depends_on) or "-"),
        ("submitted", submitted_label(job.submitted_at, job.submitted_by)),
        ("reason", _reason(job.done_reason, job.final_reason, job.final_message) or "-"),
    ):
        summary.add_row(label, value)
    parts: list[Any] = [Panel(summary, title=f"job {job.job_id}", expand=False)]
    if last is not None:
        figures = [f"attempt {last.attempt}", f"step {last.step}"]
        figures.append(format_energy(last.potential_kj_mol, job.units or ""))
        if last.temperature_k:  # none for an analysis
            figures.append(_temperature_format(job.units).format(last.temperature_k))
        if last.ns_per_day:  # none without MD (a minimisation, an analysis)
            figures.append(_speed_format(job.units).format(last.ns_per_day))
        parts.append("last progress: " + ", ".join(figures))
    if detail.attempts:
        attempts = Table(title="attempts")
        columns = ("attempt", "node", "started", "ended", "from", "last step", "failure", "lost")
        for column in columns:
            attempts.add_column(column)
        for attempt in detail.attempts:
            copy = " (copy)" if attempt.resumed_from_copy else ""
            lag = f" ({attempt.copy_lag_steps} copy lag)" if attempt.copy_lag_steps else ""
            attempts.add_row(
                str(attempt.attempt),
                attempt.node or "-",
                format_time(attempt.started_at),
                format_time(attempt.ended_at),
                f"{attempt.resumed_from_step}{copy}",
                str(attempt.last_step),
                _attempt_failure(attempt.failure_reason, attempt.failure_message),
                f"{attempt.steps_lost}{lag}",
            )
        parts.append(attempts)
    energies = energy_trace(timeline, attempt=job.attempt)
    if len(energies) >= 2:
        parts.append(
            f"energy (attempt {job.attempt}, {len(energies)} reports): "
            f"{sparkline(energies)}  {format_energy(min(energies))} .. "
            f"{format_energy(max(energies))}"
        )
    lifecycle = [entry for entry in timeline if entry.kind != "progress"]
    reports = len(timeline) - len(lifecycle)
    if lifecycle:
        events = Table(title=f"timeline ({reports} progress reports not shown)")
        for column in ("time", "attempt", "event", "producer", "detail"):
            events.add_column(column)
        for entry in lifecycle:
            events.add_row(
                format_time(entry.time),
                str(entry.attempt),
                entry.kind,
                entry.producer,
                _event_detail(entry.body),
            )
        parts.append(events)
    return Group(*parts)


def energy_trace(timeline: Sequence[queries.TimelineEntry], *, attempt: int) -> list[float]:
    """Potential energies of one attempt's progress reports, in order (for the sparkline)."""
    return [
        float(entry.body.get("potential_kj_mol", 0.0))
        for entry in timeline
        if entry.kind == "progress" and entry.attempt == attempt
    ]


def _event_detail(body: dict[str, Any]) -> str:
    """The scalar fields of an event body, short."""
    parts = []
    for key, value in body.items():
        if isinstance(value, (dict, list)):
            continue
        shown = f"{value:.4g}" if isinstance(value, float) else str(value)
        parts.append(f"{key}={shown}")
    return " ".join(parts)[:120]
