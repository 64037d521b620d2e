"""Benchmark of placement (``make bench-placement``): decision cost, jobs bound per second, latency.

(a) the core's time per decision as nodes and pending jobs grow; (b) jobs bound per second end
to end through the real intake and placement against a raw loop of the same messaging shape
(``bench/raw_bus.py``), on NATS servers with and without fsync-always and authentication side
by side; (c) the latency submit → bound below capacity. The last line printed is one JSON
object. Method and keys: docs/benchmarks.md, "make bench-placement"; docs/placement.md,
"Benchmark".
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import nats
import psutil
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.api import ConsumerConfig, DeliverPolicy, StreamConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_figures, however it is run

from bench_figures import no_collector_pauses, percentile

from mdq.bus.connect import auth_options, connect
from mdq.bus.publisher import EventPublisher
from mdq.bus.requests import Requests
from mdq.bus.security.auth import Trust, issue
from mdq.bus.security.permissions import Bridge, Permissions, inbox_prefix, service_permissions
from mdq.bus.subjects import Subjects
from mdq.contracts import pb
from mdq.core import ids
from mdq.core.events import make_event
from mdq.core.placement import NodeState, QueuedJob, plan
from mdq.core.spec import normalize_job
from mdq.embedded import SYNC_ALWAYS, SYNC_SERVER_DEFAULT, start_nats

REPO = Path(__file__).resolve().parents[1]
ROUNDS = 5
"""Throughput rounds (each: raw then mdq, on each server); the best of each is reported."""
WINDOW = 256
"""Requests in flight in the closed-loop throughput rounds (both pipelines)."""
NOW = datetime(2026, 1, 1, tzinfo=UTC)
NODES = 1000
NODE_CORES = 64
NODE_MEMORY_MB = 256 * 1024
MAX_JOB_CORES = 16
"""End to end: ``NODES`` nodes of ``NODE_CORES`` cores, jobs of 1 to ``MAX_JOB_CORES`` cores
(8.5 on average: a round of 5,000 jobs takes two thirds of the cluster)."""
REPORT_S = 30.0
REPORT_SLICES = 30
"""Nodes report in this many slices of ``REPORT_S``, a slice at a time."""
LOAD_TIMEOUT_S = 600.0
"""Nodes report every ``REPORT_S``; placement trusts a report this long in the bench
(``MDQ_PLACEMENT_LOAD_TIMEOUT_S``): a thousand fsynced reports every few seconds would compete
with what is measured for the disk. Ended jobs free their cores and in-flight counts at once."""
LOAD_LEVELS = (0.1, 0.5, 0.8)
"""Latency is measured at these shares of the capacity measured in the same run."""
LATENCY_SECONDS = 8.0
"""A latency level offers at most this many seconds of submits (``--latency-jobs`` at most)."""


# -- (a) the pure core ---------------------------------------------------------------------------
def _nodes(count: int) -> list[NodeState]:
    return [
        NodeState(
            name=f"n{i:05d}",
            cpu_capacity=128,
            memory_capacity_mb=1 << 20,
            ready=i % 50 != 49,
            cpu_load=(i % 7) / 20,
            memory_load=(i % 5) / 20,
            reported_at=NOW,
        )
        for i in range(count)
    ]


def _jobs(count: int) -> list[QueuedJob]:
    classes = (100, 500, 1000)
    return [
        QueuedJob(
            job_id=f"j{k}",
            cpu=1 + k % 3,
            memory_mb=512 * (1 + k % 4),
            priority=classes[k % 3],
            submitted_at=NOW - timedelta(seconds=k % 600),
        )
        for k in range(count)
    ]


def core_cost(nodes: int, pending: int, rounds: int) -> float:
    """Best seconds per decision over ``rounds`` plans of ``pending`` jobs on ``nodes`` nodes."""
    best = float("inf")
    jobs = _jobs(pending)
    for _ in range(rounds):
        cluster = _nodes(nodes)
        started = time.perf_counter()
        decisions = plan(cluster, jobs, NOW)
        elapsed = time.perf_counter() - started
        best = min(best, elapsed / max(1, len(decisions)))
    return best


def bench_core(quick: bool) -> dict[str, float]:
    rounds = 2 if quick else 3
    by_nodes = {n: core_cost(n, 1000, rounds) for n in (100, 1000, 10_000)}
    by_pending = {
        p: core_cost(1000, p, 1 if p > 10_000 else rounds)
        for p in ((1000, 10_000) if quick else (1000, 10_000, 100_000))
    }
    for n, cost in by_nodes.items():
        print(f"core: {n:>6} nodes, 1000 pending: {cost * 1e6:7.1f} us/decision")
    for p, cost in by_pending.items():
        print(f"core: 1000 nodes, {p:>6} pending: {cost * 1e6:7.1f} us/decision")
    return {
        "core_decisions_per_s_100_nodes": round(1 / by_nodes[100]),
        "core_decisions_per_s_1000_nodes": round(1 / by_nodes[1000]),
        "core_decisions_per_s_10000_nodes": round(1 / by_nodes[10_000]),
        "core_growth_100_to_10000_nodes": round(by_nodes[10_000] / by_nodes[100], 2),
        "core_us_per_decision_1000_nodes_100000_pending": round(
            max(by_pending.items())[1] * 1e6, 1
        ),
        "core_growth_1000_to_max_pending": round(max(by_pending.items())[1] / by_pending[1000], 2),
    }


# -- (b)/(c) end to end --------------------------------------------------------------------------
@contextlib.contextmanager
def processes(
    commands: list[list[str]], env: dict[str, str], logs: Path
) -> Iterator[list[subprocess.Popen[bytes]]]:
    children = [
        subprocess.Popen(
            command,
            cwd=REPO,
            env=env,
            stdout=(logs / f"{i}.log").open("wb"),
            stderr=subprocess.STDOUT,
        )
        for i, command in enumerate(commands)
    ]
    try:
        yield children
    finally:
        for child in children:
            child.terminate()
        for child in children:
            try:
                child.wait(timeout=10)
            except subprocess.TimeoutExpired:
                child.kill()


def submit_payload(key: str, cpu: int = 1) -> bytes:
    request = pb.SubmitRequest(idempotency_key=key, submitted_by="bench")
    job = request.jobs.add(name="j", steps=1000)
    job.resources.cpu, job.resources.memory_mb = cpu, 512 * cpu
    return request.SerializeToString()


def job_cores(index: int) -> int:
    """The cores of the bench's ``index``-th job of a round: 1 to ``MAX_JOB_CORES``."""
    return 1 + index % MAX_JOB_CORES


class Arrivals:
    """Counts ``bound`` messages and remembers when each job's arrived."""

    def __init__(self) -> None:
        self.at: dict[str, float] = {}
        self.done = asyncio.Event()
        self.expect = 0

    async def on_message(self, message: Msg) -> None:
        job = message.subject.split(".")[-2]
        self.at.setdefault(job, time.perf_counter())
        if len(self.at) >= self.expect:
            self.done.set()


async def wait_for_responder(nc: Client, subject: str, payload: bytes) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            await nc.request(subject, payload, timeout=5)
            return
        except (nats.errors.NoRespondersError, nats.errors.TimeoutError):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


async def closed_loop(
    nc: Client, subject: str, payloads: list[tuple[str, bytes]], window: int
) -> None:
    slots = asyncio.Semaphore(window)

    async def one(payload: bytes) -> None:
        async with slots:
            await nc.request(subject, payload, timeout=30)

    await asyncio.gather(*(one(payload) for _, payload in payloads))


async def throughput(
    nc: Client, request_subject: str, bound_subject: str, payloads: list[tuple[str, bytes]]
) -> float:
    arrivals = Arrivals()
    arrivals.expect = len(payloads)
    subscription = await nc.subscribe(bound_subject, cb=arrivals.on_message)
    started = time.perf_counter()
    await closed_loop(nc, request_subject, payloads, window=WINDOW)
    await asyncio.wait_for(arrivals.done.wait(), timeout=120)
    elapsed = max(arrivals.at.values()) - started
    await subscription.unsubscribe()
    return len(payloads) / elapsed


async def publish_then_count(
    nc: Client, bound_subject: str, messages: list[tuple[str, bytes, str]]
) -> float:
    """Publish (subject, data, msg id) to JetStream at once; bound arrivals per second."""
    js = nc.jetstream()
    arrivals = Arrivals()
    arrivals.expect = len(messages)
    subscription = await nc.subscribe(bound_subject, cb=arrivals.on_message)
    slots = asyncio.Semaphore(512)

    async def one(subject: str, data: bytes, msg_id: str) -> None:
        async with slots:
            await js.publish(subject, data, headers={"Nats-Msg-Id": msg_id})

    started = time.perf_counter()
    await asyncio.gather(*(one(*message) for message in messages))
    await asyncio.wait_for(arrivals.done.wait(), timeout=120)
    elapsed = max(arrivals.at.values()) - started
    await subscription.unsubscribe()
    return len(messages) / elapsed


def submitted_events(subjects: Subjects, prefix: str, count: int) -> list[tuple[str, bytes, str]]:
    spec = normalize_job(pb.JobSpec(name="j", steps=1000), "jobs[0]")
    out = []
    for i in range(count):
        job = f"{prefix}{i:06d}-j"
        event = make_event(
            "submitted",
            pb.JobSubmitted(spec=spec, request_id=f"{prefix}{i:06d}"),
            job_id=job,
            attempt=0,
            producer="intake",
            at=datetime.now(UTC),
        )
        out.append((subjects.for_event(event), event.SerializeToString(), event.event_id))
    return out


@dataclass
class Offered:
    """One latency level, open loop: when each job's submit was sent and its ``bound`` arrived
    (the bench's ``perf_counter``), and that clock's offset from the wall clock."""

    sent: dict[str, float]
    arrived: dict[str, float]
    wall_minus_perf: float

    def latencies_ms(self) -> list[float]:
        return sorted(1000 * (self.arrived[job] - self.sent[job]) for job in self.sent)


async def latency(
    nc: Client,
    request_subject: str,
    bound_subject: str,
    payloads: list[tuple[str, bytes]],
    rate: float,
) -> Offered:
    arrivals = Arrivals()
    arrivals.expect = len(payloads)
    sent: dict[str, float] = {}
    subscription = await nc.subscribe(bound_subject, cb=arrivals.on_message)
    tasks = []
    wall_minus_perf = time.time() - time.perf_counter()
    with no_collector_pauses():
        started = time.perf_counter()
        for index, (job, payload) in enumerate(payloads):
            delay = started + index / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            sent[job] = time.perf_counter()
            tasks.append(asyncio.create_task(nc.request(request_subject, payload, timeout=30)))
        await asyncio.gather(*tasks)
        await asyncio.wait_for(arrivals.done.wait(), timeout=120)
    await subscription.unsubscribe()
    return Offered(sent, arrivals.at, wall_minus_perf)


async def stored_at(
    nc: Client, subjects: Subjects, offered: Offered, kinds: tuple[str, ...]
) -> dict[tuple[str, str], float]:
    """When the jobs stream stored each offered job's events of ``kinds`` (the server's
    timestamp of each message, on the bench's ``perf_counter``): where a submit's time went,
    read from the log, not from mdq."""
    first = datetime.fromtimestamp(min(offered.sent.values()) + offered.wall_minus_perf - 1, UTC)
    subscription = await nc.jetstream().subscribe(
        subjects.job("*", ">"),
        stream=subjects.jobs_stream,
        ordered_consumer=True,
        config=ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_TIME, opt_start_time=first),
    )
    wanted = {(job, kind) for job in offered.sent for kind in kinds}
    stored: dict[tuple[str, str], float] = {}
    try:
        while len(stored) < len(wanted):
            message = await subscription.next_msg(timeout=10)
            job, kind = message.subject.split(".")[-2:]
            if (job, kind) in wanted:
                at = message.metadata.timestamp.timestamp() - offered.wall_minus_perf
                stored.setdefault((job, kind), at)
    finally:
        await subscription.unsubscribe()
    return stored


async def keep_nodes_reporting(nc: Client, subjects: Subjects, count: int) -> None:
    """``count`` nodes of ``NODE_CORES`` cores, each reporting a tenth of its CPU busy every
    ``REPORT_S`` (placement trusts a report for ``LOAD_TIMEOUT_S``): all of them at once when
    they start, then a ``REPORT_SLICES``-th of them at a time, as independent agents report,
    not all in the same instant. A report that fails (a machine too busy to acknowledge it in
    time) is sent again at its node's next turn."""
    bus = EventPublisher(js=nc.jetstream(), subjects=subjects, producer="metrics")
    requests = await Requests(nc, timeout_s=60).start()
    nodes = range(count)
    for turn in itertools.count():
        events = [
            bus.event(
                "node_load",
                pb.NodeLoad(
                    node=f"node{i:04d}",
                    cpu_load=0.1,
                    memory_load=0.1,
                    cpu_capacity=NODE_CORES,
                    memory_capacity_mb=NODE_MEMORY_MB,
                    ready=True,
                ),
                job_id="",
                attempt=0,
                detail=f"node{i}:{time.time_ns()}",
            )
            for i in nodes
        ]
        results = await requests.publish_many(
            [(subjects.for_event(event), event.SerializeToString(), None) for event in events]
        )
        if failed := [result for result in results if isinstance(result, Exception)]:
            print(f"{len(failed)} node reports failed ({failed[0]!r}); sent again later")
        await asyncio.sleep(REPORT_S / REPORT_SLICES)
        nodes = range(turn % REPORT_SLICES, count, REPORT_SLICES)


SERVERS = {
    "fsync_always": (SYNC_ALWAYS, True),
    "fsync_always_open": (SYNC_ALWAYS, False),
    "fsync_default": (SYNC_SERVER_DEFAULT, True),
    "fsync_default_open": (SYNC_SERVER_DEFAULT, False),
}
"""The NATS servers of every run: (JetStream ``sync_interval``, whether clients authenticate).
mdq's embedded default is the first (fsync-always, every client with its own least-privilege
credentials: intake as intake, placement as placement); the second is the same without
authentication (the cost of the closed bus), the third the same with the server's default
fsync interval (the cost of fsync-always), the fourth that one without authentication (the cost
of the closed bus where the server's CPU, not the disk, sets the pace)."""


NAMESPACE = "bench"
"""mdq's namespace on every server of the run."""
RAW_BRIDGE = Bridge(services=("raw.job.>",), streams=(f"{inbox_prefix('bench')}.>",))
"""On an authenticating server, the raw loop's stream subjects and its ordered consumers'
deliveries cross between the accounts as mdq's own do (``mdq.bus.security.permissions.Bridge``)."""


def issue_side_creds(trust: Trust, subjects: Subjects, folder: Path) -> dict[str, Path]:
    """Credentials of one side: intake's and placement's own, everything for the bench
    harness (it publishes every kind) and for the raw loop (its own subjects and stream)."""
    everything = Permissions("bench", (">",), (">",), respond=True)
    return {
        "intake": issue(trust, service_permissions("intake", subjects), folder / "intake.creds"),
        "placement": issue(
            trust, service_permissions("placement", subjects), folder / "placement.creds"
        ),
        "bench": issue(trust, everything, folder / "bench.creds"),
    }


@dataclass
class Side:
    """One NATS server with both pipelines (raw and mdq) running against it."""

    name: str
    subjects: Subjects
    nc: Client
    raw: Client
    reporter: asyncio.Task[None]
    server: psutil.Process
    """The side's nats-server."""
    raw_processes: list[psutil.Process]
    """The raw loop's responder and consumer."""
    mdq_processes: list[psutil.Process]
    """mdq's intake and placement."""

    async def end(self, jobs: list[str]) -> None:
        """End the bound ``jobs`` (a ``succeeded`` event each, as the watcher would): their
        cores are free for the next round, which placement folds before its submits (one
        stream, in order). Published as atomic batches, outside any measurement."""
        now = datetime.now(UTC)
        events = [
            make_event(
                "succeeded",
                pb.JobSucceeded(final_step=1000, reason="steps_reached"),
                job_id=job,
                attempt=1,  # the first attempt, the one bound
                producer="watcher",  # the producer that ends a job (mdq.core.producers)
                at=now,
            )
            for job in jobs
        ]
        requests = await Requests(self.nc).start()
        try:
            results = await requests.publish_batch(
                [
                    (self.subjects.for_event(event), event.SerializeToString(), None)
                    for event in events
                ],
                timeout_s=30,
            )
        finally:
            await requests.close()
        failed = [result for result in results if isinstance(result, Exception)]
        if failed:
            raise RuntimeError(f"ending {len(failed)} of the round's jobs failed: {failed[0]!r}")


def cpu_seconds(processes: list[psutil.Process]) -> float:
    """User plus system CPU seconds the processes have used so far (read from /proc)."""
    return sum(sum(process.cpu_times()[:2]) for process in processes)


@dataclass
class Measured:
    """One throughput round of one pipeline on one side, seen from outside."""

    per_s: float
    """Jobs (round trips) per second, wall clock."""
    pipeline_cpu_us: float
    """CPU microseconds per job of the server, the pipeline's processes and the harness."""
    server_cpu_us: float
    """CPU microseconds per job of the nats-server alone."""


SETTLED_CPU = 0.2
"""A pipeline has settled when its processes together use less than this share of a core..."""
SETTLED_WINDOWS = 4
"""...over this many windows of ``SETTLE_WINDOW_S`` in a row."""
SETTLE_WINDOW_S = 0.25
SETTLE_TIMEOUT_S = 60.0


async def settle(processes: list[psutil.Process]) -> float:
    """Wait until ``processes`` are done with what came before (the previous phase's jobs
    ended, their snapshots written): a latency level measures from a settled pipeline, not the
    tail of the last phase. Read from the process table; returns the seconds waited, and
    fails the bench if they never settle."""
    started = time.monotonic()
    quiet = 0
    before = cpu_seconds(processes)
    while quiet < SETTLED_WINDOWS:
        if time.monotonic() - started > SETTLE_TIMEOUT_S:
            raise SystemExit(f"the pipeline did not settle within {SETTLE_TIMEOUT_S:.0f} s")
        await asyncio.sleep(SETTLE_WINDOW_S)
        after = cpu_seconds(processes)
        quiet = quiet + 1 if after - before < SETTLED_CPU * SETTLE_WINDOW_S else 0
        before = after
    return time.monotonic() - started


async def measured_throughput(
    side: Side,
    pipeline: list[psutil.Process],
    nc: Client,
    request_subject: str,
    bound_subject: str,
    payloads: list[tuple[str, bytes]],
) -> Measured:
    """``throughput``, with the CPU the server and the pipeline's processes (and this harness,
    which drives only this side meanwhile) used for it, per job. CPU time is what the closed
    bus costs on a machine that is not saturated; on this 2-core one the rate follows it, with
    the scheduler's noise on top."""
    harness = psutil.Process()
    everyone = [side.server, harness, *pipeline]
    server_before, all_before = cpu_seconds([side.server]), cpu_seconds(everyone)
    per_s = await throughput(nc, request_subject, bound_subject, payloads)
    await asyncio.sleep(0.5)  # the acknowledgements and bookkeeping that trail the last job
    server_after, all_after = cpu_seconds([side.server]), cpu_seconds(everyone)
    jobs = len(payloads)
    return Measured(
        per_s=per_s,
        pipeline_cpu_us=1e6 * (all_after - all_before) / jobs,
        server_cpu_us=1e6 * (server_after - server_before) / jobs,
    )


async def bench_end_to_end(jobs: int, latency_jobs: int, rounds: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="mdq-bench-placement-") as folder:
        root = Path(folder)
        trusts = {
            name: Trust.generate(NAMESPACE) if auth else None for name, (_, auth) in SERVERS.items()
        }
        servers = {
            name: start_nats(
                root / name / "nats",
                sync_interval=sync,
                auth=trust.server_block(extra=RAW_BRIDGE) if (trust := trusts[name]) else "",
            )
            for name, (sync, _) in SERVERS.items()
        }
        try:
            return await _end_to_end(
                {name: (server.url, server.process.pid) for name, server in servers.items()},
                trusts,
                root,
                jobs,
                latency_jobs,
                rounds,
            )
        finally:
            for server in servers.values():
                server.stop()


def raw_payloads(prefix: str, count: int) -> list[tuple[str, bytes]]:
    return [
        (f"{prefix}{i}", f"{prefix}{i}\n".encode() + submit_payload(f"{prefix}{i}"))
        for i in range(count)
    ]


def payloads_for(prefix: str, count: int) -> list[tuple[str, bytes]]:
    out = []
    for i in range(count):
        key = f"{prefix}-{i}"
        job = ids.job_id(ids.request_id_for_key(key), "j")
        out.append((job, submit_payload(key, job_cores(i))))
    return out


def side_env(url: str, namespace: str, folder: Path) -> dict[str, str]:
    """The environment of a side's intake and placement: this process's, with ``namespace`` on
    the NATS at ``url``, the jobs' data under ``folder``, intake logging warnings only, and
    placement placing without a leader lease, reconciling every second."""
    return os.environ | {
        "NATS_URL": url,
        "MDQ_NAMESPACE": namespace,
        "MDQ_DATA_DIR": str(folder / "data"),
        "MDQ_INTAKE_LOG_LEVEL": "warning",
        "MDQ_PLACEMENT_LEADER_ELECTION": "false",
        "MDQ_PLACEMENT_RECONCILE_INTERVAL_S": "1.0",
        "PYTHONPATH": str(REPO),
    }


async def open_side(
    name: str,
    url: str,
    server_pid: int,
    trust: Trust | None,
    root: Path,
    stack: contextlib.ExitStack,
) -> Side:
    """Start the raw and the mdq pipeline against ``url``; wait until both answer and follow;
    warm both up. With ``trust``, every process authenticates with its own credentials."""
    namespace = NAMESPACE
    subjects = Subjects(namespace=namespace)
    creds: dict[str, Path] = {}
    if trust is not None:
        creds = issue_side_creds(trust, subjects, root / name / "creds")

    def as_identity(identity: str) -> dict[str, str]:
        return {"MDQ_NATS_CREDS": str(creds[identity])} if creds else {}

    nc = await connect(url, name=f"bench-{name}", subjects=subjects, creds=creds.get("bench"))
    reporter = asyncio.create_task(keep_nodes_reporting(nc, subjects, NODES))
    env = side_env(url, namespace, root / name) | {
        "MDQ_PLACEMENT_LOAD_TIMEOUT_S": str(LOAD_TIMEOUT_S)
    }
    logs = root / name / "logs"
    (logs / "raw").mkdir(parents=True)
    (logs / "mdq").mkdir()
    python = sys.executable
    raw = await nats.connect(url, **auth_options(creds.get("bench")))
    # the raw loop group-commits with atomic batches (bench/raw_bus.py)
    await raw.jetstream().add_stream(
        config=StreamConfig(name="RAWBENCH", subjects=["raw.job.>"], allow_atomic=True)
    )
    # Both pipelines run side by side (idle while another is measured) and the rounds
    # alternate, so a change in the machine's background load hits all of them.
    raw_children = stack.enter_context(
        processes(
            [
                [python, "bench/raw_bus.py", "responder", url],
                [python, "bench/raw_bus.py", "consumer", url],
            ],
            env | as_identity("bench"),
            logs / "raw",
        )
    )
    mdq_logs = logs / "mdq"
    mdq_children = stack.enter_context(
        processes([[python, "-m", "services.intake"]], env | as_identity("intake"), mdq_logs)
    )
    placement_logs = logs / "placement"
    placement_logs.mkdir()
    mdq_children += stack.enter_context(
        processes(
            [[python, "bench/placement_noop.py"]], env | as_identity("placement"), placement_logs
        )
    )
    probe_bound = await raw.subscribe("raw.job.probe.bound")
    await wait_for_responder(raw, "raw.api.submit", b"probe\n")
    await probe_bound.next_msg(timeout=60)  # the consumer is following too
    probe = ids.job_id(ids.request_id_for_key("probe"), "j")
    probe_bound = await nc.subscribe(subjects.job(probe, "bound"))
    await wait_for_responder(nc, subjects.api_submit, submit_payload("probe"))
    await probe_bound.next_msg(timeout=60)  # placement is following too
    for prefix in ("w", "p-w"):  # both raw loops (bench/raw_bus.py)
        await throughput(raw, "raw.api.submit", "raw.job.*.bound", raw_payloads(prefix, 500))
    warm = payloads_for("warm", 500)
    await throughput(nc, subjects.api_submit, subjects.job("*", "bound"), warm)
    side = Side(
        name=name,
        subjects=subjects,
        nc=nc,
        raw=raw,
        reporter=reporter,
        server=psutil.Process(server_pid),
        raw_processes=[psutil.Process(child.pid) for child in raw_children],
        mdq_processes=[psutil.Process(child.pid) for child in mdq_children],
    )
    await side.end([job for job, _ in warm])
    return side


async def stop_reporting(side: Side) -> None:
    """Stop ``side``'s nodes reporting their loads (the side is measured no more)."""
    side.reporter.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await side.reporter


async def close_side(side: Side) -> None:
    await stop_reporting(side)
    await side.raw.drain()
    await side.nc.drain()


async def _end_to_end(
    urls: dict[str, tuple[str, int]],
    trusts: dict[str, Trust | None],
    root: Path,
    jobs: int,
    latency_jobs: int,
    rounds: int,
) -> dict[str, Any]:
    results: dict[str, Any] = {}
    sides: dict[str, Side] = {}
    with contextlib.ExitStack() as stack:
        try:
            for name, (url, server_pid) in urls.items():
                sides[name] = await open_side(name, url, server_pid, trusts[name], root, stack)
            measured: dict[str, list[float]] = {
                f"{kind}_{name}": [] for kind in ("raw", "mdq") for name in urls
            }
            cpu: dict[str, list[Measured]] = {key: [] for key in measured}
            raw_loops: dict[str, list[float]] = {
                f"{loop}_{name}": [] for loop in ("batched", "plain") for name in urls
            }
            for number in range(rounds):
                order = list(urls) if number % 2 == 0 else list(reversed(urls))
                for name in order:
                    side = sides[name]
                    # the raw baseline: the faster of its two loops in this round
                    loops = {}
                    for loop, prefix in (("batched", f"r{number}-"), ("plain", f"p-r{number}-")):
                        loops[loop] = await measured_throughput(
                            side,
                            side.raw_processes,
                            side.raw,
                            "raw.api.submit",
                            "raw.job.*.bound",
                            raw_payloads(prefix, jobs),
                        )
                        raw_loops[f"{loop}_{name}"].append(loops[loop].per_s)
                    raw = max(loops.values(), key=lambda seen: seen.per_s)
                    round_payloads = payloads_for(f"tp{number}", jobs)
                    ours = await measured_throughput(
                        side,
                        side.mdq_processes,
                        side.nc,
                        side.subjects.api_submit,
                        side.subjects.job("*", "bound"),
                        round_payloads,
                    )
                    await side.end([job for job, _ in round_payloads])
                    for kind, seen in (("raw", raw), ("mdq", ours)):
                        measured[f"{kind}_{name}"].append(seen.per_s)
                        cpu[f"{kind}_{name}"].append(seen)
                    print(
                        f"round {number + 1} {name:17s}: raw bus {raw.per_s:.0f} round trips/s "
                        f"(batched {loops['batched'].per_s:.0f}, plain {loops['plain'].per_s:.0f}; "
                        f"{raw.pipeline_cpu_us:.0f} us CPU each, server {raw.server_cpu_us:.0f}), "
                        f"mdq {ours.per_s:.0f} jobs bound/s ({ours.pipeline_cpu_us:.0f} us, "
                        f"server {ours.server_cpu_us:.0f})",
                        flush=True,
                    )
            for key, seen_rounds in cpu.items():
                results[f"cpu_us_per_job_{key}_rounds"] = [
                    seen.pipeline_cpu_us for seen in seen_rounds
                ]
                results[f"server_cpu_us_per_job_{key}_rounds"] = [
                    seen.server_cpu_us for seen in seen_rounds
                ]
            for key, values in raw_loops.items():
                results[f"raw_{key}_rounds"] = values
            results["raw_bus_per_s"] = max(measured["raw_fsync_always"])
            results["jobs_bound_per_s"] = max(measured["mdq_fsync_always"])
            results["raw_bus_rounds"] = measured["raw_fsync_always"]
            results["jobs_bound_rounds"] = measured["mdq_fsync_always"]
            results["raw_bus_fsync_default_rounds"] = measured["raw_fsync_default"]
            results["jobs_bound_fsync_default_rounds"] = measured["mdq_fsync_default"]
            results["fsync_always_per_s"] = results["jobs_bound_per_s"]
            results["fsync_default_per_s"] = max(measured["mdq_fsync_default"])
            results["raw_fsync_always_per_s"] = results["raw_bus_per_s"]
            results["raw_fsync_default_per_s"] = max(measured["raw_fsync_default"])
            results["auth_off_per_s"] = max(measured["mdq_fsync_always_open"])
            results["raw_auth_off_per_s"] = max(measured["raw_fsync_always_open"])
            results["jobs_bound_auth_off_rounds"] = measured["mdq_fsync_always_open"]
            results["raw_bus_auth_off_rounds"] = measured["raw_fsync_always_open"]
            results["jobs_bound_fsync_default_auth_off_rounds"] = measured["mdq_fsync_default_open"]
            results["raw_bus_fsync_default_auth_off_rounds"] = measured["raw_fsync_default_open"]

            # The stage alone and the latency: on the fsync-always server (mdq's default). The
            # other sides are idle from here on, but their nodes would go on reporting and
            # their placements folding the reports on the same cores: they stop reporting.
            side = sides["fsync_always"]
            for other in sides.values():
                if other is not side:
                    await stop_reporting(other)
            bound = side.subjects.job("*", "bound")
            stage = [
                (f"raw.job.s{i}.submitted", submit_payload(f"s{i}"), f"s{i}") for i in range(jobs)
            ]
            results["raw_consumer_per_s"] = await publish_then_count(
                side.raw, "raw.job.*.bound", stage
            )
            print(f"raw consumer stage: {results['raw_consumer_per_s']:.0f} events/s")
            await asyncio.sleep(0.5)
            stage_events = submitted_events(side.subjects, "pl", jobs)
            results["placement_bound_per_s"] = await publish_then_count(
                side.nc, bound, stage_events
            )
            await side.end([f"pl{i:06d}-j" for i in range(jobs)])
            print(f"placement stage: {results['placement_bound_per_s']:.0f} jobs bound/s")
            # Latency below capacity: the capacity is the median of mdq's rounds on this
            # server; each level offers its share of it, open loop (a bench that offers more
            # than capacity measures a queue).
            capacity = statistics.median(measured["mdq_fsync_always"])
            results["capacity_jobs_per_s"] = capacity
            for level in LOAD_LEVELS:
                rate = level * capacity
                count = max(200, min(latency_jobs, round(rate * LATENCY_SECONDS)))
                level_payloads = payloads_for(f"lat{round(100 * level)}-", count)
                await settle(side.mdq_processes)
                offered = await latency(
                    side.nc, side.subjects.api_submit, bound, level_payloads, rate
                )
                stored = await stored_at(side.nc, side.subjects, offered, ("submitted", "bound"))
                await side.end([job for job, _ in level_payloads])
                latencies = offered.latencies_ms()
                percent = f"{round(100 * level)}pct"
                results[f"p50_ms_at_{percent}"] = statistics.median(latencies)
                results[f"p99_ms_at_{percent}"] = percentile(latencies, 0.99)
                results[f"offered_per_s_at_{percent}"] = rate
                # where the time went: to the submitted event stored (intake's part), from it
                # to the bound event stored (placement's part), the stream's timestamps
                jobs_sent = offered.sent
                parts = {
                    "to_submitted": [stored[j, "submitted"] - jobs_sent[j] for j in jobs_sent],
                    "submitted_to_bound": [
                        stored[j, "bound"] - stored[j, "submitted"] for j in jobs_sent
                    ],
                }
                for part, ms in parts.items():
                    results[f"p99_ms_{part}_at_{percent}"] = percentile(
                        [1000 * value for value in ms], 0.99
                    )
                # the batched raw loop at the same rate: what the machine's hops cost alone
                await settle(side.raw_processes)
                raw_latencies = (
                    await latency(
                        side.raw,
                        "raw.api.submit",
                        "raw.job.*.bound",
                        raw_payloads(f"l{round(100 * level)}-", count),
                        rate,
                    )
                ).latencies_ms()
                results[f"raw_p50_ms_at_{percent}"] = statistics.median(raw_latencies)
                results[f"raw_p99_ms_at_{percent}"] = percentile(raw_latencies, 0.99)
                print(
                    f"mdq at {rate:.0f}/s offered ({percent} of {capacity:.0f}/s), {count} jobs: "
                    f"p50 {results[f'p50_ms_at_{percent}']:.1f} ms, "
                    f"p99 {results[f'p99_ms_at_{percent}']:.1f} ms; raw loop p50 "
                    f"{results[f'raw_p50_ms_at_{percent}']:.1f} ms, "
                    f"p99 {results[f'raw_p99_ms_at_{percent}']:.1f} ms",
                    flush=True,
                )
        finally:
            for side in sides.values():
                await close_side(side)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=5000, help="jobs per throughput round")
    parser.add_argument("--latency-jobs", type=int, default=2500, help="jobs at the offered rate")
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="rounds on each server")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smaller core runs, 2,000 jobs per round, 3 rounds, 1,000 latency jobs a level",
    )
    args = parser.parse_args()
    if args.quick:
        args.jobs, args.rounds, args.latency_jobs = 2000, 3, 1000
    load = os.getloadavg()[0]
    if args.rounds < 3:
        parser.error("--rounds: at least 3 (the ratios are medians of paired rounds)")
    summary: dict[str, Any] = {}
    summary.update(bench_core(args.quick))
    e2e = asyncio.run(bench_end_to_end(args.jobs, args.latency_jobs, args.rounds))
    summary.update(
        {
            key: [round(v) for v in value] if isinstance(value, list) else round(value, 1)
            for key, value in e2e.items()
        }
    )
    # Every ratio is the median of the rounds' paired quotients (the two sides of a pair
    # measured in the same round, one right after the other), with each round's quotient and
    # their spread (max - min); ``*_best`` is best round over best round.
    for key, rounds_on, rounds_off, best_on, best_off in (
        ("ratio_vs_raw", "jobs_bound_rounds", "raw_bus_rounds", "jobs_bound_per_s",
         "raw_bus_per_s"),
        ("fsync_cost_ratio", "jobs_bound_rounds", "jobs_bound_fsync_default_rounds",
         "fsync_always_per_s", "fsync_default_per_s"),
        ("raw_fsync_cost_ratio", "raw_bus_rounds", "raw_bus_fsync_default_rounds",
         "raw_fsync_always_per_s", "raw_fsync_default_per_s"),
        ("ratio_vs_raw_fsync_default", "jobs_bound_fsync_default_rounds",
         "raw_bus_fsync_default_rounds", "fsync_default_per_s", "raw_fsync_default_per_s"),
    ):  # fmt: skip
        paired = [on / off for on, off in zip(e2e[rounds_on], e2e[rounds_off], strict=True)]
        summary[key] = round(statistics.median(paired), 3)
        summary[f"{key}_rounds"] = [round(ratio, 3) for ratio in paired]
        summary[f"{key}_spread"] = round(max(paired) - min(paired), 3)
        summary[f"{key}_best"] = round(e2e[best_on] / e2e[best_off], 3)
    # The two fsync-always servers, with and without authentication, are measured one right
    # after the other in every round (the order alternates, they stay neighbours): each round's
    # quotient sees the same machine, and the median of them is the key. The best round over
    # the best round (``*_best``) moved 0.79-1.13 between runs of the same code.
    for key, rounds_on, rounds_off, best_on, best_off in (
        ("auth_cost", "jobs_bound_rounds", "jobs_bound_auth_off_rounds", "jobs_bound_per_s",
         "auth_off_per_s"),
        ("raw_auth_cost", "raw_bus_rounds", "raw_bus_auth_off_rounds", "raw_bus_per_s",
         "raw_auth_off_per_s"),
        ("auth_cost_fsync_default", "jobs_bound_fsync_default_rounds",
         "jobs_bound_fsync_default_auth_off_rounds", "", ""),
        ("raw_auth_cost_fsync_default", "raw_bus_fsync_default_rounds",
         "raw_bus_fsync_default_auth_off_rounds", "", ""),
    ):  # fmt: skip
        paired = [on / off for on, off in zip(e2e[rounds_on], e2e[rounds_off], strict=True)]
        summary[f"{key}_ratio"] = round(statistics.median(paired), 3)
        summary[f"{key}_round_ratios"] = [round(ratio, 3) for ratio in paired]
        if best_on:
            summary[f"{key}_ratio_best"] = round(e2e[best_on] / e2e[best_off], 3)
    # The same pairs in CPU: microseconds of CPU per job, with over without authentication, of
    # the server plus the pipeline's processes plus the harness (``auth_cpu_cost_ratio``: > 1
    # is what the closed bus costs), and of the server alone (``server_auth_cpu_cost_ratio``).
    # ``*_fsync_default``: the same pairs on the two servers with the server's default fsync
    # interval, where no fsync wait hides the CPU.
    for key, kind in (("auth_cpu_cost", "mdq"), ("raw_auth_cpu_cost", "raw")):
        for prefix, label in (("", "cpu_us_per_job"), ("server_", "server_cpu_us_per_job")):
            for sync, suffix in (("fsync_always", ""), ("fsync_default", "_fsync_default")):
                on = e2e[f"{label}_{kind}_{sync}_rounds"]
                off = e2e[f"{label}_{kind}_{sync}_open_rounds"]
                paired = [a / b for a, b in zip(on, off, strict=True)]
                summary[f"{prefix}{key}{suffix}_ratio"] = round(statistics.median(paired), 3)
                summary[f"{prefix}{key}{suffix}_round_ratios"] = [
                    round(ratio, 3) for ratio in paired
                ]
                summary[f"{label}_{kind}_auth_on{suffix}"] = round(statistics.median(on))
                summary[f"{label}_{kind}_auth_off{suffix}"] = round(statistics.median(off))
    summary["placement_ratio_vs_raw_consumer"] = round(
        e2e["placement_bound_per_s"] / e2e["raw_consumer_per_s"], 3
    )
    summary["quick"] = args.quick
    summary["cpus"] = os.cpu_count() or 0
    summary["load_average_at_start"] = round(load, 2)
    summary["load_average_at_end"] = round(os.getloadavg()[0], 2)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
