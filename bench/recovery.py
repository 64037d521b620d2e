"""Benchmark: how fast mdq recovers, and how much MD work a failure costs.

Runs the whole stack (embedded NATS and PostgreSQL, every service, the local backend with three
nodes, real OpenMM runners) and injects:

1. evictions/preemptions (the failure classes retried at once): the pod of a running attempt is
   deleted (SIGTERM: the runner checkpoints and exits PREEMPTED); timed from the delete to the
   next attempt's pod running (its ``started`` event);
2. kill -9 of runners at random steps: the steps lost per recovery (the work done past the
   checkpoint the retry resumes from) against the checkpoint interval.

Usage: ``make bench-recovery`` (``python -m bench.recovery --evictions 30 --kills 10``).
The last line printed is one JSON object with the figures.
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
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from google.protobuf import json_format

from mdq.backends.local.api import LocalBackend
from mdq.bus.codec import decode_event
from mdq.contracts import pb
from mdq.core import ids
from mdq.embedded import start_nats, start_postgres
from mdq.sdk.client import IntakeUnavailable, MdqClient
from mdq.stack import Stack
from mdq.testing.processes import runner_pid

CHECKPOINT_INTERVAL = 1000


def job(name: str, steps: int) -> dict[str, object]:
    return {
        "name": name,
        "system": {"water_box": {"box_nm": 1.6}},
        "steps": steps,
        "report_interval_steps": 100,
        "checkpoint_interval_steps": CHECKPOINT_INTERVAL,
        "resources": {"cpu": 1, "memory_mb": 1024},
        "max_retries": 20,
    }


async def submit(client: MdqClient, key: str, *jobs: dict[str, object]) -> list[str]:
    request = json_format.ParseDict(
        {"idempotency_key": key, "jobs": list(jobs)}, pb.SubmitRequest()
    )
    for _ in range(120):
        try:
            return await client.submit(request, timeout=5)
        except IntakeUnavailable:
            await asyncio.sleep(0.5)
    raise RuntimeError("intake never answered")


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
        await js.subscribe(client.subjects.progress("*"), cb=on_message, ordered_consumer=True)

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
    """Delete running pods one after the other; time delete → next attempt running."""
    job_ids = await submit(client, "bench-evict", job("evict-a", 10**7), job("evict-b", 10**7))
    timings: list[float] = []
    for index in range(count):
        victim = job_ids[index % len(job_ids)]
        attempt = await tap.until(lambda v=victim: current_attempt(tap, v) or None)
        await tap.until(lambda v=victim, a=attempt: tap.last_step(v, a) >= 0 or None)
        started = time.monotonic()
        failed_at = datetime.now(UTC)
        await backend.delete_pod(ids.pod_name(victim, attempt))
        event = await tap.until(lambda v=victim, a=attempt: tap.find("started", v, a + 1))
        running_at = event.time.ToDatetime(tzinfo=UTC)
        timings.append((running_at - failed_at).total_seconds())
        print(
            f"eviction {index + 1}/{count}: {victim} attempt {attempt} → running again in "
            f"{timings[-1]:.2f} s (waited {time.monotonic() - started:.2f} s)",
            flush=True,
        )
    return timings


async def measure_kills(client: MdqClient, tap: Tap, count: int, rng: random.Random) -> list[int]:
    """kill -9 runners at random steps; return the steps lost per recovery."""
    [job_id] = await submit(client, "bench-kill", job("kill", 10**7))
    lost: list[int] = []
    attempt = 1
    for index in range(count):
        await tap.until(lambda a=attempt: tap.find("started", job_id, a))
        await tap.until(lambda a=attempt: tap.last_step(job_id, a) >= 0 or None, timeout=300)
        base = tap.last_step(job_id, attempt)
        target = base + rng.randrange(CHECKPOINT_INTERVAL + 100, 3 * CHECKPOINT_INTERVAL, 100)
        await tap.until(
            lambda a=attempt, t=target: tap.last_step(job_id, a) >= t or None, timeout=300
        )
        pid = runner_pid(job_id)
        if pid is None:
            continue
        os.kill(pid, signal.SIGKILL)
        requeued = await tap.until(
            lambda a=attempt: tap.find("requeued", job_id, a + 1), timeout=120
        )
        lost.append(requeued.requeued.steps_lost)
        print(
            f"kill {index + 1}/{count}: at step ≥ {target}, resumed from "
            f"{requeued.requeued.resume_from.step}, {lost[-1]} steps lost",
            flush=True,
        )
        attempt += 1
    return lost


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


async def main(evictions: int, kills: int, seed: int) -> dict[str, object]:
    root = Path(tempfile.mkdtemp(prefix="mdq-bench-recovery-"))
    nats = start_nats(root / "nats")
    postgres = start_postgres(root / "pg", keep=False)
    stack = Stack(
        state_dir=root / "state",
        namespace="benchrec",
        nats_url=nats.url,
        database_url=postgres.url,
        metrics_port=0,
        local_nodes=3,
        extra_env={
            "MDQ_METRICS_INTERVAL_S": "1",
            "MDQ_LOCAL_CPU_PER_NODE": "1",
            "MDQ_RECOVERY_BACKOFF_BASE_S": "0.5",
            "MDQ_RECOVERY_BACKOFF_FACTOR": "1",
            "MDQ_RECOVERY_QUARANTINE_AFTER": "1000",
        },
        grace_s=5.0,
    )
    await stack.start()
    try:
        async with await MdqClient.connect(nats.url, "benchrec") as client:
            tap = Tap()
            await tap.start(client)
            backend = LocalBackend(nc=client.nc, subjects=client.subjects)
            timings = await measure_evictions(client, tap, backend, evictions)
            await backend.close()
            lost = await measure_kills(client, tap, kills, random.Random(seed))
    finally:
        await stack.stop()
        nats.stop()
        postgres.stop()
    return {
        "recoveries": len(timings),
        "p50_recovery_s": round(statistics.median(timings), 3),
        "p95_recovery_s": round(percentile(timings, 0.95), 3),
        "max_recovery_s": round(max(timings), 3),
        "runner_kills": len(lost),
        "max_steps_lost": max(lost) if lost else 0,
        "mean_steps_lost": round(statistics.mean(lost), 1) if lost else 0,
        "checkpoint_interval_steps": CHECKPOINT_INTERVAL,
        "slurm_requeue_steps_lost": "everything since the start",
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--evictions", type=int, default=30)
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--seed", type=int, default=11)
    args = parser.parse_args()
    result = asyncio.run(main(args.evictions, args.kills, args.seed))
    print(json.dumps(result))
