"""The three tasks of a runner: MD, minimisation and analysis, each returning its exit code.

The loops here are the same for every engine (``services.runner.engines``, docs/engines.md):
MD advances the engine in chunks that end on report, checkpoint and engine boundaries (and are
at most ``max_chunk_steps`` long, and about ``chunk_s`` at the measured speed); each chunk runs
in a worker thread so the event loop keeps publishing. Between chunks the loop reports
(energies, volume, density, pressure, ns/day, ETA; at least every ``alive_report_s``),
checks stability and convergence, checkpoints (every ``checkpoint_interval_steps`` steps, and
after ``checkpoint_interval_s`` seconds when set), and honours a stop request (SIGTERM) by
checkpointing at once and exiting PREEMPTED, and a folder grown past the job's
``max_disk_mb`` the same way, exiting LIMIT_EXCEEDED. A successful run leaves the engine's
final state and files and the energy table in the job's output folder and announces them,
with their sha256, in an ``outputs`` event; its last checkpoint is of its final step, which an
extend continues from.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from mdq.bus.copies import CopyStore
from mdq.contracts import pb
from mdq.core.convergence import ConvergenceTracker, done_reason
from mdq.core.exit_codes import RunnerExit
from mdq.core.runner_task import RunnerTask
from services.runner.analysis import FILE_NAME as ANALYSIS_FILE
from services.runner.analysis import analyze
from services.runner.checkpoints import CheckpointFile, sha256_of
from services.runner.copies import CheckpointCopier, fetch_resume_copy
from services.runner.energies import FILE_NAME as ENERGIES_FILE
from services.runner.energies import EnergyLog
from services.runner.engines import (
    Engine,
    EngineOutput,
    EngineSetup,
    StartPoint,
    open_engine,
)
from services.runner.inputs import InputFetcher
from services.runner.metrics import RunnerMetrics
from services.runner.outbox import Outbox
from services.runner.paths import output_path, work_dir
from services.runner.samples import EnergySample, check_stable
from services.runner.settings import RunnerSettings

log = logging.getLogger(__name__)

SECONDS_PER_DAY = 86_400.0
STOP_POLL_S = 0.2
"""How often a running chunk of an interruptible engine looks for a stop request."""


@dataclass(slots=True)
class RunContext:
    """Everything a task needs: what to do, how, and where to tell about it."""

    task: RunnerTask
    settings: RunnerSettings
    outbox: Outbox
    metrics: RunnerMetrics
    stop: threading.Event = field(default_factory=threading.Event)
    """Set on SIGTERM: checkpoint at the next chunk boundary and exit PREEMPTED."""
    data_dir: Path | None = None
    """Root that structure paths are resolved in (MDQ_DATA_DIR)."""
    copies: CopyStore | None = None
    """The store every cluster shares (``mdq.bus.copies``); None: nothing is copied."""
    copier: CheckpointCopier | None = None
    """Copies this attempt's checkpoints and outputs into ``copies``."""
    inputs: InputFetcher | None = None
    """Fetches the job's own input files into its working folder (None: it has none to
    fetch, or no bus to fetch them from)."""
    units: str = ""
    """``Progress.units`` of this attempt's reports (the engine's)."""
    engine_loading: asyncio.Future[None] | None = None
    """The engine's module and library being loaded in a worker thread since the runner
    started (``services.runner.engines.load_engine``); awaited before the engine is opened."""

    @property
    def spec(self) -> pb.JobSpec:
        return self.task.spec

    async def flush(self) -> None:
        await self.outbox.flush(timeout_s=self.settings.flush_timeout_s)


@dataclass(frozen=True, slots=True)
class Speedometer:
    """Speed of this attempt since it started stepping: ns/day and time to the target."""

    start_step: int
    started: float
    timestep_ps: float

    def rates(self, *, step: int, target_steps: int) -> tuple[float, float]:
        elapsed = time.monotonic() - self.started
        steps = step - self.start_step
        if elapsed <= 0 or steps <= 0:
            return 0.0, 0.0
        steps_per_s = steps / elapsed
        ns_per_day = steps_per_s * self.timestep_ps / 1000.0 * SECONDS_PER_DAY
        return ns_per_day, max(0, target_steps - step) / steps_per_s


def next_chunk(*, step: int, target: int, boundaries: tuple[int, ...], max_steps: int) -> int:
    """Steps to run from ``step`` so the chunk ends on the next multiple of any of
    ``boundaries`` (report, checkpoint, trajectory intervals), at ``target`` at the latest."""
    ends = [target, step + max_steps]
    ends.extend((step // every + 1) * every for every in boundaries if every > 0)
    return max(1, min(ends) - step)


PROBE_STEPS = 10
"""The first chunk of an attempt: few steps, timed, before its speed is known."""


class ChunkPace:
    """How many steps the next chunk may take so that it lasts about ``target_s`` at the
    speed of the last chunk (at most ``max_steps``; ``PROBE_STEPS`` before any was timed)."""

    def __init__(self, *, target_s: float, max_steps: int) -> None:
        self._target_s = target_s
        self._max_steps = max_steps
        self._seconds_per_step: float | None = None

    def max_steps(self) -> int:
        if self._seconds_per_step is None:
            return min(PROBE_STEPS, self._max_steps)
        if self._seconds_per_step <= 0:
            return self._max_steps
        return max(1, min(self._max_steps, int(self._target_s / self._seconds_per_step)))

    def observe(self, steps: int, seconds: float) -> None:
        """A chunk of ``steps`` took ``seconds``."""
        if steps > 0:
            self._seconds_per_step = max(0.0, seconds) / steps


def folder_mb(folder: Path) -> float:
    """MiB the files under ``folder`` hold (what ``JobSpec.max_disk_mb`` bounds)."""
    total = 0
    for root, _, files in os.walk(folder):
        for name in files:
            with contextlib.suppress(OSError):  # a temporary file renamed meanwhile
                total += os.lstat(os.path.join(root, name)).st_size
    return total / (1024 * 1024)


def _report(
    run: RunContext,
    energies: EnergyLog,
    sample: EnergySample,
    *,
    speed: Speedometer | None,
    reason: str = "",
) -> None:
    """Record one progress report: energy table, metrics, progress event."""
    energies.append(sample)
    ns_per_day, eta_s = (
        (0.0, 0.0) if speed is None else speed.rates(step=sample.step, target_steps=run.spec.steps)
    )
    run.metrics.observe(sample, ns_per_day=ns_per_day, eta_s=eta_s)
    progress = pb.Progress(
        step=sample.step,
        target_steps=run.spec.steps,
        time_ps=sample.time_ps,
        potential_kj_mol=sample.potential_kj_mol,
        kinetic_kj_mol=sample.kinetic_kj_mol,
        total_kj_mol=sample.total_kj_mol,
        temperature_k=sample.temperature_k,
        ns_per_day=ns_per_day,
        eta_s=eta_s,
        done_reason=reason,
        volume_nm3=sample.volume_nm3,
        density_g_cm3=sample.density_g_cm3,
        units=run.units,
    )
    if sample.pressure_bar is not None:
        progress.pressure_bar = sample.pressure_bar
    run.outbox.progress(progress)


async def _checkpoint(run: RunContext, engine: Engine, step: int) -> None:
    """Write the engine's checkpoint of the current state, announce it, wait for what is in
    flight."""
    checkpoint: CheckpointFile = await asyncio.to_thread(engine.checkpoint, step)
    run.outbox.checkpoint(checkpoint.to_pb())
    if run.copier is not None:
        run.copier.offer(checkpoint)  # in the background: the MD loop goes on
    run.metrics.checkpointed(step)
    log.info(
        "checkpoint at step %d: %s (%d bytes, sha256 %s)",
        step,
        checkpoint.path,
        checkpoint.size_bytes,
        checkpoint.sha256[:12],
    )
    await run.flush()


def _output_file(output: EngineOutput) -> pb.OutputFile:
    return pb.OutputFile(
        kind=output.kind,
        path=str(output.path),
        sha256=sha256_of(output.path),
        size_bytes=output.path.stat().st_size,
        format=output.format,
        frames=output.frames,
    )


async def announce_outputs(
    run: RunContext, *, final_step: int, engine: Engine | None = None, energy_rows: int = 0
) -> None:
    """Publish the ``outputs`` event: every file the attempt leaves, with its sha256."""
    job_dir = run.task.job_dir

    def describe() -> list[pb.OutputFile]:
        found = engine.outputs() if engine is not None else []
        for name, kind, file_format, rows in (
            (ENERGIES_FILE, "energies", "csv", energy_rows),
            (ANALYSIS_FILE, "analysis", "json", 0),
        ):
            path = job_dir / name
            if path.is_file() and not path.is_symlink():
                found.append(EngineOutput(path, kind, file_format, rows))
        return [_output_file(output) for output in found]

    files = await asyncio.to_thread(describe)
    if run.copier is not None:
        await run.copier.copy_outputs([(Path(file.path), file.kind) for file in files])
    run.outbox.outputs(pb.JobOutputs(final_step=final_step, output_dir=str(job_dir), files=files))


def _announce_fetched(run: RunContext, fetched: pb.CopyFetched | None, resumed: int | None) -> None:
    """Tell that this attempt resumed from the fetched copy (the ``fetched`` event, which
    the history records as the attempt's ``resumed_from_copy``), when it did: a copy fetched
    but not loaded (unreadable after all) left the attempt on another start."""
    if fetched is not None and resumed == fetched.checkpoint.step:
        run.outbox.fetched(fetched)


async def _start(run: RunContext) -> tuple[Engine, StartPoint, pb.CopyFetched | None]:
    """Fetch the job's input files, build its engine, fetch the announced checkpoint's copy
    when the folder lacks it (``services.runner.copies``) and put the start state in."""
    folder = work_dir(run.task.job_dir)
    if run.inputs is not None:
        await run.inputs.fetch_all(run.spec.inputs, folder)
    if run.engine_loading is not None:
        await run.engine_loading
    setup = EngineSetup(
        task=run.task, settings=run.settings, data_dir=run.data_dir, work_dir=folder
    )
    engine = await asyncio.to_thread(open_engine, setup)
    try:
        engine.checkpoints.remove_temporaries()
        fetched = None
        if run.copies is not None:
            fetched = await fetch_resume_copy(
                run.task.resume_from,
                job_id=run.task.job_id,
                store=engine.checkpoints,
                copies=run.copies,
            )
        start = await asyncio.to_thread(engine.prepare)
        run.units = engine.units  # known once the engine has read its input
    except BaseException:
        engine.close()
        raise
    return engine, start, fetched


async def _advance(run: RunContext, engine: Engine, steps: int) -> None:
    """One chunk in a worker thread; a stop request interrupts it where the engine can (the
    checkpoint then comes within a few steps, not at the chunk's end)."""
    chunk = asyncio.ensure_future(asyncio.to_thread(engine.advance, steps))
    if not engine.interruptible:
        await chunk
        return
    while True:
        done, _ = await asyncio.wait({chunk}, timeout=STOP_POLL_S)
        if done:
            chunk.result()
            return
        if run.stop.is_set():
            engine.interrupt()
            await chunk
            return


async def run_md(run: RunContext) -> RunnerExit:
    """Integrate to the step target or convergence; checkpoint on the way."""
    spec = run.spec
    engine, start, fetched = await _start(run)
    run.outbox.first_step = start.resumed_step or 0
    _announce_fetched(run, fetched, start.resumed_step)
    last_checkpoint = start.resumed_step
    target = spec.steps
    boundaries = (spec.report_interval_steps, spec.checkpoint_interval_steps, *engine.boundaries)
    tracker = ConvergenceTracker(
        tolerance=spec.convergence.tolerance_kj_mol, reports=spec.convergence.reports
    )
    seconds_between_checkpoints = spec.checkpoint_interval_s
    disk_mb = spec.max_disk_mb
    absurd = run.settings.absurd_energy_per_atom_kj_mol
    try:
        with EnergyLog(
            path=output_path(run.task.job_dir, ENERGIES_FILE),
            keep_through_step=start.resumed_step,
        ) as energies:
            speed = Speedometer(
                start_step=engine.step, started=time.monotonic(), timestep_ps=engine.timestep_ps
            )
            last_checkpoint_at = time.monotonic()
            pace = ChunkPace(target_s=run.settings.chunk_s, max_steps=run.settings.max_chunk_steps)
            last_report_at = time.monotonic()
            while True:
                step = engine.step
                if run.stop.is_set():
                    if step != last_checkpoint:
                        await _checkpoint(run, engine, step)
                    await run.flush()
                    log.info("stopped on request at step %d", step)
                    return RunnerExit.PREEMPTED
                if step < target:
                    chunk = next_chunk(
                        step=step, target=target, boundaries=boundaries, max_steps=pace.max_steps()
                    )
                    began = time.monotonic()
                    await _advance(run, engine, chunk)
                    pace.observe(engine.step - step, time.monotonic() - began)
                    step = engine.step
                reason = ""
                if step % spec.report_interval_steps == 0 or step >= target:
                    sample = engine.sample()
                    check_stable(sample, atoms=engine.atoms, absurd_per_atom=absurd)
                    reason = done_reason(
                        step=step,
                        target_steps=target,
                        converged=tracker.observe(sample.potential_kj_mol),
                    )
                    if not reason:
                        _report(run, energies, sample, speed=speed)
                    last_report_at = time.monotonic()
                elif time.monotonic() - last_report_at >= run.settings.alive_report_s:
                    # reports far apart (a large system): one between them, as a sign of
                    # life, never counted towards convergence
                    sample = engine.sample()
                    check_stable(sample, atoms=engine.atoms, absurd_per_atom=absurd)
                    _report(run, energies, sample, speed=speed)
                    last_report_at = time.monotonic()
                engine.after_chunk(step)
                if reason:
                    _report(run, energies, sample, speed=speed, reason=reason)
                    rows = energies.rows
                    if step != last_checkpoint:  # what an extend continues from (docs/control.md)
                        await _checkpoint(run, engine, step)
                    await asyncio.to_thread(engine.finish)
                    break
                if disk_mb and step % spec.report_interval_steps == 0:
                    used = await asyncio.to_thread(folder_mb, run.task.job_dir)
                    if used > disk_mb:  # a runaway: stop at a checkpoint, never retried
                        if step != last_checkpoint:
                            await _checkpoint(run, engine, step)
                        log.error(
                            "LIMIT_EXCEEDED: the job's folder holds %.0f MiB, its max_disk_mb "
                            "is %d; stopped at step %d",
                            used,
                            disk_mb,
                            step,
                        )
                        return RunnerExit.LIMIT_EXCEEDED
                due = step % spec.checkpoint_interval_steps == 0 or (
                    seconds_between_checkpoints > 0
                    and time.monotonic() - last_checkpoint_at >= seconds_between_checkpoints
                )
                if due and step != last_checkpoint:
                    await _checkpoint(run, engine, step)
                    last_checkpoint = step
                    last_checkpoint_at = time.monotonic()
        await announce_outputs(run, final_step=step, engine=engine, energy_rows=rows)
        await run.flush()
        log.info("finished at step %d: %s", step, reason)
        return RunnerExit.OK
    finally:
        engine.close()


async def run_minimize(run: RunContext) -> RunnerExit:
    """Minimise for at most ``spec.steps`` iterations; write the minimised structure."""
    spec = run.spec
    engine, start, fetched = await _start(run)
    try:
        first = run.outbox.first_step = start.resumed_step or 0
        if start.resumed_step is not None:
            _announce_fetched(run, fetched, first)
        absurd = run.settings.absurd_energy_per_atom_kj_mol
        loop = asyncio.get_running_loop()
        # A resumed minimisation reports its start iteration again: keep the rows before it.
        with EnergyLog(
            path=output_path(run.task.job_dir, ENERGIES_FILE),
            keep_through_step=first - 1 if first else None,
        ) as energies:

            def report(iteration: int, potential: float) -> None:
                sample = EnergySample(
                    step=iteration,
                    time_ps=0.0,
                    potential_kj_mol=potential,
                    kinetic_kj_mol=0.0,
                    temperature_k=0.0,
                )
                _report(run, energies, sample, speed=None)

            def from_engine(iteration: int, potential: float) -> None:
                """The engine reports from its worker thread: hand it to the event loop."""
                loop.call_soon_threadsafe(report, iteration, potential)

            remaining = spec.steps - first
            iterations = 0
            if remaining > 0:
                # high energy is what minimising fixes: not checked for stability
                _report(run, energies, engine.minimizer_sample(first), speed=None)
                iterations = await asyncio.to_thread(
                    engine.minimize, remaining, on_report=from_engine, stop=run.stop
                )
            done = first + iterations
            await asyncio.sleep(0)  # let the reports handed over by the engine's thread run
            if run.stop.is_set():
                await _checkpoint(run, engine, done)
                log.info("stopped on request at iteration %d", done)
                return RunnerExit.PREEMPTED
            final = engine.minimizer_sample(done)
            check_stable(final, atoms=engine.atoms, absurd_per_atom=absurd)
            await asyncio.to_thread(engine.finish)
            _report(run, energies, final, speed=None, reason="minimized")
            rows = energies.rows
        await announce_outputs(run, final_step=done, engine=engine, energy_rows=rows)
        await run.flush()
        log.info("minimised in %d iterations: %.1f kJ/mol", iterations, final.potential_kj_mol)
        return RunnerExit.OK
    finally:
        engine.close()


async def run_analyze(run: RunContext) -> RunnerExit:
    """Summarise the dependencies' energy tables into analysis.json."""
    output = output_path(run.task.job_dir, ANALYSIS_FILE)
    document = await asyncio.to_thread(analyze, run.task.input_dirs, output=output)
    run.outbox.progress(
        pb.Progress(step=run.spec.steps, target_steps=run.spec.steps, done_reason="analyzed")
    )
    await announce_outputs(run, final_step=run.spec.steps)
    await run.flush()
    log.info("analysed %d inputs into %s", len(document["inputs"]), output)
    return RunnerExit.OK


TASKS = {
    pb.TASK_UNSPECIFIED: run_md,
    pb.TASK_MD: run_md,
    pb.TASK_MINIMIZE: run_minimize,
    pb.TASK_ANALYZE: run_analyze,
}
