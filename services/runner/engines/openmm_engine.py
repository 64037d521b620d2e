"""The OpenMM engine: the job's system built by a recipe, stepped by OpenMM (docs/engines.md).

Its checkpoints are the portable State XML plus OpenMM's native checkpoint of the same step
(exact continuation on the same platform) and a sidecar (``services.runner.checkpoints``); a
resume verifies them and falls back to the newest good one. A job that depends on another
starts from that dependency's ``final_state.xml``; a fresh start minimises briefly and draws
velocities at the job's temperature. The trajectory (DCD/XTC, ``trajectory_interval_steps``)
is the engine's own file: a resumed attempt cuts it back to the checkpoint's length.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import openmm

from mdq.contracts import pb
from mdq.core.engines import OPENMM
from mdq.core.runner_task import inputs_home
from services.runner.checkpoints import CheckpointFile, CheckpointStore, write_atomically
from services.runner.engines import EngineOutput, EngineSetup, StartPoint
from services.runner.errors import UnstableError
from services.runner.paths import dependency_file, output_path
from services.runner.samples import EnergySample
from services.runner.system import MdSystem, build_system, is_nan_error, read_state
from services.runner.trajectory import Trajectory, TrajectoryMark, file_name

log = logging.getLogger(__name__)

FINAL_STATE_FILE = "final_state.xml"
CHECKPOINT_DIR = "checkpoints"
MINIMIZER_TOLERANCE_KJ_MOL_NM = 10.0
MINIMIZER_TIMESTEP_PS = 0.001
"""The minimiser's context needs an integrator; it never steps."""


def unstable(error: BaseException) -> bool:
    """Whether ``error`` is OpenMM reporting NaN coordinates (a blown-up simulation)."""
    return is_nan_error(error)


class _Halted(Exception):
    """Raised by the minimiser's reporter to end ``LocalEnergyMinimizer.minimize`` at once."""


class _MinimizationProgress(openmm.MinimizationReporter):  # type: ignore[misc]
    """Counts minimiser iterations, hands every report-interval one to ``on_report``, and ends
    the minimisation when the iterations reach ``budget`` or on a stop request.

    With constraints OpenMM minimises in rounds of growing restraint strength and applies
    ``maxIterations`` to each round, so its own limit lets the total run to several times the
    spec's step target; and a reporter that merely returns True ends only the current round
    (every later one still runs an iteration, and the positions go back to the start). So the
    reporter counts every iteration of every round, keeps the positions of the last one it
    allows and raises ``_Halted`` there, which ends the minimiser at once; the engine then puts
    those positions back and satisfies the constraints. A report is handed over one iteration
    late, so the last iteration is never reported twice (the final report, with its
    done_reason, covers it; a stop, which has no final report, hands it over as it halts).
    """

    def __init__(
        self,
        *,
        on_report: Callable[[int, float], None],
        first_iteration: int,
        interval: int,
        budget: int,
        stop: threading.Event,
    ) -> None:
        super().__init__()
        self._on_report = on_report
        self._first = first_iteration
        self._interval = interval
        self._budget = budget
        self._stop = stop
        self._pending: tuple[int, float] | None = None
        self.iterations = 0
        self.halted_at: list[float] | None = None
        """The positions (nm, x y z of each particle) the minimiser was halted at."""

    def report(self, iteration: int, x: Any, grad: Any, args: Any) -> bool:
        self.iterations += 1
        self._flush()
        done = self._first + self.iterations
        if done % self._interval == 0:
            self._pending = (done, float(args["system energy"]))
        stopping = self._stop.is_set()
        if stopping or self.iterations >= self._budget:
            if stopping:
                self._flush()
            self.halted_at = list(x)
            raise _Halted
        return False

    def _flush(self) -> None:
        if self._pending is not None:
            self._on_report(*self._pending)
            self._pending = None


class OpenMMEngine:
    """One attempt of an OpenMM job (the engine port, ``services.runner.engines``)."""

    name = OPENMM
    units = ""
    interruptible = False

    def __init__(self, setup: EngineSetup, md: MdSystem) -> None:
        self._setup = setup
        self._spec = setup.task.spec
        self.md = md
        self.atoms = md.atoms
        self.timestep_ps = md.timestep_ps
        job_dir = setup.task.job_dir
        self.checkpoints = CheckpointStore(directory=job_dir / CHECKPOINT_DIR)
        self._minimizing = self._spec.task == pb.TASK_MINIMIZE
        every_frame = 0 if self._minimizing else self._spec.trajectory_interval_steps
        self.boundaries: tuple[int, ...] = (every_frame,) if every_frame > 0 else ()
        self._trajectory: Trajectory | None = None
        self._first_iteration = 0

    @property
    def step(self) -> int:
        return self.md.step

    # -- start -------------------------------------------------------------------------------
    def prepare(self) -> StartPoint:
        """Resume from the announced checkpoint, else start from a dependency's final state
        or fresh; open the trajectory."""
        if self._minimizing:
            return self._prepare_minimize()
        resumed, mark = self._start_md()
        every_frame = self._spec.trajectory_interval_steps
        if every_frame > 0:
            self._trajectory = Trajectory(
                path=output_path(self._setup.task.job_dir, file_name(self._spec.trajectory_format)),
                trajectory_format=self._spec.trajectory_format,
                topology=self.md.topology,
                timestep_ps=self.md.timestep_ps,
                interval=every_frame,
                resume=mark if resumed is not None else None,
                resumed_step=resumed,
            )
        return StartPoint(resumed_step=resumed)

    def _start_md(self) -> tuple[int | None, TrajectoryMark | None]:
        task, spec, md = self._setup.task, self._spec, self.md
        if task.resume_from is not None:
            loaded = self.checkpoints.load(task.resume_from, platform=md.platform)
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
                return step, loaded.trajectory
            log.warning("no usable checkpoint to resume from: starting over from step 0")
        if task.input_dirs:
            structure = dependency_file(task.input_dirs[0], FINAL_STATE_FILE)
            if structure.is_file():
                md.start_from_structure(
                    read_state(structure), temperature_k=spec.temperature_k, seed=spec.seed
                )
                log.info("starting from %s", structure)
                return None, None
            log.info("%s does not exist: starting from the built system", structure)
        if md.start_state is not None:
            md.start_from_structure(
                md.start_state, temperature_k=spec.temperature_k, seed=spec.seed
            )
            log.info("starting from the job's State XML")
            return None, None
        md.start_fresh(
            minimize_iterations=self._setup.settings.warmup_minimize_iterations,
            temperature_k=spec.temperature_k,
            seed=spec.seed,
        )
        return None, None

    def _prepare_minimize(self) -> StartPoint:
        resume = self._setup.task.resume_from
        if resume is None:
            return StartPoint(resumed_step=None)
        loaded = self.checkpoints.load(resume)
        if loaded is None:
            return StartPoint(resumed_step=None)
        self.md.restore(loaded.state, step=loaded.file.step)
        self._first_iteration = loaded.file.step
        log.info(
            "resuming minimisation from %s at iteration %d", loaded.file.path, loaded.file.step
        )
        return StartPoint(resumed_step=loaded.file.step)

    # -- stepping ----------------------------------------------------------------------------
    def advance(self, steps: int) -> None:
        """Run ``steps`` MD steps; NaN coordinates are UnstableError."""
        after = self.md.step
        try:
            self.md.run(steps)
        except openmm.OpenMMException as error:
            if is_nan_error(error):
                raise UnstableError(f"simulation blew up after step {after}: {error}") from None
            raise

    def interrupt(self) -> None:
        """Nothing: a stop request waits for the chunk's end (``max_chunk_steps``)."""

    def after_chunk(self, step: int) -> None:
        """Write a trajectory frame on its steps."""
        if self._trajectory is not None and step % self._trajectory.interval == 0:
            self._trajectory.write(*self.md.positions())

    def sample(self) -> EnergySample:
        return self.md.sample()

    def minimizer_sample(self, iteration: int) -> EnergySample:
        """The potential energy after ``iteration`` minimiser iterations (no dynamics: kinetic
        energy and temperature are 0)."""
        return self.md.sample(step=iteration).minimized(iteration)

    def minimize(
        self, iterations: int, *, on_report: Callable[[int, float], None], stop: threading.Event
    ) -> int:
        """Minimise for at most ``iterations`` in all (every restraint round counted); return
        the iterations done. The context's step count is then the iterations done in all."""
        progress = _MinimizationProgress(
            on_report=on_report,
            first_iteration=self._first_iteration,
            interval=self._spec.report_interval_steps,
            budget=iterations,
            stop=stop,
        )
        if iterations > 0:
            try:
                openmm.LocalEnergyMinimizer.minimize(
                    self.md.context, MINIMIZER_TOLERANCE_KJ_MOL_NM, iterations, progress
                )
            except _Halted:
                if progress.halted_at is not None:
                    self._settle(progress.halted_at)
        self.md.simulation.currentStep = self._first_iteration + progress.iterations
        return progress.iterations

    def _settle(self, flat_positions: list[float]) -> None:
        """Put the positions a halted minimiser reached back into the context, with its
        constraints satisfied (a restraint round leaves them only nearly so)."""
        context = self.md.context
        context.setPositions(
            [openmm.Vec3(*flat_positions[i : i + 3]) for i in range(0, len(flat_positions), 3)]
        )
        context.applyConstraints(context.getIntegrator().getConstraintTolerance())
        context.computeVirtualSites()

    # -- files -------------------------------------------------------------------------------
    def checkpoint(self, step: int) -> CheckpointFile:
        """State XML, native checkpoint (not of a minimiser's context: it holds no dynamics
        worth one) and the trajectory's mark; written atomically and verified."""
        xml, time_ps = self.md.snapshot()
        native = None if self._minimizing else self.md.native_checkpoint()
        mark = self._trajectory.mark() if self._trajectory is not None else None
        return self.checkpoints.write(
            state_xml=xml,
            step=step,
            time_ps=time_ps,
            native=native,
            platform=self.md.platform,
            trajectory=mark,
        )

    def finish(self) -> None:
        """Write the final state (a dependent job starts from it)."""
        xml, _ = self.md.snapshot()
        write_atomically(output_path(self._setup.task.job_dir, FINAL_STATE_FILE), xml.encode())

    def outputs(self) -> list[EngineOutput]:
        files: list[EngineOutput] = []
        trajectory = self._trajectory
        if trajectory is not None:
            mark = trajectory.mark()
            if trajectory.path.is_file():
                files.append(
                    EngineOutput(trajectory.path, "trajectory", trajectory.format, mark.frames)
                )
        final = self._setup.task.job_dir / FINAL_STATE_FILE
        if final.is_file() and not final.is_symlink():
            files.append(EngineOutput(final, "final_state", "xml"))
        return files

    def close(self) -> None:
        if self._trajectory is not None:
            self._trajectory.close()


def open_engine(setup: EngineSetup) -> OpenMMEngine:
    """Build the job's OpenMM system (a minimisation gets a context that never steps)."""
    task = setup.task
    spec = task.spec
    integrator = (
        openmm.VerletIntegrator(MINIMIZER_TIMESTEP_PS) if spec.task == pb.TASK_MINIMIZE else None
    )
    md = build_system(
        spec,
        threads=task.threads,
        integrator=integrator,
        # a tenant's "inputs/..." are its own: <data>/tenants/<tenant>/inputs
        data_dir=inputs_home(setup.data_dir, task.job_id) if setup.data_dir else None,
        input_dirs=task.input_dirs,
        work_dir=setup.work_dir,
    )
    log.info("built %d atoms on the %s platform", md.atoms, md.platform)
    return OpenMMEngine(setup, md)
