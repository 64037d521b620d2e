"""Benchmark: MD progress events per second from NATS JetStream into PostgreSQL.

Three measurements in one process, on the same NATS server and PostgreSQL server, over the
same events:

* ``raw_copy_rows_per_s``: asyncpg ``copy_records_to_table`` of rows already in memory
  (PostgreSQL alone, no NATS);
* ``raw_pipeline_per_s``: the least a projection must do, with no mdq logic: nats-py pull
  fetch of the PROGRESS stream in batches of the watcher's size, protobuf decode,
  ``copy_records_to_table`` into a table shaped exactly like ``progress`` (same columns, same
  primary key, logged like every table of the projection), ack after the commit;
* ``events_per_s``: the watcher's projector (``services.watcher.projector.Projector``) on a
  fresh, migrated database: every report stored once in ``progress`` (COPY), every lifecycle
  event in ``job_events``, the jobs folded, the offset committed in the same transaction, ack
  after commit.

``ratio_vs_raw = events_per_s / raw_pipeline_per_s``. Because the watcher fetches with
``mdq.bus.fetch.BatchFetcher`` rather than nats-py's ``fetch``, the same raw loop is also run
with that fetcher (``raw_lean_fetch_pipeline_per_s``, ``ratio_vs_raw_lean_fetch``): the cost
of mdq's own logic over the least a projection must do. The rounds alternate raw and watcher so
that background load on the machine hits both; the best round of each is reported. NATS and
PostgreSQL are started embedded in a temporary folder unless NATS_URL / DATABASE_URL are set.
The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import nats.errors
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "libs")]

from mdq.bus.codec import encode  # noqa: E402
from mdq.bus.connect import connect  # noqa: E402
from mdq.bus.fetch import BatchFetcher  # noqa: E402
from mdq.bus.subjects import Subjects  # noqa: E402
from mdq.contracts import pb  # noqa: E402
from mdq.core.events import make_event  # noqa: E402
from mdq.core.ids import pod_name  # noqa: E402
from mdq.embedded import start_nats, start_postgres  # noqa: E402
from mdq.store.engine import asyncpg_dsn, create_writer_pool  # noqa: E402
from mdq.store.migrate import upgrade_async  # noqa: E402
from mdq.store.projection import PROGRESS_COLUMNS  # noqa: E402
from services.watcher.projector import Projector  # noqa: E402
from services.watcher.settings import WatcherSettings  # noqa: E402

T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
RAW_TABLE = """
CREATE TABLE IF NOT EXISTS {name} (
    job_id text NOT NULL, attempt int NOT NULL, step bigint NOT NULL,
    time timestamptz NOT NULL, time_ps float8 NOT NULL, potential_kj_mol float8 NOT NULL,
    kinetic_kj_mol float8 NOT NULL, temperature_k float8 NOT NULL, ns_per_day float8 NOT NULL,
    event_id text NOT NULL, stream text NOT NULL, stream_seq bigint NOT NULL,
    producer text NOT NULL, target_steps bigint NOT NULL, eta_s float8 NOT NULL,
    done_reason text NOT NULL,
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
                make_event(kind, body, job_id=job, attempt=attempt, producer="bench", at=at)
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


async def raw_pipeline(
    js: JetStreamContext,
    subjects: Subjects,
    database_url: str,
    *,
    total: int,
    batch: int,
    lean: bool = False,
) -> float:
    """Pull-fetch + decode + COPY + ack, no mdq logic; events/s. ``lean`` fetches with
    ``mdq.bus.fetch.BatchFetcher`` (the watcher's fetch) instead of nats-py's."""
    name = f"raw-{uuid.uuid4().hex[:6]}"
    table = "raw_" + name.replace("-", "_")
    await js.add_consumer(
        subjects.progress_stream,
        config=ConsumerConfig(
            durable_name=name,
            ack_policy=AckPolicy.ALL,
            deliver_policy=DeliverPolicy.ALL,
            max_ack_pending=4 * batch,
        ),
    )
    stream = subjects.progress_stream
    subscription = await js.pull_subscribe_bind(name, stream=stream, pending_msgs_limit=4 * batch)
    fetcher = await BatchFetcher(js, stream=stream, consumer=name).start() if lean else None
    connection = await asyncpg.connect(asyncpg_dsn(database_url))
    try:
        await connection.execute(RAW_TABLE.format(name=table))
        done = 0
        started = time.perf_counter()
        while done < total:
            try:
                if fetcher is not None:
                    messages = await fetcher.fetch(batch, 1.0)
                else:
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
        return total / (time.perf_counter() - started)
    finally:
        await connection.close()
        await subscription.unsubscribe()
        if fetcher is not None:
            await fetcher.close()
        await js.delete_consumer(subjects.progress_stream, name)


async def watcher(
    js: JetStreamContext, subjects: Subjects, database_url: str, *, settings: WatcherSettings
) -> tuple[float, int]:
    """The projector from an empty database until both streams are projected; events/s."""
    await upgrade_async(database_url)
    pool = await create_writer_pool(database_url, size=settings.pool_size)
    wanted = {
        stream: (await js.stream_info(stream)).state.last_seq
        for stream in (subjects.jobs_stream, subjects.progress_stream)
    }
    jobs_consumer = f"watcher-jobs-{uuid.uuid4().hex[:6]}"
    progress_consumer = f"watcher-progress-{uuid.uuid4().hex[:6]}"
    projector = Projector(
        js=js,
        subjects=subjects,
        pool=pool,
        batch_size=settings.batch_size,
        batch_wait_s=settings.batch_wait_s,
        jobs_consumer=jobs_consumer,
        progress_consumer=progress_consumer,
    )
    started = time.perf_counter()
    task = asyncio.create_task(projector.run())
    try:
        while True:
            rows = await pool.fetch("SELECT stream, last_seq FROM consumer_offsets")
            have = {row["stream"]: row["last_seq"] for row in rows}
            if all(have.get(stream, 0) >= last for stream, last in wanted.items()):
                break
            if task.done():
                task.result()
            await asyncio.sleep(0.01)
        elapsed = time.perf_counter() - started
        projected = int(await pool.fetchval("SELECT count(*) FROM events"))  # the view
    finally:
        projector.stop()
        await asyncio.wait_for(task, timeout=30)
        for stream, consumer in (
            (subjects.jobs_stream, jobs_consumer),
            (subjects.progress_stream, progress_consumer),
        ):
            with contextlib.suppress(Exception):
                await js.delete_consumer(stream, consumer)
        await pool.close()
    return sum(wanted.values()) / elapsed, projected


async def run(arguments: argparse.Namespace) -> dict[str, Any]:
    servers: list[Any] = []
    folder = Path(tempfile.mkdtemp(prefix="mdq-bench-ingest-"))
    nats_url = os.environ.get("NATS_URL")
    if not nats_url:
        server = start_nats(folder / "nats")
        servers.append(server)
        nats_url = server.url
    postgres_url = os.environ.get("DATABASE_URL")
    if not postgres_url:
        postgres = start_postgres(folder / "pg", database="bench", keep=False)
        servers.append(postgres)
        postgres_url = postgres.url
    subjects = Subjects("bench" + uuid.uuid4().hex[:8])
    nc = await connect(nats_url, name="bench-ingest", subjects=subjects)
    js = nc.jetstream()
    try:
        job_ids = [f"0123456789ab-md{number:03d}" for number in range(arguments.jobs)]
        lifecycle = lifecycle_events(job_ids)
        progress = progress_events(job_ids, arguments.events)
        await publish(js, subjects, lifecycle)
        publish_per_s = await publish(js, subjects, progress)
        rows = [
            row_of(event, subjects.progress_stream, number)
            for number, event in enumerate(progress, start=1)
        ]
        settings = WatcherSettings()
        results: dict[str, list[float]] = {
            "raw_copy": [],
            "raw": [],
            "raw_lean_fetch": [],
            "watcher": [],
        }
        projected = 0
        for number in range(arguments.rounds):
            raw_url = await fresh_database(postgres_url, f"bench_raw_{number}")
            results["raw_copy"].append(await raw_copy(raw_url, rows))
            results["raw"].append(
                await raw_pipeline(
                    js, subjects, raw_url, total=len(progress), batch=arguments.raw_batch
                )
            )
            lean_url = await fresh_database(postgres_url, f"bench_lean_{number}")
            results["raw_lean_fetch"].append(
                await raw_pipeline(
                    js,
                    subjects,
                    lean_url,
                    total=len(progress),
                    batch=arguments.raw_batch,
                    lean=True,
                )
            )
            watcher_url = await fresh_database(postgres_url, f"bench_watcher_{number}")
            rate, projected = await watcher(js, subjects, watcher_url, settings=settings)
            results["watcher"].append(rate)
            print(
                f"round {number + 1}: raw copy {results['raw_copy'][-1]:,.0f} rows/s, "
                f"raw pipeline {results['raw'][-1]:,.0f} ev/s "
                f"(lean fetch {results['raw_lean_fetch'][-1]:,.0f}), watcher {rate:,.0f} ev/s",
                flush=True,
            )
        if projected != len(progress) + len(lifecycle):
            raise SystemExit(f"watcher projected {projected} of {len(progress) + len(lifecycle)}")
        events_per_s, raw_per_s = max(results["watcher"]), max(results["raw"])
        return {
            "benchmark": "ingest",
            "events": len(progress) + len(lifecycle),
            "progress_events": len(progress),
            "jobs": arguments.jobs,
            "rounds": arguments.rounds,
            "events_per_s": round(events_per_s),
            "raw_pipeline_per_s": round(raw_per_s),
            "ratio_vs_raw": round(events_per_s / raw_per_s, 3),
            "raw_lean_fetch_pipeline_per_s": round(max(results["raw_lean_fetch"])),
            "ratio_vs_raw_lean_fetch": round(events_per_s / max(results["raw_lean_fetch"]), 3),
            "raw_copy_rows_per_s": round(max(results["raw_copy"])),
            "publish_per_s": round(publish_per_s),
            "watcher_batch_size": settings.batch_size,
            "raw_batch_size": arguments.raw_batch,
            "all_rounds": {key: [round(v) for v in values] for key, values in results.items()},
            "cpus": os.cpu_count(),
            "load_avg_1m": round(os.getloadavg()[0], 2),
        }
    finally:
        await nc.drain()
        for running in reversed(servers):
            running.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000, help="progress events")
    parser.add_argument("--jobs", type=int, default=50, help="running jobs they belong to")
    parser.add_argument("--rounds", type=int, default=2, help="raw/watcher rounds (best kept)")
    parser.add_argument(
        "--raw-batch",
        type=int,
        default=WatcherSettings().batch_size,
        help="raw loop fetch size (default: the watcher's batch size)",
    )
    result = asyncio.run(run(parser.parse_args()))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
