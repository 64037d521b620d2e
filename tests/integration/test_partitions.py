"""The monthly partitions of ``progress`` and ``job_events``, on a real
PostgreSQL set up as deployments set it up (owner, writer, reader): rows land in their month,
a month made late takes its rows out of the default partition, old months detach, only the
writer may run the partition functions, and the tables read as one through their parents."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from mdq.store.partitions import detach_expired, keep_partitions, make_partitions
from mdq.store.roles import RoleUrls
from tests.helpers import wait_for

PROGRESS = (
    "INSERT INTO progress (job_id, attempt, step, time, time_ps, potential_kj_mol, "
    "kinetic_kj_mol, temperature_k, ns_per_day, event_id, stream, stream_seq, producer, "
    "target_steps, eta_s, done_reason) VALUES ($1, 1, $2, $3, 0, 0, 0, 300, 0, $4, 'P', 1, "
    "'runner', 10, 0, '')"
)
EVENT = (
    "INSERT INTO job_events (event_id, stream, stream_seq, job_id, attempt, kind, time, "
    "producer, body) VALUES ($1, 'J', 1, 'r-x', 1, 'started', $2, 'watcher', '{}')"
)


@pytest.fixture
async def writer(database_roles: RoleUrls) -> AsyncIterator[asyncpg.Pool]:
    """A small pool as the writer role (the watcher's)."""
    pool = await asyncpg.create_pool(database_roles.writer, min_size=1, max_size=2)
    assert pool is not None
    yield pool
    await pool.close()


@pytest.fixture
async def owner(database_roles: RoleUrls) -> AsyncIterator[asyncpg.Connection]:
    """A connection as the owner role (the one that migrates: it may write any row)."""
    connection = await asyncpg.connect(database_roles.owner)
    yield connection
    await connection.close()


def month_name(table: str, at: datetime) -> str:
    return f"{table}_y{at:%Y}m{at:%m}"


async def test_rows_land_in_their_month_and_the_rest_in_the_default(
    owner: asyncpg.Connection,
) -> None:
    now = datetime.now(UTC)
    await owner.execute(PROGRESS, "r-x", 1, now, "progress:r-x:1:1")
    await owner.execute(PROGRESS, "r-x", 2, datetime(1999, 1, 1, tzinfo=UTC), "progress:old")
    await owner.execute(EVENT, "started:r-x:1", now)
    found = {
        row["event_id"]: row["partition"]
        for row in await owner.fetch(
            "SELECT event_id, tableoid::regclass::text AS partition FROM progress "
            "UNION ALL SELECT event_id, tableoid::regclass::text FROM job_events"
        )
    }
    assert found == {
        "progress:r-x:1:1": month_name("progress", now),
        "progress:old": "progress_default",
        "started:r-x:1": month_name("job_events", now),
    }
    assert await owner.fetchval("SELECT count(*) FROM events") == 3  # one history still


async def test_a_month_made_late_takes_its_rows_out_of_the_default(
    owner: asyncpg.Connection, writer: asyncpg.Pool
) -> None:
    later = datetime.now(UTC).replace(day=15) + timedelta(days=31 * 5)  # beyond the 2 made
    await owner.execute(PROGRESS, "r-x", 1, later, "progress:later")
    assert await owner.fetchval("SELECT count(*) FROM progress_default") == 1
    made = await make_partitions(writer, months_ahead=6)  # as the watcher, the writer
    assert made >= 2  # that month for both tables, at least
    row = await owner.fetchrow(
        "SELECT tableoid::regclass::text AS partition, step FROM progress "
        "WHERE event_id = 'progress:later'"
    )
    assert row is not None and dict(row) == {
        "partition": month_name("progress", later),
        "step": 1,
    }
    assert await owner.fetchval("SELECT count(*) FROM progress_default") == 0
    assert await make_partitions(writer, months_ahead=6) == 0  # idempotent


async def test_months_past_the_retention_are_detached_and_kept(
    owner: asyncpg.Connection, writer: asyncpg.Pool
) -> None:
    await owner.execute("SELECT mdq_make_partitions('2025-01-01Z', '2025-01-31Z')")
    january = datetime(2025, 1, 15, tzinfo=UTC)
    await owner.execute(PROGRESS, "r-x", 1, january, "progress:january")
    await owner.execute(EVENT, "started:january", january)
    await owner.execute(PROGRESS, "r-x", 2, datetime.now(UTC), "progress:now")

    assert await detach_expired(writer, retention_days=0) == []  # 0 keeps everything
    detached = await detach_expired(writer, retention_days=31)

    assert set(detached) == {"progress_y2025m01", "job_events_y2025m01"}
    assert await owner.fetchval("SELECT array_agg(event_id) FROM progress") == ["progress:now"]
    assert await owner.fetchval("SELECT count(*) FROM progress_y2025m01") == 1  # kept
    assert await detach_expired(writer, retention_days=31) == []


@pytest.mark.parametrize(
    "call",
    [
        "SELECT mdq_make_partitions(now(), now())",
        "SELECT mdq_detach_partitions(now())",
        "SELECT mdq_add_partition('progress', '2030-01-01')",
    ],
)
async def test_only_the_writer_may_run_the_partition_functions(
    database_roles: RoleUrls, call: str
) -> None:
    reader = await asyncpg.connect(database_roles.reader)
    try:
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await reader.execute(call)
    finally:
        await reader.close()


async def test_no_one_but_the_owner_reads_a_partition_itself(database_roles: RoleUrls) -> None:
    """Row security is on the parent tables: a partition read directly would skip it."""
    now = datetime.now(UTC)
    for url in (database_roles.reader, database_roles.writer):
        connection = await asyncpg.connect(url)
        try:
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await connection.fetch(f"SELECT * FROM {month_name('progress', now)}")
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await connection.fetch("SELECT * FROM job_events_default")
        finally:
            await connection.close()


async def test_the_watchers_keeper_makes_the_months_ahead(writer: asyncpg.Pool) -> None:
    """``keep_partitions`` (the watcher runs it beside its projector) makes the months ahead at
    once, as the writer, and keeps running."""
    ahead = (datetime.now(UTC).replace(day=1) + timedelta(days=32 * 5)).replace(day=1)
    keeper = asyncio.create_task(keep_partitions(writer, months_ahead=5, retention_days=0))
    try:

        async def made() -> bool:
            found = await writer.fetchval("SELECT to_regclass($1)", month_name("progress", ahead))
            return found is not None

        await wait_for(made, timeout=10, what="the partition five months ahead")
        assert not keeper.done()
    finally:
        keeper.cancel()


async def test_watcher_replicas_making_the_same_months_at_once_all_succeed(
    database_roles: RoleUrls,
) -> None:
    """Every watcher replica keeps the partitions: concurrent calls wait for each other
    instead of failing on a month another one is making."""
    pools = [
        await asyncpg.create_pool(database_roles.writer, min_size=1, max_size=1) for _ in range(4)
    ]
    try:
        made = await asyncio.gather(*(make_partitions(pool, months_ahead=12) for pool in pools))
        assert sum(made) == 2 * 10  # the 10 months not made yet, for both tables, once each
    finally:
        for pool in pools:
            await pool.close()
