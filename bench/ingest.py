"""Benchmark: MD progress events per second from NATS JetStream into PostgreSQL.

The watcher's projector against the fastest raw fetch-and-COPY loop, on NATS servers side by
side (fsync-always with and without authentication, and the server's default interval), the
rows counted after every side; ratios are medians of the rounds' paired quotients. The last
line printed is one JSON object. Method and keys: docs/benchmarks.md, "make bench-ingest".
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import nats.errors
import psutil
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "libs")]

from mdq.bus.codec import encode  # noqa: E402
from mdq.bus.connect import connect  # noqa: E402
from mdq.bus.fetch import BatchFetcher  # noqa: E402
from mdq.bus.security.auth import Trust, issue  # noqa: E402
from mdq.bus.security.permissions import Names, service_permissions  # noqa: E402
from mdq.bus.streams import ensure_streams  # noqa: E402
from mdq.bus.subjects import Subjects  # noqa: E402
from mdq.cli.replay import caught_up  # noqa: E402
from mdq.contracts import pb  # noqa: E402
from mdq.core.events import make_event  # noqa: E402
from mdq.core.ids import pod_name  # noqa: E402
from mdq.core.producers import owner_of  # noqa: E402
from mdq.embedded import SYNC_ALWAYS, SYNC_SERVER_DEFAULT, start_nats, start_postgres  # noqa: E402
from mdq.memory import keep_state_out_of_gc  # noqa: E402
from mdq.store.engine import asyncpg_dsn, create_writer_pool  # noqa: E402
from mdq.store.migrate import upgrade_async  # noqa: E402
from mdq.store.projection import PROGRESS_COLUMNS  # noqa: E402
from services.watcher.projector import Projector  # noqa: E402
from services.watcher.settings import WatcherSettings  # noqa: E402

T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
PUBLISH_TIMEOUT_S = 60.0
"""An fsynced publish waits for the disk; 2,000 in flight on a busy disk take seconds."""
RAW_TABLE = """
CREATE TABLE IF NOT EXISTS {name} (
    job_id text NOT NULL, attempt int NOT NULL, step bigint NOT NULL,
    time timestamptz NOT NULL, time_ps float8 NOT NULL, potential_kj_mol float8 NOT NULL,
    kinetic_kj_mol float8 NOT NULL, temperature_k float8 NOT NULL, ns_per_day float8 NOT NULL,
    event_id text NOT NULL, stream text NOT NULL, stream_seq bigint NOT NULL,
    producer text NOT NULL, target_steps bigint NOT NULL, eta_s float8 NOT NULL,
    done_reason text NOT NULL, units text,
    PRIMARY KEY (job_id, attempt, step))
"""
RAW_COLUMNS = list(PROGRESS_COLUMNS)


def lifecycle_events(job_ids: list[str]) -> list[pb.Event]:
    """submitted, bound, started for every job (the jobs the progress is about)."""
    events = []
    for number, job in enumerate(job_ids):
        spec = pb.JobSpec(name=job.split("-", 1)[1], steps=10_000_000, report_interval_steps=10)
        spec.resources.cpu, spec.resources.memory_mb = 1, 1024
        node = f"node-{number % 4}"
        at = T0 + timedelta(milliseconds=number)
        for kind, body in (
            ("submitted", pb.JobSubmitted(spec=spec, request_id=job.split("-", 1)[0])),
            ("bound", pb.JobBound(node=node, pod_name=pod_name(job, 1))),
            ("started", pb.JobStarted(node=node, pod_name=pod_name(job, 1))),
        ):
            attempt = 0 if kind == "submitted" else 1
            events.append(
                make_event(kind, body, job_id=job, attempt=attempt, producer=owner_of(kind), at=at)
            )
    return events


def progress_events(job_ids: list[str], count: int) -> list[pb.Event]:
    """``count`` progress reports, round-robin over the jobs, steps increasing."""
    events = []
    for index in range(count):
        job = job_ids[index % len(job_ids)]
        step = 10 * (index // len(job_ids) + 1)
        body = pb.Progress(
            step=step,
            target_steps=10_000_000,
            time_ps=step * 0.002,
            potential_kj_mol=-41_000.0 - (index % 997) * 0.37,
            kinetic_kj_mol=6_200.0 + (index % 89) * 0.11,
            temperature_k=300.0 + (index % 13) * 0.07,
            ns_per_day=31.5,
            eta_s=3600.0,
        )
        at = T0 + timedelta(seconds=1, milliseconds=index)
        events.append(
            make_event(
                "progress", body, job_id=job, attempt=1, producer="runner", at=at, detail=step
            )
        )
    return events


async def publish(js: JetStreamContext, subjects: Subjects, events: list[pb.Event]) -> float:
    """Publish with many acks in flight; return events/s."""
    started = time.perf_counter()
    window = 2000
    for start in range(0, len(events), window):
        chunk = events[start : start + window]
        await asyncio.gather(
            *(
                js.publish(
                    subjects.for_event(event),
                    encode(event),
                    headers={"Nats-Msg-Id": event.event_id},
                    timeout=PUBLISH_TIMEOUT_S,
                )
                for event in chunk
            )
        )
    return len(events) / (time.perf_counter() - started)


async def fresh_database(admin_url: str, name: str) -> str:
    admin = await asyncpg.connect(asyncpg_dsn(admin_url))
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    base, _, query = admin_url.partition("?")
    return base.rsplit("/", 1)[0] + f"/{name}" + (f"?{query}" if query else "")


def row_of(event: pb.Event, stream: str, sequence: int) -> tuple[Any, ...]:
    """The ``progress`` row of one report (what the raw loop copies)."""
    body = event.progress
    return (
        event.job_id,
        event.attempt,
        body.step,
        event.time.ToDatetime(tzinfo=UTC),
        body.time_ps,
        body.potential_kj_mol,
        body.kinetic_kj_mol,
        body.temperature_k,
        body.ns_per_day,
        event.event_id,
        stream,
        sequence,
        event.producer,
        body.target_steps,
        body.eta_s,
        body.done_reason,
        body.units or None,
    )


async def raw_copy(database_url: str, rows: list[tuple[Any, ...]]) -> float:
    """COPY alone: rows/s of copy_records_to_table, in chunks like a pipeline would send."""
    connection = await asyncpg.connect(asyncpg_dsn(database_url))
    try:
        await connection.execute(RAW_TABLE.format(name="raw_copy"))
        started = time.perf_counter()
        for start in range(0, len(rows), 5000):
            await connection.copy_records_to_table(
                "raw_copy", records=rows[start : start + 5000], columns=RAW_COLUMNS
            )
        return len(rows) / (time.perf_counter() - started)
    finally:
        await connection.close()


def stream_sequence(reply: str) -> int:
    """The stream sequence of a JetStream delivery, straight from its reply subject
    (``$JS.ACK.<stream>.<consumer>.<n>.<stream seq>...``, or the form with a domain and an
    account hash): nats-py's ``Msg.metadata`` builds dataclasses and a datetime for it."""
    tokens = reply.split(".")
    return int(tokens[5] if len(tokens) == 9 else tokens[7])


def fast_row(event: pb.Event, stream: str, sequence: int) -> tuple[Any, ...]:
    """``row_of`` with the time computed by plain arithmetic (protobuf's ``ToDatetime`` goes
    through rounding helpers)."""
    body, at = event.progress, event.time
    return (
        event.job_id,
        event.attempt,
        body.step,
        EPOCH + timedelta(0, at.seconds, at.nanos // 1000),
        body.time_ps,
        body.potential_kj_mol,
        body.kinetic_kj_mol,
        body.temperature_k,
        body.ns_per_day,
        event.event_id,
        stream,
        sequence,
        event.producer,
        body.target_steps,
        body.eta_s,
        body.done_reason,
        body.units or None,
    )


async def durable_consumer(js: JetStreamContext, stream: str, batch: int) -> str:
    name = f"raw-{uuid.uuid4().hex[:6]}"
    await js.add_consumer(
        stream,
        config=ConsumerConfig(
            durable_name=name,
            ack_policy=AckPolicy.ALL,
            deliver_policy=DeliverPolicy.ALL,
            max_ack_pending=max(1000, 4 * batch),
        ),
    )
    return name


async def count_rows(database_url: str, table: str) -> int:
    connection = await asyncpg.connect(asyncpg_dsn(database_url))
    try:
        return int(await connection.fetchval(f"SELECT count(*) FROM {table}"))
    finally:
        await connection.close()


async def raw_fastest(
    js: JetStreamContext, subjects: Subjects, database_url: str, *, total: int, batch: int
) -> float:
    """The fastest raw loop: the watcher's own fetch (``BatchFetcher`` on a durable AckAll
    pull consumer), the next batch fetched while the current one is written, protobuf decode,
    one COPY per batch into ``progress`` of a freshly migrated database, ack after commit; no
    mdq logic. Events/s; the table must then hold exactly ``total`` rows."""
    await upgrade_async(database_url)
    stream = subjects.progress_stream
    name = await durable_consumer(js, stream, batch)
    fetcher = await BatchFetcher(js, stream=stream, consumer=name).start()
    connection = await asyncpg.connect(asyncpg_dsn(database_url))
    freezer = asyncio.create_task(keep_state_out_of_gc())  # as the watcher runs it
    try:
        done = 0
        started = time.perf_counter()
        ahead = asyncio.create_task(fetcher.fetch(batch, 1.0))
        while done < total:
            messages = await ahead
            ahead = asyncio.create_task(fetcher.fetch(batch, 1.0))  # while this one is written
            if not messages:
                continue
            rows = []
            for message in messages:
                event = pb.Event.FromString(message.data)
                rows.append(fast_row(event, stream, stream_sequence(message.reply)))
            async with connection.transaction():
                await connection.copy_records_to_table(
                    "progress", records=rows, columns=RAW_COLUMNS
                )
            await messages[-1].ack()
            done += len(messages)
        elapsed = time.perf_counter() - started
        ahead.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await ahead
    finally:
        freezer.cancel()
        await connection.close()
        await fetcher.close()
        await js.delete_consumer(stream, name)
    stored = await count_rows(database_url, "progress")
    if stored != total:
        raise SystemExit(f"raw loop stored {stored} progress rows of {total}")
    return total / elapsed


async def raw_nats_py_fetch(
    js: JetStreamContext, subjects: Subjects, database_url: str, *, total: int, batch: int
) -> float:
    """The simple raw loop (nats-py's pull ``fetch``, no prefetch, COPY into a table shaped
    like ``progress``, ack after commit); events/s, rows counted after."""
    stream = subjects.progress_stream
    name = await durable_consumer(js, stream, batch)
    table = "raw_" + name.replace("-", "_")
    subscription = await js.pull_subscribe_bind(name, stream=stream, pending_msgs_limit=4 * batch)
    connection = await asyncpg.connect(asyncpg_dsn(database_url))
    try:
        await connection.execute(RAW_TABLE.format(name=table))
        done = 0
        started = time.perf_counter()
        while done < total:
            try:
                messages = await subscription.fetch(batch, timeout=1.0)
            except (TimeoutError, nats.errors.TimeoutError):
                continue
            if not messages:
                continue
            rows = []
            for message in messages:
                event = pb.Event()
                event.ParseFromString(message.data)
                rows.append(row_of(event, stream, message.metadata.sequence.stream))
            async with connection.transaction():
                await connection.copy_records_to_table(table, records=rows, columns=RAW_COLUMNS)
            await messages[-1].ack()
            done += len(messages)
        elapsed = time.perf_counter() - started
        stored = int(await connection.fetchval(f"SELECT count(*) FROM {table}"))
    finally:
        await connection.close()
        await subscription.unsubscribe()
        await js.delete_consumer(stream, name)
    if stored != total:
        raise SystemExit(f"nats-py raw loop stored {stored} rows of {total}")
    return total / elapsed


async def watcher(
    js: JetStreamContext,
    subjects: Subjects,
    database_url: str,
    *,
    settings: WatcherSettings,
    progress: int,
    lifecycle: int,
    consumers: tuple[str, str],
) -> float:
    """The projector from an empty database until both streams are projected; events/s. The
    database must then hold exactly ``progress`` reports and ``lifecycle`` other events."""
    await upgrade_async(database_url)
    pool = await create_writer_pool(database_url, size=settings.pool_size)
    wanted = {
        stream: (await js.stream_info(stream)).state.last_seq
        for stream in (subjects.jobs_stream, subjects.progress_stream)
    }
    jobs_consumer, progress_consumer = consumers
    projector = Projector(
        js=js,
        subjects=subjects,
        pool=pool,
        batch_size=settings.batch_size,
        batch_wait_s=settings.batch_wait_s,
        jobs_consumer=jobs_consumer,
        progress_consumer=progress_consumer,
    )
    watching = await asyncpg.connect(asyncpg_dsn(database_url))  # the bench's own, not mdq's
    started = time.perf_counter()
    task = asyncio.create_task(projector.run())
    freezer = asyncio.create_task(keep_state_out_of_gc())  # as services.watcher runs it
    try:
        await caught_up(watching, wanted, task, poll_s=0.01)
        elapsed = time.perf_counter() - started
        reports = int(await pool.fetchval("SELECT count(*) FROM progress"))
        others = int(await pool.fetchval("SELECT count(*) FROM job_events"))
    finally:
        await watching.close()
        freezer.cancel()
        projector.stop()
        await asyncio.wait_for(task, timeout=30)
        for stream, consumer in (
            (subjects.jobs_stream, jobs_consumer),
            (subjects.progress_stream, progress_consumer),
        ):
            with contextlib.suppress(Exception):
                await js.delete_consumer(stream, consumer)
        await pool.close()
    if (reports, others) != (progress, lifecycle):
        raise SystemExit(
            f"watcher stored {reports} progress rows of {progress} and {others} job events of "
            f"{lifecycle}"
        )
    return sum(wanted.values()) / elapsed


SERVERS = {
    "fsync_always": (SYNC_ALWAYS, True),
    "fsync_always_open": (SYNC_ALWAYS, False),
    "fsync_default": (SYNC_SERVER_DEFAULT, True),
}
"""The NATS servers of every run: (JetStream ``sync_interval``, whether clients authenticate).
mdq's embedded default is the first: fsync before every acknowledgement, and every client
proving who it is (``mdq.bus.security.auth``), the watcher with its own least permissions. The
second is the same without authentication (the cost of the closed bus), the third the same with the
server's default fsync interval (the cost of fsync-always)."""


PUBLISH_SLICES = 8
"""The reports are published in slices, alternating the servers (ABBA), so that a change in
the machine's load hits every server's publish rate; the cost of authentication in publishing
is the median of the slices' quotients."""


@dataclass
class Server:
    """One NATS server of the run, its client and the namespace its events are in."""

    name: str
    nc: Client
    subjects: Subjects
    url: str
    trust: Trust | None
    """The server's trust chain when its clients authenticate."""
    folder: Path
    process: psutil.Process
    """The server's process, whose CPU time is read around each watcher run."""
    publish_s: float = 0.0
    slice_rates: list[float] = field(default_factory=list)
    """The reports' publish rate of each slice."""

    async def watcher_client(self, consumers: tuple[str, str]) -> Client:
        """A connection as the watcher would make it: on an authenticating server with the
        watcher's own credentials, allowed exactly these two durable consumers."""
        if self.trust is None:
            return await connect(self.url, name=f"bench-watcher-{self.name}")
        names = Names(watcher_consumers=consumers)
        permissions = service_permissions("watcher", self.subjects, names)
        creds = issue(self.trust, permissions, self.folder / f"watcher-{consumers[0]}.creds")
        return await connect(self.url, name=f"bench-watcher-{self.name}", creds=creds)

    @property
    def js(self) -> JetStreamContext:
        return self.nc.jetstream()


def paired(numerators: list[float], denominators: list[float]) -> list[float]:
    """The quotients of two series measured side by side, pair by pair."""
    return [round(a / b, 3) for a, b in zip(numerators, denominators, strict=True)]


async def publish_all(
    servers: list[Server], lifecycle: list[pb.Event], progress: list[pb.Event]
) -> None:
    """Publish the same events to every server; time the reports' publishes per server."""
    for server in servers:
        await ensure_streams(server.js, server.subjects)
        await publish(server.js, server.subjects, lifecycle)
    size = -(-len(progress) // PUBLISH_SLICES)
    for index, start in enumerate(range(0, len(progress), size)):
        chunk = progress[start : start + size]
        for server in servers if index % 4 in (0, 3) else list(reversed(servers)):
            rate = await publish(server.js, server.subjects, chunk)
            server.publish_s += len(chunk) / rate
            server.slice_rates.append(rate)


async def one_round(
    server: Server,
    postgres_url: str,
    arguments: argparse.Namespace,
    *,
    number: int,
    lifecycle: int,
    progress: list[pb.Event],
    results: dict[str, list[float]],
) -> None:
    """Project ``server``'s events with the raw loops and the watcher (each into a fresh
    database and through a fresh consumer), appending each rate to ``results``."""
    js, subjects, name = server.js, server.subjects, server.name
    if name == "fsync_always":
        rows = [
            row_of(event, subjects.progress_stream, index)
            for index, event in enumerate(progress, start=1)
        ]
        copy_url = await fresh_database(postgres_url, f"bench_copy_{number}")
        results["raw_copy"].append(await raw_copy(copy_url, rows))
        simple_url = await fresh_database(postgres_url, f"bench_simple_{number}")
        results["raw_nats_py_fetch"].append(
            await raw_nats_py_fetch(
                js, subjects, simple_url, total=len(progress), batch=arguments.raw_batches[0]
            )
        )
    best = 0.0
    for batch in arguments.raw_batches:  # the strongest raw loop: its best fetch size
        raw_url = await fresh_database(postgres_url, f"bench_raw_{name}_{number}_{batch}")
        rate = await raw_fastest(js, subjects, raw_url, total=len(progress), batch=batch)
        results.setdefault(f"raw_{name}_batch_{batch}", []).append(rate)
        best = max(best, rate)
    results[f"raw_{name}"].append(best)
    watcher_url = await fresh_database(postgres_url, f"bench_watcher_{name}_{number}")
    consumers = (f"watcher-jobs-{uuid.uuid4().hex[:6]}", f"watcher-progress-{uuid.uuid4().hex[:6]}")
    watcher_nc = await server.watcher_client(consumers)
    cpu_before = sum(server.process.cpu_times()[:2])
    try:
        results[f"watcher_{name}"].append(
            await watcher(
                watcher_nc.jetstream(),
                subjects,
                watcher_url,
                settings=WatcherSettings(),
                progress=len(progress),
                lifecycle=lifecycle,
                consumers=consumers,
            )
        )
    finally:
        await watcher_nc.drain()
    events = len(progress) + lifecycle
    server_cpu_us = 1e6 * (sum(server.process.cpu_times()[:2]) - cpu_before) / events
    results[f"server_cpu_us_watcher_{name}"].append(server_cpu_us)
    print(
        f"round {number + 1} {name:13s}: raw {results[f'raw_{name}'][-1]:9,.0f} ev/s, "
        f"watcher {results[f'watcher_{name}'][-1]:9,.0f} ev/s "
        f"(server {server_cpu_us:.1f} us CPU per event)",
        flush=True,
    )


async def run(arguments: argparse.Namespace) -> dict[str, Any]:
    folder = Path(tempfile.mkdtemp(prefix="mdq-bench-ingest-"))
    namespaces = {name: "bench" + uuid.uuid4().hex[:8] for name in SERVERS}
    trusts = {
        name: Trust.generate(namespaces[name]) if auth else None
        for name, (_, auth) in SERVERS.items()
    }
    embedded = {
        name: start_nats(
            folder / name,
            sync_interval=sync,
            auth=trust.server_block() if (trust := trusts[name]) else "",
        )
        for name, (sync, _) in SERVERS.items()
    }
    postgres = start_postgres(folder / "pg", database="bench", keep=False)
    servers = []
    for name, nats_server in embedded.items():
        trust, subjects = trusts[name], Subjects(namespaces[name])
        admin = None  # the harness publishes every kind and makes the raw loops' consumers
        if trust is not None:
            admin = issue(trust, service_permissions("admin", subjects), folder / f"{name}.creds")
        servers.append(
            Server(
                name=name,
                nc=await connect(nats_server.url, name=f"bench-ingest-{name}", creds=admin),
                subjects=subjects,
                url=nats_server.url,
                trust=trust,
                folder=folder,
                process=psutil.Process(nats_server.process.pid),
            )
        )
    try:
        job_ids = [f"0123456789ab-md{number:03d}" for number in range(arguments.jobs)]
        lifecycle = lifecycle_events(job_ids)
        progress = progress_events(job_ids, arguments.events)
        await publish_all(servers, lifecycle, progress)
        for server in servers:
            print(
                f"published {len(progress):,} reports to {server.name}: "
                f"{len(progress) / server.publish_s:,.0f}/s",
                flush=True,
            )
        results: dict[str, list[float]] = {"raw_copy": [], "raw_nats_py_fetch": []}
        for server in servers:
            results[f"raw_{server.name}"] = []
            results[f"watcher_{server.name}"] = []
            results[f"server_cpu_us_watcher_{server.name}"] = []
        for number in range(arguments.rounds):
            # Alternate which server goes first, so load drifts hit both alike.
            for server in servers if number % 2 == 0 else list(reversed(servers)):
                await one_round(
                    server,
                    postgres.url,
                    arguments,
                    number=number,
                    lifecycle=len(lifecycle),
                    progress=progress,
                    results=results,
                )
        best = {key: max(values) for key, values in results.items()}
        auth_rounds = paired(results["watcher_fsync_always"], results["watcher_fsync_always_open"])
        auth_cpu_rounds = paired(
            results["server_cpu_us_watcher_fsync_always"],
            results["server_cpu_us_watcher_fsync_always_open"],
        )
        by_name = {server.name: server for server in servers}
        publish_auth_slices = paired(
            by_name["fsync_always"].slice_rates, by_name["fsync_always_open"].slice_rates
        )
        publish_rate = {server.name: len(progress) / server.publish_s for server in servers}
        events_per_s, raw_per_s = best["watcher_fsync_always"], best["raw_fsync_always"]
        # the headline ratios: medians of the rounds' paired quotients (both sides of a pair
        # measured in the same round), each round's quotient and their spread listed
        ratios = {
            "ratio_vs_raw": paired(results["watcher_fsync_always"], results["raw_fsync_always"]),
            "fsync_cost_ratio": paired(
                results["watcher_fsync_always"], results["watcher_fsync_default"]
            ),
            "raw_fsync_cost_ratio": paired(
                results["raw_fsync_always"], results["raw_fsync_default"]
            ),
        }
        headline: dict[str, Any] = {}
        for key, rounds in ratios.items():
            headline[key] = round(statistics.median(rounds), 3)
            headline[f"{key}_rounds"] = rounds
            headline[f"{key}_spread"] = round(max(rounds) - min(rounds), 3)
        return headline | {
            "benchmark": "ingest",
            "events": len(progress) + len(lifecycle),
            "progress_events": len(progress),
            "jobs": arguments.jobs,
            "rounds": arguments.rounds,
            "events_per_s": round(events_per_s),
            "raw_pipeline_per_s": round(raw_per_s),
            "ratio_vs_raw_best": round(events_per_s / raw_per_s, 3),
            "raw_nats_py_fetch_pipeline_per_s": round(best["raw_nats_py_fetch"]),
            "ratio_vs_raw_nats_py_fetch": round(events_per_s / best["raw_nats_py_fetch"], 3),
            "raw_copy_rows_per_s": round(best["raw_copy"]),
            "publish_per_s": round(publish_rate["fsync_always"]),
            "fsync_always_per_s": round(events_per_s),
            "fsync_default_per_s": round(best["watcher_fsync_default"]),
            "fsync_cost_ratio_best": round(events_per_s / best["watcher_fsync_default"], 3),
            "raw_fsync_always_per_s": round(raw_per_s),
            "raw_fsync_default_per_s": round(best["raw_fsync_default"]),
            "raw_fsync_cost_ratio_best": round(raw_per_s / best["raw_fsync_default"], 3),
            "publish_fsync_always_per_s": round(publish_rate["fsync_always"]),
            "publish_fsync_default_per_s": round(publish_rate["fsync_default"]),
            "publish_fsync_cost_ratio": round(
                publish_rate["fsync_always"] / publish_rate["fsync_default"], 3
            ),
            "auth_on_per_s": round(events_per_s),
            "auth_off_per_s": round(best["watcher_fsync_always_open"]),
            "auth_cost_ratio": round(statistics.median(auth_rounds), 3),
            "auth_cost_round_ratios": auth_rounds,
            "auth_cost_ratio_best": round(events_per_s / best["watcher_fsync_always_open"], 3),
            "server_auth_cpu_cost_ratio": round(statistics.median(auth_cpu_rounds), 3),
            "server_auth_cpu_cost_round_ratios": auth_cpu_rounds,
            "server_cpu_us_per_event_auth_on": round(
                statistics.median(results["server_cpu_us_watcher_fsync_always"]), 1
            ),
            "server_cpu_us_per_event_auth_off": round(
                statistics.median(results["server_cpu_us_watcher_fsync_always_open"]), 1
            ),
            "publish_auth_on_per_s": round(publish_rate["fsync_always"]),
            "publish_auth_off_per_s": round(publish_rate["fsync_always_open"]),
            "publish_auth_cost_ratio": round(statistics.median(publish_auth_slices), 3),
            "publish_auth_cost_slice_ratios": publish_auth_slices,
            "rows_checked": "exact: progress and job_events after every watcher run, progress "
            "after every raw run",
            "watcher_batch_size": WatcherSettings().batch_size,
            "raw_batch_sizes": arguments.raw_batches,
            "all_rounds": {key: [round(v, 1) for v in values] for key, values in results.items()},
            "quick": arguments.quick,
            "cpus": os.cpu_count(),
            "load_avg_1m": round(os.getloadavg()[0], 2),
        }
    finally:
        for server in servers:
            await server.nc.drain()
        for nats_server in embedded.values():
            nats_server.stop()
        postgres.stop()
        shutil.rmtree(folder, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=50_000, help="progress events")
    parser.add_argument("--jobs", type=int, default=50, help="running jobs they belong to")
    parser.add_argument(
        "--rounds", type=int, default=5, help="rounds, each on every server (best kept)"
    )
    parser.add_argument(
        "--quick", action="store_true", help="10,000 events, 20 jobs, 3 rounds: a check"
    )
    parser.add_argument(
        "--raw-batches",
        type=lambda text: sorted({int(size) for size in text.split(",")}),
        default=sorted({WatcherSettings().batch_size, 2000}),
        help="fetch sizes the raw loop runs at each round, its best kept (default: the "
        "watcher's batch size and 2,000)",
    )
    arguments = parser.parse_args()
    if arguments.quick:
        arguments.events, arguments.jobs, arguments.rounds = 10_000, 20, 3
    result = asyncio.run(run(arguments))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
