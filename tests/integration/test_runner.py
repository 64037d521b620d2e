"""The MD runner as a real subprocess, against a real NATS JetStream and real OpenMM.

Each test starts ``python -m services.runner`` with the environment placement would give it
(``RunnerTask.to_env`` plus NATS_URL / MDQ_NAMESPACE) on a tiny water box, and watches the
events it publishes through JetStream, the files it leaves and its exit code: step targets,
checkpoint integrity, resuming after kill -9, falling back from a corrupt checkpoint, SIGTERM,
a minimize → MD → analyze chain, convergence and bad input.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import signal
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg

from mdq.bus.codec import decode_event
from mdq.bus.copies import CopyStore
from mdq.bus.subjects import Subjects
from mdq.contracts import pb
from mdq.core.exit_codes import RunnerExit
from mdq.core.runner_task import RunnerTask, job_dir
from mdq.core.spec import normalize_job
from mdq.embedded import free_port
from mdq.testing.runner_files import last_energy_step
from tests.helpers import with_fields
from tools.processes import spawn_runner

REPO_ROOT = Path(__file__).resolve().parents[2]
BOX_NM = 1.5
TIMESTEP_PS = 0.002
WAIT_S = 60.0


def md_spec(name: str, **fields: object) -> pb.JobSpec:
    """A normalised spec of a tiny water box job (defaults filled as intake would)."""
    spec = pb.JobSpec(name=name, seed=7, system=pb.System(water_box=pb.WaterBox(box_nm=BOX_NM)))
    return normalize_job(with_fields(spec, fields), "jobs[0]")


@dataclass
class JobEvents:
    """The progress and checkpoint events of one job, as JetStream delivers them."""

    progress: list[pb.Event] = field(default_factory=list)
    checkpoints: list[pb.Event] = field(default_factory=list)
    outputs: list[pb.Event] = field(default_factory=list)
    usage: list[pb.Event] = field(default_factory=list)
    copied: list[pb.Event] = field(default_factory=list)
    fetched: list[pb.Event] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    async def on_message(self, message: Msg) -> None:
        event = decode_event(message.data)
        kind = event.WhichOneof("body")
        if kind == "progress":
            self.progress.append(event)
        elif kind == "outputs":
            self.outputs.append(event)
        elif kind == "usage":
            self.usage.append(event)
        elif kind == "copied":
            self.copied.append(event)
        elif kind == "fetched":
            self.fetched.append(event)
        else:
            self.checkpoints.append(event)
        self.changed.set()

    async def wait_until(self, condition: Callable[[], bool], within_s: float = WAIT_S) -> None:
        async def poll() -> None:
            while not condition():
                self.changed.clear()
                await self.changed.wait()

        await asyncio.wait_for(poll(), within_s)

    async def until_done(self, within_s: float = WAIT_S) -> None:
        """Wait for the report that ends an attempt (one with a done reason)."""
        await self.wait_until(lambda: any(e.progress.done_reason for e in self.progress), within_s)

    def of_attempt(self, attempt: int) -> tuple[list[pb.Progress], list[pb.Checkpoint]]:
        return (
            [event.progress for event in self.progress if event.attempt == attempt],
            [event.checkpoint for event in self.checkpoints if event.attempt == attempt],
        )


@dataclass
class Runner:
    """One runner process."""

    process: asyncio.subprocess.Process
    stderr_path: Path

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text()

    async def wait(self, within_s: float = WAIT_S) -> int:
        try:
            return await asyncio.wait_for(self.process.wait(), within_s)
        except TimeoutError:
            self.process.kill()
            await self.process.wait()
            raise AssertionError(f"runner did not finish in {within_s} s:\n{self.stderr}") from None


async def runner_process(
    task: RunnerTask, nats_url: str, subjects: Subjects, stderr_path: Path, **extra_env: str
) -> Runner:
    """A runner process (``python -m services.runner``) of ``task`` on the bus at
    ``nats_url``, ``extra_env`` added to its environment, its stderr written to
    ``stderr_path``."""
    with stderr_path.open("wb") as stderr:
        process = await spawn_runner(
            task, nats_url, subjects.namespace, cwd=REPO_ROOT, stderr=stderr, extra_env=extra_env
        )
    return Runner(process=process, stderr_path=stderr_path)


async def kill_running(runners: list[Runner]) -> None:
    """Kill every one of ``runners`` still running (a test's leftovers) and reap it."""
    for runner in runners:
        if runner.process.returncode is None:
            runner.process.kill()
            await runner.process.wait()


StartRunner = Callable[..., Awaitable[Runner]]


@pytest.fixture
async def start_runner(
    nats_url: str, subjects: Subjects, tmp_path: Path
) -> AsyncIterator[StartRunner]:
    started: list[Runner] = []

    async def start(task: RunnerTask, **extra_env: str) -> Runner:
        stderr_path = tmp_path / f"runner-{task.job_id}-{task.attempt}.log"
        runner = await runner_process(task, nats_url, subjects, stderr_path, **extra_env)
        started.append(runner)
        return runner

    yield start
    await kill_running(started)


async def tap(nc: Client, subjects: Subjects, job_id: str) -> JobEvents:
    """Follow a job's progress and checkpoint events from the start of the streams."""
    events = JobEvents()
    js = nc.jetstream()
    await js.subscribe(subjects.progress(job_id), cb=events.on_message, ordered_consumer=True)
    await js.subscribe(
        subjects.job(job_id, "checkpoint"), cb=events.on_message, ordered_consumer=True
    )
    await js.subscribe(subjects.job(job_id, "outputs"), cb=events.on_message, ordered_consumer=True)
    await js.subscribe(subjects.job(job_id, "usage"), cb=events.on_message, ordered_consumer=True)
    await js.subscribe(subjects.job(job_id, "copied"), cb=events.on_message, ordered_consumer=True)
    await js.subscribe(subjects.job(job_id, "fetched"), cb=events.on_message, ordered_consumer=True)
    return events


Started = tuple[RunnerTask, JobEvents, Runner]
StartJob = Callable[..., Awaitable[Started]]


@pytest.fixture
def start_job(
    nc: Client, subjects: Subjects, data_dir: Path, start_runner: StartRunner
) -> StartJob:
    """Start a runner on attempt 1 of a job in the test's data folder, its events followed from
    the start of the streams: ``task, events, runner = await start_job(job_id, spec)``;
    keyword arguments are added to the runner's environment, as ``start_runner``'s."""

    async def start(job_id: str, spec: pb.JobSpec, **extra_env: str) -> Started:
        task = make_task(data_dir, job_id, spec)
        events = await tap(nc, subjects, job_id)
        return task, events, await start_runner(task, **extra_env)

    return start


def make_task(
    data_dir: Path, job_id: str, spec: pb.JobSpec, *, attempt: int = 1, **fields: object
) -> RunnerTask:
    return RunnerTask(
        job_id=job_id,
        attempt=attempt,
        spec=spec,
        job_dir=job_dir(data_dir, job_id),
        threads=1,
        **fields,  # type: ignore[arg-type]
    )


def flip_bytes(path: Path) -> None:
    """Corrupt a file in place: invert 64 bytes in its middle (same size, wrong content)."""
    data = bytearray(path.read_bytes())
    for offset in range(len(data) // 2, len(data) // 2 + 64):
        data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def on_disk(path: Path) -> tuple[str, int]:
    """sha256 and size of a file as it is on disk now."""
    data = path.read_bytes()
    return hashlib.sha256(data).hexdigest(), len(data)


def text_of(path: Path) -> str:
    return path.read_text()


def sha256_file(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


async def test_md_run_reaches_its_step_target(start_job: StartJob) -> None:
    spec = md_spec("md", steps=400, report_interval_steps=50, checkpoint_interval_steps=200)
    task, events, runner = await start_job("job-target", spec)

    assert await runner.wait() == RunnerExit.OK, runner.stderr
    await events.until_done()
    progress, _ = events.of_attempt(1)
    assert [p.step for p in progress] == list(range(50, 401, 50))
    assert all(p.target_steps == 400 for p in progress)
    assert all(100.0 < p.temperature_k < 600.0 for p in progress), progress
    assert all(p.potential_kj_mol < 0 < p.kinetic_kj_mol for p in progress)
    assert progress[-1].time_ps == pytest.approx(400 * TIMESTEP_PS)
    assert progress[-1].ns_per_day > 0
    assert [p.done_reason for p in progress] == [""] * 7 + ["steps_reached"]
    assert progress[-1].eta_s == pytest.approx(0.0)
    assert all(
        event.event_id == f"progress:job-target:1:{event.progress.step}"
        for event in events.progress
    )
    assert all(p.volume_nm3 == pytest.approx(BOX_NM**3, rel=1e-6) for p in progress)
    assert all(0.85 < p.density_g_cm3 < 1.1 for p in progress), progress
    rows = (task.job_dir / "energies.csv").read_text().splitlines()
    assert rows[0] == (
        "step,time_ps,potential_kj_mol,kinetic_kj_mol,temperature_k,volume_nm3,density_g_cm3,"
        "total_kj_mol,pressure_bar"
    )
    # OpenMM computes no pressure: the column is empty, the progress field unset
    assert all(row.endswith(",") for row in rows[1:])
    assert not any(p.HasField("pressure_bar") for p in progress)
    assert all(
        p.total_kj_mol == pytest.approx(p.potential_kj_mol + p.kinetic_kj_mol) for p in progress
    )
    assert all(p.units == "" for p in progress)
    assert [int(row.split(",")[0]) for row in rows[1:]] == list(range(50, 401, 50))
    assert "<State" in (task.job_dir / "final_state.xml").read_text()
    await events.wait_until(lambda: bool(events.outputs))
    outputs = events.outputs[0]
    assert outputs.event_id == "outputs:job-target:1"
    assert outputs.outputs.final_step == 400
    by_kind = {file.kind: file for file in outputs.outputs.files}
    assert set(by_kind) == {"final_state", "energies"}, "no trajectory was asked for"
    assert by_kind["energies"].frames == 8
    for file in by_kind.values():
        assert Path(file.path).parent == task.job_dir
        assert on_disk(Path(file.path)) == (file.sha256, file.size_bytes)
    # what the attempt used, reported once as it ended (the resource recommender learns from it)
    await events.wait_until(lambda: bool(events.usage))
    [usage_event] = events.usage
    assert usage_event.event_id == "usage:job-target:1"
    assert usage_event.producer == "runner"
    usage = usage_event.usage
    assert 40 < usage.peak_memory_mb < spec.resources.memory_mb, usage
    assert usage.source == "rusage"
    assert usage.cpu_seconds > 0 and usage.wall_seconds > 0
    assert usage.mean_cores == pytest.approx(usage.cpu_seconds / usage.wall_seconds)
    assert (usage.steps, usage.exit_code) == (400, RunnerExit.OK)
    assert usage.ns_per_day == pytest.approx(progress[-1].ns_per_day)
    assert (usage.memory_limit_mb, usage.cpu_limit) == (1024, 1.0)


async def test_checkpoint_events_match_the_files_on_disk(start_job: StartJob) -> None:
    spec = md_spec("md", steps=300, report_interval_steps=50, checkpoint_interval_steps=100)
    task, events, runner = await start_job("job-ckpt", spec)

    assert await runner.wait() == RunnerExit.OK, runner.stderr
    await events.wait_until(lambda: len(events.checkpoints) >= 3)
    _, checkpoints = events.of_attempt(1)
    # the last is of the final step: what an extend continues from
    assert [c.step for c in checkpoints] == [100, 200, 300]
    assert not await asyncio.to_thread(Path(checkpoints[0].path).exists), "the newest two kept"
    for checkpoint in checkpoints[1:]:
        path = Path(checkpoint.path)
        assert path.parent == task.job_dir / "checkpoints"
        assert on_disk(path) == (checkpoint.sha256, checkpoint.size_bytes)
        assert checkpoint.time_ps == pytest.approx(checkpoint.step * TIMESTEP_PS)
        sidecar = json.loads(path.with_suffix(".json").read_text())
        assert sidecar["sha256"] == checkpoint.sha256
        assert sidecar["step"] == checkpoint.step
        assert f'stepCount="{checkpoint.step}"' in text_of(path), "the XML carries the step"
        native = Path(checkpoint.native_path)
        assert native == path.with_suffix(".chk")
        assert on_disk(native)[0] == checkpoint.native_sha256 == sidecar["native_sha256"]
        assert checkpoint.platform == sidecar["platform"] == "CPU"
    assert events.checkpoints[0].event_id == "checkpoint:job-ckpt:1:100"


async def test_resume_after_kill_continues_the_trajectory(
    data_dir: Path, start_runner: StartRunner, start_job: StartJob
) -> None:
    spec = md_spec("md", steps=3000, report_interval_steps=20, checkpoint_interval_steps=100)
    first_task, events, first = await start_job("job-kill", spec)
    await events.wait_until(lambda: bool(events.checkpoints))
    first.process.kill()
    assert await first.wait() == -signal.SIGKILL
    # How far the attempt got is read from its energy table, final once it is dead; the
    # report of the newest checkpoint's step, sent before it on another stream, is waited for.
    newest = events.of_attempt(1)[1][-1].step
    await events.wait_until(lambda: newest in {p.step for p in events.of_attempt(1)[0]})
    before, checkpoints = events.of_attempt(1)
    last_row = last_energy_step(first_task.job_dir / "energies.csv")
    assert last_row < spec.steps, "the first attempt finished before it was killed"
    resume_from = pb.Checkpoint()
    resume_from.CopyFrom(next(c for c in checkpoints if c.step == newest))
    resume_from.copy_slot = "1.a"  # announced as copied too: the folder's own file comes first

    second = await start_runner(
        make_task(data_dir, "job-kill", spec, attempt=2, resume_from=resume_from)
    )
    assert await second.wait() == RunnerExit.OK, second.stderr
    await events.until_done()
    after, _ = events.of_attempt(2)
    assert after[0].step == resume_from.step + 20
    assert after[0].time_ps == pytest.approx(after[0].step * TIMESTEP_PS)
    assert after[-1].step == spec.steps
    assert after[-1].done_reason == "steps_reached"
    assert not events.fetched, "the job's folder held the checkpoint: nothing fetched"
    assert "no copy needed" in second.stderr
    at_checkpoint = next(p for p in before if p.step == resume_from.step)
    assert after[0].potential_kj_mol == pytest.approx(at_checkpoint.potential_kj_mol, rel=0.03)
    assert after[0].temperature_k == pytest.approx(at_checkpoint.temperature_k, abs=60)
    steps = [
        int(row.split(",")[0])
        for row in (first_task.job_dir / "energies.csv").read_text().splitlines()[1:]
    ]
    assert steps == list(range(20, spec.steps + 1, 20)), "the energy table is one trajectory"
    kept = sorted(path.name for path in (first_task.job_dir / "checkpoints").iterdir())
    assert kept == [
        "ckpt-000000002900.chk",
        "ckpt-000000002900.json",
        "ckpt-000000002900.xml",
        "ckpt-000000003000.chk",
        "ckpt-000000003000.json",
        "ckpt-000000003000.xml",
    ], "the newest checkpoint (the final step's) and the one before it are kept, nothing else"


async def test_a_retry_on_another_cluster_resumes_from_the_copied_checkpoint(
    nc: Client, subjects: Subjects, start_runner: StartRunner, tmp_path: Path, start_job: StartJob
) -> None:
    """The first attempt copies its checkpoints to the shared store as it runs (each copy
    announced with its lag) and is killed; the retry runs where no file of the job exists (the
    other cluster's data folder), fetches the announced copy, checks it and goes on from its
    step; its outputs are copied too, byte for byte what its outputs event announces."""
    spec = md_spec("md", steps=2000, report_interval_steps=20, checkpoint_interval_steps=100)
    _, events, first = await start_job("job-moves", spec)
    await events.wait_until(lambda: len(events.copied) >= 2)
    first.process.kill()
    assert await first.wait() == -signal.SIGKILL
    # every copy is announced after its checkpoint (on another stream): waited for
    copies = [event.copied for event in events.copied]
    await events.wait_until(
        lambda: {c.checkpoint.step for c in copies} <= {c.step for c in events.of_attempt(1)[1]}
    )
    _, checkpoints = events.of_attempt(1)
    assert all(c.checkpoint.copy_slot in ("1.a", "1.b") for c in copies)
    assert [c.checkpoint.copy_slot for c in copies[:2]] == ["1.a", "1.b"]  # slots alternate
    written = {c.step: c.sha256 for c in checkpoints}
    assert all(written[c.checkpoint.step] == c.checkpoint.sha256 for c in copies)
    assert all(0 <= c.copy_lag_s < 30 and c.bytes > c.checkpoint.size_bytes for c in copies)
    resume_from = copies[-1].checkpoint

    elsewhere = tmp_path / "other-cluster" / "data"
    second_task = make_task(elsewhere, "job-moves", spec, attempt=2, resume_from=resume_from)
    second = await start_runner(second_task)
    assert await second.wait() == RunnerExit.OK, second.stderr
    assert f"fetched the copy of checkpoint {resume_from.step}" in second.stderr
    await events.wait_until(lambda: bool(events.outputs) and bool(events.fetched))
    [told] = events.fetched  # once, for the attempt that resumed from it
    assert told.attempt == 2 and told.producer == "runner"
    assert told.fetched.checkpoint == resume_from
    assert told.fetched.bytes > resume_from.size_bytes and told.fetched.fetch_s > 0
    after, _ = events.of_attempt(2)
    assert after[0].step == resume_from.step + 20, "went on from the copy's step"
    assert after[-1].step == spec.steps
    fetched = second_task.job_dir.resolve() / "checkpoints" / f"ckpt-{resume_from.step:012d}.xml"
    assert f"resuming from {fetched} at step {resume_from.step}" in second.stderr
    client = CopyStore(nc.jetstream(), subjects)
    manifest = await client.outputs_manifest("job-moves", 2)
    assert manifest is not None
    announced = {f.kind: f.sha256 for f in events.outputs[-1].outputs.files}
    assert {f.kind: f.sha256 for f in manifest.files} == announced
    copied_back = await client.fetch(manifest, tmp_path / "downloaded")
    assert {sha256_file(path) for path in copied_back} == set(announced.values())


async def test_corrupt_resume_checkpoint_falls_back_to_the_previous_one(
    data_dir: Path, start_runner: StartRunner, start_job: StartJob
) -> None:
    spec = md_spec("md", steps=300, report_interval_steps=50, checkpoint_interval_steps=100)
    _, events, first = await start_job("job-corrupt", spec)
    assert await first.wait() == RunnerExit.OK, first.stderr
    await events.wait_until(lambda: len(events.checkpoints) >= 3)
    _, checkpoints = events.of_attempt(1)
    newest = checkpoints[-1]
    assert newest.step == 300  # the final step's
    flip_bytes(Path(newest.path))

    second = await start_runner(
        make_task(data_dir, "job-corrupt", spec, attempt=2, resume_from=newest)
    )
    assert await second.wait() == RunnerExit.OK, second.stderr
    await events.wait_until(lambda: len(events.of_attempt(2)[0]) >= 2)
    after, _ = events.of_attempt(2)
    assert after[0].step == 250, "resumed from the checkpoint of step 200"
    assert after[-1].step == 300
    assert "falling back to checkpoint" in second.stderr
    assert "ckpt-000000000200.xml" in second.stderr


async def test_a_pruned_resume_checkpoint_falls_back_to_the_newest_one_on_disk(
    data_dir: Path, start_runner: StartRunner, start_job: StartJob
) -> None:
    """Recovery announced an old checkpoint, and a runner that went on after its attempt was
    declared lost pruned it: the retry resumes from the newest verified checkpoint in the
    folder (later than the announced one), not from step 0."""
    spec = md_spec("md", steps=400, report_interval_steps=50, checkpoint_interval_steps=100)
    _, events, first = await start_job("job-pruned", spec)
    assert await first.wait() == RunnerExit.OK, first.stderr
    await events.wait_until(lambda: len(events.checkpoints) >= 3)
    _, checkpoints = events.of_attempt(1)
    announced = checkpoints[0]
    announced_path = Path(announced.path)
    on_disk = sorted(
        int(p.name[5:17]) for p in announced_path.parent.glob("ckpt-*.xml") if p != announced_path
    )
    assert on_disk and on_disk[-1] > announced.step
    for suffix in (".xml", ".chk", ".json"):
        announced_path.with_suffix(suffix).unlink(missing_ok=True)

    second = await start_runner(
        make_task(data_dir, "job-pruned", spec, attempt=2, resume_from=announced)
    )
    assert await second.wait() == RunnerExit.OK, second.stderr
    await events.wait_until(lambda: any(p.done_reason for p in events.of_attempt(2)[0]))
    after, _ = events.of_attempt(2)
    assert "starting over" not in second.stderr
    assert f"ckpt-{on_disk[-1]:012d}.xml" in second.stderr
    assert after[0].step > announced.step, "resumed from a later checkpoint"
    assert after[-1].step == 400


async def test_a_later_checkpoint_than_announced_is_the_one_resumed_from(
    data_dir: Path, start_runner: StartRunner, start_job: StartJob
) -> None:
    """The runner wrote a checkpoint it could not announce (NATS away, then the attempt
    declared lost): recovery announces the one before, intact, and the retry resumes from the
    later verified one on disk rather than recompute its steps."""
    spec = md_spec("md", steps=400, report_interval_steps=50, checkpoint_interval_steps=100)
    _, events, first = await start_job("job-later", spec)
    assert await first.wait() == RunnerExit.OK, first.stderr
    await events.wait_until(lambda: len(events.checkpoints) >= 4)
    announced = events.of_attempt(1)[1][-2]  # 300: the announcement of 400 was lost
    assert announced.step == 300

    longer = md_spec("md", steps=500, report_interval_steps=50, checkpoint_interval_steps=100)
    second = await start_runner(
        make_task(data_dir, "job-later", longer, attempt=2, resume_from=announced)
    )
    assert await second.wait() == RunnerExit.OK, second.stderr
    assert "later than the announced step 300: resuming from it" in second.stderr
    await events.wait_until(lambda: any(p.done_reason for p in events.of_attempt(2)[0]))
    after, _ = events.of_attempt(2)
    assert after[0].step == 450, "resumed from the checkpoint of step 400"
    assert after[-1].step == 500


async def test_sigterm_checkpoints_and_exits_preempted(start_job: StartJob) -> None:
    spec = md_spec("md", steps=100_000, report_interval_steps=50, checkpoint_interval_steps=50_000)
    port = free_port()
    _, events, runner = await start_job("job-term", spec, MDQ_RUNNER_METRICS_PORT=str(port))
    await events.wait_until(lambda: len(events.progress) >= 2)

    def scrape() -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
            return str(reply.read().decode())

    metrics = await asyncio.to_thread(scrape)
    assert 'md_step{attempt="1",job_id="job-term"}' in metrics
    assert 'md_energy{attempt="1",job_id="job-term"} -' in metrics
    for gauge in ("md_temperature_k", "md_ns_per_day", "md_eta_seconds", "md_density_g_cm3"):
        assert f'{gauge}{{attempt="1",job_id="job-term"}}' in metrics, gauge
    assert f'md_volume_nm3{{attempt="1",job_id="job-term"}} {BOX_NM**3}' in metrics

    runner.process.send_signal(signal.SIGTERM)
    assert await runner.wait() == RunnerExit.PREEMPTED, runner.stderr
    await events.wait_until(lambda: bool(events.checkpoints))
    progress, checkpoints = events.of_attempt(1)
    assert len(checkpoints) == 1
    checkpoint = checkpoints[0]
    assert 0 < checkpoint.step < spec.steps
    assert checkpoint.step >= progress[-1].step
    assert sha256_file(checkpoint.path) == checkpoint.sha256
    assert not any(p.done_reason for p in progress)
    assert "SIGTERM" in runner.stderr


async def test_minimize_md_analyze_chain(
    nc: Client, subjects: Subjects, data_dir: Path, start_runner: StartRunner
) -> None:
    minimize = make_task(
        data_dir,
        "chain-min",
        md_spec("min", task=pb.TASK_MINIMIZE, steps=60, report_interval_steps=20),
    )
    min_events = await tap(nc, subjects, minimize.job_id)
    runner = await start_runner(minimize)
    assert await runner.wait() == RunnerExit.OK, runner.stderr
    await min_events.until_done()
    min_progress, _ = min_events.of_attempt(1)
    assert min_progress[0].step == 0
    assert min_progress[-1].done_reason == "minimized"
    assert min_progress[-1].step > 0
    assert min_progress[-1].potential_kj_mol < min(0.0, min_progress[0].potential_kj_mol)
    assert all(p.kinetic_kj_mol == 0 for p in min_progress)
    assert len({p.step for p in min_progress}) == len(min_progress)
    assert (minimize.job_dir / "final_state.xml").is_file()

    md = make_task(
        data_dir,
        "chain-md",
        md_spec("md", steps=100, report_interval_steps=20),
        input_dirs=(minimize.job_dir,),
    )
    runner = await start_runner(md)
    assert await runner.wait() == RunnerExit.OK, runner.stderr
    assert "chain-min/final_state.xml" in runner.stderr

    analyze = make_task(
        data_dir,
        "chain-analyze",
        normalize_job(
            pb.JobSpec(name="analyze", task=pb.TASK_ANALYZE, depends_on=["min", "md"]), "jobs[0]"
        ),
        input_dirs=(minimize.job_dir, md.job_dir),
    )
    analyze_events = await tap(nc, subjects, analyze.job_id)
    runner = await start_runner(analyze)
    assert await runner.wait() == RunnerExit.OK, runner.stderr
    await analyze_events.wait_until(lambda: bool(analyze_events.progress))
    assert analyze_events.progress[-1].progress.done_reason == "analyzed"
    document = json.loads((analyze.job_dir / "analysis.json").read_text())
    by_job = {entry["job_id"]: entry for entry in document["inputs"]}
    assert list(by_job) == ["chain-min", "chain-md"]
    assert by_job["chain-min"]["samples"] == len(min_progress)
    assert by_job["chain-min"]["final_step"] == min_progress[-1].step
    assert by_job["chain-md"]["samples"] == 5
    assert by_job["chain-md"]["final_step"] == 100
    assert 100 < by_job["chain-md"]["temperature_k"]["mean"] < 600
    assert by_job["chain-md"]["potential_kj_mol"]["std"] > 0


async def test_large_tolerance_converges_early(start_job: StartJob) -> None:
    spec = md_spec(
        "md",
        steps=10_000,
        report_interval_steps=20,
        convergence=pb.Convergence(tolerance_kj_mol=1e6, reports=2),
    )
    task, events, runner = await start_job("job-converge", spec)
    assert await runner.wait() == RunnerExit.OK, runner.stderr
    await events.until_done()
    progress, _ = events.of_attempt(1)
    assert [p.step for p in progress] == [20, 40, 60]
    assert progress[-1].done_reason == "converged"
    assert (task.job_dir / "final_state.xml").is_file()


async def test_analyze_with_missing_input_is_invalid_input(
    data_dir: Path, start_runner: StartRunner, nc: Client
) -> None:
    missing = data_dir / "jobs" / "never-ran"
    task = make_task(
        data_dir,
        "job-bad-analyze",
        normalize_job(
            pb.JobSpec(name="analyze", task=pb.TASK_ANALYZE, depends_on=["x"]), "jobs[0]"
        ),
        input_dirs=(missing,),
    )
    runner = await start_runner(task)
    assert await runner.wait() == RunnerExit.INVALID_INPUT
    assert f"missing input: {missing / 'energies.csv'} does not exist" in runner.stderr
    assert not (task.job_dir / "analysis.json").exists()


async def test_exploding_simulation_exits_unstable(start_job: StartJob) -> None:
    spec = md_spec("md", steps=2000, report_interval_steps=20, temperature_k=5000, timestep_fs=5)
    task, events, runner = await start_job("job-unstable", spec)
    assert await runner.wait() == RunnerExit.UNSTABLE, runner.stderr
    assert "UNSTABLE" in runner.stderr
    assert "NaN" in runner.stderr
    assert not any(event.progress.done_reason for event in events.progress)
    assert not (task.job_dir / "final_state.xml").exists()


async def test_a_folder_past_max_disk_mb_stops_at_a_checkpoint(start_job: StartJob) -> None:
    """A runaway trajectory (a frame every step) fills the job's folder past its max_disk_mb:
    the runner checkpoints and exits LIMIT_EXCEEDED (FAILURE_LIMIT_EXCEEDED: never retried)
    long before its step target."""
    spec = md_spec(
        "md",
        steps=1_000_000,
        report_interval_steps=10,
        checkpoint_interval_steps=500_000,
        trajectory_interval_steps=1,
        max_disk_mb=1,
    )
    _, events, runner = await start_job("job-disk", spec)
    assert await runner.wait() == RunnerExit.LIMIT_EXCEEDED, runner.stderr
    assert "LIMIT_EXCEEDED: the job's folder holds" in runner.stderr
    await events.wait_until(lambda: bool(events.checkpoints))
    progress, checkpoints = events.of_attempt(1)
    [checkpoint] = checkpoints
    assert checkpoint.step == progress[-1].step < spec.steps
    assert sha256_file(checkpoint.path) == checkpoint.sha256
