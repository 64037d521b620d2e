"""Benchmark: how fast mdq recovers, and how much MD work a failure costs.

On the whole stack, measured from outside: the time from a pod's deletion to the next
attempt's runner, and the steps lost to kill -9 of runners at random steps, checked against the
files on disk. Usage: ``make bench-recovery`` (``--quick``); the last line printed is one JSON
object. Method and keys: docs/benchmarks.md, "make bench-recovery".
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
from bench_figures import percentile
from bench_stack import BenchFailed, failing_as, servers, stack_on

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository's tools/

from mdq.backends.local.api import LocalBackend
from mdq.bus.codec import decode_event
from mdq.contracts import pb
from mdq.core import ids
from mdq.core.runner_task import ENV_ATTEMPT, ENV_JOB_ID, job_dir
from mdq.sdk.client import MdqClient
from mdq.testing.runner_files import (
    checkpoint_steps,
    energy_rows,
    last_energy_step,
    logged_resume,
    newest_checkpoint_step,
    retry_table_problem,
)
from tools.processes import runner_environments
from tools.submitting import submit_request, water_job

CHECKPOINT_INTERVAL = 1000
REPORT_INTERVAL = 10
"""Reports (rows of the runner's energy table) every 10 steps: the resolution of the step a
killed runner had reached."""


def runner_process(job_id: str, attempt: int) -> psutil.Process | None:
    """The runner process of one attempt of ``job_id`` on this machine, or None."""
    for process, env in runner_environments():
        if env.get(ENV_JOB_ID) == job_id and env.get(ENV_ATTEMPT) == str(attempt):
            return process
    return None


async def resumed_step(log_path: Path, timeout: float = 180.0) -> int:
    """The step a runner says (in its own log) it resumed from; 0 if it started over."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (step := logged_resume(log_path)) is not None:
            return step
        await asyncio.sleep(0.1)
    raise BenchFailed(f"{log_path} never said which step the retry resumed from")


@dataclass(frozen=True)
class Kill:
    """One kill -9 and what the runners' own files say it cost."""

    last_step: int
    """The killed runner's last reported step, from its energy table."""
    newest_checkpoint: int
    """The newest checkpoint file in the job's folder when the runner died."""
    resumed_from: int
    """The step the retry's runner logged it resumed from."""
    mdq_reported: int
    """steps_lost of mdq's requeued event (for comparison only)."""

    @property
    def steps_lost(self) -> int:
        return self.last_step - self.resumed_from


def job(name: str, steps: int) -> dict[str, object]:
    return water_job(
        name,
        steps=steps,
        report_interval_steps=REPORT_INTERVAL,
        checkpoint_interval_steps=CHECKPOINT_INTERVAL,
        max_retries=20,
    )


async def submit(client: MdqClient, key: str, *jobs: dict[str, object]) -> list[str]:
    return await client.submit_when_ready(submit_request(*jobs, key=key), within_s=600)


class Tap:
    """Every lifecycle and progress event of the namespace, as it happens."""

    def __init__(self) -> None:
        self.events: list[pb.Event] = []
        self.changed = asyncio.Event()

    async def start(self, client: MdqClient) -> None:
        js = client.nc.jetstream()

        async def on_message(message: object) -> None:
            self.events.append(decode_event(message.data))  # type: ignore[attr-defined]
            self.changed.set()

        await js.subscribe(client.subjects.job_all("*"), cb=on_message, ordered_consumer=True)
        await js.subscribe(client.subjects.progress_all, cb=on_message, ordered_consumer=True)

    def find(self, kind: str, job_id: str, attempt: int) -> pb.Event | None:
        for event in self.events:
            if (
                event.job_id == job_id
                and event.attempt == attempt
                and event.WhichOneof("body") == kind
            ):
                return event
        return None

    def last_step(self, job_id: str, attempt: int) -> int:
        steps = [
            e.progress.step
            for e in self.events
            if e.job_id == job_id and e.attempt == attempt and e.WhichOneof("body") == "progress"
        ]
        return steps[-1] if steps else -1

    async def until(self, probe, timeout: float = 180.0):  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + timeout
        while (found := probe()) is None or found is False:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("benchmark wait timed out")
            self.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), timeout=min(remaining, 1.0))
        return found


def current_attempt(tap: Tap, job_id: str) -> int:
    attempts = [
        e.attempt for e in tap.events if e.job_id == job_id and e.WhichOneof("body") == "started"
    ]
    return max(attempts) if attempts else 0


async def measure_evictions(
    client: MdqClient, tap: Tap, backend: LocalBackend, count: int
) -> list[float]:
    """Delete running pods one after the other; time delete → the next attempt's runner
    process in the process table."""
    job_ids = await submit(client, "bench-evict", job("evict-a", 10**7), job("evict-b", 10**7))
    timings: list[float] = []
    for index in range(count):
        victim = job_ids[index % len(job_ids)]
        attempt = await tap.until(lambda v=victim: current_attempt(tap, v) or None)
        await tap.until(lambda v=victim, a=attempt: tap.last_step(v, a) >= 0 or None)
        if runner_process(victim, attempt) is None:
            raise BenchFailed(f"eviction {index + 1}: no runner process of {victim}#{attempt}")
        started = time.monotonic()
        await backend.delete_pod(ids.pod_name(victim, attempt))
        deadline = started + 180
        while runner_process(victim, attempt + 1) is None:
            if time.monotonic() > deadline:
                raise BenchFailed(f"{victim}#{attempt + 1} was not running 180 s after eviction")
            await asyncio.sleep(0.02)
        timings.append(time.monotonic() - started)
        print(
            f"eviction {index + 1}/{count}: {victim} attempt {attempt} → attempt "
            f"{attempt + 1}'s runner process up in {timings[-1]:.2f} s",
            flush=True,
        )
    return timings


async def measure_kills(
    client: MdqClient, tap: Tap, data_dir: Path, count: int, rng: random.Random
) -> list[Kill]:
    """kill -9 runners at random steps; what each cost, from the runners' own files."""
    [job_id] = await submit(client, "bench-kill", job("kill", 10**7))
    folder = job_dir(data_dir, job_id)
    kills: list[Kill] = []
    attempt = 1
    for index in range(count):
        # The tap only paces the kills (when to strike); nothing measured comes from it.
        await tap.until(lambda a=attempt: tap.find("started", job_id, a))
        await tap.until(lambda a=attempt: tap.last_step(job_id, a) >= 0 or None, timeout=300)
        base = tap.last_step(job_id, attempt)
        target = base + rng.randrange(CHECKPOINT_INTERVAL + 100, 3 * CHECKPOINT_INTERVAL, 100)
        await tap.until(
            lambda a=attempt, t=target: tap.last_step(job_id, a) >= t or None, timeout=300
        )
        victim = runner_process(job_id, attempt)
        if victim is None:
            raise BenchFailed(
                f"kill {index + 1}: no runner process of {job_id}#{attempt} at step ≥ {target}"
            )
        victim.send_signal(signal.SIGKILL)
        try:
            victim.wait(timeout=10)
        except psutil.TimeoutExpired:
            raise BenchFailed(f"runner pid {victim.pid} still alive 10 s after kill -9") from None
        last_step = last_energy_step(folder / "energies.csv")
        killed_rows = energy_rows(folder / "energies.csv")
        on_disk = checkpoint_steps(folder / "checkpoints")
        newest = newest_checkpoint_step(folder / "checkpoints")
        resumed = await resumed_step(data_dir / "pods" / f"{ids.pod_name(job_id, attempt + 1)}.log")
        if resumed and resumed not in on_disk:
            raise BenchFailed(f"kill {index + 1}: the retry says step {resumed}, no such file")
        requeued = await tap.until(
            lambda a=attempt: tap.find("requeued", job_id, a + 1), timeout=120
        )
        # The table is read once the retry reported past its resume (the tap only paces).
        await tap.until(
            lambda a=attempt, r=resumed: tap.last_step(job_id, a + 1) > r or None, timeout=300
        )
        problem = retry_table_problem(
            killed_rows, energy_rows(folder / "energies.csv"), resumed, REPORT_INTERVAL
        )
        if problem:
            raise BenchFailed(f"kill {index + 1}: the retry's energy table: {problem}")
        kill = Kill(
            last_step=last_step,
            newest_checkpoint=newest,
            resumed_from=resumed,
            mdq_reported=requeued.requeued.steps_lost,
        )
        if last_step < 0:
            raise BenchFailed(f"the killed runner's energy table {folder} has no row")
        kills.append(kill)
        print(
            f"kill {index + 1}/{count}: runner pid {victim.pid} at step {last_step} "
            f"(its table; newest checkpoint {newest}), retry resumed from {resumed}: "
            f"{kill.steps_lost} steps lost (mdq reported {kill.mdq_reported})",
            flush=True,
        )
        attempt += 1
    return kills


async def main(evictions: int, kills: int, seed: int) -> dict[str, object]:
    env = {
        "MDQ_METRICS_INTERVAL_S": "1",
        "MDQ_LOCAL_CPU_PER_NODE": "1",
        "MDQ_RECOVERY_BACKOFF_BASE_S": "0.5",
        "MDQ_RECOVERY_BACKOFF_FACTOR": "1",
        "MDQ_RECOVERY_QUARANTINE_AFTER": "1000",
    }
    async with (
        servers("mdq-bench-recovery-") as bus_and_db,
        stack_on(bus_and_db, "benchrec", local_nodes=3, extra_env=env, grace_s=5.0) as stack,
        await MdqClient.connect(bus_and_db.nats_url, "benchrec") as client,
    ):
        tap = Tap()
        await tap.start(client)
        backend = LocalBackend(nc=client.nc, subjects=client.subjects)
        timings = await measure_evictions(client, tap, backend, evictions)
        await backend.close()
        measured = await measure_kills(client, tap, stack.data_dir, kills, random.Random(seed))
    lost = [kill.steps_lost for kill in measured]
    return {
        "recoveries": len(timings),
        "p50_recovery_s": round(statistics.median(timings), 3),
        "p95_recovery_s": round(percentile(timings, 0.95), 3),
        "max_recovery_s": round(max(timings), 3),
        "runner_kills": len(lost),
        "max_steps_lost": max(lost),
        "mean_steps_lost": round(statistics.mean(lost), 1),
        "steps_lost": lost,
        "step_resolution_steps": REPORT_INTERVAL,
        "resumed_older_than_newest_checkpoint": sum(
            kill.resumed_from < kill.newest_checkpoint for kill in measured
        ),
        "mdq_reported_max_steps_lost": max(kill.mdq_reported for kill in measured),
        "kills_where_mdq_reported_other_steps_lost": sum(
            kill.mdq_reported != kill.steps_lost for kill in measured
        ),
        "checkpoint_interval_steps": CHECKPOINT_INTERVAL,
        "load_avg": [round(x, 2) for x in os.getloadavg()],
        "measured": "steps: runner's energies.csv at kill minus its retry's logged resume, "
        "checked against the checkpoint files at kill and the retry's energies.csv; time: bench "
        "clock, delete to the retry's runner process; mdq_reported_*: mdq's own events, in no "
        "figure",
        "slurm_requeue_steps_lost": "everything since the start",
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--evictions", type=int, default=30)
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--quick", action="store_true", help="5 evictions, 3 kills")
    args = parser.parse_args()
    if args.quick:
        args.evictions, args.kills = 5, 3
    if args.evictions < 1 or args.kills < 1:
        parser.error("--evictions and --kills must be at least 1")
    with failing_as("recovery"):
        result = asyncio.run(main(args.evictions, args.kills, args.seed))
    print(json.dumps(result))
