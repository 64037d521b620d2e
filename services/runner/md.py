"""The three tasks of a runner: MD, minimisation and analysis, each returning its exit code.

MD integrates in chunks that end on report, trajectory and checkpoint boundaries (and are at
most ``max_chunk_steps`` long); each chunk runs in a worker thread so the event loop keeps
publishing. Between chunks the loop reports (energies, volume, density, ns/day, ETA), checks
stability and convergence, writes trajectory frames, checkpoints (every
``checkpoint_interval_steps`` steps, and after ``checkpoint_interval_s`` seconds when set), and
honours a stop request (SIGTERM) by checkpointing at once and exiting PREEMPTED, and a folder
grown past the job's ``max_disk_mb`` the same way, exiting LIMIT_EXCEEDED. A successful
run leaves the final state, the trajectory and the energy table in the job's output folder and
announces them, with their sha256, in an ``outputs`` event; its last checkpoint is of its final
step, which an extend continues from.
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
from typing import Any

import openmm

from mdq.bus.copies import CopyStore
from mdq.contracts import pb
from mdq.core.convergence import ConvergenceTracker, done_reason
from mdq.core.exit_codes import RunnerExit
from mdq.core.runner_task import RunnerTask, inputs_home
from services.runner.analysis import FILE_NAME as ANALYSIS_FILE
from services.runner.analysis import analyze
from services.runner.checkpoints import (
    CheckpointFile,
    CheckpointStore,
    sha256_of,
    write_atomically,
)
from services.runner.copies import CheckpointCopier, fetch_resume_copy
from services.runner.energies import FILE_NAME as ENERGIES_FILE
from services.runner.energies import EnergyLog
from services.runner.errors import InvalidInputError, UnstableError
from services.runner.metrics import RunnerMetrics
from services.runner.outbox import Outbox
from services.runner.recipes import dependency_file
from services.runner.settings import RunnerSettings
from services.runner.system import (
    EnergySample,
    MdSystem,
    build_system,
    check_stable,
    is_nan_error,
    read_state,
)
from services.runner.trajectory import Trajectory, TrajectoryMark, file_name

log = logging.getLogger(__name__)

FINAL_STATE_FILE = "final_state.xml"
CHECKPOINT_DIR = "checkpoints"
MINIMIZER_TOLERANCE_KJ_MOL_NM = 10.0
SECONDS_PER_DAY = 86_400.0


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


def folder_mb(folder: Path) -> float:
    """MiB the files under ``folder`` hold (what ``JobSpec.max_disk_mb`` bounds)."""
    total = 0
    for root, _, files in os.walk(folder):
        for name in files:
            with contextlib.suppress(OSError):  # a temporary file renamed meanwhile
                total += os.lstat(os.path.join(root, name)).st_size
    return total / (1024 * 1024)


def output_path(job_dir: Path, name: str) -> Path:
    """``job_dir/name`` and nowhere else: a symlink planted under that name is removed first,
    so writing to it cannot reach outside the job's folder."""
    path = job_dir / name
    if path.is_symlink():
        path.unlink()
    if path.name != name or path.parent.resolve() != job_dir.resolve():
        raise InvalidInputError(f"output {name!r} would leave the job folder {job_dir}")
    return path


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
    run.outbox.progress(
        pb.Progress(
            step=sample.step,
            target_steps=run.spec.steps,
            time_ps=sample.time_ps,
            potential_kj_mol=sample.potential_kj_mol,
            kinetic_kj_mol=sample.kinetic_kj_mol,
            temperature_k=sample.temperature_k,
            ns_per_day=ns_per_day,
            eta_s=eta_s,
            done_reason=reason,
            volume_nm3=sample.volume_nm3,
            density_g_cm3=sample.density_g_cm3,
        )
    )


async def _checkpoint(
    run: RunContext,
    md: MdSystem,
    store: CheckpointStore,
    step: int,
    trajectory: Trajectory | None = None,
    *,
    native: bool = True,
) -> None:
    """Write the checkpoint of the current state (State XML, native checkpoint, trajectory
    mark), announce it, wait for what is in flight."""
    xml, time_ps = md.snapshot()
    native_data = md.native_checkpoint() if native else None
    mark = trajectory.mark() if trajectory is not None else None
    checkpoint: CheckpointFile = await asyncio.to_thread(
        store.write,
        state_xml=xml,
        step=step,
        time_ps=time_ps,
        native=native_data,
        platform=md.platform,
        trajectory=mark,
    )
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


async def _write_final_state(run: RunContext, md: MdSystem) -> None:
    xml, _ = md.snapshot()
    path = output_path(run.task.job_dir, FINAL_STATE_FILE)
    await asyncio.to_thread(write_atomically, path, xml.encode())


def _output_file(path: Path, *, kind: str, file_format: str, frames: int = 0) -> pb.OutputFile:
    return pb.OutputFile(
        kind=kind,
        path=str(path),
        sha256=sha256_of(path),
        size_bytes=path.stat().st_size,
        format=file_format,
        frames=frames,
    )


async def announce_outputs(
    run: RunContext, *, final_step: int, trajectory: Trajectory | None = None, energy_rows: int = 0
) -> None:
    """Publish the ``outputs`` event: every file the attempt leaves, with its sha256."""
    job_dir = run.task.job_dir

    def describe() -> list[pb.OutputFile]:
        files: list[pb.OutputFile] = []
        if trajectory is not None:
            mark = trajectory.mark()
            if trajectory.path.is_file():
                files.append(
                    _output_file(
                        trajectory.path,
                        kind="trajectory",
                        file_format=trajectory.format,
                        frames=mark.frames,
                    )
                )
        for name, kind, file_format, rows in (
            (FINAL_STATE_FILE, "final_state", "xml", 0),
            (ENERGIES_FILE, "energies", "csv", energy_rows),
            (ANALYSIS_FILE, "analysis", "json", 0),
        ):
            path = job_dir / name
            if path.is_file() and not path.is_symlink():
                files.append(_output_file(path, kind=kind, file_format=file_format, frames=rows))
        return files

    files = await asyncio.to_thread(describe)
    if run.copier is not None:
        await run.copier.copy_outputs([(Path(file.path), file.kind) for file in files])
    run.outbox.outputs(pb.JobOutputs(final_step=final_step, output_dir=str(job_dir), files=files))


@dataclass(frozen=True, slots=True)
class StartPoint:
    """Where an MD attempt starts: the resumed step (None for a new run) and the trajectory's
    length at that step."""

    resumed_step: int | None
    trajectory: TrajectoryMark | None = None


def _prepare_md(run: RunContext, md: MdSystem, store: CheckpointStore) -> StartPoint:
    """Put the start state into the context."""
    task, spec = run.task, run.spec
    if task.resume_from is not None:
        loaded = store.load(task.resume_from, platform=md.platform)
        if loaded is not None:
            step = loaded.file.step
            how = "State XML"
            if loaded.native is not None:
                try:
                    md.load_native_checkpoint(loaded.native)
                    how = "native checkpoint"
                except Exception as error:  # OpenMMException: not loadable after all
                    log.warning("native checkpoint unusable (%s): using the State XML", error)
            if how == "State XML":
                md.restore(loaded.state, step=step)
            md.simulation.currentStep = step
            log.info("resuming from %s at step %d (%s)", loaded.file.path, step, how)
            return StartPoint(resumed_step=step, trajectory=loaded.trajectory)
        log.warning("no usable checkpoint to resume from: starting over from step 0")
    if task.input_dirs:
        structure = dependency_file(task.input_dirs[0], FINAL_STATE_FILE)
        if structure.is_file():
            md.start_from_structure(
                read_state(structure), temperature_k=spec.temperature_k, seed=spec.seed
            )
            log.info("starting from %s", structure)
            return StartPoint(resumed_step=None)
        log.info("%s does not exist: starting from the built system", structure)
    md.start_fresh(
        minimize_iterations=run.settings.warmup_minimize_iterations,
        temperature_k=spec.temperature_k,
        seed=spec.seed,
    )
    return StartPoint(resumed_step=None)


async def _fetch_resume_copy(run: RunContext, store: CheckpointStore) -> pb.CopyFetched | None:
    """Fetch the announced checkpoint's copy when the job's folder lacks it (a retry on
    another cluster, ``services.runner.copies``); what was fetched, if anything."""
    if run.copies is None:
        return None
    return await fetch_resume_copy(
        run.task.resume_from, job_id=run.task.job_id, store=store, copies=run.copies
    )


def _announce_fetched(run: RunContext, fetched: pb.CopyFetched | None, resumed: int | None) -> None:
    """Tell that this attempt resumed from the fetched copy (the ``fetched`` event, which
    the history records as the attempt's ``resumed_from_copy``), when it did: a copy fetched
    but not loaded (unreadable after all) left the attempt on another start."""
    if fetched is not None and resumed == fetched.checkpoint.step:
        run.outbox.fetched(fetched)


def _build(run: RunContext, integrator: openmm.Integrator | None = None) -> MdSystem:
    return build_system(
        run.spec,
        threads=run.task.threads,
        integrator=integrator,
        # a tenant's "inputs/..." are its own: <data>/tenants/<tenant>/inputs
        data_dir=inputs_home(run.data_dir, run.task.job_id) if run.data_dir else None,
        input_dirs=run.task.input_dirs,
    )


async def _step(md: MdSystem, steps: int, *, after: int) -> None:
    """Run ``steps`` MD steps in a worker thread; NaN coordinates are UnstableError."""
    try:
        await asyncio.to_thread(md.run, steps)
    except openmm.OpenMMException as error:
        if is_nan_error(error):
            raise UnstableError(f"simulation blew up after step {after}: {error}") from None
        raise


async def run_md(run: RunContext) -> RunnerExit:
    """Integrate to the step target or convergence; checkpoint on the way."""
    spec = run.spec
    md = await asyncio.to_thread(_build, run)
    log.info("built %d atoms on the %s platform", md.atoms, md.platform)
    store = CheckpointStore(directory=run.task.job_dir / CHECKPOINT_DIR)
    store.remove_temporaries()
    fetched = await _fetch_resume_copy(run, store)
    start = await asyncio.to_thread(_prepare_md, run, md, store)
    _announce_fetched(run, fetched, start.resumed_step)
    last_checkpoint = start.resumed_step
    target = spec.steps
    every_frame = spec.trajectory_interval_steps
    trajectory = (
        Trajectory(
            path=output_path(run.task.job_dir, file_name(spec.trajectory_format)),
            trajectory_format=spec.trajectory_format,
            topology=md.topology,
            timestep_ps=md.timestep_ps,
            interval=every_frame,
            resume=start.trajectory if start.resumed_step is not None else None,
            resumed_step=start.resumed_step,
        )
        if every_frame > 0
        else None
    )
    boundaries = (spec.report_interval_steps, spec.checkpoint_interval_steps, every_frame)
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
                start_step=md.step, started=time.monotonic(), timestep_ps=md.timestep_ps
            )
            last_checkpoint_at = time.monotonic()
            while True:
                step = md.step
                if run.stop.is_set():
                    if step != last_checkpoint:
                        await _checkpoint(run, md, store, step, trajectory)
                    await run.flush()
                    log.info("stopped on request at step %d", step)
                    return RunnerExit.PREEMPTED
                if step < target:
                    chunk = next_chunk(
                        step=step,
                        target=target,
                        boundaries=boundaries,
                        max_steps=run.settings.max_chunk_steps,
                    )
                    await _step(md, chunk, after=step)
                    step = md.step
                reason = ""
                if step % spec.report_interval_steps == 0 or step >= target:
                    sample = md.sample()
                    check_stable(sample, atoms=md.atoms, absurd_per_atom=absurd)
                    reason = done_reason(
                        step=step,
                        target_steps=target,
                        converged=tracker.observe(sample.potential_kj_mol),
                    )
                    if not reason:
                        _report(run, energies, sample, speed=speed)
                if trajectory is not None and step % every_frame == 0:
                    trajectory.write(*md.positions())
                if reason:
                    _report(run, energies, sample, speed=speed, reason=reason)
                    rows = energies.rows
                    await _write_final_state(run, md)
                    if step != last_checkpoint:  # what an extend continues from (docs/control.md)
                        await _checkpoint(run, md, store, step, trajectory)
                    break
                if disk_mb and step % spec.report_interval_steps == 0:
                    used = await asyncio.to_thread(folder_mb, run.task.job_dir)
                    if used > disk_mb:  # a runaway: stop at a checkpoint, never retried
                        if step != last_checkpoint:
                            await _checkpoint(run, md, store, step, trajectory)
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
                    await _checkpoint(run, md, store, step, trajectory)
                    last_checkpoint = step
                    last_checkpoint_at = time.monotonic()
        await announce_outputs(run, final_step=step, trajectory=trajectory, energy_rows=rows)
        await run.flush()
        log.info("finished at step %d: %s", step, reason)
        return RunnerExit.OK
    finally:
        if trajectory is not None:
            trajectory.close()


class _MinimizationProgress(openmm.MinimizationReporter):  # type: ignore[misc]
    """Counts minimiser iterations, hands every report-interval one to the event loop, and
    asks the minimiser to stop on a stop request.

    With constraints OpenMM minimises in rounds of growing restraint strength and applies
    ``maxIterations`` to each round, so the total can exceed the spec's step target; stopping
    a round early leaves the constraints unsatisfied, so the count is reported as it is rather
    than cut at the target. A report is handed over one iteration late, so the last iteration
    is never reported twice (the final report, with its done_reason, covers it).
    """

    def __init__(
        self,
        *,
        loop: asyncio.AbstractEventLoop,
        on_report: Any,
        first_iteration: int,
        interval: int,
        stop: threading.Event,
    ) -> None:
        super().__init__()
        self._loop = loop
        self._on_report = on_report
        self._first = first_iteration
        self._interval = interval
        self._stop = stop
        self._pending: tuple[int, float] | None = None
        self.iterations = 0

    def report(self, iteration: int, x: Any, grad: Any, args: Any) -> bool:
        self.iterations += 1
        if self._pending is not None:
            self._loop.call_soon_threadsafe(self._on_report, *self._pending)
            self._pending = None
        done = self._first + self.iterations
        if done % self._interval == 0:
            self._pending = (done, float(args["system energy"]))
        return self._stop.is_set()


def _minimizer_sample(md: MdSystem, *, iteration: int) -> EnergySample:
    """The potential energy after ``iteration`` minimiser iterations (no dynamics: kinetic
    energy and temperature are 0)."""
    sample = md.sample(step=iteration)
    return EnergySample(
        step=iteration,
        time_ps=0.0,
        potential_kj_mol=sample.potential_kj_mol,
        kinetic_kj_mol=0.0,
        temperature_k=0.0,
        volume_nm3=sample.volume_nm3,
        density_g_cm3=sample.density_g_cm3,
    )


async def run_minimize(run: RunContext) -> RunnerExit:
    """Minimise for at most ``spec.steps`` iterations; write the minimised structure."""
    spec = run.spec
    md = await asyncio.to_thread(_build, run, openmm.VerletIntegrator(0.001))
    store = CheckpointStore(directory=run.task.job_dir / CHECKPOINT_DIR)
    store.remove_temporaries()
    fetched = await _fetch_resume_copy(run, store)
    first = 0
    if run.task.resume_from is not None:
        loaded = await asyncio.to_thread(store.load, run.task.resume_from)
        if loaded is not None:
            md.restore(loaded.state, step=loaded.file.step)
            first = loaded.file.step
            log.info("resuming minimisation from %s at iteration %d", loaded.file.path, first)
            _announce_fetched(run, fetched, first)
    absurd = run.settings.absurd_energy_per_atom_kj_mol
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

        start = _minimizer_sample(md, iteration=first)  # high energy is what minimising fixes
        remaining = spec.steps - first
        progress = _MinimizationProgress(
            loop=asyncio.get_running_loop(),
            on_report=report,
            first_iteration=first,
            interval=spec.report_interval_steps,
            stop=run.stop,
        )
        if remaining > 0:
            _report(run, energies, start, speed=None)
            await asyncio.to_thread(
                openmm.LocalEnergyMinimizer.minimize,
                md.context,
                MINIMIZER_TOLERANCE_KJ_MOL_NM,
                remaining,
                progress,
            )
        done = first + progress.iterations
        await asyncio.sleep(0)  # let the reports handed over by the minimiser thread run
        if run.stop.is_set():
            md.simulation.currentStep = done
            # The minimiser's context holds no dynamics worth a native checkpoint.
            await _checkpoint(run, md, store, done, native=False)
            log.info("stopped on request at iteration %d", done)
            return RunnerExit.PREEMPTED
        final = _minimizer_sample(md, iteration=done)
        check_stable(final, atoms=md.atoms, absurd_per_atom=absurd)
        md.simulation.currentStep = done
        await _write_final_state(run, md)
        _report(run, energies, final, speed=None, reason="minimized")
        rows = energies.rows
    await announce_outputs(run, final_step=done, energy_rows=rows)
    await run.flush()
    log.info("minimised in %d iterations: %.1f kJ/mol", progress.iterations, final.potential_kj_mol)
    return RunnerExit.OK


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
