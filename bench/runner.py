"""Benchmark of the MD runner: ``make bench-runner``.

OpenMM speed (ns/day) of the same systems, bare against under the runner:

* **bare**: in this process, the system built by the runner's own recipe
  (``services.runner.system.build_system``: same force field, cutoff, constraints, integrator,
  platform and threads), the same warm-up (100 minimiser iterations, velocities at
  temperature), then ``integrator.step(steps)`` in one call and nothing else;
* **mdq**: the real runner (``python -m services.runner``) on that job, publishing a progress
  event every 1,000 steps and writing a checkpoint (State XML + native checkpoint, fsynced,
  sha256 read back, event published) every 10,000 steps, to an embedded NATS JetStream. Its
  speed is the one it reports in its last progress event: measured from its first step to its
  last report, so it includes every report, checkpoint and publish, but not the start-up
  (imports, building the system, connecting) that the bare run does not time either.

Systems: a water box of 2,661 atoms (3 nm TIP3P, PME, 2 fs) and an argon Lennard-Jones fluid
of 1,000 atoms (reduced density 0.8442, 2.5 sigma cutoff). OpenMM runs one CPU thread by
default (``--threads``): on a 2-core machine two threads would share the cores with NATS, the
runner's event loop and this process, and a fast system's per-step thread barriers turn every
such interruption into lost time, which measures the machine rather than the runner. Runs
alternate bare, mdq, mdq, bare (ABBA) per round so drifts of the machine's load hit both sides
alike; each side's speed is the best of its runs (the least disturbed by other load on this
shared machine), and the ratio of the means is printed too. The last line printed is one JSON
object with ``bare_ns_per_day``, ``mdq_ns_per_day`` and ``ratio`` of the system with the worst
ratio, every system's figures, and the load average before and after.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from nats.aio.msg import Msg

from mdq.bus.codec import decode_event
from mdq.bus.connect import connect
from mdq.bus.subjects import Subjects
from mdq.contracts import pb
from mdq.core.runner_task import RunnerTask, job_dir
from mdq.core.spec import normalize_job
from mdq.embedded import start_nats
from services.runner.system import build_system

REPO_ROOT = Path(__file__).resolve().parents[1]
REPORT_EVERY = 1_000
CHECKPOINT_EVERY = 10_000
SECONDS_PER_DAY = 86_400.0
WARMUP_MINIMIZE_ITERATIONS = 100


@dataclass
class Case:
    """One system of the benchmark and its measured speeds."""

    name: str
    spec: pb.JobSpec
    atoms: int = 0
    bare: list[float] = field(default_factory=list)
    mdq: list[float] = field(default_factory=list)

    def summary(self) -> dict[str, object]:
        bare, mdq = max(self.bare), max(self.mdq)
        return {
            "atoms": self.atoms,
            "steps": self.spec.steps,
            "bare_ns_per_day": round(bare, 3),
            "mdq_ns_per_day": round(mdq, 3),
            "ratio": round(mdq / bare, 4),
            "bare_runs": [round(value, 3) for value in self.bare],
            "mdq_runs": [round(value, 3) for value in self.mdq],
            "ratio_of_means": round(statistics.fmean(self.mdq) / statistics.fmean(self.bare), 4),
        }


def job_spec(name: str, system: pb.System, *, steps: int) -> pb.JobSpec:
    spec = pb.JobSpec(
        name=name,
        system=system,
        steps=steps,
        seed=1,
        report_interval_steps=REPORT_EVERY,
        checkpoint_interval_steps=CHECKPOINT_EVERY,
    )
    return normalize_job(spec, "bench")


def bare_ns_per_day(spec: pb.JobSpec, *, threads: int) -> tuple[float, int]:
    """Speed of plain OpenMM stepping on the runner's system; and the atom count."""
    md = build_system(spec, threads=threads)
    md.start_fresh(
        minimize_iterations=WARMUP_MINIMIZE_ITERATIONS,
        temperature_k=spec.temperature_k,
        seed=spec.seed,
    )
    integrator = md.simulation.integrator
    started = time.perf_counter()
    integrator.step(spec.steps)
    md.context.getState(getEnergy=True)  # make sure the work is done (GPU platforms queue it)
    elapsed = time.perf_counter() - started
    return spec.steps * md.timestep_ps / 1000.0 / elapsed * SECONDS_PER_DAY, md.atoms


async def mdq_ns_per_day(
    spec: pb.JobSpec, *, threads: int, nats_url: str, data_dir: Path, run: int
) -> float:
    """Speed the real runner reports in its last progress event."""
    subjects = Subjects(f"bench{os.getpid()}r{run}")
    client = await connect(nats_url, name="bench-runner", subjects=subjects)
    job_id = f"{spec.name}-{run}"
    finished: asyncio.Future[pb.Progress] = asyncio.get_running_loop().create_future()

    async def on_progress(message: Msg) -> None:
        progress = decode_event(message.data).progress
        if progress.done_reason and not finished.done():
            finished.set_result(progress)

    await client.jetstream().subscribe(
        subjects.progress(job_id), cb=on_progress, ordered_consumer=True
    )
    task = RunnerTask(
        job_id=job_id,
        attempt=1,
        spec=spec,
        job_dir=job_dir(data_dir, job_id),
        threads=threads,
    )
    env = {
        **os.environ,
        **task.to_env(),
        "NATS_URL": nats_url,
        "MDQ_NAMESPACE": subjects.namespace,
        "MDQ_DATA_DIR": str(data_dir),
        "MDQ_RUNNER_WARMUP_MINIMIZE_ITERATIONS": str(WARMUP_MINIMIZE_ITERATIONS),
    }
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "services.runner",
        env=env,
        cwd=REPO_ROOT,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    _, stderr = await process.communicate()
    if process.returncode != 0:
        raise RuntimeError(f"runner exited {process.returncode}:\n{stderr.decode()[-2000:]}")
    progress = await asyncio.wait_for(finished, 30)
    await client.drain()
    checkpoints = sorted((task.job_dir / "checkpoints").glob("ckpt-*.xml"))
    if spec.steps > CHECKPOINT_EVERY and not checkpoints:
        raise RuntimeError("the runner wrote no checkpoint: the benchmark is not measuring one")
    return progress.ns_per_day


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=1, help="ABBA rounds per system")
    parser.add_argument(
        "--threads", type=int, default=1, help="OpenMM CPU threads (1 leaves a core to NATS)"
    )
    parser.add_argument("--water-steps", type=int, default=10_500)
    parser.add_argument("--lj-steps", type=int, default=21_000)
    parser.add_argument("--water-box-nm", type=float, default=3.0)
    parser.add_argument("--lj-atoms", type=int, default=1000)
    parser.add_argument(
        "--systems", default="water_box,lennard_jones", help="comma-separated subset to run"
    )
    args = parser.parse_args()

    cases = [
        Case(
            name="water_box",
            spec=job_spec(
                "water",
                pb.System(water_box=pb.WaterBox(box_nm=args.water_box_nm)),
                steps=args.water_steps,
            ),
        ),
        Case(
            name="lennard_jones",
            spec=job_spec(
                "argon",
                pb.System(lennard_jones=pb.LennardJonesFluid(atoms=args.lj_atoms)),
                steps=args.lj_steps,
            ),
        ),
    ]
    wanted = set(args.systems.split(","))
    cases = [case for case in cases if case.name in wanted]
    if not cases:
        parser.error(f"--systems: choose from water_box, lennard_jones, got {args.systems!r}")
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="mdq-bench-runner-") as temp:
        nats = start_nats(Path(temp) / "nats")
        data_dir = Path(temp) / "data"
        run = 0
        try:
            for case in cases:
                for _ in range(args.rounds):
                    for side in ("bare", "mdq", "mdq", "bare"):
                        run += 1
                        if side == "bare":
                            speed, case.atoms = bare_ns_per_day(case.spec, threads=args.threads)
                            case.bare.append(speed)
                        else:
                            speed = await mdq_ns_per_day(
                                case.spec,
                                threads=args.threads,
                                nats_url=nats.url,
                                data_dir=data_dir,
                                run=run,
                            )
                            case.mdq.append(speed)
                        print(
                            f"{case.name:14s} {side:4s} {speed:10.3f} ns/day "
                            f"(load {os.getloadavg()[0]:.2f})",
                            flush=True,
                        )
        finally:
            nats.stop()
    summaries = {case.name: case.summary() for case in cases}
    worst = min(summaries, key=lambda name: float(summaries[name]["ratio"]))  # type: ignore[arg-type]
    for name, summary in summaries.items():
        print(
            f"{name:14s} bare {summary['bare_ns_per_day']} ns/day, mdq "
            f"{summary['mdq_ns_per_day']} ns/day, ratio {summary['ratio']}",
            flush=True,
        )
    result = {
        "bare_ns_per_day": summaries[worst]["bare_ns_per_day"],
        "mdq_ns_per_day": summaries[worst]["mdq_ns_per_day"],
        "ratio": summaries[worst]["ratio"],
        "worst_system": worst,
        "systems": summaries,
        "threads": args.threads,
        "report_every_steps": REPORT_EVERY,
        "checkpoint_every_steps": CHECKPOINT_EVERY,
        "load_avg_before": [round(value, 2) for value in load_before],
        "load_avg_after": [round(value, 2) for value in os.getloadavg()],
        "cpus": os.cpu_count(),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    asyncio.run(main())
