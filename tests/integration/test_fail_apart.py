"""Parts fail apart: NATS and PostgreSQL that are not there yet, or go away.

- ``connect(wait=True)`` waits for a NATS server that starts later, saying so in its log;
- the watcher (``services.watcher.app.run_watcher``, its real composition) starts without
  PostgreSQL, turns pod phases into ``started`` / ``succeeded`` while the database is down, and
  projects every event exactly once when it comes back (its own PostgreSQL, in a tmp folder,
  started, stopped and restarted on the same folder by the test);
- PostgreSQL killed with SIGKILL in the middle of a projection and restarted: nothing lost,
  nothing doubled;
- an error that is not connection-class (a database that does not exist) stops the watcher
  instead of being retried forever.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path

import asyncpg
import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext

from mdq.backends.port import PodUpdate
from mdq.bus.connect import connect
from mdq.bus.publisher import EventPublisher
from mdq.bus.subjects import Subjects
from mdq.contracts import pb
from mdq.embedded import EmbeddedPostgres, free_port, start_nats, start_postgres
from mdq.store.migrate import upgrade_async
from services.watcher.app import run_watcher
from services.watcher.settings import WatcherSettings
from tests.helpers import (
    RecordingBackend,
    event,
    events_of,
    publisher,
    read_all,
    submitted,
    wait_for,
)

SETTINGS = WatcherSettings(batch_size=100, batch_wait_s=0.05, lost_min_silence_s=3600)


@contextlib.asynccontextmanager
async def background(coroutine: Awaitable[None]) -> AsyncIterator[asyncio.Task[None]]:
    """Run ``coroutine`` for the block; a crash of it fails the test (also at the end)."""
    task: asyncio.Task[None] = asyncio.ensure_future(coroutine)
    try:
        yield task
    finally:
        if task.done():
            task.result()  # re-raises the crash
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def alive(task: asyncio.Task[None]) -> None:
    """Fail with the task's own error if it ended."""
    if task.done():
        task.result()
        raise AssertionError(f"{task.get_name()} returned early")


@contextlib.asynccontextmanager
async def migrated_postgres(folder: Path) -> AsyncIterator[EmbeddedPostgres]:
    """A PostgreSQL in ``folder`` with database ``mdq``, migrated; stopped afterwards."""
    server = await asyncio.to_thread(start_postgres, folder, database="mdq", keep=False)
    try:
        await upgrade_async(server.url)
        yield server
    finally:
        with contextlib.suppress(Exception):
            await asyncio.to_thread(server.stop)


@pytest.fixture
async def own_postgres(tmp_path: Path) -> AsyncIterator[EmbeddedPostgres]:
    """A PostgreSQL of this test alone (never the session's), migrated, in a tmp folder."""
    async with migrated_postgres(tmp_path / "pg") as server:
        yield server


def pod(job: str, phase: pb.PodPhase) -> PodUpdate:
    return PodUpdate(
        pod_name=f"mdq-{job}-1",
        job_id=job,
        attempt=1,
        node="n1",
        phase=phase,
        exit_code=0,
        reason="",
    )


async def stream_ids(js: JetStreamContext, subject: str) -> list[str]:
    return [e.event_id for e in await read_all(js, subject)]


async def last_seq(js: JetStreamContext, stream: str) -> int:
    return int((await js.stream_info(stream)).state.last_seq)


async def projected_up_to(database_url: str, js: JetStreamContext, subjects: Subjects) -> bool:
    """True once the stored offsets reach the last message of both streams."""
    try:
        connection = await asyncpg.connect(database_url)
    except (OSError, asyncpg.PostgresError):
        return False
    try:
        rows = await connection.fetch("SELECT stream, last_seq FROM consumer_offsets")
    finally:
        await connection.close()
    have = {row["stream"]: row["last_seq"] for row in rows}
    for stream in (subjects.jobs_stream, subjects.progress_stream):
        if have.get(stream, 0) < await last_seq(js, stream):
            return False
    return True


async def assert_projected_once(
    database_url: str, js: JetStreamContext, subjects: Subjects
) -> None:
    """Every event of both streams is in PostgreSQL exactly once, and nothing else is."""
    job_ids = await stream_ids(js, subjects.job_all("*"))
    progress_ids = await stream_ids(js, subjects.progress("*"))
    connection = await asyncpg.connect(database_url)
    try:
        stored = [r["event_id"] for r in await connection.fetch("SELECT event_id FROM job_events")]
        reports = [r["event_id"] for r in await connection.fetch("SELECT event_id FROM progress")]
        offsets = {
            r["stream"]: r["last_seq"]
            for r in await connection.fetch("SELECT stream, last_seq FROM consumer_offsets")
        }
    finally:
        await connection.close()
    assert sorted(stored) == sorted(job_ids), "job_events differs from the JOBS stream"
    assert sorted(reports) == sorted(progress_ids), "progress differs from the PROGRESS stream"
    assert offsets == {
        subjects.jobs_stream: await last_seq(js, subjects.jobs_stream),
        subjects.progress_stream: await last_seq(js, subjects.progress_stream),
    }


async def caught_up_once(
    database_url: str,
    js: JetStreamContext,
    subjects: Subjects,
    watcher: asyncio.Task[None],
    *,
    timeout: float,
    what: str = "the projection to catch up",
) -> None:
    """Until PostgreSQL at ``database_url`` holds both streams up to their ends, the
    ``watcher`` alive all along; then every event is there exactly once."""

    async def caught_up() -> bool:
        alive(watcher)
        return await projected_up_to(database_url, js, subjects)

    await wait_for(caught_up, timeout=timeout, what=what)
    await assert_projected_once(database_url, js, subjects)


async def rows_of(database_url: str, query: str) -> list[asyncpg.Record]:
    """The rows ``query`` returns, on a connection of its own."""
    connection = await asyncpg.connect(database_url)
    try:
        rows: list[asyncpg.Record] = await connection.fetch(query)
    finally:
        await connection.close()
    return rows


async def publish_campaign(bus: EventPublisher, jobs: list[str], steps: range) -> None:
    """Each of ``jobs`` submitted, bound, started, reporting at every one of ``steps``
    (published 500 at a time) and succeeded at the last."""
    for job in jobs:
        await bus.publish(submitted(job))
        await bus.publish(event("bound", pb.JobBound(node="n1"), job=job, attempt=1))
        await bus.publish(event("started", pb.JobStarted(node="n1"), job=job, attempt=1))
    reports = [
        event("progress", pb.Progress(step=s, target_steps=steps[-1]), job=job, attempt=1, detail=s)
        for s in steps
        for job in jobs
    ]
    for start in range(0, len(reports), 500):
        await asyncio.gather(*(bus.publish(report) for report in reports[start : start + 500]))
    for job in jobs:
        body = pb.JobSucceeded(final_step=steps[-1], reason="steps_reached")
        await bus.publish(event("succeeded", body, job=job, attempt=1))


# -- NATS ---------------------------------------------------------------------------------


async def test_connect_waits_for_a_nats_server_that_starts_later(
    tmp_path: Path, subjects: Subjects, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="mdq.backoff")
    port = free_port()
    url = f"nats://127.0.0.1:{port}"
    connecting = asyncio.create_task(connect(url, name="late", subjects=subjects, wait=True))

    async def said_twice() -> bool:
        return sum(f"NATS at {url} not reachable" in m for m in caplog.messages) >= 2

    try:
        await wait_for(said_twice, timeout=20, what="two 'not reachable' lines")
        assert not connecting.done(), "connect gave up instead of waiting"
        server = await asyncio.to_thread(start_nats, tmp_path / "nats", port=port)
    except BaseException:
        connecting.cancel()
        raise
    try:
        client = await asyncio.wait_for(connecting, timeout=30)
        try:
            info = await client.jetstream().stream_info(subjects.jobs_stream)
            assert info.config.name == subjects.jobs_stream  # the streams were made on connect
        finally:
            await client.close()
    finally:
        await asyncio.to_thread(server.stop)
    delays = [m.rsplit("retrying in ", 1)[1] for m in caplog.messages if "retrying in" in m]
    assert delays[:3] == ["0.5 s", "1.0 s", "2.0 s"][: len(delays[:3])]  # backoff, not a fixed beat


# -- the watcher without PostgreSQL -------------------------------------------------------


async def test_pod_lifecycle_works_while_postgresql_is_down_and_the_projection_catches_up(
    nc: Client,
    subjects: Subjects,
    js: JetStreamContext,
    bus: EventPublisher,
    backend: RecordingBackend,
    own_postgres: EmbeddedPostgres,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="mdq.store.projection")
    await asyncio.to_thread(own_postgres.kill)  # down before the watcher starts
    jobs = ["r1-a", "r2-b"]
    for job in jobs:
        await bus.publish(submitted(job))
        await bus.publish(event("bound", pb.JobBound(node="n1"), job=job, attempt=1))
    watcher = run_watcher(
        nc=nc,
        subjects=subjects,
        database_url=own_postgres.url,
        backend=backend,
        settings=SETTINGS,
    )
    async with background(watcher) as task:
        for job in jobs:
            await backend.updates.put(pod(job, pb.POD_RUNNING))

        async def started() -> bool:
            return [len(await events_of(js, subjects, "started", job)) for job in jobs] == [1, 1]

        await wait_for(started, timeout=30, what="started while PostgreSQL is down")
        for job in jobs:
            for step in (100, 200, 300):
                reason = "steps_reached" if step == 300 else ""
                report = pb.Progress(step=step, target_steps=300, done_reason=reason)
                await bus.publish(event("progress", report, job=job, attempt=1, detail=step))
            await backend.updates.put(pod(job, pb.POD_SUCCEEDED))

        async def succeeded() -> bool:
            counts = [len(await events_of(js, subjects, "succeeded", job)) for job in jobs]
            return counts == [1, 1]

        await wait_for(succeeded, timeout=30, what="succeeded while PostgreSQL is down")
        for job in jobs:
            [done] = await events_of(js, subjects, "succeeded", job)
            assert done.succeeded.final_step == 300
        alive(task)
        assert any("not reachable" in m and "retrying in" in m for m in caplog.messages), (
            "the projector said nothing about the missing database"
        )
        assert not await projected_up_to(own_postgres.url, js, subjects)

        await asyncio.to_thread(own_postgres.restart)
        await caught_up_once(own_postgres.url, js, subjects, task, timeout=60)
        rows = await rows_of(
            own_postgres.url, "SELECT job_id, state, last_step FROM jobs ORDER BY job_id"
        )
        assert [tuple(r) for r in rows] == [(job, "SUCCEEDED", 300) for job in jobs]
        alive(task)


async def test_postgresql_killed_mid_projection_loses_and_doubles_nothing(
    nc: Client,
    subjects: Subjects,
    js: JetStreamContext,
    bus: EventPublisher,
    own_postgres: EmbeddedPostgres,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="mdq.store.projection")
    jobs = [f"r{n}-job{n}" for n in range(15)]
    steps = range(10, 2001, 10)  # 200 reports per job, 3,000 in all
    await publish_campaign(bus, jobs, steps)
    total = len(jobs) * len(steps)

    # small batches: hundreds of transactions, so that the kill lands in the middle of them
    settings = WatcherSettings(batch_size=10, batch_wait_s=0.05, lost_min_silence_s=3600)
    watcher = run_watcher(
        nc=nc,
        subjects=subjects,
        database_url=own_postgres.url,
        backend=RecordingBackend(),
        settings=settings,
    )
    watch = await asyncpg.connect(own_postgres.url)
    async with background(watcher) as task:

        async def some_projected() -> bool:
            return bool(await watch.fetchval("SELECT count(*) FROM progress") >= 300)

        await wait_for(some_projected, timeout=60, what="a first part of the projection")
        # Hold the projector's next COPY inside its transaction, then kill: the kill lands in
        # the middle of a batch (offset row locked, events inserted, nothing committed).
        hold = watch.transaction()
        await hold.start()
        await watch.execute("LOCK TABLE progress IN SHARE MODE")

        async def blocked() -> bool:
            waiting = await watch.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND datname = current_database()"
            )
            return bool(waiting >= 1)

        await wait_for(blocked, timeout=30, what="the projector to wait inside a batch")
        await asyncio.to_thread(own_postgres.kill)
        watch.terminate()
        # Nothing can be acknowledged without the database, so what the projector's consumer
        # has not acknowledged now was not projected at the kill.
        consumer = await js.consumer_info(subjects.progress_stream, "watcher-progress")
        unprojected = (consumer.num_pending or 0) + (consumer.num_ack_pending or 0)
        assert 0 < unprojected < total, f"the kill was not mid-projection ({unprojected} left)"

        async def noticed() -> bool:
            alive(task)
            return any("PostgreSQL at" in m and "not reachable" in m for m in caplog.messages)

        await wait_for(noticed, timeout=30, what="the projector to notice")
        await asyncio.to_thread(own_postgres.restart)
        await caught_up_once(own_postgres.url, js, subjects, task, timeout=120)
        counts = await rows_of(
            own_postgres.url,
            "SELECT job_id, count(*) AS n, count(DISTINCT step) AS steps, max(step) AS last "
            "FROM progress GROUP BY job_id ORDER BY job_id",
        )
        states = await rows_of(own_postgres.url, "SELECT state, last_step FROM jobs")
        assert [tuple(r) for r in counts] == [(job, 200, 200, 2000) for job in sorted(jobs)]
        assert sorted(tuple(r) for r in states) == [("SUCCEEDED", 2000)] * len(jobs)
        alive(task)


async def test_an_error_that_is_not_connection_class_stops_the_watcher(
    nc: Client, subjects: Subjects, own_postgres: EmbeddedPostgres
) -> None:
    """A database that does not exist is a configuration error, not an outage: the watcher
    stops with it (and exits non-zero) instead of retrying it as transient."""
    wrong = own_postgres.url.replace("/mdq?", "/no_such_database?")
    assert wrong != own_postgres.url
    watcher = run_watcher(
        nc=nc, subjects=subjects, database_url=wrong, backend=RecordingBackend(), settings=SETTINGS
    )
    with pytest.raises(ExceptionGroup) as raised:
        await asyncio.wait_for(watcher, timeout=30)
    assert raised.group_contains(asyncpg.InvalidCatalogNameError)


async def test_the_watcher_waits_for_the_migrations(
    nc: Client,
    subjects: Subjects,
    js: JetStreamContext,
    database_url: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The mdq-migrate Job may run beside the watcher: a database without the tables yet is
    waited for, and projected into once they exist."""
    caplog.set_level(logging.WARNING, logger="mdq.store.projection")
    await publisher(js, subjects).publish(submitted("r1-early"))
    watcher = run_watcher(
        nc=nc,
        subjects=subjects,
        database_url=database_url,  # a fresh database, not migrated
        backend=RecordingBackend(),
        settings=SETTINGS,
    )
    async with background(watcher) as task:

        async def said_so() -> bool:
            alive(task)
            return any("has no mdq tables yet" in m for m in caplog.messages)

        await wait_for(said_so, timeout=30, what="the watcher to wait for the migrations")
        await upgrade_async(database_url)

        async def caught_up() -> bool:
            alive(task)
            return await projected_up_to(database_url, js, subjects)

        await wait_for(caught_up, timeout=60, what="the projection after the migrations")
        await assert_projected_once(database_url, js, subjects)
        alive(task)
