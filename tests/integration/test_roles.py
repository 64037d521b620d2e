"""PostgreSQL roles (``mdq.store.roles``), against a real PostgreSQL: the reader cannot write,
the writer cannot change the schema, no role is a superuser, the setup is idempotent and takes
over a database migrated before the roles existed, and every relation has a rule.

The database is set up as every deployment sets it up (the ``database_roles`` fixture:
provision as the administrator, migrate as the owner, grant). The projector's own tests
(test_projector.py, test_log_continuity.py, test_replay.py) run as the writer through the
``pool`` fixture, which proves the writer may do all the projector does.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import asyncpg
import pytest

from mdq.store.migrate import upgrade_async
from mdq.store.roles import (
    RELATIONS,
    Access,
    RoleNames,
    RolePasswords,
    RoleUrls,
    role_urls,
    schema_relations,
    setup_database_async,
)

NOT_ALLOWED = (asyncpg.InsufficientPrivilegeError,)
"""SQLSTATE 42501: what PostgreSQL answers a role that lacks a privilege (ownership included)."""

A_JOB = (
    "INSERT INTO jobs (job_id, request_id, name, task, state, attempt, priority_class, spec, "
    "depends_on, submitted_at, updated_at, target_steps, last_step) VALUES ('r-x', 'r', 'x', "
    "'TASK_MD', 'PENDING', 1, 'normal', '{}', '{}', now(), now(), 10, 0)"
)


async def _connect(url: str) -> AsyncIterator[asyncpg.Connection]:
    connection = await asyncpg.connect(url)
    try:
        yield connection
    finally:
        await connection.close()


@pytest.fixture
async def reader(database_roles: RoleUrls) -> AsyncIterator[asyncpg.Connection]:
    async for connection in _connect(database_roles.reader):
        yield connection


@pytest.fixture
async def writer(database_roles: RoleUrls) -> AsyncIterator[asyncpg.Connection]:
    async for connection in _connect(database_roles.writer):
        yield connection


READER_REFUSED = {
    "insert": A_JOB,
    "update": "UPDATE jobs SET state = 'FAILED'",
    "delete": "DELETE FROM jobs",
    "truncate": "TRUNCATE progress",
    "copy in": "COPY rejections FROM STDIN",
    "create table": "CREATE TABLE mine (x int)",
    "create view": "CREATE VIEW mine AS SELECT 1",
    "alter table": "ALTER TABLE jobs ADD COLUMN x int",
    "drop view": "DROP VIEW events",
    "update the offsets": "UPDATE consumer_offsets SET last_seq = 0",
    "read the migrations' table": "SELECT * FROM alembic_version",
}


@pytest.mark.parametrize("statement", READER_REFUSED.values(), ids=READER_REFUSED.keys())
async def test_the_reader_cannot_write(reader: asyncpg.Connection, statement: str) -> None:
    with pytest.raises(NOT_ALLOWED):
        await reader.execute(statement)


async def test_the_reader_reads_every_history_table_and_view(reader: asyncpg.Connection) -> None:
    readable = sorted(name for name, access in RELATIONS.items() if access is not Access.OWNER_ONLY)
    for relation in readable:
        await reader.fetch(f'SELECT * FROM "{relation}" LIMIT 1')


WRITER_REFUSED = {
    "alter table": "ALTER TABLE jobs ADD COLUMN x int",
    "drop table": "DROP TABLE progress",
    "create table": "CREATE TABLE mine (x int)",
    "create index": "CREATE INDEX mine ON jobs (name)",
    "truncate": "TRUNCATE progress",
    "delete": "DELETE FROM jobs",
    "drop view": "DROP VIEW events",
    "create or replace view": "CREATE OR REPLACE VIEW events AS SELECT 1 AS x",
    "write the migrations' table": "UPDATE alembic_version SET version_num = 'x'",
    "create role": "CREATE ROLE rogue",
}


@pytest.mark.parametrize("statement", WRITER_REFUSED.values(), ids=WRITER_REFUSED.keys())
async def test_the_writer_cannot_change_the_schema(
    writer: asyncpg.Connection, statement: str
) -> None:
    with pytest.raises(NOT_ALLOWED):
        await writer.execute(statement)


async def test_the_writer_writes_its_tables_and_reads_the_views(
    writer: asyncpg.Connection,
) -> None:
    await writer.execute(A_JOB)
    await writer.execute("UPDATE jobs SET state = 'BOUND' WHERE job_id = 'r-x'")
    assert await writer.fetchval("SELECT count(*) FROM job_timeline") == 0
    assert await writer.fetchval("SELECT state FROM jobs") == "BOUND"
    # granting itself more is a no-op with a warning, not a way round
    await writer.execute("GRANT DELETE ON jobs TO PUBLIC")
    with pytest.raises(NOT_ALLOWED):
        await writer.execute("DELETE FROM jobs")


async def test_no_role_is_a_superuser_or_may_make_roles_or_databases(
    database_url: str, database_roles: RoleUrls, namespace: str
) -> None:
    """Nor bypass row security, but the writer: it writes every tenant's rows, and its COPY
    into ``progress`` is refused where row security applies (test_tenant_rows.py)."""
    names = RoleNames.with_prefix(namespace)
    admin = await asyncpg.connect(database_url)
    try:
        rows = await admin.fetch(
            "SELECT rolname, rolsuper, rolcreaterole, rolcreatedb, rolbypassrls, rolcanlogin "
            "FROM pg_roles WHERE rolname = ANY($1::text[])",
            [*names.all(), names.tenants],
        )
        owners = await admin.fetch(
            "SELECT DISTINCT pg_get_userbyid(c.relowner) AS owner FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'public'"
        )
        schema_owner = await admin.fetchval(
            "SELECT pg_get_userbyid(nspowner) FROM pg_namespace WHERE nspname = 'public'"
        )
    finally:
        await admin.close()
    assert {row["rolname"]: tuple(row.values())[1:] for row in rows} == {
        names.owner: (False, False, False, False, True),
        names.writer: (False, False, False, True, True),
        names.reader: (False, False, False, False, True),
        names.tenants: (False, False, False, False, False),
    }
    assert [row["owner"] for row in owners] == [names.owner]
    assert schema_owner == names.owner


async def test_setup_takes_over_a_database_migrated_before_the_roles_and_runs_again(
    database_url: str, namespace: str
) -> None:
    """An installation from before the roles: everything owned by the administrator. The
    setup hands it to the owner; run again (new passwords), it changes nothing else."""
    await upgrade_async(database_url)
    names = RoleNames.with_prefix(namespace)
    for _ in range(2):
        passwords = RolePasswords.generate()
        urls = role_urls(database_url, names, passwords)
        await setup_database_async(
            admin_url=database_url, owner_url=urls.owner, names=names, passwords=passwords
        )
    async for writer in _connect(urls.writer):
        await writer.execute(A_JOB)
        with pytest.raises(NOT_ALLOWED):
            await writer.execute("DROP TABLE jobs")
    async for owner in _connect(urls.owner):
        assert await owner.fetchval("SELECT count(*) FROM jobs") == 1
        assert (
            await owner.fetchval(
                "SELECT pg_get_userbyid(relowner) FROM pg_class WHERE relname = 'alembic_version'"
            )
            == names.owner
        )
        # the partitions and the functions too: a SECURITY DEFINER function the writer runs
        # (mdq_make_partitions) would otherwise run as the administrator
        owners = await owner.fetch(
            "SELECT relname AS name, pg_get_userbyid(relowner) AS owner FROM pg_class "
            "WHERE relname LIKE 'progress%' OR relname LIKE 'job_events%' "
            "UNION ALL SELECT proname, pg_get_userbyid(proowner) FROM pg_proc "
            "WHERE pronamespace = 'public'::regnamespace"
        )
        assert {row["name"] for row in owners} >= {"progress_default", "mdq_make_partitions"}
        assert {row["owner"] for row in owners} == {names.owner}


async def test_every_relation_of_the_schema_has_an_access_rule(
    database_roles: RoleUrls,
) -> None:
    """A migration that adds a table or a view must say who may use it (``RELATIONS``)."""
    assert await schema_relations(database_roles.owner) == set(RELATIONS)
