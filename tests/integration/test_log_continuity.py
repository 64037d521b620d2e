"""The projector refuses a log that is not the one its offsets were projected from.

Real NATS JetStream and PostgreSQL: events are projected, then the JOBS stream is deleted and
created again (or the stored offset is put past the stream's end, which is what the projector
sees when JetStream lost its tail) and new events are published. The projector must stop with
``LogContinuityError`` naming the stream, the stored offset and the way out (``mdq replay
--rebuild``), and store nothing of the new events, whether it finds out on start or while
running.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import asyncpg
import pytest
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from mdq.bus.publisher import EventPublisher
from mdq.bus.streams import ensure_streams
from mdq.bus.subjects import Subjects
from mdq.cli.replay import compare, rebuild
from mdq.core.log_continuity import Verdict, message_digest
from mdq.store.engine import create_writer_pool
from mdq.store.projection import JOBS_CONSUMER, LogContinuityError, Projector
from services.watcher.__main__ import EXIT_LOG_CONTINUITY
from tests.helpers import OwnersPublisher, wait_for
from tests.integration.test_projector import History, publish_in_order, wait_projected

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def publisher(js: JetStreamContext, subjects: Subjects) -> EventPublisher:
    return OwnersPublisher(js=js, subjects=subjects)


def projector_for(
    js: JetStreamContext, subjects: Subjects, pool: asyncpg.Pool, *, check_s: float = 3600.0
) -> Projector:
    """A projector whose periodic check comes every ``check_s`` (by default: never in a test,
    so that the test shows the path it names finds the break)."""
    return Projector(js=js, subjects=subjects, pool=pool, batch_size=50, continuity_check_s=check_s)


async def opened(projector: Projector) -> None:
    """Until both consumers of ``projector`` have checked the log and opened."""
    await wait_for(lambda: _true(projector.continuity_checks >= 2), what="consumers open")


async def _true(value: bool) -> bool:
    return value


Acted = TypeVar("Acted")


async def broken_while_running(
    projector: Projector, act: Callable[[], Awaitable[Acted]]
) -> tuple[LogContinuityError, Acted]:
    """Run ``projector`` and, once its consumers have opened, ``act`` (which breaks the log):
    the LogContinuityError the projector stops with (within 20 s), and what ``act`` returned."""
    task = asyncio.create_task(projector.run())
    try:
        await opened(projector)
        acted = await act()
        with pytest.raises(LogContinuityError) as raised:
            await asyncio.wait_for(asyncio.shield(task), timeout=20)
    finally:
        projector.stop()
        if not task.done():
            task.cancel()
    return raised.value, acted


async def project_first_job(
    js: JetStreamContext, subjects: Subjects, pool: asyncpg.Pool, publisher: EventPublisher
) -> int:
    """Project a job of four JOBS events; return the stored JOBS offset."""
    first = History("first")
    projector = projector_for(js, subjects, pool)
    task = asyncio.create_task(projector.run())
    try:
        await publish_in_order(
            publisher,
            [*first.began(), first.failed(1)],
        )
        await wait_projected(js, subjects, pool)
    finally:
        projector.stop()
        await asyncio.wait_for(task, timeout=10)
    offset = await stored_offset(pool)
    assert offset == 4
    return offset


async def offset_column(pool: asyncpg.Pool, column: str) -> Any:
    """``column`` of the jobs consumer's row in ``consumer_offsets``."""
    return await pool.fetchval(
        f"SELECT {column} FROM consumer_offsets WHERE consumer = $1", JOBS_CONSUMER
    )


async def stored_offset(pool: asyncpg.Pool) -> int:
    return int(await offset_column(pool, "last_seq"))


async def recreate_jobs_stream(js: JetStreamContext, subjects: Subjects) -> None:
    await js.delete_stream(subjects.jobs_stream)
    await ensure_streams(js, subjects)


async def publish_second_job(publisher: EventPublisher) -> str:
    """Two events: sequences 1 and 2 of a recreated stream, both at or below the offset."""
    second = History("second", request_id="fedcba987654")
    await publish_in_order(publisher, [second.submitted(), second.bound(1, "n2")])
    return second.job_id


def assert_explains(error: LogContinuityError, stream: str, offset: int) -> None:
    text = str(error)
    assert stream in text
    assert f"stored offset {offset}" in text
    assert "mdq replay --rebuild" in text


async def nothing_of(pool: asyncpg.Pool, job_id: str) -> None:
    assert await pool.fetchval("SELECT count(*) FROM jobs WHERE job_id = $1", job_id) == 0
    assert await pool.fetchval("SELECT count(*) FROM events WHERE job_id = $1", job_id) == 0


async def test_a_recreated_stream_stops_the_projector_on_start(
    js: JetStreamContext, subjects: Subjects, pool: asyncpg.Pool, publisher: EventPublisher
) -> None:
    offset = await project_first_job(js, subjects, pool, publisher)
    created = await offset_column(pool, "stream_created")
    assert created == (await js.stream_info(subjects.jobs_stream)).created
    await recreate_jobs_stream(js, subjects)
    second = await publish_second_job(publisher)

    projector = projector_for(js, subjects, pool)
    with pytest.raises(LogContinuityError) as raised:
        await asyncio.wait_for(projector.run(), timeout=20)

    assert raised.value.continuity.verdict is Verdict.RECREATED
    assert_explains(raised.value, subjects.jobs_stream, offset)
    await nothing_of(pool, second)
    assert await stored_offset(pool) == offset


async def test_a_stream_recreated_while_running_stops_the_projector(
    js: JetStreamContext, subjects: Subjects, pool: asyncpg.Pool, publisher: EventPublisher
) -> None:
    offset = await project_first_job(js, subjects, pool, publisher)

    async def recreate_and_publish() -> str:
        """The projector opened on the old stream: the break is found while it runs."""
        await recreate_jobs_stream(js, subjects)
        return await publish_second_job(publisher)

    error, second = await broken_while_running(
        projector_for(js, subjects, pool), recreate_and_publish
    )
    assert error.continuity.verdict is Verdict.RECREATED
    assert_explains(error, subjects.jobs_stream, offset)
    await nothing_of(pool, second)
    assert await stored_offset(pool) == offset


async def test_new_events_below_the_offset_stop_the_running_projector(
    js: JetStreamContext, subjects: Subjects, pool: asyncpg.Pool, publisher: EventPublisher
) -> None:
    """What the projector sees when JetStream lost the tail it had projected: its offset is
    past the stream's end, and new events arrive with sequences it believes it has stored."""
    await project_first_job(js, subjects, pool, publisher)

    async def lose_the_tail_and_publish() -> str:
        # The last six messages it projected are gone from the log (sequences 5 to 10).
        await pool.execute(
            "UPDATE consumer_offsets SET last_seq = 10 WHERE consumer = $1", JOBS_CONSUMER
        )
        return await publish_second_job(publisher)  # sequences 5 and 6

    error, second = await broken_while_running(
        projector_for(js, subjects, pool), lose_the_tail_and_publish
    )
    assert error.continuity.verdict is Verdict.WENT_BACKWARDS
    assert_explains(error, subjects.jobs_stream, 10)
    await nothing_of(pool, second)


async def test_a_continuous_log_is_projected_after_a_restart(
    js: JetStreamContext, subjects: Subjects, pool: asyncpg.Pool, publisher: EventPublisher
) -> None:
    """The checks do not stop a projector whose log simply went on (and record its digest)."""
    offset = await project_first_job(js, subjects, pool, publisher)
    digest = await offset_column(pool, "last_digest")
    assert digest is not None
    projector = projector_for(js, subjects, pool, check_s=0.2)
    task = asyncio.create_task(projector.run())
    try:
        second = await publish_second_job(publisher)
        await wait_projected(js, subjects, pool)
        checks = projector.continuity_checks
        await wait_for(
            lambda: _true(projector.continuity_checks >= checks + 4), what="periodic checks"
        )
        assert not task.done()
    finally:
        projector.stop()
        await asyncio.wait_for(task, timeout=10)
    assert await stored_offset(pool) == offset + 2
    assert await pool.fetchval("SELECT count(*) FROM jobs WHERE job_id = $1", second) == 1


async def test_the_periodic_check_finds_a_log_that_went_backwards_while_idle(
    js: JetStreamContext, subjects: Subjects, pool: asyncpg.Pool, publisher: EventPublisher
) -> None:
    """No new event arrives: the projector still finds out, within ``continuity_check_s``."""
    await project_first_job(js, subjects, pool, publisher)

    async def lose_the_tail() -> None:
        await pool.execute(
            "UPDATE consumer_offsets SET last_seq = 10 WHERE consumer = $1", JOBS_CONSUMER
        )

    error, _ = await broken_while_running(
        projector_for(js, subjects, pool, check_s=0.2), lose_the_tail
    )
    assert error.continuity.verdict is Verdict.WENT_BACKWARDS


async def test_the_watcher_exits_non_zero_with_the_explanation(
    js: JetStreamContext,
    subjects: Subjects,
    pool: asyncpg.Pool,
    publisher: EventPublisher,
    nats_url: str,
    database_url: str,
) -> None:
    """``python -m services.watcher`` on a recreated stream: it stops, says why and how to
    recover, and exits with its own status (a supervisor sees a failure, not a clean stop)."""
    offset = await project_first_job(js, subjects, pool, publisher)
    await recreate_jobs_stream(js, subjects)
    second = await publish_second_job(publisher)
    env = {
        **os.environ,
        "NATS_URL": nats_url,
        "DATABASE_URL": database_url,
        "MDQ_NAMESPACE": subjects.namespace,
        "MDQ_WATCHER_BACKEND": "local",
    }
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "services.watcher",
        env=env,
        cwd=REPO,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        out, _ = await asyncio.wait_for(process.communicate(), timeout=60)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    text = out.decode()
    assert process.returncode == EXIT_LOG_CONTINUITY, text
    assert f"stored offset {offset}" in text and subjects.jobs_stream in text
    assert "mdq replay --rebuild" in text
    await nothing_of(pool, second)


async def test_the_documented_recovery_rebuilds_and_resumes(
    js: JetStreamContext,
    subjects: Subjects,
    pool: asyncpg.Pool,
    publisher: EventPublisher,
    database_url: str,
    spare_database: str,
) -> None:
    """The way out the error names: ``mdq replay --rebuild`` projects the log as it is now into
    a fresh database, and a projector on that database resumes and goes on projecting; the
    comparison with the refused database shows what the log lost."""
    await project_first_job(js, subjects, pool, publisher)
    await recreate_jobs_stream(js, subjects)
    second = await publish_second_job(publisher)
    with pytest.raises(LogContinuityError):
        await asyncio.wait_for(projector_for(js, subjects, pool).run(), timeout=20)

    report = await rebuild(js, subjects, spare_database)
    assert report.last_seq[subjects.jobs_stream] == 2
    differences = await compare(database_url, spare_database)
    assert differences["jobs"] == (1, 1)  # the first job only in the old, the second only here

    rebuilt = await create_writer_pool(spare_database, size=3)
    try:
        projector = projector_for(js, subjects, rebuilt)
        task = asyncio.create_task(projector.run())
        try:
            third = History("third", request_id="0a0b0c0d0e0f")
            await publish_in_order(publisher, [third.submitted()])
            await wait_projected(js, subjects, rebuilt)
            assert not task.done()
        finally:
            projector.stop()
            await asyncio.wait_for(task, timeout=10)
        jobs = {row["job_id"] for row in await rebuilt.fetch("SELECT job_id FROM jobs")}
        assert jobs == {second, third.job_id}
    finally:
        await rebuilt.close()


async def fetch_from(js: JetStreamContext, stream: str, start: int, count: int) -> list[Msg]:
    """``count`` real messages of ``stream`` from sequence ``start`` (an ephemeral consumer)."""
    subscription = await js.pull_subscribe(
        "",
        stream=stream,
        config=ConsumerConfig(
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
            opt_start_seq=start,
            ack_policy=AckPolicy.NONE,
        ),
    )
    try:
        return await subscription.fetch(count, timeout=5)
    finally:
        await subscription.unsubscribe()


async def test_a_batch_mixing_old_and_new_sequences_applies_nothing_before_the_check(
    js: JetStreamContext, subjects: Subjects, pool: asyncpg.Pool, publisher: EventPublisher
) -> None:
    """Redelivered messages (at or below the offset) and new ones in one batch: nothing is
    applied until the log is checked. A broken log (here: the message at the offset is not
    the one projected) stores nothing of the new ones; a continuous one is delivered again from
    after the offset and projected."""
    offset = await project_first_job(js, subjects, pool, publisher)
    second = await publish_second_job(publisher)  # sequences 5 and 6
    mixed = await fetch_from(js, subjects.jobs_stream, start=3, count=4)  # 3, 4 | 5, 6
    assert [m.metadata.sequence.stream for m in mixed] == [3, 4, 5, 6]

    projector = projector_for(js, subjects, pool)
    feed = next(f for f in projector._feeds if f.stream == subjects.jobs_stream)
    await pool.execute(
        "UPDATE consumer_offsets SET last_digest = 'not what was there' WHERE consumer = $1",
        JOBS_CONSUMER,
    )
    with pytest.raises(LogContinuityError) as raised:
        await projector._handle(feed, mixed)
    assert raised.value.continuity.verdict is Verdict.REWRITTEN
    await nothing_of(pool, second)
    assert await stored_offset(pool) == offset

    # The same batch from a continuous log: applied only after a fresh delivery.
    digest = message_digest(mixed[1].subject, mixed[1].data)
    await pool.execute(
        "UPDATE consumer_offsets SET last_digest = $2 WHERE consumer = $1", JOBS_CONSUMER, digest
    )
    await projector._handle(feed, mixed)
    await nothing_of(pool, second)
    assert feed.subscription is not None and feed.trusted_start == offset + 1  # rewound
    task = asyncio.create_task(projector.run())
    try:
        await wait_projected(js, subjects, pool)
    finally:
        projector.stop()
        await asyncio.wait_for(task, timeout=10)
    assert await pool.fetchval("SELECT count(*) FROM jobs WHERE job_id = $1", second) == 1
