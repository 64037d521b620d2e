"""OpenMM on the scientist's own input files, as a real runner subprocess: a serialized System
and State, and a PDB, each uploaded into the inputs bucket and fetched by the runner through
intake's desk (the fixtures of ``test_runner_lammps``). A System that would run code as it is
read (a PythonForce) is refused before OpenMM reads it.
"""

from __future__ import annotations

from pathlib import Path

import openmm
import openmm.unit as unit
import pytest
from nats.aio.client import Client

from mdq.bus.subjects import Subjects
from mdq.contracts import pb
from mdq.core.exit_codes import RunnerExit
from services.runner.recipes import lattice_positions
from tests.integration.test_runner import StartRunner, make_task, start_runner, tap
from tests.integration.test_runner_lammps import WAIT_S, Stage, desk, stage
from tests.integration.test_runner_recipes import ALANINE_DIPEPTIDE

__all__ = ["desk", "stage", "start_runner"]  # the fixtures, shared with the modules above

ATOMS = 125
BOX_NM = 2.5


def argon() -> tuple[str, str]:
    """A small argon fluid as a serialized System and a State with velocities at 120 K."""
    system = openmm.System()
    force = openmm.NonbondedForce()
    force.setNonbondedMethod(openmm.NonbondedForce.CutoffPeriodic)
    force.setCutoffDistance(1.0)
    for _ in range(ATOMS):
        system.addParticle(39.948)
        force.addParticle(0.0, 0.3405, 0.996)
    system.addForce(force)
    vectors = [openmm.Vec3(BOX_NM, 0, 0), openmm.Vec3(0, BOX_NM, 0), openmm.Vec3(0, 0, BOX_NM)]
    system.setDefaultPeriodicBoxVectors(*vectors)
    context = openmm.Context(system, openmm.VerletIntegrator(0.001))
    context.setPositions(lattice_positions(ATOMS, BOX_NM) * unit.nanometer)
    context.setVelocitiesToTemperature(120 * unit.kelvin, 5)
    state = context.getState(getPositions=True, getVelocities=True)
    return openmm.XmlSerializer.serialize(system), openmm.XmlSerializer.serialize(state)


def xml_spec(**fields: object) -> pb.JobSpec:
    spec = pb.JobSpec(
        name="xml",
        system=pb.System(
            openmm_xml=pb.OpenMMSystemXml(system_xml="system.xml", state_xml="state.xml")
        ),
        temperature_k=120.0,
        seed=3,
    )
    for key, value in fields.items():
        setattr(spec, key, value)
    return spec


async def test_a_serialized_system_and_state_run(
    nc: Client, subjects: Subjects, data_dir: Path, stage: Stage, start_runner: StartRunner
) -> None:
    system_xml, state_xml = argon()
    job = "xml-argon"
    spec = await stage(
        job,
        xml_spec(steps=200, report_interval_steps=50, checkpoint_interval_steps=100),
        {"system.xml": system_xml.encode(), "state.xml": state_xml.encode()},
    )
    task = make_task(data_dir, job, spec)
    events = await tap(nc, subjects, job)
    runner = await start_runner(task)
    assert await runner.wait(WAIT_S) == RunnerExit.OK, runner.stderr
    await events.wait_until(
        lambda: (
            any(p.progress.done_reason for p in events.progress)
            and any(c.checkpoint.step == 200 for c in events.checkpoints)
        )  # the final one
    )
    progress, checkpoints = events.of_attempt(1)
    assert [p.step for p in progress] == [50, 100, 150, 200]
    assert "starting from the job's State XML" in runner.stderr
    assert all(p.volume_nm3 == pytest.approx(BOX_NM**3) for p in progress)
    assert all(40 < p.temperature_k < 300 for p in progress), "the State's velocities (120 K)"
    assert [c.step for c in checkpoints] == [100, 200]  # and the final step, for an extend


async def test_a_system_with_a_python_force_is_refused_before_openmm_reads_it(
    nc: Client, subjects: Subjects, data_dir: Path, stage: Stage, start_runner: StartRunner
) -> None:
    system_xml, state_xml = argon()
    evil = system_xml.replace(
        "</Forces>",
        '<Force type="PythonForce" version="1" pickled="gASVAAAA"/></Forces>',
    )
    job = "xml-evil"
    spec = await stage(
        job,
        xml_spec(steps=100),
        {"system.xml": evil.encode(), "state.xml": state_xml.encode()},
    )
    runner = await start_runner(make_task(data_dir, job, spec))
    assert await runner.wait(WAIT_S) == RunnerExit.INVALID_INPUT, runner.stderr
    assert "force 'PythonForce' is refused" in runner.stderr


async def test_a_pdb_among_the_inputs_is_a_structure(
    nc: Client, subjects: Subjects, data_dir: Path, stage: Stage, start_runner: StartRunner
) -> None:
    job = "pdb-input"
    spec = await stage(
        job,
        pb.JobSpec(
            name="ala",
            system=pb.System(structure=pb.Structure(pdb_path="molecules/ala.pdb")),
            nonbonded_method=pb.NONBONDED_NO_CUTOFF,
            steps=100,
            report_interval_steps=50,
        ),
        {"molecules/ala.pdb": ALANINE_DIPEPTIDE.encode()},
    )
    task = make_task(data_dir, job, spec)
    events = await tap(nc, subjects, job)
    runner = await start_runner(task)
    assert await runner.wait(WAIT_S) == RunnerExit.OK, runner.stderr
    await events.wait_until(lambda: any(p.progress.done_reason for p in events.progress))
    progress, _ = events.of_attempt(1)
    assert [p.step for p in progress] == [50, 100]
    assert all(p.volume_nm3 == 0 for p in progress), "in vacuum: no box"
