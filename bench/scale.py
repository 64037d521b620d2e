"""Benchmark of history size: ``make bench-scale`` (constant memory, instant restart).

Placement, recovery and intake are started cold and then restarted on a namespace with no
history and one with a year of ended jobs; restart time, resident memory and jobs bound per
second are compared big over empty, then bench-history's PostgreSQL half runs. The last line
printed is one JSON object. Method, keys and goals: docs/benchmarks.md, "make bench-scale".
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil
from google.protobuf.message import Message
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from mdq.bus.connect import connect
from mdq.bus.subjects import Subjects
from mdq.contracts import pb
from mdq.core import ids
from mdq.core.events import make_event
from mdq.core.producers import EVENT_PRODUCERS
from mdq.core.spec import normalize_job
from mdq.embedded import SHARED_FILE_STORE, SYNC_SERVER_DEFAULT, start_nats

REPO = Path(__file__).resolve().parents[1]
NODES = 1000
NODE_CORES = 64
NODE_MEMORY_MB = 256 * 1024
MEMORY_MB_PER_CORE = 4096
LIVE_JOBS = 20
"""Jobs still running in each namespace's history (recovery's live state, one fails later)."""
TIMEOUT_S = float(os.environ.get("MDQ_BENCH_TIMEOUT_S", "600"))
"""The longest wait for any one step (a step that takes longer fails the bench)."""
WINDOW = 2000
"""Publishes in flight while the history is written."""


def _event(kind: str, body: Message, job: str, attempt: int) -> pb.Event:
    """An event as its producer would publish it, stamped now (placement takes a node whose
    last report is old for gone)."""
    producer = sorted(EVENT_PRODUCERS[kind])[0]
    return make_event(
        kind, body, job_id=job, attempt=attempt, producer=producer, at=datetime.now(UTC)
    )


SPEC = normalize_job(pb.JobSpec(name="j", steps=1000), "jobs[0]")


def submitted(job: str, cores: int = 1) -> pb.Event:
    """A job's submitted event, asking for ``cores`` (and 4 GiB each)."""
    spec = pb.JobSpec()
    spec.CopyFrom(SPEC)
    spec.resources.cpu, spec.resources.memory_mb = cores, cores * MEMORY_MB_PER_CORE
    return _event("submitted", pb.JobSubmitted(spec=spec, request_id=job[:-2]), job, 0)


def job_name(prefix: str, index: int) -> str:
    return f"{prefix}{index:08x}-j"


def lifecycle(job: str, *, ends: bool) -> list[pb.Event]:
    node = f"node{hash(job) % NODES}"
    events = [
        submitted(job),
        _event("bound", pb.JobBound(node=node, pod_name=ids.pod_name(job, 1)), job, 1),
        _event("started", pb.JobStarted(node=node), job, 1),
    ]
    if ends:
        events.append(_event("succeeded", pb.JobSucceeded(final_step=1000), job, 1))
    return events


async def publish_events(js: JetStreamContext, subjects: Subjects, events: list[pb.Event]) -> None:
    """Publish ``events`` in order of job, ``WINDOW`` at a time (each job's own events in
    order: a window holds whole jobs, published one after another per job)."""
    pending: list[asyncio.Future[Any]] = []
    for event in events:
        pending.append(
            asyncio.ensure_future(
                js.publish(
                    subjects.for_event(event),
                    event.SerializeToString(),
                    headers={"Nats-Msg-Id": event.event_id},
                )
            )
        )
        if len(pending) >= WINDOW:
            await asyncio.gather(*pending)
            pending.clear()
    await asyncio.gather(*pending)


async def write_history(nc: Client, subjects: Subjects, ended: int) -> None:
    js = nc.jetstream()
    batch: list[pb.Event] = []
    for index in range(ended):
        # one job's events in one window, in order (the stream keeps publish order per subject
        # and the fold fences by state, so a job's events must not overtake each other)
        batch.extend(lifecycle(job_name("h", index), ends=True))
        if len(batch) >= WINDOW:
            await publish_events_ordered(js, subjects, batch)
            batch.clear()
    for index in range(LIVE_JOBS):
        batch.extend(lifecycle(job_name("live", index), ends=False))
    await publish_events_ordered(js, subjects, batch)


async def publish_events_ordered(
    js: JetStreamContext, subjects: Subjects, events: list[pb.Event]
) -> None:
    """Each job's events in order: one round per position in its lifecycle."""
    by_position: dict[int, list[pb.Event]] = {}
    seen: dict[str, int] = {}
    for event in events:
        position = seen.get(event.job_id, 0)
        seen[event.job_id] = position + 1
        by_position.setdefault(position, []).append(event)
    for position in sorted(by_position):
        await publish_events(js, subjects, by_position[position])


async def report_nodes(nc: Client, subjects: Subjects) -> None:
    js = nc.jetstream()
    while True:
        publishes = []
        for index in range(NODES):
            load = pb.NodeLoad(
                node=f"node{index}",
                cpu_load=0.1,
                memory_load=0.1,
                cpu_capacity=NODE_CORES,
                memory_capacity_mb=NODE_MEMORY_MB,
                ready=True,
            )
            event = _event("node_load", load, "", 0)
            event.event_id = f"node_load:node{index}:{time.time_ns()}"
            publishes.append(js.publish(subjects.for_event(event), event.SerializeToString()))
        await asyncio.gather(*publishes)
        await asyncio.sleep(2.0)


@contextlib.contextmanager
def services(env: dict[str, str], logs: Path) -> Iterator[dict[str, subprocess.Popen[bytes]]]:
    commands = {
        "placement": [sys.executable, "bench/placement_noop.py"],
        "recovery": [sys.executable, "-m", "services.recovery"],
        "intake": [sys.executable, "-m", "services.intake"],
    }
    logs.mkdir(parents=True, exist_ok=True)
    children = {
        name: subprocess.Popen(
            command,
            cwd=REPO,
            env=env,
            stdout=(logs / f"{name}.log").open("ab"),
            stderr=subprocess.STDOUT,
        )
        for name, command in commands.items()
    }
    try:
        yield children
    finally:
        for child in children.values():
            child.kill()
            child.wait()


@dataclass
class Arrivals:
    """Core-NATS subscription that notes when each awaited event arrived."""

    at: dict[str, float] = field(default_factory=dict)

    async def on_message(self, message: Msg) -> None:
        event = pb.Event()
        event.ParseFromString(message.data)
        self.at.setdefault(event.job_id, time.perf_counter())


async def wait_until(what: str, check: Any, timeout: float) -> None:
    deadline = time.perf_counter() + timeout
    while not await check():
        if time.perf_counter() > deadline:
            raise TimeoutError(f"{what}: not after {timeout:.0f} s")
        await asyncio.sleep(0.02)


async def snapshots_cover_the_log(js: JetStreamContext, subjects: Subjects) -> bool:
    """Whether placement's and recovery's snapshots are at the jobs stream's last sequence."""
    last = (await js.stream_info(subjects.jobs_stream)).state.last_seq
    for bucket in (subjects.placement_snapshot_bucket, subjects.recovery_snapshot_bucket):
        try:
            head = json.loads((await (await js.key_value(bucket)).get("head")).value or b"{}")
        except Exception:
            return False
        if head.get("sequence") != last:
            return False
    return True


def submit_payload(key: str) -> bytes:
    request = pb.SubmitRequest(idempotency_key=key)
    job = request.jobs.add(name="j", steps=1000)
    job.resources.cpu, job.resources.memory_mb = 1, 512
    return request.SerializeToString()


async def one_start(
    nc: Client, subjects: Subjects, env: dict[str, str], logs: Path, *, label: str, burst: int
) -> dict[str, float]:
    """Start the three services, time them to their first act, sample their memory, measure
    the burst; end with kill -9 of each once the snapshots cover the log."""
    js = nc.jetstream()
    bound, requeued = Arrivals(), Arrivals()
    subs = [
        await nc.subscribe(subjects.job("*", "bound"), cb=bound.on_message),
        await nc.subscribe(subjects.job("*", "requeued"), cb=requeued.on_message),
    ]
    first_job, failing = job_name(f"first{label}", 0), job_name("live", 0)
    out: dict[str, float] = {}
    started = time.perf_counter()
    with services(env, logs) as children:
        # what each service must answer as soon as it can: a new job, a failed live one, a submit
        await publish_events(js, subjects, [submitted(first_job)])
        if label == "restart":
            failure = pb.AttemptFailed(reason=pb.FAILURE_CRASHED, node="node0", last_step=10)
            await publish_events(js, subjects, [_event("attempt_failed", failure, failing, 1)])

        async def first_bound() -> bool:
            return first_job in bound.at

        await wait_until(f"{label}: first bound", first_bound, TIMEOUT_S)
        out["first_bound_s"] = bound.at[first_job] - started
        while True:
            try:
                await nc.request(subjects.api_submit, submit_payload(f"probe-{label}"), timeout=5)
                break
            except Exception:
                if time.perf_counter() - started > 600:
                    raise
        out["intake_first_answer_s"] = time.perf_counter() - started
        if label == "restart":

            async def decided() -> bool:
                return failing in requeued.at

            await wait_until("recovery's first decision", decided, 600)
            out["recovery_first_decision_s"] = requeued.at[failing] - started
        await asyncio.sleep(2.0)  # settled: what each holds once caught up
        for name, child in children.items():
            out[f"rss_mb_{name}"] = psutil.Process(child.pid).memory_info().rss / 2**20
        # jobs bound per second: a burst of submitted events published at once
        jobs = [job_name(f"burst{label}", i) for i in range(burst)]
        burst_started = time.perf_counter()
        await publish_events(
            js, subjects, [submitted(job, 1 + i % 16) for i, job in enumerate(jobs)]
        )

        async def all_bound() -> bool:
            return all(job in bound.at for job in jobs)

        await wait_until(f"{label}: burst bound", all_bound, 600)
        out["bound_per_s"] = burst / (max(bound.at[job] for job in jobs) - burst_started)

        async def covered() -> bool:
            return await snapshots_cover_the_log(js, subjects)

        await wait_until(f"{label}: snapshots", covered, 600)
    for sub in subs:
        await sub.unsubscribe()
    return out


async def namespace_run(
    url: str, root: Path, name: str, history: int, burst: int
) -> dict[str, dict[str, float]]:
    subjects = Subjects(f"scale{name}")
    nc = await connect(url, name=f"bench-scale-{name}", subjects=subjects)
    try:
        write_started = time.perf_counter()
        await write_history(nc, subjects, history)
        info = await nc.jetstream().stream_info(subjects.jobs_stream)
        written = {
            "history_write_s": time.perf_counter() - write_started,
            "jobs_stream_messages": float(info.state.messages),
            "jobs_stream_mb": info.state.bytes / 2**20,
        }
        reporter = asyncio.create_task(report_nodes(nc, subjects))
        env = os.environ | {
            "NATS_URL": url,
            "MDQ_NAMESPACE": subjects.namespace,
            "MDQ_DATA_DIR": str(root / name / "data"),
            "MDQ_PLACEMENT_LEADER_ELECTION": "false",
            "MDQ_PLACEMENT_LOAD_SETTLE_S": "0",
            "MDQ_PLACEMENT_SNAPSHOT_INTERVAL_S": "1",
            "MDQ_RECOVERY_SNAPSHOT_INTERVAL_S": "1",
            "MDQ_RECOVERY_BACKOFF_BASE_S": "0",
            "MDQ_BENCH_LOG_LEVEL": "INFO",
            "PYTHONPATH": str(REPO),
        }
        logs = root / name / "logs"
        cold = await one_start(nc, subjects, env, logs, label="cold", burst=burst)
        restart = await one_start(nc, subjects, env, logs, label="restart", burst=burst)
        reporter.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reporter
        return {"written": written, "cold": cold, "restart": restart}
    finally:
        await nc.drain()


async def run(history: int, burst: int) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="mdq-bench-scale-"))
    server = start_nats(  # two namespaces on one server
        root / "nats", sync_interval=SYNC_SERVER_DEFAULT, max_file_store=SHARED_FILE_STORE
    )
    try:
        empty = await namespace_run(server.url, root, "empty", 0, burst)
        big = await namespace_run(server.url, root, "big", history, burst)
    finally:
        server.stop()
    restart_big, restart_empty = big["restart"], empty["restart"]
    summary: dict[str, Any] = {"history_jobs": history, "burst_jobs": burst}
    for service in ("placement", "recovery", "intake"):
        summary[f"rss_ratio_{service}"] = round(
            restart_big[f"rss_mb_{service}"] / restart_empty[f"rss_mb_{service}"], 3
        )
    summary["restart_to_first_bound_s"] = round(restart_big["first_bound_s"], 3)
    summary["restart_ratio"] = round(
        restart_big["first_bound_s"] / restart_empty["first_bound_s"], 3
    )
    summary["bound_per_s_ratio"] = round(
        restart_big["bound_per_s"] / restart_empty["bound_per_s"], 3
    )
    summary["cold_start_to_first_bound_s"] = round(big["cold"]["first_bound_s"], 3)
    for name, result in (("empty", empty), ("big", big)):
        for phase, values in result.items():
            for key, value in values.items():
                summary[f"{name}_{phase}_{key}"] = round(value, 3)
    return summary


PG_KEYS = (
    "pg_jobs",
    "pg_progress_rows",
    "pg_job_events_rows",
    "pg_p99_ms",
    "pg_p99_ms_max",
    "pg_slowest",
)


def postgresql_part(*, quick: bool) -> dict[str, Any]:
    """The second part: ``bench/history_pg.py`` in its own process, after the bus
    part has stopped everything it started; its ``pg_*`` keys (and its slowest query)."""
    command = [sys.executable, str(Path(__file__).with_name("history_pg.py"))]
    done = subprocess.run(
        [*command, *(["--quick"] if quick else [])], check=True, capture_output=True, text=True
    )
    measured = json.loads(done.stdout.strip().splitlines()[-1])
    return {key: measured[key] for key in PG_KEYS}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--history", type=int, default=200_000, help="ended jobs in 'big'")
    parser.add_argument("--burst", type=int, default=3000, help="jobs of the bound/s burst")
    parser.add_argument("--quick", action="store_true", help="20,000 ended jobs, burst 1,000")
    parser.add_argument(
        "--no-pg",
        action="store_true",
        help="skip the PostgreSQL part (bench/history_pg.py: 1,000,000 jobs, 20,000,000 rows)",
    )
    args = parser.parse_args()
    if args.quick:
        args.history, args.burst = 20_000, 1000
    load = os.getloadavg()[0]
    summary = asyncio.run(run(args.history, args.burst))
    if not args.no_pg:
        summary.update(postgresql_part(quick=args.quick))
    summary["quick"] = args.quick
    summary["cpus"] = os.cpu_count() or 0
    summary["load_average_at_start"] = round(load, 2)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
