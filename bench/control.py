"""Benchmark: how fast job control stops running work, and how fast it cancels a flood.

On the whole stack, measured from outside: cancel to runner exit against a raw SIGTERM, a bulk
cancel of pending jobs by one label against publishing as many events, and what must be zero
at the end. Usage: ``make bench-control`` (``--quick``); the last line printed is one JSON object.
Method, keys and runs: docs/benchmarks.md, "make bench-control".
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import statistics
import sys
import time
from pathlib import Path

import psutil
from bench_figures import percentile
from bench_stack import BenchFailed, failing_as, servers, stack_on
from nats.aio.msg import Msg
from nats.js.api import DeliverPolicy, StreamConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository's tools/

from mdq.bus.codec import decode_event, encode
from mdq.bus.requests import Requests
from mdq.contracts import pb
from mdq.core.runner_task import ENV_JOB_ID, job_dir
from mdq.sdk.client import ControlUnavailable, IntakeUnavailable, MdqClient
from tools.processes import ENV_NAMESPACE, runner_environments
from tools.submitting import submit_request, water_job

NAMESPACE = "benchctl"
NODES = 4
WAVE = NODES
"""Running jobs per wave: one per node."""
TERMINAL = ("succeeded", "failed", "cancelled")
BATCH = 512
"""Publishes awaited together (placement's ``bind_concurrency``, which its control uses)."""


def runner_processes(namespace: str) -> dict[str, psutil.Process]:
    """job id -> its live runner process, of ``namespace``, on this machine."""
    found: dict[str, psutil.Process] = {}
    for process, env in runner_environments():
        if env.get(ENV_NAMESPACE) == namespace and env.get(ENV_JOB_ID) and not gone(process):
            found[env[ENV_JOB_ID]] = process
    return found


def gone(process: psutil.Process) -> bool:
    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


async def until_gone(process: psutil.Process, timeout: float = 60.0) -> float:
    """Seconds until ``process`` is gone (polled every 10 ms)."""
    started = time.monotonic()
    while not gone(process):
        if time.monotonic() - started > timeout:
            raise BenchFailed(f"runner pid {process.pid} still alive {timeout:g} s later")
        await asyncio.sleep(0.01)
    return time.monotonic() - started


def running_job(name: str) -> dict[str, object]:
    """A job that runs until it is told to stop (no checkpoint due for a million steps)."""
    return water_job(
        name,
        steps=100_000_000,
        report_interval_steps=100,
        checkpoint_interval_steps=1_000_000,
        labels={"bench": "running"},
    )


async def submit(client: MdqClient, key: str, jobs: list[dict[str, object]]) -> list[str]:
    request = submit_request(*jobs, key=key)
    return await client.submit_when_ready(request, within_s=600, answer_within_s=30)


async def wave_running(job_ids: list[str], timeout: float = 300.0) -> dict[str, psutil.Process]:
    """Until every job of the wave has a runner that has stepped (its energy table has a row);
    their processes."""
    deadline = time.monotonic() + timeout
    while True:
        processes = runner_processes(NAMESPACE)
        if all(job in processes for job in job_ids):
            return {job: processes[job] for job in job_ids}
        if time.monotonic() > deadline:
            missing = [job for job in job_ids if job not in processes]
            raise BenchFailed(f"no runner process for {missing} after {timeout:g} s")
        await asyncio.sleep(0.2)


def newest_checkpoint_mtime(folder: Path) -> float:
    files = list((folder / "checkpoints").glob("ckpt-*.xml"))
    return max((path.stat().st_mtime for path in files), default=0.0)


async def stepped(folder: Path, timeout: float = 300.0) -> None:
    """Until the runner has written a report row (it is past building its system)."""
    deadline = time.monotonic() + timeout
    table = folder / "energies.csv"
    while not (table.is_file() and table.stat().st_size > 60):
        if time.monotonic() > deadline:
            raise BenchFailed(f"{table} has no report after {timeout:g} s")
        await asyncio.sleep(0.1)


async def measure_waves(
    client: MdqClient, data_dir: Path, waves: int
) -> tuple[list[float], list[float], int]:
    """Per wave, WAVE running jobs: one SIGTERMed raw (timed; its place in the wave rotates),
    the others cancelled through mdq (timed), one by one; the raw one (requeued by recovery)
    is cancelled untimed before the next wave. Returns
    (mdq cancel-to-exit times, raw SIGTERM-to-exit times, jobs checkpointed on cancel)."""
    through_mdq: list[float] = []
    raw: list[float] = []
    checkpointed = 0
    for wave in range(waves):
        names = [f"w{wave}-j{index}" for index in range(WAVE)]
        job_ids = await submit(client, f"bench-wave-{wave}", [running_job(n) for n in names])
        processes = await wave_running(job_ids)
        for job in job_ids:
            await stepped(job_dir(data_dir, job))
        for index, job in enumerate(job_ids):
            process = processes[job]
            mdq = index != wave % WAVE  # one raw SIGTERM a wave, a different place each time
            started = time.monotonic()
            wall_started = time.time()
            if mdq:
                await client.cancel([job], reason="bench")
            else:
                process.send_signal(signal.SIGTERM)
            waited = await until_gone(process)
            took = time.monotonic() - started if mdq else waited
            (through_mdq if mdq else raw).append(took)
            if mdq and newest_checkpoint_mtime(job_dir(data_dir, job)) >= wall_started:
                checkpointed += 1
            print(
                f"wave {wave + 1}/{waves} {job}: "
                f"{'mdq cancel' if mdq else 'raw SIGTERM'} → runner gone in {took:.3f} s",
                flush=True,
            )
        # the raw SIGTERMed jobs are requeued by recovery: cancel them (untimed) and wait until
        # no runner of the wave is left before the next
        reply = await client.cancel(labels={"bench": "running"}, reason="bench wave end")
        await client.wait_control("cancel", reply, timeout=300)
        deadline = time.monotonic() + 120
        while any(job in runner_processes(NAMESPACE) for job in job_ids):
            if time.monotonic() > deadline:
                raise BenchFailed(f"runners of wave {wave + 1} left after it was cancelled")
            await asyncio.sleep(0.1)
    return through_mdq, raw, checkpointed


def pending_job(name: str) -> dict[str, object]:
    """A job no node can take (more cores than any has): it stays PENDING."""
    return {
        "name": name,
        "steps": 1000,
        "resources": {"cpu": 64, "memory_mb": 512},
        "labels": {"bench": "bulk"},
    }


async def measure_bulk(client: MdqClient, count: int) -> tuple[float, float]:
    """(seconds from one cancel by label to every job CANCELLED in the log, the best of two raw
    rounds publishing as many events of the same size: one before, one after)."""
    per_submit = 500
    for start in range(0, count, per_submit):
        names = [f"b{index}" for index in range(start, min(count, start + per_submit))]
        await submit(client, f"bench-bulk-{start}", [pending_job(n) for n in names])
    print(f"{count} pending jobs submitted", flush=True)
    # a request that changes nothing tells when placement holds them all (a positive marker)
    deadline = time.monotonic() + 300
    while True:
        probe = await client.reprioritize(labels={"bench": "bulk"}, priority_class="normal")
        if probe.matched >= count:
            break
        if time.monotonic() > deadline:
            raise BenchFailed(f"placement held {probe.matched} of {count} jobs after 300 s")
        await asyncio.sleep(0.5)
    raw_before = await raw_publish(client, count, 1)
    js = client.nc.jetstream()
    logged: set[str] = set()
    all_logged = asyncio.Event()

    async def on_cancelled(message: Msg) -> None:
        event = decode_event(message.data)
        if event.WhichOneof("body") == "cancelled" and event.job_id.split("-", 1)[1][:1] == "b":
            logged.add(event.job_id)
            if len(logged) >= count:
                all_logged.set()

    # from the stream's end on: every cancelled event stored after the request, as stored
    watch = await js.subscribe(
        client.subjects.job_all("*").replace(".>", ".cancelled"),
        cb=on_cancelled,
        ordered_consumer=True,
        deliver_policy=DeliverPolicy.NEW,
    )
    started = time.monotonic()
    reply = await client.cancel(labels={"bench": "bulk"}, reason="bench bulk", timeout=120)
    if reply.matched != count:
        raise BenchFailed(f"the selector matched {reply.matched} of {count} jobs")
    try:
        await asyncio.wait_for(all_logged.wait(), timeout=300)
    except TimeoutError:
        raise BenchFailed(
            f"{len(logged)} of {count} bulk jobs CANCELLED in the log within 300 s"
        ) from None
    bulk_s = time.monotonic() - started
    await watch.unsubscribe()
    print(f"bulk: {count} jobs CANCELLED in the log {bulk_s:.3f} s after one request", flush=True)
    raw_s = min(raw_before, await raw_publish(client, count, 2))
    return bulk_s, raw_s


async def raw_publish(client: MdqClient, count: int, round_: int) -> float:
    """The raw floor of a bulk cancel: ``count`` events the size of a ``cancelled``, each with
    its own message id, published to a scratch stream of the same server (atomic batches
    allowed, as the jobs stream) with the fastest path there is: JetStream atomic batches, one
    flush each (``Requests.publish_batch``), in placement's batches of ``BATCH``, from this
    process; seconds until the last is acknowledged."""
    js = client.nc.jetstream()
    sample = pb.Event(event_id="cancelled:000000000000-b0:1", job_id="000000000000-b0", attempt=1)
    sample.cancelled.message = "cancelled by the operator: bench bulk"
    sample.cancelled.origin.control_id = "000000000000"
    sample.cancelled.origin.requested_by = "the operator"
    data = encode(sample)
    stream = f"BENCHRAW{round_}"
    await js.add_stream(
        StreamConfig(name=stream, subjects=[f"benchraw{round_}.>"], allow_atomic=True)
    )
    requests = await Requests(client.nc).start()
    batch = [
        (f"benchraw{round_}.{index}", data, {"Nats-Msg-Id": f"raw-{index}"})
        for index in range(count)
    ]
    started = time.monotonic()
    results: list[object] = []
    for first in range(0, count, BATCH):  # as placement publishes: a batch under one timer
        results += await requests.publish_batch(batch[first : first + BATCH])
    took = time.monotonic() - started
    await requests.close()
    await js.delete_stream(stream)
    if failed := [result for result in results if isinstance(result, Exception)]:
        raise BenchFailed(f"the raw baseline: {len(failed)} publishes failed: {failed[0]!r}")
    print(f"raw: {count} events of the same size published in {took:.3f} s", flush=True)
    return took


async def double_terminal(client: MdqClient) -> int:
    """Jobs with more than one terminal event in the jobs stream (read in full)."""
    js = client.nc.jetstream()
    subscription = await js.subscribe(f"{NAMESPACE}.job.>", ordered_consumer=True)
    info = await subscription.consumer_info()
    total = info.num_pending or 0
    terminal: dict[str, int] = {}
    for _ in range(total):
        message = await subscription.next_msg(timeout=30)
        event = decode_event(message.data)
        if event.WhichOneof("body") in TERMINAL:
            terminal[event.job_id] = terminal.get(event.job_id, 0) + 1
    await subscription.unsubscribe()
    return sum(1 for count in terminal.values() if count > 1)


async def main(waves: int, bulk: int) -> dict[str, object]:
    env = {
        "MDQ_METRICS_INTERVAL_S": "1",
        "MDQ_LOCAL_CPU_PER_NODE": "1",
        "MDQ_RECOVERY_BACKOFF_BASE_S": "0.5",
    }
    async with (
        servers("mdq-bench-control-") as bus_and_db,
        stack_on(bus_and_db, NAMESPACE, local_nodes=NODES, extra_env=env, grace_s=10.0) as stack,
        await MdqClient.connect(bus_and_db.nats_url, NAMESPACE) as client,
    ):
        through_mdq, raw, checkpointed = await measure_waves(client, stack.data_dir, waves)
        bulk_s, raw_bulk_s = await measure_bulk(client, bulk)
        left = len(runner_processes(NAMESPACE))
        doubled = await double_terminal(client)
    p50, raw_p50 = statistics.median(through_mdq), statistics.median(raw)
    return {
        "cancelled": len(through_mdq),
        "p50_cancel_to_exit_s": round(p50, 3),
        "p99_cancel_to_exit_s": round(percentile(through_mdq, 0.99), 3),
        "checkpointed_on_cancel": round(checkpointed / len(through_mdq), 3),
        "runners_left": left,
        "bulk_cancel_jobs": bulk,
        "bulk_cancel_s": round(bulk_s, 3),
        "double_terminal": doubled,
        "raw_sigterm_to_exit_p50_s": round(raw_p50, 3),
        "cancel_to_exit_ratio": round(p50 / raw_p50, 3),
        "raw_publish_s": round(raw_bulk_s, 3),
        "bulk_cancel_ratio": round(bulk_s / raw_bulk_s, 3),
        "measured": "bench clock; cancel sent to runner gone from the process table; bulk: one "
        "request to every cancelled event in the jobs stream",
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--waves", type=int, default=18, help="waves of 4 running jobs")
    parser.add_argument("--bulk", type=int, default=10_000, help="pending jobs cancelled at once")
    parser.add_argument("--quick", action="store_true", help="3 waves, 2,000 pending jobs")
    args = parser.parse_args()
    if args.quick:
        args.waves, args.bulk = 3, 2000
    if args.waves < 1 or args.bulk < 1:
        parser.error("--waves and --bulk must be at least 1")
    with failing_as("control", ControlUnavailable, IntakeUnavailable):
        result = asyncio.run(main(args.waves, args.bulk))
    with contextlib.suppress(BrokenPipeError):
        print(json.dumps(result))
