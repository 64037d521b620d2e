"""Live progress of jobs in the terminal: one rich progress bar per job.

Each bar shows the job's state, step / target, potential energy, ns/day and the ETA the runner
reports; lifecycle events (bound to a node, started, failed, requeued, held, released,
succeeded) are printed above the bars as they happen. Everything comes from
``MdqClient.watch`` — the log, folded by the same state machine the services use.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TaskID, TextColumn

from mdq.contracts import pb
from mdq.core.state import JobState, JobView
from mdq.sdk.client import JobUpdate, MdqClient

STATE_STYLES = {
    "WAITING": "dim",
    "PENDING": "yellow",
    "BOUND": "cyan",
    "RUNNING": "blue",
    "RECOVERING": "magenta",
    "HELD": "yellow",
    "SUCCEEDED": "green",
    "FAILED": "bold red",
    "CANCELLED": "dim",
}


def state_text(state: str) -> str:
    """A state with its colour, as rich markup."""
    style = STATE_STYLES.get(state, "")
    return f"[{style}]{state}[/]" if style else state


def format_eta(seconds: float) -> str:
    """0:01:05-style duration; "-" when unknown."""
    if seconds <= 0:
        return "-"
    whole = round(seconds)
    return f"{whole // 3600}:{whole % 3600 // 60:02d}:{whole % 60:02d}"


def format_energy(value: float | None, units: str = "") -> str:
    """An energy with its unit: kJ/mol, or ε for a LAMMPS job in reduced Lennard-Jones units
    (``Progress.units == "lj"``: no conversion exists)."""
    if value is None:
        return "-"
    return f"{value:,.1f} ε (lj)" if units == "lj" else f"{value:,.1f} kJ/mol"


def steps_label(step: int, target: float | None) -> str:
    """``1500/5000``; just the step when the target is unknown. A report past its target (a
    minimisation by an older runner, whose OpenMM minimiser applied the iteration limit to each
    round of its constraint restraints) shows ``614 it``, not ``614/200``."""
    if not target:
        return str(step)
    if step > target:
        return f"{step} it"
    return f"{step}/{int(target)}"


def steps_text(step: int, target: float | None) -> tuple[str, float | None]:
    """A bar's step column and its total (past its target, the bar is simply full)."""
    total = float(step) if target and step > target else target
    return steps_label(step, target), total


def _origin(origin: pb.ControlOrigin) -> str:
    """`` by ada: check inputs``: who asked a job-control verb, and why ("" when unsaid)."""
    who = f" by {origin.requested_by}" if origin.requested_by else ""
    why = f": {origin.reason}" if origin.reason else ""
    return escape(who + why)


def describe(update: JobUpdate, name: str) -> str | None:
    """One line about a lifecycle event (None for events not worth a line)."""
    event = update.event
    view = update.view
    match update.kind:
        case "submitted":
            deps = ", ".join(event.submitted.depends_on_ids)
            return f"{name}: submitted" + (f", waits for {deps}" if deps else "")
        case "released":
            return f"{name}: dependencies succeeded, pending"
        case "bound":
            bound = event.bound
            chosen = next((c for c in bound.candidates if c.node == bound.node), None)
            score = f" (score {chosen.score:.1f})" if chosen is not None else ""
            resume = (
                f", resuming from step {bound.resume_from.step}"
                if bound.HasField("resume_from")
                else ""
            )
            return f"{name}: attempt {event.attempt} bound to {bound.node}{score}{resume}"
        case "started":
            return f"{name}: attempt {event.attempt} running on {event.started.node}"
        case "succeeded":
            done = event.succeeded
            return f"{name}: [green]succeeded[/] at step {done.final_step} ({done.reason})"
        case "attempt_failed":
            failed = event.attempt_failed
            reason = pb.FailureReason.Name(failed.reason)
            return f"{name}: [magenta]attempt {event.attempt} failed[/]: {reason} {failed.message}"
        case "requeued":
            requeued = event.requeued
            where = (
                f"from checkpoint step {requeued.resume_from.step}"
                if requeued.HasField("resume_from")
                else "from the start"
            )
            held = view is not None and view.state is JobState.HELD
            then = ", [yellow]held[/] until released" if held else ""
            return f"{name}: requeued as attempt {event.attempt}, {where}{then}"
        case "held":
            origin = _origin(event.held.origin)
            if view is not None and view.state is not JobState.HELD:  # stopped first
                return (
                    f"{name}: [yellow]hold[/]{origin}: attempt {view.attempt} is stopping at a "
                    "checkpoint, then held"
                )
            return f"{name}: [yellow]held[/]{origin}: not placed until released"
        case "unheld":
            origin = _origin(event.unheld.origin)
            if view is not None and view.state is JobState.WAITING:
                return f"{name}: released{origin}: waits for its dependencies"
            if view is not None and view.state is JobState.PENDING:
                return f"{name}: released{origin}: pending"
            return f"{name}: released{origin}"
        case "failed":
            failed_for_good = event.failed
            reason = pb.FailureReason.Name(failed_for_good.reason)
            return f"{name}: [bold red]failed[/]: {reason} {failed_for_good.message}"
    return None


def make_progress(console: Console) -> Progress:
    """The bars: name, state, bar, step/target, energy, ns/day, ETA."""
    return Progress(
        TextColumn("{task.description:<24}"),
        TextColumn("{task.fields[state]:<10}"),
        BarColumn(bar_width=28),
        TextColumn("{task.fields[steps]:>13}"),
        TextColumn("{task.fields[energy]:>20}"),
        TextColumn("{task.fields[speed]:>12}"),
        TextColumn("ETA {task.fields[eta]:>8}"),
        console=console,
        refresh_per_second=4,
    )


async def follow_jobs(
    client: MdqClient,
    job_ids: Sequence[str],
    *,
    names: Mapping[str, str] | None = None,
    limit_s: float,
    console: Console,
) -> dict[str, JobView]:
    """Show live bars until every job is terminal or ``limit_s`` seconds passed; return the
    last view of each job seen (a job never seen is missing)."""
    labels = {job: (names or {}).get(job, job) for job in job_ids}
    views: dict[str, JobView] = {}
    progress = make_progress(console)
    tasks: dict[str, TaskID] = {
        job: progress.add_task(
            labels[job],
            total=None,
            state=state_text("-"),
            steps="-",
            energy="-",
            speed="-",
            eta="-",
        )
        for job in job_ids
    }
    with progress:
        try:
            async with asyncio.timeout(limit_s):
                async with contextlib.aclosing(client.watch(job_ids)) as updates:
                    async for update in updates:
                        _show(progress, tasks[update.job_id], update, labels[update.job_id])
                        if update.view is not None:
                            views[update.job_id] = update.view
        except TimeoutError:
            console.print(f"[bold red]gave up waiting after {limit_s:g} s[/]")
    return views


def _show(progress: Progress, task: TaskID, update: JobUpdate, name: str) -> None:
    view = update.view
    fields: dict[str, Any] = {}
    total: float | None = None
    if view is not None:
        fields["state"] = state_text(str(view.state))
        total = float(view.spec.steps) or None
    if update.kind == "progress":
        report = update.event.progress
        fields["steps"], total = steps_text(report.step, float(report.target_steps) or total)
        analysis = view is not None and view.spec.task == pb.TASK_ANALYZE
        fields["energy"] = "-" if analysis else format_energy(report.potential_kj_mol, report.units)
        if report.units == "lj":  # reduced time: tau a day, not ns
            fields["speed"] = f"{report.ns_per_day:.1f} kτ/d" if report.ns_per_day else "-"
        else:
            fields["speed"] = f"{report.ns_per_day:.1f} ns/d" if report.ns_per_day else "-"
        fields["eta"] = "0:00:00" if report.done_reason else format_eta(report.eta_s)
        progress.update(task, total=total, completed=report.step, **fields)
    else:
        if view is not None and view.state.terminal:
            fields["eta"] = "-"
            if total:
                steps = view.last_step if view.last_step else 0
                fields["steps"], total = steps_text(steps, total)
                progress.update(task, total=total, completed=steps, **fields)
                fields = {}
        if fields:
            progress.update(task, total=total, **fields)
        line = describe(update, name)
        if line:
            progress.console.print(line)
