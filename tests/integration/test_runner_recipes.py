"""The runner's system recipes and engine settings, as a real subprocess with real OpenMM.

A Lennard-Jones fluid (200 argon atoms) is fast enough to test exact continuation: an attempt
killed with SIGKILL and resumed from its native checkpoint must continue the energies and the
trajectory of an uninterrupted run with the same seed. User structures (an inline alanine
dipeptide in vacuum; a file under the data folder, solvated and run at constant pressure), the
time-based checkpoint, other integrators, and input errors (paths leaving the data folder,
missing platforms and force fields) are tested with the events, files and exit codes they
produce.
"""

from __future__ import annotations

import asyncio
import signal
import struct
from functools import partial
from pathlib import Path
from typing import Any

import openmm
import pytest

from mdq.contracts import pb
from mdq.core.exit_codes import RunnerExit
from mdq.core.spec import normalize_job
from mdq.testing.runner_files import newest_checkpoint_step
from services.runner.checkpoints import checkpoint_name
from services.runner.errors import InvalidInputError
from services.runner.system import build_system
from tests.helpers import with_fields
from tests.integration.test_runner import (
    WAIT_S,
    JobEvents,
    Runner,
    StartJob,
    StartRunner,
    flip_bytes,
    make_task,
    on_disk,
    start_job,
    start_runner,
)

__all__ = ["start_job", "start_runner"]  # the fixtures, shared with test_runner

ALANINE_DIPEPTIDE = """\
ATOM      1  H1  ACE A   1      15.908  11.969  16.089  1.00  0.00           H
ATOM      2  CH3 ACE A   1      15.377  12.899  15.886  1.00  0.00           C
ATOM      3  H2  ACE A   1      14.471  12.940  16.490  1.00  0.00           H
ATOM      4  H3  ACE A   1      15.112  12.945  14.830  1.00  0.00           H
ATOM      5  C   ACE A   1      16.244  14.114  16.225  1.00  0.00           C
ATOM      6  O   ACE A   1      17.382  13.964  16.665  1.00  0.00           O
ATOM      7  N   ALA A   2      15.699  15.314  16.018  1.00  0.00           N
ATOM      8  H   ALA A   2      14.759  15.386  15.655  1.00  0.00           H
ATOM      9  CA  ALA A   2      16.418  16.541  16.300  1.00  0.00           C
ATOM     10  HA  ALA A   2      16.683  16.572  17.357  1.00  0.00           H
ATOM     11  CB  ALA A   2      17.696  16.630  15.473  1.00  0.00           C
ATOM     12  HB1 ALA A   2      17.446  16.609  14.413  1.00  0.00           H
ATOM     13  HB2 ALA A   2      18.215  17.560  15.705  1.00  0.00           H
ATOM     14  HB3 ALA A   2      18.343  15.785  15.711  1.00  0.00           H
ATOM     15  C   ALA A   2      15.568  17.761  15.975  1.00  0.00           C
ATOM     16  O   ALA A   2      14.428  17.628  15.534  1.00  0.00           O
ATOM     17  N   NME A   3      16.126  18.953  16.194  1.00  0.00           N
ATOM     18  H   NME A   3      17.066  19.012  16.558  1.00  0.00           H
ATOM     19  C   NME A   3      15.420  20.190  15.926  1.00  0.00           C
ATOM     20  H1  NME A   3      14.425  19.965  15.540  1.00  0.00           H
ATOM     21  H2  NME A   3      15.330  20.766  16.847  1.00  0.00           H
ATOM     22  H3  NME A   3      15.972  20.771  15.187  1.00  0.00           H
TER
END
"""
DCD_HEADER_BYTES = 276
"""Length of the header OpenMM writes for a DCD file."""


def lj_spec(name: str = "lj", **fields: object) -> pb.JobSpec:
    """200 argon atoms near the triple point, defaults filled as intake would."""
    spec = pb.JobSpec(
        name=name,
        seed=11,
        temperature_k=100,
        system=pb.System(lennard_jones=pb.LennardJonesFluid(atoms=200)),
    )
    return normalize_job(with_fields(spec, fields), "jobs[0]")


def structure_spec(structure: pb.Structure, **fields: object) -> pb.JobSpec:
    spec = pb.JobSpec(name="structure", seed=5, system=pb.System(structure=structure))
    return normalize_job(with_fields(spec, fields), "jobs[0]")


def dcd_frames(path: Path) -> tuple[int, bytes]:
    """Frame count in a DCD header, and the bytes of every frame."""
    data = path.read_bytes()
    (frames,) = struct.unpack("<i", data[8:12])
    return frames, data[DCD_HEADER_BYTES:]


def energies_by_step(events: JobEvents, attempt: int) -> dict[int, float]:
    progress, _ = events.of_attempt(attempt)
    return {p.step: p.potential_kj_mol for p in progress}


async def outputs_of(events: JobEvents) -> dict[str, pb.OutputFile]:
    await events.wait_until(lambda: bool(events.outputs))
    return {file.kind: file for file in events.outputs[-1].outputs.files}


async def test_lennard_jones_fluid_reports_argon_density_and_writes_a_dcd(
    start_job: StartJob,
) -> None:
    spec = lj_spec(
        steps=1000, report_interval_steps=100, trajectory_interval_steps=250, timestep_fs=5
    )
    fluid = spec.system.lennard_jones
    task, events, runner = await start_job("job-lj", spec)
    assert await runner.wait() == RunnerExit.OK, runner.stderr
    await events.until_done()
    progress, _ = events.of_attempt(1)
    assert [p.step for p in progress] == list(range(100, 1001, 100))
    box_volume = fluid.atoms / fluid.density_atoms_nm3
    assert all(p.volume_nm3 == pytest.approx(box_volume, rel=1e-6) for p in progress)
    assert all(p.density_g_cm3 == pytest.approx(1.4185, rel=1e-3) for p in progress)
    assert all(p.potential_kj_mol < 0 for p in progress), "a dense LJ liquid is bound"
    assert 50 < progress[-1].temperature_k < 150
    assert "built 200 atoms on the CPU platform" in runner.stderr
    outputs = await outputs_of(events)
    assert set(outputs) == {"trajectory", "final_state", "energies"}
    trajectory = outputs["trajectory"]
    assert trajectory.path == str(task.job_dir / "trajectory.dcd")
    assert (trajectory.format, trajectory.frames) == ("dcd", 4)
    assert on_disk(Path(trajectory.path)) == (trajectory.sha256, trajectory.size_bytes)
    frames, body = dcd_frames(Path(trajectory.path))
    assert frames == 4
    frame_bytes = 4 + 48 + 4 + 3 * (4 + 4 * fluid.atoms + 4)  # unit cell + x, y, z blocks
    assert len(body) == 4 * frame_bytes


def _more_reports_than(events: JobEvents, reports: int) -> bool:
    return len(events.progress) > reports


async def stop_past_a_checkpoint(runner: Runner, events: JobEvents, job_dir: Path) -> None:
    """SIGSTOP ``runner`` at a moment when it has reported progress past its latest checkpoint.

    A fast runner can write its next checkpoint between the test seeing "progress past the
    checkpoint" and a kill, so the runner is stopped first and its checkpoint folder read: a
    stopped runner writes nothing more, and it writes a checkpoint's files before announcing
    it, so when the newest file on disk is older than the progress already seen, no checkpoint
    event in flight can overtake that progress. Otherwise it runs on to its next report and
    the check is made again.
    """
    deadline = asyncio.get_running_loop().time() + WAIT_S
    while True:
        await events.wait_until(
            lambda: (
                bool(events.checkpoints)
                and events.progress[-1].progress.step > events.checkpoints[-1].checkpoint.step
            )
        )
        runner.process.send_signal(signal.SIGSTOP)
        progress, _ = events.of_attempt(1)
        if progress[-1].step > newest_checkpoint_step(job_dir / "checkpoints"):
            return
        assert asyncio.get_running_loop().time() < deadline, "never stopped past a checkpoint"
        runner.process.send_signal(signal.SIGCONT)
        await events.wait_until(partial(_more_reports_than, events, len(events.progress)))


async def test_resume_from_native_checkpoint_continues_energies_and_trajectory(
    data_dir: Path, start_runner: StartRunner, start_job: StartJob
) -> None:
    spec = lj_spec(
        steps=12_000,
        report_interval_steps=200,
        checkpoint_interval_steps=2000,
        trajectory_interval_steps=500,
    )
    reference_task, reference_events, reference = await start_job("job-lj-reference", spec)
    assert await reference.wait() == RunnerExit.OK, reference.stderr
    await reference_events.until_done()
    uninterrupted = energies_by_step(reference_events, 1)

    first_task, events, first = await start_job("job-lj-killed", spec)
    await stop_past_a_checkpoint(first, events, first_task.job_dir)
    first.process.kill()
    assert await first.wait() == -signal.SIGKILL
    before, checkpoints = events.of_attempt(1)
    resume_from = checkpoints[-1]
    assert before[-1].step > resume_from.step, "work after the checkpoint is lost and redone"
    assert before[-1].step < spec.steps, "the first attempt finished before it was killed"
    assert resume_from.platform == "CPU"
    assert on_disk(Path(resume_from.native_path))[0] == resume_from.native_sha256
    for p in before:
        assert p.potential_kj_mol == pytest.approx(uninterrupted[p.step], rel=1e-9), p.step

    second = await start_runner(
        make_task(data_dir, "job-lj-killed", spec, attempt=2, resume_from=resume_from)
    )
    assert await second.wait() == RunnerExit.OK, second.stderr
    assert f"at step {resume_from.step} (native checkpoint)" in second.stderr
    await events.until_done()
    after = energies_by_step(events, 2)
    assert min(after) == resume_from.step + 200
    assert max(after) == spec.steps
    # The first reports after the resume are those of the uninterrupted run (the native
    # checkpoint carries the thermostat's random state); chaos lets rounding differences grow
    # later, so only the next few are compared tightly.
    for step in sorted(after)[:5]:
        assert after[step] == pytest.approx(uninterrupted[step], rel=1e-5), step

    reference_frames, reference_body = dcd_frames(reference_task.job_dir / "trajectory.dcd")
    frames, body = dcd_frames(first_task.job_dir / "trajectory.dcd")
    assert frames == reference_frames == spec.steps // 500
    assert len(body) == len(reference_body), "one trajectory: no frame twice, none missing"
    kept_bytes = resume_from.step // 500 * (len(body) // frames)
    assert body[:kept_bytes] == reference_body[:kept_bytes]
    outputs = await outputs_of(events)
    assert outputs["trajectory"].frames == reference_frames
    rows = (first_task.job_dir / "energies.csv").read_text().splitlines()[1:]
    assert [int(row.split(",")[0]) for row in rows] == list(range(200, spec.steps + 1, 200))


async def test_corrupt_native_checkpoint_falls_back_to_the_state_xml(
    data_dir: Path, start_runner: StartRunner, start_job: StartJob
) -> None:
    spec = lj_spec(steps=600, report_interval_steps=100, checkpoint_interval_steps=200)
    _, events, first = await start_job("job-lj-native", spec)
    assert await first.wait() == RunnerExit.OK, first.stderr
    await events.wait_until(lambda: len(events.checkpoints) >= 3)
    # resumed from the checkpoint before the end: the final step's is removed (a resume takes
    # the newest verified checkpoint in the folder, CheckpointStore.load)
    newest = next(c for c in events.of_attempt(1)[1] if c.step == 400)
    flip_bytes(Path(newest.native_path))
    final = Path(newest.path).parent / checkpoint_name(600)
    for suffix in (".xml", ".chk", ".json"):
        final.with_suffix(suffix).unlink()

    second = await start_runner(
        make_task(data_dir, "job-lj-native", spec, attempt=2, resume_from=newest)
    )
    assert await second.wait() == RunnerExit.OK, second.stderr
    assert "is corrupt" in second.stderr
    assert "at step 400 (State XML)" in second.stderr
    await events.wait_until(lambda: any(p.done_reason for p in events.of_attempt(2)[0]))
    assert sorted(energies_by_step(events, 2)) == [500, 600]


async def test_time_based_checkpoints(start_job: StartJob) -> None:
    spec = lj_spec(
        steps=30_000,
        report_interval_steps=100,
        checkpoint_interval_steps=1_000_000,
        checkpoint_interval_s=1,
    )
    _, events, runner = await start_job("job-lj-seconds", spec)
    await events.wait_until(lambda: len(events.checkpoints) >= 2, within_s=30)
    runner.process.send_signal(signal.SIGTERM)
    assert await runner.wait() == RunnerExit.PREEMPTED, runner.stderr
    _, checkpoints = events.of_attempt(1)
    steps = [c.step for c in checkpoints]
    assert steps == sorted(set(steps))
    assert all(0 < step < spec.checkpoint_interval_steps for step in steps)
    times = [event.time.ToDatetime() for event in events.checkpoints[:2]]
    assert (times[1] - times[0]).total_seconds() >= 0.9


@pytest.mark.parametrize(
    ("integrator", "barostat"),
    [
        pytest.param(pb.INTEGRATOR_VERLET, None, id="verlet-nve"),
        pytest.param(pb.INTEGRATOR_NOSE_HOOVER, None, id="nose-hoover-nvt"),
        pytest.param(pb.INTEGRATOR_LANGEVIN, pb.Barostat(pressure_bar=1000), id="langevin-npt"),
    ],
)
async def test_integrators_and_barostat(
    integrator: int, barostat: pb.Barostat | None, start_job: StartJob
) -> None:
    fields: dict[str, Any] = {"integrator": integrator}
    if barostat is not None:
        fields["barostat"] = barostat
    spec = lj_spec(steps=600, report_interval_steps=100, timestep_fs=5, **fields)
    _task, events, runner = await start_job(f"job-lj-{integrator}", spec)
    assert await runner.wait() == RunnerExit.OK, runner.stderr
    await events.until_done()
    progress, _ = events.of_attempt(1)
    volumes = {round(p.volume_nm3, 9) for p in progress}
    if barostat is None:
        assert len(volumes) == 1, "constant volume without a barostat"
    else:
        assert len(volumes) > 1, "the barostat changes the volume"
    if integrator == pb.INTEGRATOR_VERLET:
        total = [p.potential_kj_mol + p.kinetic_kj_mol for p in progress]
        assert max(total) - min(total) < 0.02 * abs(total[0]), "NVE conserves energy"


async def test_inline_structure_in_vacuum_with_xtc_trajectory(start_job: StartJob) -> None:
    spec = structure_spec(
        pb.Structure(pdb_content=ALANINE_DIPEPTIDE),
        steps=200,
        report_interval_steps=50,
        trajectory_interval_steps=50,
        trajectory_format=pb.TRAJECTORY_XTC,
        timestep_fs=1,
    )
    _, events, runner = await start_job("job-dipeptide", spec)
    assert await runner.wait() == RunnerExit.OK, runner.stderr
    assert "built 22 atoms" in runner.stderr
    await events.until_done()
    progress, _ = events.of_attempt(1)
    assert [p.step for p in progress] == [50, 100, 150, 200]
    assert all(p.volume_nm3 == 0 and p.density_g_cm3 == 0 for p in progress), "not periodic"
    outputs = await outputs_of(events)
    xtc = outputs["trajectory"]
    assert (xtc.format, xtc.frames, Path(xtc.path).name) == ("xtc", 4, "trajectory.xtc")
    assert on_disk(Path(xtc.path)) == (xtc.sha256, xtc.size_bytes)


async def test_structure_file_solvated_at_constant_pressure(
    data_dir: Path, start_job: StartJob
) -> None:
    inputs = data_dir / "inputs"
    inputs.mkdir()
    (inputs / "dipeptide.pdb").write_text(ALANINE_DIPEPTIDE)
    spec = structure_spec(
        pb.Structure(pdb_path="inputs/dipeptide.pdb", padding_nm=0.8),
        cutoff_nm=0.8,
        steps=200,
        report_interval_steps=50,
        barostat=pb.Barostat(pressure_bar=1, frequency_steps=5),
    )
    assert spec.nonbonded_method == pb.NONBONDED_PME
    _task, events, runner = await start_job("job-solvated", spec, MDQ_DATA_DIR=str(data_dir))
    assert await runner.wait() == RunnerExit.OK, runner.stderr
    await events.until_done()
    progress, _ = events.of_attempt(1)
    assert all(0.8 < p.density_g_cm3 < 1.2 for p in progress), progress
    assert len({p.volume_nm3 for p in progress}) > 1, "the barostat moves the box"
    assert all(p.potential_kj_mol < 0 for p in progress)


def absent_platform() -> str:
    present = {
        openmm.Platform.getPlatform(index).getName()
        for index in range(openmm.Platform.getNumPlatforms())
    }
    return next(name for name in ("CUDA", "OpenCL", "HIP") if name not in present)


def outside_link(data_dir: Path, tmp_path: Path) -> None:
    """data_dir/inputs/link.pdb: a symlink to a structure outside the data folder."""
    outside = tmp_path / "secret.pdb"
    outside.write_text(ALANINE_DIPEPTIDE)
    inputs = data_dir / "inputs"
    inputs.mkdir(exist_ok=True)
    (inputs / "link.pdb").symlink_to(outside)


async def test_structure_path_leaving_the_data_folder_is_invalid_input(
    data_dir: Path, tmp_path: Path, start_runner: StartRunner
) -> None:
    outside_link(data_dir, tmp_path)
    spec = structure_spec(pb.Structure(pdb_path="inputs/link.pdb"))
    task = make_task(data_dir, "job-escape", spec)
    runner = await start_runner(task, MDQ_DATA_DIR=str(data_dir))
    assert await runner.wait() == RunnerExit.INVALID_INPUT, runner.stderr
    assert "structure file 'inputs/link.pdb' not found inside the job's allowed folders" in (
        runner.stderr
    )
    assert not (task.job_dir / "final_state.xml").exists()


def input_error_cases() -> list[object]:
    return [
        pytest.param(
            structure_spec(pb.Structure(pdb_path="inputs/link.pdb")),
            "symlinks are followed and must stay inside",
            id="symlink-out-of-the-data-folder",
        ),
        pytest.param(
            structure_spec(pb.Structure(pdb_path="inputs/nothing.pdb")),
            "structure file 'inputs/nothing.pdb' not found inside",
            id="missing-file",
        ),
        pytest.param(
            structure_spec(
                pb.Structure(pdb_content=ALANINE_DIPEPTIDE, force_fields=["no-such-field.xml"])
            ),
            "force field refused: 'no-such-field.xml' is not one of OpenMM's force fields",
            id="unknown-force-field",
        ),
        pytest.param(
            structure_spec(
                pb.Structure(pdb_content=ALANINE_DIPEPTIDE, force_fields=["amber14/tip3p.xml"])
            ),
            "cannot parameterise the structure",
            id="force-field-without-templates",
        ),
        pytest.param(
            structure_spec(
                pb.Structure(pdb_content="ATOM      1  X   XXX A   1   0.0\n"),
            ),
            "cannot read the inline structure as PDB",
            id="unreadable-pdb",
        ),
        pytest.param(
            structure_spec(
                pb.Structure(pdb_content=ALANINE_DIPEPTIDE),
                nonbonded_method=pb.NONBONDED_PME,
            ),
            "needs a periodic structure",
            id="pme-without-a-box",
        ),
        pytest.param(
            structure_spec(
                pb.Structure(pdb_content=ALANINE_DIPEPTIDE, padding_nm=0.5),
                cutoff_nm=1.0,
            ),
            "is not below half the periodic box",
            id="cutoff-too-long-for-the-box",
        ),
        pytest.param(
            lj_spec(platform=absent_platform()),
            "is not available here",
            id="platform-not-installed",
        ),
    ]


@pytest.mark.parametrize(("spec", "message"), input_error_cases())
def test_unusable_input_is_named(
    spec: pb.JobSpec, message: str, data_dir: Path, tmp_path: Path
) -> None:
    outside_link(data_dir, tmp_path)
    with pytest.raises(InvalidInputError) as caught:
        build_system(spec, threads=1, data_dir=data_dir)
    assert message in str(caught.value)
    assert caught.value.exit_code == RunnerExit.INVALID_INPUT


async def test_the_runner_validates_its_spec_again_and_refuses_an_invalid_one(
    data_dir: Path, start_runner: StartRunner
) -> None:
    """A spec that never went through intake (a forged pod record or event) is checked by
    the runner itself, with intake's validation: one log line names the field."""
    spec = lj_spec()
    spec.temperature_k = -5.0
    task = make_task(data_dir, "job-forged-spec", spec)
    runner = await start_runner(task)
    assert await runner.wait() == RunnerExit.INVALID_INPUT, runner.stderr
    assert "INVALID_INPUT: the job spec is invalid: spec.temperature_k" in runner.stderr
    assert not (task.job_dir / "energies.csv").exists()


async def test_a_force_field_in_the_working_or_data_folder_is_never_loaded(
    data_dir: Path, tmp_path: Path, start_runner: StartRunner
) -> None:
    """OpenMM would load "evil.xml" from the working directory and run its <Script> when it
    builds the system; the runner (working in its job folder) refuses the name instead."""
    marker = tmp_path / "pwned"
    script = (
        f"<ForceField><Script>\nopen({str(marker)!r}, 'w').write('x')\n</Script></ForceField>\n"
    )
    task = make_task(
        data_dir,
        "job-evil-ff",
        structure_spec(pb.Structure(pdb_content=ALANINE_DIPEPTIDE, force_fields=["evil.xml"])),
    )
    task.job_dir.mkdir(parents=True)
    for folder in (task.job_dir, data_dir):
        (folder / "evil.xml").write_text(script)
    runner = await start_runner(task)
    assert await runner.wait() == RunnerExit.INVALID_INPUT, runner.stderr
    assert "spec.system.structure.force_fields[0]" in runner.stderr
    assert not marker.exists()


async def test_a_task_naming_a_folder_outside_its_jobs_is_invalid_input(
    data_dir: Path, tmp_path: Path, start_runner: StartRunner
) -> None:
    """MDQ_INPUT_DIRS must be the data folder's jobs/<dependency>: another folder (here: one
    outside the data folder) is refused before anything is read."""
    elsewhere = tmp_path / "elsewhere" / "dep"
    elsewhere.mkdir(parents=True)
    task = make_task(data_dir, "job-elsewhere", lj_spec(), input_dirs=(elsewhere,))
    runner = await start_runner(task)
    assert await runner.wait() == RunnerExit.INVALID_INPUT, runner.stderr
    assert f"the input folder {elsewhere} is not the folder of job 'dep'" in runner.stderr
