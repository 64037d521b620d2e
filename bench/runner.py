"""Benchmark of the MD runner (``make bench-runner``): the same jobs bare and under the runner.

OpenMM's water box and Lennard-Jones fluid and a LAMMPS melt, each run bare
(``bench/bare_openmm.py``, ``bench/bare_lammps.py``) and through ``python -m services.runner``,
timed from outside by wall clock and steady rate, in ABBA rounds; every ratio is the median of
paired quotients. The last line printed is one JSON object. Method and keys:
docs/benchmarks.md, "make bench-runner".
"""

from __future__ import annotations

import argparse
import asyncio
import compileall
import csv
import hashlib
import json
import os
import statistics
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from google.protobuf import json_format
from nats.aio.client import Client
from nats.aio.msg import Msg

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository's tools/

from mdq.bus.codec import decode_event
from mdq.bus.connect import connect
from mdq.bus.inputs import InputDesk, ensure_inputs_bucket, upload
from mdq.bus.publisher import EventPublisher
from mdq.bus.subjects import Subjects
from mdq.contracts import pb
from mdq.core.runner_task import RunnerTask, job_dir
from mdq.core.spec import normalize_job
from mdq.embedded import SHARED_FILE_STORE, start_nats
from tools.processes import spawn_runner

REPO_ROOT = Path(__file__).resolve().parents[1]
REPORT_EVERY = 1_000
CHECKPOINT_EVERY = 10_000
QUICK = {
    "water_steps": 2_100,
    "water_box_nm": 2.5,
    "lammps_steps": 2_100,
    "report_every": 100,
    "checkpoint_every": 1_000,
}
LAMMPS_SCRIPT = REPO_ROOT / "examples" / "lammps" / "in.lj-melt"
LAMMPS_TIMESTEP_TAU = 0.005
"""The Lennard-Jones melt's time step (LAMMPS's lj default), in tau: the "ns/day" of that case
is in reduced time; its ratio and steps per second are what count."""
"""``--quick``: a smaller water box, a tenth of the steps and of both intervals (one checkpoint
still falls inside the run), one round."""
SECONDS_PER_DAY = 86_400.0
SIDES = ("bare", "mdq", "uncopied", "uncopied", "mdq", "bare")
"""One round: the bare loop, the runner, the runner without copies, and back (ABCCBA), so a
drift of the machine's load weighs on every side alike."""
ONLY_COPIED = ("bare", "mdq", "mdq", "bare")
"""One round with ``--no-uncopied`` (ABBA)."""
WARMUP_MINIMIZE_ITERATIONS = 100
SOURCES = ("libs", "services", "bench")
"""mdq's folders of modules that either side imports."""


@dataclass
class Timed:
    """One run as this process saw it: spawn to exit, and each report's receipt time."""

    steps: int
    timestep_ps: float
    wall_s: float
    reports: list[tuple[float, int]]
    """(receipt time on this process's monotonic clock, step), in order of receipt."""
    energy_rows: int
    self_reported_ns_per_day: float = 0.0

    def ns_per_day(self, steps: float, seconds: float) -> float:
        return steps * self.timestep_ps / 1000.0 / seconds * SECONDS_PER_DAY

    @property
    def wall_ns_per_day(self) -> float:
        return self.ns_per_day(self.steps, self.wall_s)

    @property
    def steady_ns_per_day(self) -> float:
        (first_at, first_step), (last_at, last_step) = self.reports[0], self.reports[-1]
        if last_step <= first_step or last_at <= first_at:
            raise RuntimeError(f"too few reports to time between: {self.reports}")
        return self.ns_per_day(last_step - first_step, last_at - first_at)


@dataclass
class Case:
    """One system of the benchmark and its measured runs."""

    name: str
    spec: pb.JobSpec
    atoms: int = 0
    bare: list[Timed] = field(default_factory=list)
    mdq: list[Timed] = field(default_factory=list)
    uncopied: list[Timed] = field(default_factory=list)
    """The runner with ``MDQ_RUNNER_COPY_TO_SHARED_STORE=false``: what copying costs."""

    def summary(self) -> dict[str, object]:
        steps_per_s = {
            "bare_steps_per_s": round(self.spec.steps / min(run.wall_s for run in self.bare), 2),
            "mdq_steps_per_s": round(self.spec.steps / min(run.wall_s for run in self.mdq), 2),
        }
        bare_wall = [run.wall_ns_per_day for run in self.bare]
        mdq_wall = [run.wall_ns_per_day for run in self.mdq]
        bare_steady = [run.steady_ns_per_day for run in self.bare]
        mdq_steady = [run.steady_ns_per_day for run in self.mdq]
        return {
            "atoms": self.atoms,
            "steps": self.spec.steps,
            "bare_ns_per_day": round(max(bare_wall), 3),
            "mdq_ns_per_day": round(max(mdq_wall), 3),
            **paired("ratio", mdq_wall, bare_wall),
            "bare_wall_s": round(min(run.wall_s for run in self.bare), 3),
            "mdq_wall_s": round(min(run.wall_s for run in self.mdq), 3),
            "bare_steady_ns_per_day": round(max(bare_steady), 3),
            "mdq_steady_ns_per_day": round(max(mdq_steady), 3),
            **paired("steady_ratio", mdq_steady, bare_steady),
            "mdq_self_reported_ns_per_day": round(
                max(run.self_reported_ns_per_day for run in self.mdq), 3
            ),
            "bare_runs": [round(value, 3) for value in bare_wall],
            "mdq_runs": [round(value, 3) for value in mdq_wall],
            "bare_steady_runs": [round(value, 3) for value in bare_steady],
            "mdq_steady_runs": [round(value, 3) for value in mdq_steady],
            "energy_rows": self.mdq[-1].energy_rows,
            **steps_per_s,
            **self.copies_summary(mdq_wall, mdq_steady),
        }

    def copies_summary(self, mdq_wall: list[float], mdq_steady: list[float]) -> dict[str, object]:
        """The runner copying its checkpoints and outputs against the same runner not
        copying them (the copies must not slow the MD loop)."""
        if not self.uncopied:
            return {}
        wall = [run.wall_ns_per_day for run in self.uncopied]
        steady = [run.steady_ns_per_day for run in self.uncopied]
        return {
            "uncopied_ns_per_day": round(max(wall), 3),
            "uncopied_steady_ns_per_day": round(max(steady), 3),
            **paired("copies_ratio", mdq_wall, wall),
            **paired("copies_steady_ratio", mdq_steady, steady),
            "uncopied_runs": [round(value, 3) for value in wall],
            "uncopied_steady_runs": [round(value, 3) for value in steady],
        }


def paired(key: str, numerators: list[float], denominators: list[float]) -> dict[str, object]:
    """``key``: the median of paired quotients, each run over the run of the other side next to
    it in the same round (the i-th of one side and the i-th of the other: bare, mdq | mdq, bare
    in ABBA; mdq, uncopied | uncopied, mdq in ABCCBA), so that a drift of the machine's load
    weighs on both sides of each quotient alike; ``key_pairs`` every quotient in run order,
    ``key_spread`` the largest minus the smallest, ``key_best`` the best run over the best run
    (what a quiet moment on one side alone can flatter: never a goal)."""
    if len(numerators) != len(denominators) or not numerators:
        raise RuntimeError(f"{key}: {len(numerators)} runs against {len(denominators)}")
    quotients = [top / bottom for top, bottom in zip(numerators, denominators, strict=True)]
    return {
        key: round(statistics.median(quotients), 4),
        f"{key}_pairs": [round(value, 4) for value in quotients],
        f"{key}_spread": round(max(quotients) - min(quotients), 4),
        f"{key}_best": round(max(numerators) / max(denominators), 4),
    }


def job_spec(
    name: str, system: pb.System, *, steps: int, report_every: int, checkpoint_every: int
) -> pb.JobSpec:
    spec = pb.JobSpec(
        name=name,
        system=system,
        steps=steps,
        seed=1,
        report_interval_steps=report_every,
        checkpoint_interval_steps=checkpoint_every,
    )
    return normalize_job(spec, "bench")


def lammps_spec(
    args: argparse.Namespace, *, steps: int, report_every: int, checkpoint_every: int
) -> pb.JobSpec:
    """The LAMMPS case: the Lennard-Jones melt of examples/lammps, its script an input file."""
    data = LAMMPS_SCRIPT.read_bytes()
    spec = pb.JobSpec(
        name="lj-melt",
        system=pb.System(
            lammps=pb.LammpsInput(
                script=LAMMPS_SCRIPT.name, variables={"N": str(args.lammps_cells)}
            )
        ),
        steps=steps,
        report_interval_steps=report_every,
        checkpoint_interval_steps=checkpoint_every,
    )
    spec.inputs.add(
        name=LAMMPS_SCRIPT.name, sha256=hashlib.sha256(data).hexdigest(), size_bytes=len(data)
    )
    return normalize_job(spec, "bench")


def energy_rows(path: Path) -> int:
    """Data rows of an energy table (CSV with a header)."""
    with path.open(newline="") as handle:
        return max(0, sum(1 for _ in csv.reader(handle)) - 1)


def check_checkpointed(spec: pb.JobSpec, folder: Path, side: str) -> None:
    if spec.steps > spec.checkpoint_interval_steps and not sorted(folder.glob("ckpt-*.xml")):
        raise RuntimeError(f"{side} wrote no checkpoint: the benchmark is not measuring one")


Said = tuple[str, int] | None
"""What one line of a bare run's output says: ``("step", n)``, ``("atoms", n)`` or nothing."""


async def bare_process(
    what: str, *arguments: str, said: Callable[[str], Said]
) -> tuple[list[tuple[float, int]], int, float]:
    """``python arguments`` from the repository, its output read as it comes: each step it
    reports with the time it arrived, its atom count, and its wall time. A non-zero exit
    raises, with the end of its stderr."""
    reports: list[tuple[float, int]] = []
    atoms = 0
    started = time.monotonic()
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        *arguments,
        cwd=REPO_ROOT,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert process.stdout is not None and process.stderr is not None
    errors = asyncio.create_task(process.stderr.read())
    async for line in process.stdout:
        received = time.monotonic()
        match said(line.decode()):
            case ("step", step):
                reports.append((received, step))
            case ("atoms", count):
                atoms = count
    returncode = await process.wait()
    wall = time.monotonic() - started
    if returncode != 0:
        raise RuntimeError(f"{what} exited {returncode}:\n{(await errors).decode()[-2000:]}")
    await errors
    return reports, atoms, wall


def openmm_said(line: str) -> Said:
    text = line.strip()
    if text.isdigit():  # the StateDataReporter's step column
        return "step", int(text)
    if text.startswith("atoms "):
        return "atoms", int(text.split()[1])
    return None


def lammps_said(line: str) -> Said:
    word, _, value = line.partition(" ")
    return (word, int(value)) if word in ("step", "atoms") else None


async def bare_run(spec: pb.JobSpec, *, threads: int, out_dir: Path) -> tuple[Timed, int]:
    """Plain OpenMM in a process of its own (``bench/bare_openmm.py``); and the atom count."""
    reports, atoms, wall = await bare_process(
        "bare OpenMM",
        str(REPO_ROOT / "bench" / "bare_openmm.py"),
        json_format.MessageToJson(spec, indent=None),
        str(out_dir),
        f"--threads={threads}",
        f"--report-every={spec.report_interval_steps}",
        f"--checkpoint-every={spec.checkpoint_interval_steps}",
        f"--warmup={WARMUP_MINIMIZE_ITERATIONS}",
        said=openmm_said,
    )
    if (
        spec.steps >= spec.checkpoint_interval_steps
        and not (out_dir / "checkpoints" / "checkpoint.chk").is_file()
    ):
        raise RuntimeError("bare OpenMM wrote no checkpoint: the benchmark is not measuring one")
    timed = Timed(
        steps=spec.steps,
        timestep_ps=spec.timestep_fs / 1000.0,
        wall_s=wall,
        reports=reports,
        energy_rows=energy_rows(out_dir / "energies.csv"),
    )
    return timed, atoms


def is_lammps(spec: pb.JobSpec) -> bool:
    return bool(spec.system.WhichOneof("kind") == "lammps")


def timestep_of(spec: pb.JobSpec) -> float:
    return LAMMPS_TIMESTEP_TAU if is_lammps(spec) else spec.timestep_fs / 1000.0


async def bare_lammps_run(spec: pb.JobSpec, *, threads: int, out_dir: Path) -> tuple[Timed, int]:
    """The bare loop of the lammps module in a process of its own (``bench/bare_lammps.py``);
    and the atom count."""
    variables = [
        argument
        for name, value in sorted(spec.system.lammps.variables.items())
        for argument in ("--var", name, value)
    ]
    reports, atoms, wall = await bare_process(
        "bare LAMMPS",
        str(REPO_ROOT / "bench" / "bare_lammps.py"),
        str(LAMMPS_SCRIPT),
        str(out_dir),
        f"--steps={spec.steps}",
        f"--threads={threads}",
        f"--report-every={spec.report_interval_steps}",
        f"--checkpoint-every={spec.checkpoint_interval_steps}",
        *variables,
        said=lammps_said,
    )
    if spec.steps > spec.checkpoint_interval_steps and not sorted(
        (out_dir / "checkpoints").glob("ckpt-*.restart")
    ):
        raise RuntimeError("bare LAMMPS wrote no restart: the benchmark is not measuring one")
    timed = Timed(
        steps=spec.steps,
        timestep_ps=LAMMPS_TIMESTEP_TAU,
        wall_s=wall,
        reports=reports,
        energy_rows=energy_rows(out_dir / "energies.csv"),
    )
    return timed, atoms


async def stage_inputs(client: Client, subjects: Subjects, job_id: str, spec: pb.JobSpec) -> None:
    """What intake does for a job with input files: the files in the operator's bucket and
    the job's submitted event (the desk serves a job what its spec names)."""
    js = client.jetstream()
    bucket = await ensure_inputs_bucket(js, subjects, max_bytes=64 << 20)
    await upload(js, bucket, LAMMPS_SCRIPT)
    publisher = EventPublisher(js=js, subjects=subjects, producer="intake")
    await publisher.publish(
        publisher.event("submitted", pb.JobSubmitted(spec=spec), job_id=job_id, attempt=0)
    )


async def mdq_run(
    spec: pb.JobSpec, *, threads: int, nats_url: str, data_dir: Path, run: int, copies: bool = True
) -> Timed:
    """The real runner in a process of its own, timed from spawn to exit and by the receipt
    of its progress events; ``copies``: whether it copies its checkpoints and outputs to the
    shared store (its default)."""
    subjects = Subjects(f"bench{os.getpid()}r{run}")
    client = await connect(nats_url, name="bench-runner", subjects=subjects)
    job_id = f"{spec.name}-{run}"
    reports: list[tuple[float, int]] = []
    finished: asyncio.Future[pb.Progress] = asyncio.get_running_loop().create_future()

    async def on_progress(message: Msg) -> None:
        received = time.monotonic()
        progress = decode_event(message.data).progress
        reports.append((received, progress.step))
        if progress.done_reason and not finished.done():
            finished.set_result(progress)

    await client.jetstream().subscribe(
        subjects.progress(job_id), cb=on_progress, ordered_consumer=True
    )
    desk: InputDesk | None = None
    if spec.inputs:  # a LAMMPS job: its script comes through intake's desk
        await stage_inputs(client, subjects, job_id, spec)
        desk = InputDesk(client, subjects)
        await desk.start()
    task = RunnerTask(
        job_id=job_id,
        attempt=1,
        spec=spec,
        job_dir=job_dir(data_dir, job_id),
        threads=threads,
    )
    started = time.monotonic()
    process = await spawn_runner(
        task,
        nats_url,
        subjects.namespace,
        cwd=REPO_ROOT,
        stderr=asyncio.subprocess.PIPE,
        extra_env={
            "MDQ_RUNNER_WARMUP_MINIMIZE_ITERATIONS": str(WARMUP_MINIMIZE_ITERATIONS),
            "MDQ_RUNNER_COPY_TO_SHARED_STORE": str(copies).lower(),
        },
    )
    _, stderr = await process.communicate()
    wall = time.monotonic() - started
    if process.returncode != 0:
        raise RuntimeError(f"runner exited {process.returncode}:\n{stderr.decode()[-2000:]}")
    last = await asyncio.wait_for(finished, 30)
    if desk is not None:
        await desk.stop()
    await client.drain()
    folder = task.job_dir / "checkpoints"
    if is_lammps(spec):
        if spec.steps > spec.checkpoint_interval_steps and not sorted(folder.glob("*.restart")):
            raise RuntimeError("the runner wrote no restart: the benchmark is not measuring one")
    else:
        check_checkpointed(spec, folder, "the runner")
    return Timed(
        steps=spec.steps,
        timestep_ps=timestep_of(spec),
        wall_s=wall,
        reports=reports,
        energy_rows=energy_rows(task.job_dir / "energies.csv"),
        self_reported_ns_per_day=last.ns_per_day,
    )


def compile_bytecode() -> None:
    """Compile the installed packages and mdq's own modules to bytecode (up-to-date files are
    skipped), so both sides import them as the runner's image does (pip compiles what it
    installs): under ``PYTHONDONTWRITEBYTECODE`` (the images' setting) a process compiles every
    module it imports from source, each time, which no deployed runner pays."""
    packages = Path(sysconfig.get_paths()["purelib"])
    for folder in (packages, *(REPO_ROOT / name for name in SOURCES)):
        compileall.compile_dir(folder, quiet=2, workers=0)


def min_of(summaries: dict[str, dict[str, object]], key: str) -> float | None:
    """The lowest ``key`` over the systems; None where no system measured it."""
    values = [float(summary[key]) for summary in summaries.values() if key in summary]  # type: ignore[arg-type]
    return min(values) if values else None


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--rounds", type=int, default=3, help="rounds per system (each ABCCBA, or ABBA)"
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=os.cpu_count() or 1,
        help="engine CPU threads on both sides (default: every core)",
    )
    parser.add_argument("--water-steps", type=int, default=10_500)
    parser.add_argument("--lj-steps", type=int, default=21_000)
    parser.add_argument("--water-box-nm", type=float, default=3.0)
    parser.add_argument("--lj-atoms", type=int, default=1000)
    parser.add_argument("--lammps-steps", type=int, default=10_500)
    parser.add_argument(
        "--lammps-cells", type=int, default=10, help="fcc cells a side (4 N^3 atoms)"
    )
    parser.add_argument(
        "--systems",
        default="water_box,lennard_jones,lammps",
        help="comma-separated subset to run",
    )
    parser.add_argument("--report-every", type=int, default=REPORT_EVERY)
    parser.add_argument("--checkpoint-every", type=int, default=CHECKPOINT_EVERY)
    parser.add_argument(
        "--quick", action="store_true", help=f"water box and LAMMPS only, one round, {QUICK}"
    )
    parser.add_argument(
        "--no-uncopied",
        action="store_true",
        help="skip the runs of the runner that does not copy to the shared store",
    )
    args = parser.parse_args()
    if args.quick:
        args.systems, args.rounds = "water_box,lammps", 1
        for key, value in QUICK.items():
            setattr(args, key, value)
    intervals = {"report_every": args.report_every, "checkpoint_every": args.checkpoint_every}

    cases = [
        Case(
            name="water_box",
            spec=job_spec(
                "water",
                pb.System(water_box=pb.WaterBox(box_nm=args.water_box_nm)),
                steps=args.water_steps,
                **intervals,
            ),
        ),
        Case(
            name="lennard_jones",
            spec=job_spec(
                "argon",
                pb.System(lennard_jones=pb.LennardJonesFluid(atoms=args.lj_atoms)),
                steps=args.lj_steps,
                **intervals,
            ),
        ),
        Case(name="lammps", spec=lammps_spec(args, steps=args.lammps_steps, **intervals)),
    ]
    wanted = set(args.systems.split(","))
    cases = [case for case in cases if case.name in wanted]
    if not cases:
        parser.error(
            f"--systems: choose from water_box, lennard_jones, lammps, got {args.systems!r}"
        )
    compile_bytecode()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="mdq-bench-runner-") as temp:
        # a namespace per run, on one server
        nats = start_nats(Path(temp) / "nats", max_file_store=SHARED_FILE_STORE)
        data_dir = Path(temp) / "data"
        run = 0
        try:
            for case in cases:
                for _ in range(args.rounds):
                    for side in ONLY_COPIED if args.no_uncopied else SIDES:
                        run += 1
                        if side == "bare":
                            bare = bare_lammps_run if is_lammps(case.spec) else bare_run
                            timed, case.atoms = await bare(
                                case.spec, threads=args.threads, out_dir=Path(temp) / f"bare{run}"
                            )
                            case.bare.append(timed)
                        else:
                            timed = await mdq_run(
                                case.spec,
                                threads=args.threads,
                                nats_url=nats.url,
                                data_dir=data_dir,
                                run=run,
                                copies=side == "mdq",
                            )
                            (case.mdq if side == "mdq" else case.uncopied).append(timed)
                        print(
                            f"{case.name:14s} {side:4s} wall {timed.wall_s:7.2f} s "
                            f"= {timed.wall_ns_per_day:8.3f} ns/day, steady "
                            f"{timed.steady_ns_per_day:8.3f} ns/day "
                            f"(load {os.getloadavg()[0]:.2f})",
                            flush=True,
                        )
                # the runner also reports the last step; OpenMM's reporter only every R steps
                reports = case.spec.steps // case.spec.report_interval_steps
                final = int(case.spec.steps % case.spec.report_interval_steps != 0)
                rows = {timed.energy_rows for timed in case.mdq + case.uncopied}
                if not is_lammps(case.spec):
                    rows |= {timed.energy_rows + final for timed in case.bare}
                else:
                    rows |= {timed.energy_rows for timed in case.bare}
                if len(rows) != 1 or min(rows) < reports:
                    raise RuntimeError(f"{case.name}: the sides reported differently: {rows} rows")
        finally:
            nats.stop()
    summaries = {case.name: case.summary() for case in cases}
    worst = min(summaries, key=lambda name: float(summaries[name]["ratio"]))  # type: ignore[arg-type]
    for name, summary in summaries.items():
        print(
            f"{name:14s} wall clock: bare {summary['bare_ns_per_day']} ns/day, mdq "
            f"{summary['mdq_ns_per_day']} ns/day, ratio {summary['ratio']}; steady: bare "
            f"{summary['bare_steady_ns_per_day']}, mdq {summary['mdq_steady_ns_per_day']}, "
            f"ratio {summary['steady_ratio']}",
            flush=True,
        )
    result = {
        "bare_ns_per_day": summaries[worst]["bare_ns_per_day"],
        "mdq_ns_per_day": summaries[worst]["mdq_ns_per_day"],
        "ratio": summaries[worst]["ratio"],
        "bare_steady_ns_per_day": summaries[worst]["bare_steady_ns_per_day"],
        "mdq_steady_ns_per_day": summaries[worst]["mdq_steady_ns_per_day"],
        "steady_ratio": summaries[worst]["steady_ratio"],
        "lammps_ratio": summaries["lammps"]["ratio"] if "lammps" in summaries else None,
        "lammps_bare_steps_per_s": (
            summaries["lammps"]["bare_steps_per_s"] if "lammps" in summaries else None
        ),
        "copies_ratio": min_of(summaries, "copies_ratio"),
        "copies_steady_ratio": min_of(summaries, "copies_steady_ratio"),
        "measured": "by the bench: spawn to exit (wall), report receipt times (steady)",
        "worst_system": worst,
        "systems": summaries,
        "threads": args.threads,
        "report_every_steps": args.report_every,
        "checkpoint_every_steps": args.checkpoint_every,
        "quick": args.quick,
        "load_avg_before": [round(value, 2) for value in load_before],
        "load_avg_after": [round(value, 2) for value in os.getloadavg()],
        "cpus": os.cpu_count(),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    asyncio.run(main())
