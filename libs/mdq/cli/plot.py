"""``mdq plot JOB -o energy.png``: potential energy and temperature against MD step.

The trace is the job's ``progress`` rows in PostgreSQL (every report of every attempt); each
attempt is its own line, so a retry that resumed from a checkpoint shows where it picked up.
Drawn with matplotlib's Agg backend (no display needed).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from mdq.cli.args import job_id_argument
from mdq.cli.context import GlobalOptions, resolve_endpoints
from mdq.cli.history import open_engine
from mdq.errors import InvalidInput
from mdq.store import queries

# soft_wrap: a path or a command is printed whole on its line, never broken for the
# terminal's width (it is there to be copied)
console = Console(soft_wrap=True)
err_console = Console(stderr=True, soft_wrap=True)


async def load_trace(database_url: str, job_id: str) -> list[queries.ProgressPoint]:
    async with open_engine(database_url) as engine:
        return await queries.progress_trace(engine, job_id)


def draw(job_id: str, trace: Sequence[queries.ProgressPoint], output: Path) -> Path:
    """Two panels sharing the step axis: energy (kJ/mol) above, temperature (K) below."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    figure, (energy_axis, temperature_axis) = pyplot.subplots(
        2, 1, sharex=True, figsize=(9, 6), constrained_layout=True
    )
    attempts = sorted({point.attempt for point in trace})
    for attempt in attempts:
        points = [point for point in trace if point.attempt == attempt]
        steps = [point.step for point in points]
        label = f"attempt {attempt}"
        energy_axis.plot(steps, [p.potential_kj_mol for p in points], label=label, lw=1.2)
        temperature_axis.plot(steps, [p.temperature_k for p in points], label=label, lw=1.2)
    energy_axis.set_ylabel("potential energy (kJ/mol)")
    temperature_axis.set_ylabel("temperature (K)")
    temperature_axis.set_xlabel("MD step")
    energy_axis.set_title(job_id)
    if len(attempts) > 1:
        energy_axis.legend(loc="best")
    for axis in (energy_axis, temperature_axis):
        axis.grid(True, alpha=0.3)
    output.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(output, dpi=120)
    pyplot.close(figure)
    return output


def image_formats() -> dict[str, str]:
    """The image formats matplotlib's Agg canvas writes, by file suffix (png, svg, pdf, …)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    figure = pyplot.figure()
    try:
        return dict(figure.canvas.get_supported_filetypes())
    finally:
        pyplot.close(figure)


def check_output(output: Path) -> Path:
    """``output`` if its suffix names an image format ``draw`` writes; ``InvalidInput`` naming
    ``--output`` and those formats otherwise."""
    formats = image_formats()
    suffix = output.suffix.removeprefix(".").lower()
    if suffix not in formats:
        given = f"format {suffix!r}" if suffix else "no format (no suffix)"
        raise InvalidInput(
            f"{str(output)!r} has {given}; supported: {', '.join(sorted(formats))}",
            field="--output",
        )
    return output


def plot(
    ctx: typer.Context,
    job_id: Annotated[str, typer.Argument(help="The job id.")],
    output: Annotated[
        Path, typer.Option("--output", "-o", help="Image file (png, svg, pdf).")
    ] = Path("energy.png"),
) -> None:
    """Energy and temperature against step (from PostgreSQL), drawn to an image file."""
    job_id = job_id_argument(job_id)
    check_output(output)
    options = ctx.obj
    if not isinstance(options, GlobalOptions):
        raise typer.BadParameter("internal: global options missing")
    database_url = resolve_endpoints(options).require_database()
    trace = asyncio.run(load_trace(database_url, job_id))
    if not trace:
        err_console.print(f"[red]no progress of job {job_id} in PostgreSQL[/]")
        raise typer.Exit(1)
    draw(job_id, trace, output)
    console.print(f"{len(trace)} reports of {job_id} drawn to {output}")
