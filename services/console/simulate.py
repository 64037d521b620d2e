"""The console's simulation page: named scheduler configurations compared on a generated
workload or on this site's own history, as ``mdq simulate`` compares them (docs/simulate.md),
drawn as one bar chart per metric.

A simulation is CPU work, so it never runs in the console's event loop: each runs in a process
of its own (``spawn``), one at a time, killed at ``time_limit_s``. A history is read here,
through the console's read-only engine, while that one turn is held and at most as many jobs as
a generated workload may have; its rows are handed to that process, which projects them into a
workload (the projection is CPU work too). What a web request may ask for is bounded
(``LIMITS``); every refusal names its field.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import shlex
import traceback
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection
from typing import Any

from mdq.sim.config import SimConfig, named, presets
from mdq.sim.engine import compare
from mdq.sim.generator import GeneratorSpec, generate
from mdq.sim.history import HistoryOptions, HistoryRows, project
from mdq.sim.model import Workload
from mdq.sim.report import PANELS, best_by_panel, report

SOURCES = ("generated", "history")
MAX_SIMULATED_JOBS = 50_000
"""Jobs one request may simulate: a generated workload's size, a history window's most."""
MAX_CONFIGS = 8
"""Configurations one request may compare (each runs the whole workload)."""
LIMITS: Mapping[str, tuple[float, float]] = {
    "nodes": (1, 2_000),
    "jobs": (1, MAX_SIMULATED_JOBS),
    "seed": (0, 2**31 - 1),
    "load": (0.05, 10.0),
    "noisy_fraction": (0.0, 1.0),
    "node_failures_per_day": (0.0, 24.0),
    "days": (1, 3_650),
    "extra_nodes": (0, 2_000),
    "node_cpu": (0.5, 1_024.0),
    "node_memory_mb": (256, 1 << 24),
}
"""Bounds of each numeric field (inclusive): what a page may make the console compute."""
INTEGER_FIELDS = frozenset({"nodes", "jobs", "seed", "days", "extra_nodes", "node_memory_mb"})
DEFAULTS: Mapping[str, str] = {
    "source": "generated",
    "nodes": "100",
    "jobs": "5000",
    "seed": "1",
    "load": "1.2",
    "noisy_fraction": "0",
    "node_failures_per_day": "0",
    "days": "30",
    "extra_nodes": "0",
    "node_cpu": "32",
    "node_memory_mb": "131072",
    "custom": "",
}
"""What the form shows before anything is asked (a generated MD mix of 100 nodes)."""
COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")
"""One colour per configuration (matplotlib's first eight, as ``mdq simulate --plot``)."""
CHART_HEIGHT = 120
BAR_WIDTH = 28
BAR_GAP = 10


class SimulationRefused(ValueError):
    """A form field the page refuses; ``field`` names it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class SimulationBusy(RuntimeError):
    """Another simulation is running in this console."""


class SimulationFailed(RuntimeError):
    """The simulation did not finish: past its time limit, or an error in its process."""


@dataclass(frozen=True, slots=True)
class HistorySource:
    """A history's rows and what they do not say (the nodes' capacity), projected into a
    workload in the simulation's process; the configurations take its measured start-up."""

    rows: HistoryRows
    options: HistoryOptions


def workload_of(source: Workload | GeneratorSpec | HistorySource) -> Workload:
    """The workload ``source`` describes (CPU work: called in the simulation's process).
    Raises ValueError where a history's rows make no workload (no job, no node)."""
    if isinstance(source, GeneratorSpec):
        return generate(source)
    if isinstance(source, HistorySource):
        return project(source.rows.jobs, source.rows.attempts, source.options)
    return source


@dataclass(frozen=True, slots=True)
class SimulationRequest:
    """What a valid form asks for."""

    configs: tuple[str, ...]
    source: str
    values: Mapping[str, float]
    """Every field of ``LIMITS``, parsed and bounded."""

    def generator(self) -> GeneratorSpec:
        """The generated workload this request describes."""
        return GeneratorSpec(
            nodes=int(self.values["nodes"]),
            jobs=int(self.values["jobs"]),
            seed=int(self.values["seed"]),
            load=self.values["load"],
            noisy_fraction=self.values["noisy_fraction"],
            node_failures_per_day=self.values["node_failures_per_day"],
        )

    def history(self) -> HistoryOptions:
        """The window and node capacity of the history this request describes."""
        return HistoryOptions(
            days=int(self.values["days"]),
            extra_nodes=int(self.values["extra_nodes"]),
            node_cpu=self.values["node_cpu"],
            node_memory_mb=int(self.values["node_memory_mb"]),
        )

    def resolved_configs(self) -> list[SimConfig]:
        """The named configurations."""
        return named(list(self.configs))

    def command(self) -> str:
        """The ``mdq simulate`` command line that prints the same JSON line (each argument
        quoted for a POSIX shell)."""
        parts = ["mdq simulate", *(f"-c {shlex.quote(name)}" for name in self.configs)]
        if self.source == "history":
            parts += [
                "--from-history",
                f"--days {int(self.values['days'])}",
                f"--extra-nodes {int(self.values['extra_nodes'])}",
                f"--node-cpu {self.values['node_cpu']:g}",
                f"--node-memory-mb {int(self.values['node_memory_mb'])}",
            ]
        else:
            parts += [
                f"--nodes {int(self.values['nodes'])}",
                f"--jobs {int(self.values['jobs'])}",
                f"--seed {int(self.values['seed'])}",
                f"--load {self.values['load']:g}",
                f"--noisy-fraction {self.values['noisy_fraction']:g}",
                f"--node-failures-per-day {self.values['node_failures_per_day']:g}",
            ]
        return " ".join(parts)


def parse_request(chosen: Sequence[str], fields: Mapping[str, str]) -> SimulationRequest:
    """The request a form asks for; raises ``SimulationRefused`` naming the first bad field.

    ``chosen`` are the ticked preset names; the ``custom`` field adds one configuration written
    as ``mdq simulate -c`` takes it (``load-aware:target_load=0.7``)."""
    known = presets()
    for name in chosen:
        if name not in known:
            raise SimulationRefused("config", f"unknown {name!r}; known: {', '.join(known)}")
    configs = list(dict.fromkeys(chosen))
    custom = fields.get("custom", "").strip()
    if custom:
        if len(custom) > 200:
            raise SimulationRefused("custom", "at most 200 characters")
        try:
            named([custom])
        except ValueError as error:
            raise SimulationRefused("custom", str(error)) from None
        if custom not in configs:
            configs.append(custom)
    if not configs:
        raise SimulationRefused("config", "tick at least one configuration")
    if len(configs) > MAX_CONFIGS:
        raise SimulationRefused("config", f"at most {MAX_CONFIGS} configurations at once")
    source = fields.get("source") or DEFAULTS["source"]
    if source not in SOURCES:
        raise SimulationRefused("source", f"must be one of {', '.join(SOURCES)}")
    values: dict[str, float] = {}
    for name, (low, high) in LIMITS.items():
        text = fields.get(name, DEFAULTS[name]).strip() or DEFAULTS[name]
        try:
            value = float(int(text)) if name in INTEGER_FIELDS else float(text)
        except ValueError:
            kind = "a whole number" if name in INTEGER_FIELDS else "a number"
            raise SimulationRefused(name, f"must be {kind}, not {text[:40]!r}") from None
        if not low <= value <= high:  # NaN fails this too
            raise SimulationRefused(name, f"must be between {low:g} and {high:g}")
        values[name] = value
    return SimulationRequest(configs=tuple(configs), source=source, values=values)


def _simulate_in_child(
    source: Workload | GeneratorSpec | HistorySource, configs: list[SimConfig], sender: Connection
) -> None:
    """The simulation's own process: build the workload, compare, send the report back; or
    ("refused", why) where a history makes no workload, or ("error", traceback)."""
    try:
        try:
            workload = workload_of(source)
        except ValueError as error:
            if not isinstance(source, HistorySource):
                raise
            sender.send(("refused", str(error)))
            return
        if isinstance(source, HistorySource):  # as mdq simulate --from-history: its start-up
            delay = float(workload.notes.get("start_delay_s", "0"))
            configs = [replace(config, start_delay_s=delay) for config in configs]
        sender.send(("ok", report(workload, compare(workload, configs))))
    except Exception:
        sender.send(("error", traceback.format_exc(limit=4)))
    finally:
        sender.close()


class Simulations:
    """Runs one simulation at a time, each in a process of its own, killed at the time limit.

    A caller holds the one turn (``turn``) for all its work, reading a history included, and
    computes inside it (``compute``); ``run`` is both for a workload that needs no reading."""

    def __init__(self, time_limit_s: float = 120.0, max_history_jobs: int = MAX_SIMULATED_JOBS):
        self.time_limit_s = time_limit_s
        self.max_history_jobs = max_history_jobs
        """The most jobs a history window may hold to be read (``read_history``'s bound)."""
        self._lock = asyncio.Lock()

    @property
    def busy(self) -> bool:
        return self._lock.locked()

    @asynccontextmanager
    async def turn(self) -> AsyncIterator[None]:
        """This console's one turn; raises ``SimulationBusy`` while another holds it."""
        if self._lock.locked():
            raise SimulationBusy("another simulation is running in this console")
        async with self._lock:
            yield

    async def run(
        self, source: Workload | GeneratorSpec | HistorySource, configs: list[SimConfig]
    ) -> dict[str, Any]:
        """``compute`` in a turn of its own."""
        async with self.turn():
            return await self.compute(source, configs)

    async def compute(
        self, source: Workload | GeneratorSpec | HistorySource, configs: list[SimConfig]
    ) -> dict[str, Any]:
        """The JSON line of ``mdq simulate`` for ``source`` under ``configs``; the caller holds
        the turn.

        Raises ``SimulationRefused`` (field ``days``) where a history's rows make no workload,
        ``SimulationFailed`` past the time limit or on an error in the simulation. If the
        caller is cancelled, the process is killed too."""
        if not self._lock.locked():
            raise RuntimeError("Simulations.compute: take the turn first (Simulations.turn)")
        context = multiprocessing.get_context("spawn")
        receiver, sender = context.Pipe(duplex=False)
        process = context.Process(
            target=_simulate_in_child,
            args=(source, configs, sender),
            name="mdq-console-simulation",
            daemon=True,
        )
        process.start()
        sender.close()
        try:
            answered = await asyncio.to_thread(receiver.poll, self.time_limit_s)
            if not answered:
                raise SimulationFailed(
                    f"stopped after its time limit of {self.time_limit_s:g} s: ask for "
                    "fewer jobs or configurations, or run `mdq simulate` itself"
                )
            try:
                status, payload = receiver.recv()
            except EOFError:
                raise SimulationFailed(
                    f"the simulation's process ended without an answer "
                    f"(exit code {process.exitcode})"
                ) from None
            if status == "refused":
                raise SimulationRefused("days", str(payload))
            if status != "ok":
                raise SimulationFailed(f"the simulation failed:\n{payload}")
            result: dict[str, Any] = payload
            return result
        finally:
            if process.is_alive():
                process.kill()
            await asyncio.to_thread(process.join, 10)
            receiver.close()


@dataclass(frozen=True, slots=True)
class Bar:
    """One configuration's bar in one metric's chart."""

    config: str
    value: float
    """The figure in the chart's unit."""
    label: str
    x: int
    y: int
    height: int
    colour: str
    best: bool


@dataclass(frozen=True, slots=True)
class Chart:
    """One metric, a bar per configuration (drawn as SVG by the page: no script needed)."""

    key: str
    title: str
    width: int
    height: int
    bars: tuple[Bar, ...]
    best: tuple[str, ...]


def _label(value: float) -> str:
    """A bar's figure, short enough to stand above a bar."""
    size = abs(value)
    if size >= 1e6:
        return f"{value / 1e6:.3g}M"
    if size >= 1e4:
        return f"{value / 1e3:.3g}k"
    if value == int(value):
        return f"{int(value):,}"
    return f"{value:.3g}"


def charts(line: Mapping[str, Any]) -> list[Chart]:
    """The bar charts of a report: one per metric of ``PANELS``, bars scaled to the largest."""
    configs: list[Mapping[str, Any]] = list(line["configs"])
    best = best_by_panel(configs)
    drawn: list[Chart] = []
    for panel in PANELS:
        values = [float(figures[panel.key]) * panel.factor for figures in configs]
        top = max((abs(value) for value in values), default=0.0) or 1.0
        bars = []
        for index, (figures, value) in enumerate(zip(configs, values, strict=True)):
            height = round(CHART_HEIGHT * abs(value) / top)
            bars.append(
                Bar(
                    config=str(figures["config"]),
                    value=value,
                    label=_label(value),
                    x=BAR_GAP + index * (BAR_WIDTH + BAR_GAP),
                    y=CHART_HEIGHT + 14 - height,
                    height=height,
                    colour=COLOURS[index % len(COLOURS)],
                    best=str(figures["config"]) in best.get(panel.key, []),
                )
            )
        drawn.append(
            Chart(
                key=panel.key,
                title=panel.title,
                width=BAR_GAP + len(configs) * (BAR_WIDTH + BAR_GAP),
                height=CHART_HEIGHT + 16,
                bars=tuple(bars),
                best=tuple(best.get(panel.key, [])),
            )
        )
    return drawn
