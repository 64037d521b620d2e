"""The OpenMM engine's minimiser, in process on a tiny water box (real OpenMM, no bus).

A water box has constraints, so OpenMM minimises in rounds of growing restraint strength and
applies its own ``maxIterations`` to each round: the engine must count every round's
iterations against the job's ``steps`` (docs/jobspec.md: "minimiser iterations"), report no
iteration past it, and leave a state whose constraints hold and whose energy went down.
"""

from __future__ import annotations

import math
import threading
from pathlib import Path

import pytest
from openmm import unit

from mdq.contracts import pb
from mdq.core.runner_task import RunnerTask, job_dir
from mdq.core.spec import normalize_job
from services.runner.engines import EngineSetup
from services.runner.engines.openmm_engine import OpenMMEngine, open_engine
from services.runner.settings import RunnerSettings

BOX_NM = 1.5
CONSTRAINT_SLACK_NM = 1e-4


def minimizer(tmp_path: Path, *, steps: int, report_every: int) -> OpenMMEngine:
    """An OpenMM engine of a TASK_MINIMIZE job on a 1.5 nm water box, prepared."""
    spec = normalize_job(
        pb.JobSpec(
            name="min",
            seed=7,
            task=pb.TASK_MINIMIZE,
            steps=steps,
            report_interval_steps=report_every,
            system=pb.System(water_box=pb.WaterBox(box_nm=BOX_NM)),
        ),
        "jobs[0]",
    )
    task = RunnerTask(
        job_id="job-min", attempt=1, spec=spec, job_dir=job_dir(tmp_path, "job-min"), threads=1
    )
    work = tmp_path / "work"
    work.mkdir()
    engine = open_engine(
        EngineSetup(task=task, settings=RunnerSettings(), data_dir=None, work_dir=work)
    )
    engine.prepare()
    return engine


def worst_constraint_error_nm(engine: OpenMMEngine) -> float:
    """How far the worst constrained distance of the context is from its length."""
    context = engine.md.context
    system = context.getSystem()
    state = context.getState(getPositions=True)
    positions = state.getPositions(asNumpy=True).value_in_unit(unit.nanometer)
    worst = 0.0
    for index in range(system.getNumConstraints()):
        first, second, distance = system.getConstraintParameters(index)
        length = math.dist(positions[first], positions[second])
        worst = max(worst, abs(length - distance.value_in_unit(unit.nanometer)))
    return worst


@pytest.mark.parametrize("steps", [20, 60])
def test_minimize_runs_at_most_steps_iterations_over_all_restraint_rounds(
    tmp_path: Path, steps: int
) -> None:
    engine = minimizer(tmp_path, steps=steps, report_every=10)
    try:
        assert engine.md.context.getSystem().getNumConstraints() > 0  # rounds happen
        before = engine.minimizer_sample(0).potential_kj_mol
        reported: list[int] = []
        done = engine.minimize(
            steps, on_report=lambda i, _e: reported.append(i), stop=threading.Event()
        )
        assert done == steps  # a water box does not converge in this few
        assert engine.step == steps
        assert reported == list(range(10, steps, 10))  # none past the target, none repeated
        assert engine.minimizer_sample(done).potential_kj_mol < before
        assert worst_constraint_error_nm(engine) < CONSTRAINT_SLACK_NM
    finally:
        engine.close()


def test_a_stop_request_ends_the_minimisation_at_once(tmp_path: Path) -> None:
    engine = minimizer(tmp_path, steps=500, report_every=10)
    stop = threading.Event()
    reported: list[int] = []

    def on_report(iteration: int, _energy: float) -> None:
        reported.append(iteration)
        if iteration == 30:
            stop.set()

    try:
        before = engine.minimizer_sample(0).potential_kj_mol
        done = engine.minimize(500, on_report=on_report, stop=stop)
        # the report of iteration 30 is handed over during iteration 31, which then halts
        assert done == 31
        assert reported == [10, 20, 30]
        assert engine.minimizer_sample(done).potential_kj_mol < before
        assert worst_constraint_error_nm(engine) < CONSTRAINT_SLACK_NM
    finally:
        engine.close()
