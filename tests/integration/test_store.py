"""The store's migrations and read queries against a real PostgreSQL (a fresh database each)."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator

import asyncpg
import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncEngine

from mdq.store import queries
from mdq.store.engine import create_engine
from mdq.store.migrate import current_revision, upgrade, upgrade_async
from mdq.store.models import Base

TABLES = {
    "jobs",
    "attempts",
    "events",
    "progress",
    "checkpoints",
    "placements",
    "rejections",
    "consumer_offsets",
}


async def _tables(database_url: str) -> set[str]:
    connection = await asyncpg.connect(database_url)
    try:
        rows = await connection.fetch(
            "SELECT table_name FROM information_schema.tables "
            "WHERE table_schema = 'public' AND table_type = 'BASE TABLE'"
        )
    finally:
        await connection.close()
    return {row["table_name"] for row in rows}


@pytest.fixture
async def engine(database_url: str) -> AsyncIterator[AsyncEngine]:
    await upgrade_async(database_url)
    engine = create_engine(database_url)
    yield engine
    await engine.dispose()


async def test_upgrade_creates_every_table_on_an_empty_database(database_url: str) -> None:
    assert await _tables(database_url) == set()
    assert await asyncio.to_thread(current_revision, database_url) is None

    upgrade(database_url)  # the sync entry point, called from inside a running loop

    assert await _tables(database_url) == TABLES | {"alembic_version"}
    assert await asyncio.to_thread(current_revision, database_url) == "0002_history_views"


async def test_upgrade_twice_changes_nothing(database_url: str) -> None:
    await upgrade_async(database_url)
    connection = await asyncpg.connect(database_url)
    try:
        await connection.execute(
            "INSERT INTO consumer_offsets VALUES ('watcher-jobs', 'X_JOBS', 42, now())"
        )
    finally:
        await connection.close()

    await upgrade_async(database_url)

    connection = await asyncpg.connect(database_url)
    try:
        assert await connection.fetchval("SELECT last_seq FROM consumer_offsets") == 42
    finally:
        await connection.close()
    assert await asyncio.to_thread(current_revision, database_url) == "0002_history_views"


async def test_concurrent_upgrades_wait_for_each_other(database_url: str) -> None:
    """Several services starting at once each run the migrations: none of them fails."""
    code = "import sys; from mdq.store.migrate import upgrade; upgrade(sys.argv[1])"
    processes = [
        await asyncio.create_subprocess_exec(sys.executable, "-c", code, database_url)
        for _ in range(3)
    ]
    # ... and one more in this process, on a thread, at the same time.
    codes, _ = await asyncio.gather(
        asyncio.gather(*(process.wait() for process in processes)), upgrade_async(database_url)
    )
    assert codes == [0, 0, 0]
    assert await _tables(database_url) == TABLES | {"alembic_version"}


async def test_the_migrations_create_exactly_the_models(engine: AsyncEngine) -> None:
    def differences(connection: Connection) -> list[object]:
        context = MigrationContext.configure(connection, opts={"compare_type": True})
        return list(compare_metadata(context, Base.metadata))

    async with engine.connect() as connection:
        assert await connection.run_sync(differences) == []


async def test_queries_on_an_empty_projection(engine: AsyncEngine) -> None:
    assert await queries.list_jobs(engine) == []
    assert await queries.job_detail(engine, "nope-job") is None
    assert await queries.job_timeline(engine, "nope-job") == []
    assert await queries.progress_trace(engine, "nope-job") == []
