"""The store's migrations and read queries against a real PostgreSQL (a fresh database each)."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator

import asyncpg
import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import text
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncEngine

from mdq.errors import MdqError
from mdq.store import queries
from mdq.store.engine import create_engine
from mdq.store.migrate import (
    UnknownSchema,
    alembic_config,
    current_revision,
    upgrade,
    upgrade_async,
)
from mdq.store.models import Base
from mdq.store.schema_sql import FUNCTIONS, OWNER_ONLY_FUNCTIONS, PARTITIONED, TRIGGERS, VIEWS

TABLES = {
    "jobs",
    "attempts",
    "job_events",
    "progress",
    "checkpoints",
    "placements",
    "rejections",
    "consumer_offsets",
    "progress_unfolded",
    "usage_samples",
    "usage_summaries",
    "failure_tallies",
    "node_hours",
    "progress_rollups",
}


async def _tables(database_url: str) -> set[str]:
    connection = await asyncpg.connect(database_url)
    try:
        rows = await connection.fetch(  # a partition is part of its table, not one of its own
            "SELECT c.relname AS table_name FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p') AND NOT c.relispartition"
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
    assert await asyncio.to_thread(current_revision, database_url) == "0001_schema"


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
    assert await asyncio.to_thread(current_revision, database_url) == "0001_schema"


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
        partitions = {
            row[0]
            for row in connection.exec_driver_sql(
                "SELECT relname FROM pg_class WHERE relispartition"
            )
        }

        def of_the_models(name: str | None, type_: str, parent: object) -> bool:
            return not (type_ == "table" and name in partitions)

        context = MigrationContext.configure(
            connection, opts={"compare_type": True, "include_name": of_the_models}
        )
        return list(compare_metadata(context, Base.metadata))

    async with engine.connect() as connection:
        assert await connection.run_sync(differences) == []


def _index_definitions(connection: Connection, schema: str) -> dict[str, str]:
    """Each index of the models' tables in ``schema`` as PostgreSQL itself prints it
    (``pg_indexes.indexdef``), with the schema's name left out."""
    rows = connection.execute(
        text("SELECT indexname, tablename, indexdef FROM pg_indexes WHERE schemaname = :schema"),
        {"schema": schema},
    )
    return {
        name: definition.replace(f"{schema}.", "").replace(" ON ONLY ", " ON ")
        for name, table, definition in rows
        if table in Base.metadata.tables
    }


async def test_the_migrations_make_each_index_as_the_models_declare_it(
    engine: AsyncEngine,
) -> None:
    """What alembic's comparison cannot see: an index's method (USING gin) and its operator
    classes (``jsonb_path_ops``). The models' own DDL, made in a schema of its own, and the
    migrations' are the same indexes in PostgreSQL's words."""

    def both(connection: Connection) -> tuple[dict[str, str], dict[str, str]]:
        connection.exec_driver_sql("CREATE SCHEMA models")
        connection.exec_driver_sql("SET search_path TO models")
        Base.metadata.create_all(connection)
        declared = _index_definitions(connection, "models")
        connection.exec_driver_sql("SET search_path TO public")
        return _index_definitions(connection, "public"), declared

    async with engine.connect() as connection:
        migrated, declared = await connection.run_sync(both)
        await connection.rollback()
    assert "USING gin" in declared["ix_jobs_labels"]
    assert migrated == declared


async def test_queries_on_an_empty_projection(engine: AsyncEngine) -> None:
    assert await queries.list_jobs(engine) == []
    assert await queries.job_detail(engine, "nope-job") is None
    assert await queries.job_timeline(engine, "nope-job") == []
    assert await queries.progress_trace(engine, "nope-job") == []


async def _schema_objects(database_url: str) -> dict[str, set[str]]:
    """The schema's relations (partitions included), functions and triggers, by kind."""
    connection = await asyncpg.connect(database_url)
    try:
        relations = await connection.fetch(
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p', 'v')"
        )
        functions = await connection.fetch(  # each by its signature as FUNCTIONS names it
            "SELECT coalesce(s, p.oid::regprocedure::text) FROM pg_proc p "
            "JOIN pg_namespace n ON n.oid = p.pronamespace "
            "LEFT JOIN unnest($1::text[]) AS s ON to_regprocedure(s) = p.oid "
            "WHERE n.nspname = 'public'",
            list(FUNCTIONS),
        )
        triggers = await connection.fetch("SELECT tgname FROM pg_trigger WHERE NOT tgisinternal")
    finally:
        await connection.close()
    return {
        "relations": {row[0] for row in relations},
        "functions": {row[0] for row in functions},
        "triggers": {row[0] for row in triggers},
    }


async def test_downgrade_to_base_drops_everything_and_upgrade_makes_it_again(
    database_url: str,
) -> None:
    """The migration goes down to an empty schema (the migrations' own table aside) and up
    again to the same one; the views, functions and triggers of ``schema_sql`` are all there."""
    await upgrade_async(database_url)
    made = await _schema_objects(database_url)

    await asyncio.to_thread(command.downgrade, alembic_config(database_url), "base")
    left = await _schema_objects(database_url)
    revision_after_downgrade = await asyncio.to_thread(current_revision, database_url)

    await upgrade_async(database_url)
    again = await _schema_objects(database_url)

    defaults = {f"{table}_default" for table in PARTITIONED}
    assert made["relations"] >= TABLES | set(VIEWS) | defaults
    assert made["functions"] == set(FUNCTIONS)
    assert len(made["triggers"]) == len(TRIGGERS)
    assert left == {"relations": {"alembic_version"}, "functions": set(), "triggers": set()}
    assert revision_after_downgrade is None
    assert again == made


async def test_no_one_but_the_owner_may_run_the_owners_functions_before_any_grant(
    connection: asyncpg.Connection,
) -> None:
    """The functions that run with the owner's rights are revoked from PUBLIC by the migration
    itself, not only by the grants step that follows it."""
    open_to_all = [
        signature
        for signature in OWNER_ONLY_FUNCTIONS
        if await connection.fetchval(
            "SELECT has_function_privilege('public', $1, 'EXECUTE')", signature
        )
    ]
    assert open_to_all == []
    assert "mdq_rollup_progress(timestamptz, integer)" in OWNER_ONLY_FUNCTIONS


async def test_a_schema_revision_mdq_does_not_know_is_refused_with_what_to_do(
    database_url: str,
) -> None:
    await upgrade_async(database_url)
    connection = await asyncpg.connect(database_url)
    try:
        await connection.execute("UPDATE alembic_version SET version_num = '0023_earlier_build'")
    finally:
        await connection.close()
    with pytest.raises(UnknownSchema, match="0023_earlier_build") as refused:
        await upgrade_async(database_url)
    assert "fresh database" in str(refused.value)
    assert isinstance(refused.value, MdqError)
