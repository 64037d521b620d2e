"""Benchmark: one tenant floods the closed bus every way it may; another tenant's submits go on.

Tenant ``calm`` times its submits to their ``bound`` event alone and while tenant ``flood``
does everything its credentials allow, against the real intake and placement on a closed bus;
the JSON line holds the p99 ratio and every shared stream's growth. Usage:
``make bench-tenant-flood`` (``--rounds N``, ``--submits N``, ``--quick``, ``--ways A,B`` to flood
only some ways). Method:
docs/benchmarks.md, "make bench-tenant-flood".
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.js.api import DeliverPolicy, KeyValueConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_figures, however it is run

from bench_figures import no_collector_pauses, percentile
from placement import side_env

from mdq.bus.connect import connect
from mdq.bus.publisher import EventPublisher
from mdq.bus.security.auth import Generated, generate
from mdq.bus.security.permissions import (
    TENANT_MAX_PAYLOAD,
    TENANT_MAX_SUBSCRIPTIONS,
    inbox_prefix,
    tenant_identity,
)
from mdq.bus.storage import StorageSettings
from mdq.bus.streams import ensure_streams
from mdq.bus.subjects import Subjects
from mdq.bus.tenants import ensure_tenants_bucket
from mdq.contracts import pb
from mdq.core.tenants import TenantPolicy
from mdq.embedded import EmbeddedNats, child_environment, end_process, start_nats
from mdq.tenancy import add_tenant

REPO = Path(__file__).resolve().parents[1]
NS = "mdq"
SUBJECTS = Subjects(NS)
CALM, FLOOD = "calm", "flood"
CALM_POLICY = TenantPolicy(submits_per_minute=None, max_queued_jobs=None, max_running_cpu=None)
NODE = "n1"
"""The cluster placement binds ``calm``'s and ``flood``'s jobs on: one node with room for every
job of a run, reporting its load as the metrics service does (``NODE_REPORT_S``)."""
NODE_REPORT_S = 2.0
REQUESTS_AT_ONCE = 400
"""The flood's request-reply submits in flight at once: more than intake takes at once (128),
so that requests wait in its line."""


def submit_body(key: str) -> bytes:
    return json.dumps({"idempotency_key": key, "jobs": [{"name": "w", "steps": 2000}]}).encode()


async def tenant_client(url: str, creds: Path, tenant: str, **options: Any) -> Client:
    return await nats.connect(
        url,
        user_credentials=str(creds),
        inbox_prefix=inbox_prefix(tenant_identity(tenant)),
        allow_reconnect=False,
        **options,
    )


async def prepare(url: str, generated: Generated, secrets: Path) -> dict[str, Path]:
    admin = await connect(url, name="admin", creds=generated.creds["admin"])
    try:
        await ensure_streams(admin.jetstream(), SUBJECTS)
        await ensure_tenants_bucket(admin.jetstream(), SUBJECTS)
    finally:
        await admin.close()
    placement = await connect(url, name="p", creds=generated.creds["placement"])
    try:  # intake reads the tenants' usage there
        await placement.jetstream().create_key_value(
            KeyValueConfig(bucket=SUBJECTS.waiting_bucket, max_bytes=1 << 20)
        )
    finally:
        await placement.close()
    creds = {}
    for tenant, policy in ((CALM, CALM_POLICY), (FLOOD, TenantPolicy())):
        added = await add_tenant(
            tenant,
            secrets=secrets,
            nats_url=url,
            namespace=NS,
            admin_creds=generated.creds["admin"],
            policy=policy,
        )
        creds[tenant] = added.creds
    return creds


async def intake_answers(url: str, creds: Path) -> None:
    nc = await tenant_client(url, creds, CALM)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                await nc.request(SUBJECTS.api_submit_for(CALM), b"{}", timeout=1.0)
                return
            except (nats.errors.NoRespondersError, nats.errors.TimeoutError):
                if time.monotonic() > deadline:
                    raise RuntimeError("intake did not start answering") from None
                await asyncio.sleep(0.2)
    finally:
        await nc.close()


async def stream_bytes(url: str, admin_creds: Path) -> dict[str, int]:
    """Every stream's size in bytes, as the server reports it to the admin."""
    admin = await connect(url, name="count", creds=admin_creds)
    try:
        names = (await admin.request("$JS.API.STREAM.NAMES", b"{}", timeout=5)).data
        out = {}
        for name in json.loads(names)["streams"]:
            out[name] = (await admin.jetstream().stream_info(name)).state.bytes
        return out
    finally:
        await admin.close()


async def intake_caught_up(url: str, admin_creds: Path) -> None:
    """Return once intake's durable consumers have handled every submit stored, so a baseline
    runs on a quiet bus. A flood's fire-and-forget submits wait in ``flood``'s own stream, read
    at its rate (a submit a second): the operator purges them, as docs/security.md says, again
    while the server still stores what the flood sent before it stopped."""
    admin = await connect(url, name="drain", creds=admin_creds)
    try:
        js = admin.jetstream()
        flood = SUBJECTS.tenant_submit_stream(FLOOD)
        consumers = [(SUBJECTS.submit_stream, "intake")]
        consumers += [(SUBJECTS.tenant_submit_stream(t), "intake") for t in (CALM, FLOOD)]
        deadline = time.monotonic() + 300
        for stream, consumer in consumers:
            while True:
                if stream == flood:
                    await js.purge_stream(flood)
                try:
                    info = await js.consumer_info(stream, consumer)
                except nats.js.errors.NotFoundError:
                    break  # not made yet: nothing read there yet
                if not info.num_pending and not info.num_ack_pending:
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"intake still has {info.num_pending} submits in {stream}")
                await asyncio.sleep(0.2)
        # and nothing more of the flood's lands after that
        last = (await js.stream_info(flood)).state.last_seq
        while True:
            await asyncio.sleep(0.5)
            now = (await js.stream_info(flood)).state.last_seq
            if now == last:
                break
            last = now
            await js.purge_stream(flood)
    finally:
        await admin.close()


async def keep_node_reporting(url: str, creds: Path) -> None:
    """``NODE``'s load report every ``NODE_REPORT_S``, with the metrics service's credentials,
    until cancelled."""
    nc = await connect(url, name="node", creds=creds)
    bus = EventPublisher(js=nc.jetstream(), subjects=SUBJECTS, producer="metrics")
    load = pb.NodeLoad(
        node=NODE,
        cpu_load=0.1,
        memory_load=0.1,
        cpu_capacity=1_000_000,
        memory_capacity_mb=1 << 40,
        ready=True,
    )
    try:
        while True:
            await bus.publish(bus.event("node_load", load, job_id="", attempt=0))
            await asyncio.sleep(NODE_REPORT_S)
    finally:
        await nc.close()


@dataclass
class Timed:
    """One phase of ``calm``'s submits: seconds from each request to its job's ``submitted``
    event (intake's part) and to its ``bound`` event (the whole way), as they arrive from
    ``calm``'s own stream."""

    to_submitted: list[float]
    to_bound: list[float]


async def measure_calm(url: str, creds: Path, label: str, submits: int) -> Timed:
    """Time ``submits`` request-reply submits of ``calm``, one after another, each to its
    job's ``bound`` event."""
    nc = await tenant_client(url, creds, CALM)
    arrived: dict[tuple[str, str], float] = {}
    waiting: dict[str, asyncio.Future[None]] = {}

    async def on_event(message: Any) -> None:
        event = pb.Event.FromString(message.data)
        kind = event.WhichOneof("body")
        arrived[event.job_id, kind] = time.monotonic()
        if kind == "bound" and event.job_id in waiting and not waiting[event.job_id].done():
            waiting[event.job_id].set_result(None)

    try:
        js = nc.jetstream()
        subscription = await js.subscribe(
            SUBJECTS.job(f"{CALM}.*", "*"),
            stream=SUBJECTS.tenant_stream(CALM),
            ordered_consumer=True,
            deliver_policy=DeliverPolicy.NEW,
            cb=on_event,
        )
        timed = Timed([], [])
        with no_collector_pauses():
            for number in range(submits):
                started = time.monotonic()
                reply = await nc.request(
                    SUBJECTS.api_submit_for(CALM), submit_body(f"{label}-{number}"), timeout=30
                )
                [job] = json.loads(reply.data)["job_ids"]
                if (job, "bound") not in arrived:
                    waiting[job] = asyncio.get_running_loop().create_future()
                    await asyncio.wait_for(waiting[job], timeout=30)
                timed.to_submitted.append(arrived[job, "submitted"] - started)
                timed.to_bound.append(arrived[job, "bound"] - started)
        await subscription.unsubscribe()
        return timed
    finally:
        await nc.close()


class Flood:
    """Tenant ``flood``'s every way, each in a loop of its own until ``stop``."""

    def __init__(self, url: str, creds: Path, ways: frozenset[str] = frozenset()) -> None:
        """``ways``: the names of the ways to flood (``WAYS``); empty: every one."""
        self.url, self.creds = url, creds
        self.ways = ways or frozenset(WAYS)
        self.counts: dict[str, int] = {}
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self.tricks: list[str] = []

    def count(self, what: str, number: int = 1) -> None:
        self.counts[what] = self.counts.get(what, 0) + number

    async def start(self) -> None:
        self.main = await tenant_client(self.url, self.creds, FLOOD)
        if "delivery_tricks" in self.ways:  # made once, delivering for as long as they live
            await self.delivery_tricks()
        loops = [getattr(self, way) for way in WAYS if way in self.ways and way in LOOPED]
        self._tasks = [asyncio.create_task(self._loop(way)) for way in loops]

    async def _loop(self, way: Callable[[], Awaitable[None]]) -> None:
        while not self._stop.is_set():
            try:
                await way()
            except (TimeoutError, nats.errors.Error, OSError):
                self.count("errors")
            await asyncio.sleep(0)

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        stream = SUBJECTS.tenant_stream(FLOOD)
        with contextlib.suppress(nats.errors.Error):
            for name in self.tricks:
                await self.main.jetstream().delete_consumer(stream, name)
        await self.main.close()

    async def rate_refused_requests(self) -> None:
        tries = [
            self.main.request(SUBJECTS.api_submit_for(FLOOD), submit_body(f"r{i}"), timeout=5)
            for i in range(REQUESTS_AT_ONCE)
        ]
        answers = await asyncio.gather(*tries, return_exceptions=True)
        self.count("rate_refused_requests", len(answers))

    async def fire_and_forget(self) -> None:
        for number in range(100):
            await self.main.publish(SUBJECTS.submit_for(FLOOD), submit_body(f"f{number}"))
        await self.main.flush(timeout=5)
        self.count("fire_and_forget", 100)
        await asyncio.sleep(0.05)

    @contextlib.asynccontextmanager
    async def _own_client(self) -> AsyncIterator[Client]:
        """A connection of the flooding tenant's own, closed after, then a pause."""
        nc = await tenant_client(self.url, self.creds, FLOOD, error_cb=_ignore)
        try:
            yield nc
        finally:
            await nc.close()
        await asyncio.sleep(0.1)

    async def oversized(self) -> None:
        async with self._own_client() as nc:
            nc._max_payload = 16 * TENANT_MAX_PAYLOAD  # the client's own check off
            with contextlib.suppress(nats.errors.Error):
                await nc.publish(SUBJECTS.submit_for(FLOOD), b"x" * (2 * TENANT_MAX_PAYLOAD))
                await nc.flush(timeout=2)
            self.count("oversized")

    async def subscriptions(self) -> None:
        async with self._own_client() as nc:
            prefix = inbox_prefix(tenant_identity(FLOOD))
            with contextlib.suppress(nats.errors.Error):
                for number in range(TENANT_MAX_SUBSCRIPTIONS + 10):
                    await nc.subscribe(f"{prefix}.flood.{number}")
                await nc.flush(timeout=2)
            self.count("subscription_floods")

    async def consumers(self) -> None:
        stream = SUBJECTS.tenant_stream(FLOOD)
        made = []
        for _ in range(20):  # past the stream's 16
            config = {"deliver_policy": "all", "ack_policy": "explicit"}
            body = json.dumps({"stream_name": stream, "config": config}).encode()
            answer = await self.main.request(f"$JS.API.CONSUMER.CREATE.{stream}", body, timeout=5)
            if b'"error"' in answer.data:
                self.count("consumers_refused")
            else:
                made.append(json.loads(answer.data)["name"])
                self.count("consumers_made")
        for name in made:
            await self.main.jetstream().delete_consumer(stream, name)

    async def delivery_tricks(self) -> None:
        stream = SUBJECTS.tenant_stream(FLOOD)
        targets = [
            SUBJECTS.submit,
            SUBJECTS.submit_for(CALM),
            SUBJECTS.submit_stored(CALM),
            SUBJECTS.api_submit_for(CALM),
        ]
        for target in targets:
            config = {
                "deliver_subject": target,
                "deliver_policy": "all",
                "ack_policy": "none",
                "idle_heartbeat": 100_000_000,
                "flow_control": True,
            }
            body = json.dumps({"stream_name": stream, "config": config}).encode()
            answer = await self.main.request(f"$JS.API.CONSUMER.CREATE.{stream}", body, timeout=5)
            if b'"error"' not in answer.data:
                self.tricks.append(json.loads(answer.data)["name"])
            self.count("delivery_tricks")

    async def reply_tricks(self) -> None:
        request = f"$JS.API.STREAM.INFO.{SUBJECTS.tenant_stream(FLOOD)}"
        replies = [
            SUBJECTS.submit,
            SUBJECTS.submit_for(CALM),
            SUBJECTS.submit_stored(CALM),
            SUBJECTS.api_submit,
            SUBJECTS.api_submit_for(CALM),
            SUBJECTS.job(f"{CALM}.0123456789ab-x", "succeeded"),
        ]
        for _ in range(20):
            for reply in replies:
                await self.main.publish(request, b"", reply=reply)
        await self.main.flush(timeout=5)
        self.count("reply_tricks", 20 * len(replies))
        await asyncio.sleep(0.05)


LOOPED = (
    "rate_refused_requests",
    "fire_and_forget",
    "oversized",
    "subscriptions",
    "consumers",
    "reply_tricks",
)
"""The ways of ``Flood`` that go on in a loop of their own."""
WAYS = (*LOOPED, "delivery_tricks")
"""Every way of ``Flood``, by its method's name (``--ways``)."""


async def _ignore(_: Exception) -> None:
    return None


def start_process(args: list[str], **options: Any) -> subprocess.Popen[Any]:
    """A child process in the repository's folder."""
    return subprocess.Popen(args, cwd=REPO, **options)


def growth(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {name: after.get(name, 0) - before.get(name, 0) for name in sorted(after)}


async def run(rounds: int, submits: int, ways: frozenset[str] = frozenset()) -> dict[str, Any]:
    folder = Path(tempfile.mkdtemp(prefix="mdq-flood-"))
    secrets = folder / "secrets"
    generated = generate(secrets, NS)
    server: EmbeddedNats = start_nats(folder / "nats", auth=generated.server_block.read_text())
    env = child_environment(
        NATS_URL=server.url, MDQ_NAMESPACE=NS, MDQ_NATS_CREDS=str(generated.creds["intake"])
    )
    log = (folder / "intake.log").open("wb")
    intake = start_process(
        [sys.executable, "-m", "services.intake"], env=env, stdout=log, stderr=log
    )
    placement_log = (folder / "placement.log").open("wb")
    placement = start_process(  # the placement service with a backend that creates no pod
        [sys.executable, "bench/placement_noop.py"],
        env=side_env(server.url, NS, folder)
        | {
            "MDQ_NATS_CREDS": str(generated.creds["placement"]),
            "MDQ_PLACEMENT_LOAD_TIMEOUT_S": str(30 * NODE_REPORT_S),
        },
        stdout=placement_log,
        stderr=placement_log,
    )
    node: asyncio.Task[None] | None = None
    try:
        creds = await prepare(server.url, generated, secrets)
        node = asyncio.create_task(keep_node_reporting(server.url, generated.creds["metrics"]))
        await intake_answers(server.url, creds[CALM])
        await measure_calm(server.url, creds[CALM], "warm", 5)
        admin = generated.creds["admin"]
        per_round: list[dict[str, Any]] = []
        for number in range(rounds):
            await intake_caught_up(server.url, admin)  # the last flood's backlog handled
            before = await stream_bytes(server.url, admin)
            alone = await measure_calm(server.url, creds[CALM], f"a{number}", submits)
            middle = await stream_bytes(server.url, admin)
            flood = start_process(
                [
                    sys.executable,
                    __file__,
                    "--flood",
                    server.url,
                    str(creds[FLOOD]),
                    f"--ways={','.join(sorted(ways))}",
                ],
                stdout=subprocess.PIPE,
                text=True,
            )
            assert flood.stdout is not None
            await asyncio.to_thread(flood.stdout.readline)  # "flooding": under way
            flooded = await measure_calm(server.url, creds[CALM], f"f{number}", submits)
            after_flood = await stream_bytes(server.url, admin)
            flood.send_signal(signal.SIGINT)
            counts_line, _ = await asyncio.to_thread(flood.communicate, None, 60)
            counts = json.loads(counts_line.strip().splitlines()[-1])
            per_round.append(
                {
                    "alone_p50_ms": 1000 * percentile(alone.to_bound, 0.5),
                    "alone_p99_ms": 1000 * percentile(alone.to_bound, 0.99),
                    "flood_p50_ms": 1000 * percentile(flooded.to_bound, 0.5),
                    "flood_p99_ms": 1000 * percentile(flooded.to_bound, 0.99),
                    "p99_ratio": percentile(flooded.to_bound, 0.99)
                    / percentile(alone.to_bound, 0.99),
                    "alone_p99_ms_to_submitted": 1000 * percentile(alone.to_submitted, 0.99),
                    "flood_p99_ms_to_submitted": 1000 * percentile(flooded.to_submitted, 0.99),
                    "p99_ratio_to_submitted": percentile(flooded.to_submitted, 0.99)
                    / percentile(alone.to_submitted, 0.99),
                    "growth_alone_bytes": growth(before, middle),
                    "growth_flood_bytes": growth(middle, after_flood),
                    "flood_counts": counts,
                }
            )
        for name, process in (("intake", intake), ("placement", placement)):
            if process.poll() is not None:
                raise RuntimeError(f"{name} exited {process.returncode}: see {folder}/{name}.log")
    finally:
        if node is not None:
            node.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await node
        end_process(placement, timeout=15)
        end_process(intake, timeout=15)
        placement_log.close()
        log.close()
        server.stop()
        shutil.rmtree(folder, ignore_errors=True)
    ratios = [each["p99_ratio"] for each in per_round]
    shared = (
        SUBJECTS.submit_stream,
        SUBJECTS.jobs_stream,
        SUBJECTS.progress_stream,
        SUBJECTS.nodes_stream,
        SUBJECTS.node_summaries_stream,
        SUBJECTS.copies_stream,
        SUBJECTS.tenant_stream(CALM),
        SUBJECTS.tenant_submit_stream(CALM),
    )
    worst = {
        name: max(each["growth_flood_bytes"].get(name, 0) for each in per_round) for name in shared
    }
    bound = int(StorageSettings().tenant_submit_bytes)
    bounded = all(
        worst[name] <= (2 * bound if name == SUBJECTS.jobs_stream else bound)
        for name in shared
        if name not in (SUBJECTS.tenant_stream(CALM), SUBJECTS.tenant_submit_stream(CALM))
    )
    ratio = statistics.median(ratios)
    to_submitted = [each["p99_ratio_to_submitted"] for each in per_round]
    return {
        "bench": "tenant_flood",
        "rounds": rounds,
        "ways": sorted(ways or WAYS),
        "submits_per_phase": submits,
        "p99_ratio": round(ratio, 3),
        "p99_ratio_spread": [round(min(ratios), 3), round(max(ratios), 3)],
        "p99_ratio_to_submitted": round(statistics.median(to_submitted), 3),
        "worst_shared_growth_in_a_flood_bytes": worst,
        "flood_bound_bytes": bound,
        "per_round": per_round,
        "load_avg": list(os.getloadavg()),
        "ok": ratio <= 2.0 and bounded,
    }


async def flood_until_interrupted(url: str, creds: Path, ways: frozenset[str]) -> dict[str, int]:
    """Tenant ``flood``'s process (its own, so that its client's work does not slow the
    measured client): flood until SIGINT, then print what it did."""
    flood = Flood(url, creds, ways)
    await flood.start()
    await asyncio.sleep(1.0)  # every way under way
    print("flooding", flush=True)
    interrupted = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGINT, interrupted.set)
    await interrupted.wait()
    await flood.stop()
    return flood.counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--submits",
        type=int,
        default=500,
        help="calm's submits per phase (a p99 of fewer than a few hundred is the worst few)",
    )
    parser.add_argument("--quick", action="store_true", help="15 submits per phase")
    parser.add_argument(
        "--ways",
        type=lambda text: frozenset(filter(None, text.split(","))),
        default=frozenset(),
        help=f"flood only these ways, comma-separated (default: every one): {', '.join(WAYS)}",
    )
    parser.add_argument("--flood", nargs=2, metavar=("URL", "CREDS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.submits = 15
    if args.flood:
        counts = asyncio.run(flood_until_interrupted(args.flood[0], Path(args.flood[1]), args.ways))
        print(json.dumps(counts), flush=True)
        return
    unknown = args.ways - set(WAYS)
    if unknown:
        parser.error(
            f"--ways: no way named {', '.join(sorted(unknown))}; the ways: {', '.join(WAYS)}"
        )
    print(json.dumps(asyncio.run(run(args.rounds, args.submits, args.ways))))


if __name__ == "__main__":
    main()
