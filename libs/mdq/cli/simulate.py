"""``mdq simulate``: named scheduler configurations side by side on one workload, in virtual
time, through mdq's own scheduling core (docs/simulate.md).

The workload comes from the generator (the default), an SWF trace (``--swf FILE``) or mdq's
history in PostgreSQL (``--from-history``). One JSON line is printed: the workload's figures and
each configuration's metrics; ``--plot FILE`` draws them side by side (matplotlib, Agg).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from mdq.cli.context import GlobalOptions, NoEndpoint, resolve_endpoints
from mdq.cli.history import open_engine
from mdq.sim.config import named, presets
from mdq.sim.engine import Metrics, compare
from mdq.sim.generator import GeneratorSpec, generate
from mdq.sim.history import HistoryOptions, export_history
from mdq.sim.model import Workload
from mdq.sim.report import PANELS, report
from mdq.sim.swf import SwfError, SwfOptions, read_swf

err_console = Console(stderr=True, soft_wrap=True)


def draw(results: Sequence[Metrics], output: Path, title: str) -> Path:
    """One bar per configuration in each panel of ``PANELS``."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    figure, axes = pyplot.subplots(2, 5, figsize=(18, 7), constrained_layout=True)
    names = [result.config for result in results]
    colours = [f"C{i}" for i in range(len(results))]
    for axis, panel in zip(axes.flat, PANELS, strict=True):
        values = [float(getattr(result, panel.key)) * panel.factor for result in results]
        axis.bar(range(len(values)), values, color=colours)
        axis.set_title(panel.title)
        axis.set_xticks(range(len(names)), names, rotation=30, ha="right")
        axis.grid(True, axis="y", alpha=0.3)
    figure.suptitle(title)
    output.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(output, dpi=110)
    pyplot.close(figure)
    return output


def _history(options: GlobalOptions, history: HistoryOptions) -> Workload:
    try:
        database_url = resolve_endpoints(options, need_nats=False).require_database()
    except NoEndpoint as error:
        err_console.print(f"[red]{error}[/]")
        raise typer.Exit(3) from None

    async def read() -> Workload:
        async with open_engine(database_url) as engine:
            return await export_history(engine, history)

    return asyncio.run(read())


def simulate(
    ctx: typer.Context,
    config: Annotated[
        list[str] | None,
        typer.Option(
            "--config",
            "-c",
            help=f"A configuration, repeatable: {', '.join(presets())}; NAME:key=value,... "
            "overrides placement tunables. Default: all of them.",
        ),
    ] = None,
    swf: Annotated[
        Path | None, typer.Option("--swf", help="Replay this Standard Workload Format trace.")
    ] = None,
    from_history: Annotated[
        bool, typer.Option("--from-history", help="Replay mdq's own history (PostgreSQL).")
    ] = False,
    days: Annotated[int, typer.Option(help="--from-history: the last DAYS days.")] = 30,
    extra_nodes: Annotated[
        int, typer.Option(help="--from-history: nodes to add to those it names.")
    ] = 0,
    nodes: Annotated[
        int, typer.Option(help="Generator: nodes; SWF: nodes (0: the trace's header).")
    ] = 0,
    node_cpu: Annotated[float, typer.Option(help="SWF / history: cores per node.")] = 0.0,
    node_memory_mb: Annotated[int, typer.Option(help="SWF / history: MiB per node.")] = 0,
    jobs: Annotated[int, typer.Option(help="Generator: jobs; SWF: at most this many.")] = 0,
    seed: Annotated[int, typer.Option(help="Generator: the seed.")] = 1,
    load: Annotated[float, typer.Option(help="Generator: offered load.")] = 1.2,
    noisy_fraction: Annotated[
        float, typer.Option(help="Generator: share of nodes with a noisy neighbour.")
    ] = 0.0,
    node_failures_per_day: Annotated[
        float, typer.Option(help="Generator: node losses per node per day.")
    ] = 0.0,
    weight: Annotated[
        list[str] | None,
        typer.Option(help="A tenant's fair-share weight, TENANT=W (repeatable)."),
    ] = None,
    plot: Annotated[
        Path | None, typer.Option("--plot", help="Draw the comparison to this image (png).")
    ] = None,
) -> None:
    """Compare scheduler configurations on one workload in virtual time (docs/simulate.md)."""
    options = ctx.obj
    if not isinstance(options, GlobalOptions):
        raise typer.BadParameter("internal: global options missing")
    if swf is not None and from_history:
        raise typer.BadParameter("--swf and --from-history: one source at a time")
    weights: dict[str, float] = {}
    for entry in weight or []:
        tenant, _, value = entry.partition("=")
        try:
            weights[tenant] = float(value)
        except ValueError:
            raise typer.BadParameter(f"--weight {entry!r}: want TENANT=NUMBER") from None
    try:
        configs = named(config or list(presets()), weights)
    except ValueError as error:
        raise typer.BadParameter(str(error)) from None
    try:
        if swf is not None:
            swf_options = SwfOptions(nodes=nodes, limit=jobs)
            if node_cpu:
                swf_options = replace(swf_options, node_cpu=node_cpu)
            if node_memory_mb:
                swf_options = replace(swf_options, node_memory_mb=node_memory_mb)
            workload = read_swf(swf, swf_options)
        elif from_history:
            history = HistoryOptions(days=days, extra_nodes=extra_nodes)
            if node_cpu:
                history = replace(history, node_cpu=node_cpu)
            if node_memory_mb:
                history = replace(history, node_memory_mb=node_memory_mb)
            workload = _history(options, history)
            delay = float(workload.notes.get("start_delay_s", "0"))
            configs = [replace(c, start_delay_s=delay) for c in configs]
        else:
            workload = generate(
                GeneratorSpec(
                    nodes=nodes or 100,
                    jobs=jobs or 10_000,
                    seed=seed,
                    load=load,
                    noisy_fraction=noisy_fraction,
                    node_failures_per_day=node_failures_per_day,
                )
            )
    except (OSError, SwfError, ValueError) as error:
        err_console.print(f"[red]{error}[/]")
        raise typer.Exit(2) from None
    results = compare(workload, configs)
    print(json.dumps(report(workload, results)), flush=True)
    if plot is not None:
        draw(
            results,
            plot,
            f"{workload.name}: {len(workload.jobs)} jobs, {len(workload.nodes)} nodes",
        )
        err_console.print(f"drawn to {plot}")
