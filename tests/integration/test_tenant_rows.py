"""Tenants in PostgreSQL, against a real server: a tenant's login (``mdq tenant add``) reads
only its own jobs' rows, in every table and view, enforced by PostgreSQL's row security
(the migration's row security and the policies of ``mdq.store.roles.grant``); it writes nothing
and changes nothing; the reader still reads every row and the writer still writes; ``mdq ls`` /
``show`` connected as a tenant show its jobs only; ``mdq tenant add`` makes the login; the
migration goes down and up again.

The rows are one job of each of: the operator (no tenant), ``alice``, ``lab`` and ``lab-a``
(whose ids both start with ``lab``), written as the writer, every table filled.
"""

from __future__ import annotations

import asyncio
import re
import stat
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest
from alembic import command
from typer.testing import CliRunner

from mdq.bus.security.auth import generate
from mdq.bus.setup import prepare_bus
from mdq.cli.main import app as cli
from mdq.core.ids import tenant_of
from mdq.embedded import start_nats
from mdq.stack import Stack, StackInfo
from mdq.store.engine import asyncpg_dsn
from mdq.store.migrate import alembic_config, upgrade_async
from mdq.store.projection import PROGRESS_COLUMNS
from mdq.store.roles import (
    ENV_ADMIN_PASSWORD,
    ENV_ADMIN_URL,
    ENV_PREFIX,
    RELATIONS,
    TENANT_POLICY,
    TENANT_ROWS,
    Access,
    RoleError,
    RoleNames,
    RoleUrls,
    drop_tenant,
    grant,
    provision_tenant,
    role_url,
    tenant_role_exists,
)
from mdq.tenancy import (
    DatabaseAdmin,
    NoDatabaseAdmin,
    add_tenant_database,
    database_admin,
    role_names_for,
)

NOT_ALLOWED = (asyncpg.InsufficientPrivilegeError,)
PROGRESS_TAIL = ("p:2", "NS_PROGRESS", 50, "runner", 100, 1.0, "", None)
"""A progress row's ``event_id`` ... ``units`` (``PROGRESS_COLUMNS``)."""
TENANTS = ("alice", "lab", "lab-a")
OPERATOR = "operator"
OWNERS = (OPERATOR, *TENANTS)
HEX = "3f2a9c0d1e4b"


def job_of(owner: str) -> str:
    return f"{HEX}-relax" if owner == OPERATOR else f"{owner}.{HEX}-relax"


def request_of(owner: str) -> str:
    return "0123456789ab" if owner == OPERATOR else f"{owner}.0123456789ab"


def owner_of(value: str | None) -> str:
    """Whose row a value names: a job or request id (its tenant), ``node-<owner>`` or
    ``R-<owner>`` (the node and failure reason each owner's attempt has)."""
    if value is None:
        return "(no job)"
    for marker in ("node-", "R-"):
        if value.startswith(marker):
            return value.removeprefix(marker)
    return tenant_of(value) or OPERATOR


SEEN: dict[str, str] = {
    "jobs": "SELECT job_id FROM jobs",
    "attempts": "SELECT job_id FROM attempts",
    "job_events": "SELECT job_id FROM job_events",
    "progress": "SELECT job_id FROM progress",
    "checkpoints": "SELECT job_id FROM checkpoints",
    "placements": "SELECT job_id FROM placements",
    "rejections": "SELECT request_id FROM rejections",
    "events": "SELECT job_id FROM events",
    "job_timeline": "SELECT job_id FROM job_timeline",
    "attempt_history": "SELECT job_id FROM attempt_history",
    "failures_by_reason": "SELECT reason FROM failures_by_reason",
    "node_utilisation": "SELECT node FROM node_utilisation",
    "job_outputs": "SELECT job_id FROM job_outputs",
    "attempt_usage": "SELECT job_id FROM attempt_usage",
    "usage_samples": "SELECT job_id FROM usage_samples",
    "usage_summaries": "SELECT job_id FROM usage_summaries",
    "failure_tallies": "SELECT reason FROM failure_tallies",
    "node_hours": "SELECT node FROM node_hours",
    "progress_rollups": "SELECT job_id FROM progress_rollups",
    "progress_unfolded": "SELECT job_id FROM progress_unfolded",
}
"""For each relation a tenant may read, a query whose values say whose each row is."""


async def _write_rows(writer_url: str) -> None:
    """One job of each owner in every table, and an event of no job, as the writer."""
    connection = await asyncpg.connect(writer_url)
    try:
        await connection.execute("SELECT mdq_make_partitions('2025-01-01Z', '2025-01-31Z')")
        for seq, owner in enumerate(OWNERS, start=1):
            job, node = job_of(owner), f"node-{owner}"
            await connection.execute(
                "INSERT INTO jobs (job_id, request_id, name, task, state, attempt, "
                "priority_class, spec, depends_on, submitted_at, updated_at, target_steps, "
                "last_step) VALUES ($1, $2, 'relax', 'TASK_MD', 'FAILED', 1, 'normal', "
                """'{"resources": {"cpu": 2}}', '{}', now(), now(), 100, 50)""",
                job,
                request_of(owner),
            )
            await connection.execute(
                "INSERT INTO attempts (job_id, attempt, node, started_at, ended_at, "
                "failure_reason, resumed_from_step, steps_lost, last_step) VALUES "
                "($1, 1, $2, now() - interval '1 hour', now(), $3, 0, 50, 50)",
                job,
                node,
                f"R-{owner}",
            )
            await connection.execute(
                "INSERT INTO job_events (event_id, stream, stream_seq, job_id, attempt, kind, "
                "time, producer, body) VALUES ($1, 'NS_JOBS', $2, $3, 1, 'outputs', now(), "
                """'runner', '{"output_dir": "/d", "files": [{"kind": "trajectory"}]}')""",
                f"outputs:{job}:1",
                seq,
                job,
            )
            await connection.execute(
                "INSERT INTO job_events (event_id, stream, stream_seq, job_id, attempt, kind, "
                "time, producer, body) VALUES ($1, 'NS_JOBS', $2, $3, 1, 'usage', now(), "
                """'runner', '{"peak_memory_mb": 120.5, "mean_cores": 0.9}')""",
                f"usage:{job}:1",
                seq + 1000,
                job,
            )
            await connection.execute(
                "INSERT INTO progress (job_id, attempt, step, time, time_ps, potential_kj_mol, "
                "kinetic_kj_mol, temperature_k, ns_per_day, event_id, stream, stream_seq, "
                "producer, target_steps, eta_s, done_reason) VALUES ($1, 1, 50, now(), 0.1, "
                "-1.0, 1.0, 300.0, 10.0, $2, 'NS_PROGRESS', $3, 'runner', 100, 1.0, '')",
                job,
                f"progress:{job}:1:50",
                seq,
            )
            await connection.execute(  # its attempt queued, as a watcher behind leaves it
                "INSERT INTO progress_unfolded (job_id, attempt) VALUES ($1, 1)", job
            )
            await connection.execute(  # a report of a month the rollup below rolls up
                "INSERT INTO progress (job_id, attempt, step, time, time_ps, potential_kj_mol, "
                "kinetic_kj_mol, temperature_k, ns_per_day, event_id, stream, stream_seq, "
                "producer, target_steps, eta_s, done_reason) VALUES ($1, 1, 10, "
                "'2025-01-15Z', 0.1, -1.0, 1.0, 300.0, 10.0, $2, 'NS_PROGRESS', $3, 'runner', "
                "100, 1.0, '')",
                job,
                f"progress:{job}:1:10",
                seq + 1000,
            )
            await connection.execute(
                "INSERT INTO checkpoints (job_id, attempt, step, path, sha256, size_bytes, "
                "time_ps, time) VALUES ($1, 1, 50, '/c', 'ab', 1, 0.1, now())",
                job,
            )
            await connection.execute(
                "INSERT INTO placements (job_id, attempt, node, candidates, time) VALUES "
                """($1, 1, $2, '[{"node": "n", "score": 1.0}]', now())""",
                job,
                node,
            )
            await connection.execute(
                "INSERT INTO rejections (request_id, message, time) VALUES ($1, 'no', now())",
                f"{request_of(owner)[:-1]}f",
            )
        await connection.execute(
            "INSERT INTO job_events (event_id, stream, stream_seq, job_id, attempt, kind, time, "
            "producer, body) VALUES ('rejected:x', 'NS_JOBS', 99, NULL, 0, 'rejected', now(), "
            "'intake', '{}')"
        )
        # progress_rollups' rows: January 2025 rolled up, as the watcher does
        await connection.execute("SELECT mdq_rollup_progress('2025-03-01Z', 10)")
    finally:
        await connection.close()


@dataclass(frozen=True, slots=True)
class Installation:
    """The test's database with its roles, rows and tenants' logins."""

    admin: str
    roles: RoleUrls
    names: RoleNames
    tenants: dict[str, str]
    """Each tenant's URL, password included."""


@pytest.fixture
async def installation(database_url: str, database_roles: RoleUrls, namespace: str) -> Installation:
    names = RoleNames.with_prefix(namespace)
    tenants = {}
    for tenant in TENANTS:
        password = f"pw-{tenant}"
        role = await provision_tenant(database_url, names, tenant, password)
        tenants[tenant] = role_url(database_url, user=role, password=password)
    await _write_rows(database_roles.writer)
    return Installation(database_url, database_roles, names, tenants)


@pytest.fixture
async def alice(installation: Installation) -> AsyncIterator[asyncpg.Connection]:
    connection = await asyncpg.connect(installation.tenants["alice"])
    yield connection
    await connection.close()


async def _owners_seen(url: str, relation: str) -> set[str]:
    connection = await asyncpg.connect(url)
    try:
        return {owner_of(row[0]) for row in await connection.fetch(SEEN[relation])}
    finally:
        await connection.close()


def test_every_relation_a_tenant_may_read_is_checked() -> None:
    """A new table of per-job rows, or a new view, must be added to ``SEEN`` above."""
    readable = set(TENANT_ROWS) | {n for n, a in RELATIONS.items() if a is Access.READ}
    assert set(SEEN) == readable


@pytest.mark.parametrize("relation", sorted(SEEN))
async def test_a_tenant_reads_only_its_own_rows(installation: Installation, relation: str) -> None:
    for tenant, url in installation.tenants.items():
        assert await _owners_seen(url, relation) == {tenant}, tenant
    assert await _owners_seen(installation.roles.reader, relation) >= set(OWNERS)
    assert await _owners_seen(installation.roles.writer, relation) >= set(OWNERS)


async def test_every_table_of_job_rows_is_under_a_tenant_policy(
    installation: Installation,
) -> None:
    """Any table with a ``job_id``, ``request_id`` or ``tenant_prefix`` column is in
    ``TENANT_ROWS``, under row security with the tenants' policy on that column; every view is
    ``security_invoker``."""
    connection = await asyncpg.connect(installation.admin)
    try:
        keyed = await connection.fetch(
            "SELECT c.table_name, c.column_name FROM information_schema.columns c "
            "JOIN information_schema.tables t USING (table_schema, table_name) "
            "WHERE c.table_schema = 'public' AND t.table_type = 'BASE TABLE' "
            "AND c.column_name IN ('job_id', 'request_id', 'tenant_prefix') "
            # a partition is read through its table, whose policy applies (no grant of its own)
            "AND c.table_name NOT IN (SELECT relname FROM pg_class WHERE relispartition)"
        )
        policed = await connection.fetch(
            "SELECT p.tablename, p.qual, c.relrowsecurity, c.relforcerowsecurity "
            "FROM pg_policies p JOIN pg_class c ON c.relname = p.tablename "
            "JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = p.schemaname "
            "WHERE p.schemaname = 'public' AND p.policyname = $1 AND $2 = ANY(p.roles)",
            TENANT_POLICY,
            installation.names.tenants,
        )
        views = await connection.fetch(
            "SELECT c.relname, c.reloptions FROM pg_class c JOIN pg_namespace n "
            "ON n.oid = c.relnamespace WHERE n.nspname = 'public' AND c.relkind = 'v'"
        )
    finally:
        await connection.close()
    tables = {row["table_name"] for row in keyed}
    assert tables == set(TENANT_ROWS)
    for row in keyed:
        if row["column_name"] in ("job_id", "tenant_prefix") or row["table_name"] == "rejections":
            assert TENANT_ROWS[row["table_name"]] == row["column_name"]
    by_table = {row["tablename"]: row for row in policed}
    assert set(by_table) == tables
    for table, row in by_table.items():
        assert row["relrowsecurity"] and not row["relforcerowsecurity"], table
        assert TENANT_ROWS[table] in row["qual"] and "mdq_current_tenant" in row["qual"]
    assert {row["relname"]: row["reloptions"] for row in views} == {
        name: ["security_invoker=true"] for name, a in RELATIONS.items() if a is Access.READ
    }


TENANT_REFUSED = {
    "insert": "INSERT INTO rejections (request_id, message, time) "
    "VALUES ('alice.000000000000', 'x', now())",
    "update its own job": "UPDATE jobs SET state = 'SUCCEEDED'",
    "delete its own job": "DELETE FROM jobs",
    "truncate": "TRUNCATE progress",
    "copy in": "COPY rejections FROM STDIN",
    "read the offsets": "SELECT * FROM consumer_offsets",
    "read the migrations' table": "SELECT * FROM alembic_version",
    "create table": "CREATE TABLE mine (x int)",
    "create temporary table": "CREATE TEMPORARY TABLE mine (x int)",
    "create view": "CREATE VIEW mine AS SELECT * FROM jobs",
    "create function": "CREATE FUNCTION public.mdq_current_tenant(x int) RETURNS text "
    "LANGUAGE sql AS $$ SELECT 'bob' $$",
    "replace the tenant function": "CREATE OR REPLACE FUNCTION public.mdq_current_tenant() "
    "RETURNS text LANGUAGE sql AS $$ SELECT 'lab' $$",
    "disable row security": "ALTER TABLE jobs DISABLE ROW LEVEL SECURITY",
    "drop the policy": f"DROP POLICY {TENANT_POLICY} ON jobs",
    "make a policy": "CREATE POLICY mine ON jobs FOR SELECT USING (true)",
    "make a view an owner's again": "ALTER VIEW events RESET (security_invoker)",
    "bypass row security": "ALTER ROLE CURRENT_USER BYPASSRLS",
    "create role": "CREATE ROLE rogue",
}


@pytest.mark.parametrize("statement", TENANT_REFUSED.values(), ids=TENANT_REFUSED.keys())
async def test_a_tenant_cannot_write_or_change_anything(
    alice: asyncpg.Connection, statement: str
) -> None:
    with pytest.raises(NOT_ALLOWED):
        await alice.execute(statement)


async def test_a_tenant_acting_as_the_group_sees_nothing(
    installation: Installation, alice: asyncpg.Connection
) -> None:
    """``SET ROLE`` to the group (the only role a tenant may take) names no tenant: no rows."""
    assert await alice.fetchval("SELECT public.mdq_current_tenant()") == "alice"
    await alice.execute(f'SET ROLE "{installation.names.tenants}"')
    assert await alice.fetchval("SELECT public.mdq_current_tenant()") is None
    assert await alice.fetchval("SELECT count(*) FROM jobs") == 0
    assert await alice.fetchval("SELECT count(*) FROM events") == 0


async def test_a_tenant_learns_nothing_from_the_planner_statistics(
    installation: Installation, alice: asyncpg.Connection
) -> None:
    admin = await asyncpg.connect(installation.admin)
    try:
        await admin.execute("ANALYZE jobs")
        assert await admin.fetchval("SELECT count(*) FROM pg_stats WHERE tablename = 'jobs'")
    finally:
        await admin.close()
    assert await alice.fetchval("SELECT count(*) FROM pg_stats WHERE tablename = 'jobs'") == 0


async def test_the_writer_still_upserts_and_copies(installation: Installation) -> None:
    """The projector's ways of writing, under row security: COPY (refused by PostgreSQL to a
    role row security applies to: the writer bypasses it) and upserts."""
    writer = await asyncpg.connect(installation.roles.writer)
    now = datetime.now(UTC)
    try:
        await writer.copy_records_to_table(
            "progress",
            records=[(job_of("alice"), 2, 10, now, 0.1, -1.0, 1.0, 300.0, 10.0, *PROGRESS_TAIL)],
            columns=PROGRESS_COLUMNS,
        )
        await writer.execute(
            "INSERT INTO jobs SELECT * FROM jobs WHERE job_id = $1 "
            "ON CONFLICT (job_id) DO UPDATE SET state = 'SUCCEEDED'",
            job_of("lab"),
        )
        # (beside each owner's report of January 2025, rolled up by ``_write_rows``)
        assert (
            await writer.fetchval("SELECT count(*) FROM progress WHERE time > '2025-02-01Z'")
            == len(OWNERS) + 1
        )
    finally:
        await writer.close()
    assert await _owners_seen(installation.tenants["alice"], "progress") == {"alice"}


async def test_tenant_logins_are_made_once_and_take_over_no_other_role(
    installation: Installation,
) -> None:
    names = installation.names
    role = await provision_tenant(installation.admin, names, "alice", "new")  # idempotent
    new = role_url(installation.admin, user=role, password="new")
    assert await _owners_seen(new, "jobs") == {"alice"}
    admin = await asyncpg.connect(installation.admin)
    try:
        await admin.execute(f'CREATE ROLE "{names.tenant("bob")}" LOGIN')  # not a tenant's
    finally:
        await admin.close()
    with pytest.raises(asyncpg.RaiseError, match="not a tenant"):
        await provision_tenant(installation.admin, names, "bob", "pw")
    with pytest.raises(RoleError, match="longer than"):
        RoleNames.with_prefix("m" * 30).tenant("a" * 30)


async def test_a_removed_tenant_can_no_longer_log_in_and_no_other_role_is_dropped(
    installation: Installation,
) -> None:
    names = installation.names
    session = await asyncpg.connect(installation.tenants["alice"])  # open while she is removed
    try:
        assert await tenant_role_exists(installation.admin, names, "alice")
        role = await drop_tenant(installation.admin, names, "alice")
        assert not await tenant_role_exists(installation.admin, names, "alice")
        with pytest.raises((asyncpg.PostgresError, asyncpg.InterfaceError)):  # session ended
            await session.fetch("SELECT 1")
    finally:
        await session.close()
    with pytest.raises(asyncpg.InvalidAuthorizationSpecificationError):  # no such role now
        await asyncpg.connect(installation.tenants["alice"])
    admin = await asyncpg.connect(installation.admin)
    try:
        assert await admin.fetchval("SELECT count(*) FROM pg_roles WHERE rolname = $1", role) == 0
        await admin.execute(f'CREATE ROLE "{names.tenant("bob")}" LOGIN')  # not a tenant's
        await drop_tenant(installation.admin, names, "alice")  # again: nothing left to do
        with pytest.raises(asyncpg.RaiseError, match="not a tenant"):
            await drop_tenant(installation.admin, names, "bob")
        bob = names.tenant("bob")
        assert await admin.fetchval("SELECT count(*) FROM pg_roles WHERE rolname = $1", bob) == 1
    finally:
        await admin.close()
    assert await _owners_seen(installation.tenants["lab"], "jobs") == {"lab"}  # the others stay


async def test_the_migration_goes_down_and_up_again(installation: Installation) -> None:
    """Down to nothing: no role reads or writes a table, the logins stay. Up, granted and
    written again: a tenant reads its own rows only, as before."""
    owner = installation.roles.owner
    await asyncio.to_thread(command.downgrade, alembic_config(owner), "base")
    for url in (installation.tenants["lab"], installation.roles.reader, installation.roles.writer):
        connection = await asyncpg.connect(url)
        try:
            with pytest.raises(asyncpg.UndefinedTableError):
                await connection.fetch("SELECT * FROM jobs")
        finally:
            await connection.close()
    await upgrade_async(owner)
    await grant(owner, installation.names)  # as every start does after the migrations
    await _write_rows(installation.roles.writer)
    assert await _owners_seen(installation.tenants["lab"], "events") == {"lab"}
    assert await _owners_seen(installation.roles.reader, "jobs") == set(OWNERS)


# -- the CLI ------------------------------------------------------------------------------------
def _history_cli(database_url: str, password: str, *args: str) -> str:
    env = {"DATABASE_URL": database_url, "PGPASSWORD": password, "COLUMNS": "200"}
    # no NATS at all: the history commands read PostgreSQL only
    no_stack = ["--state-dir", "/nonexistent/mdq-state"]
    result = CliRunner().invoke(cli, [*no_stack, *args], env=env)
    return f"exit {result.exit_code}\n{result.output}"


async def test_mdq_ls_and_show_as_a_tenant_show_its_jobs_only(
    installation: Installation,
) -> None:
    """With the URL ``mdq tenant add`` prints (no password) and ``PGPASSWORD``."""
    url = role_url(installation.admin, user=installation.names.tenant("lab"), password=None)
    listed = await asyncio.to_thread(_history_cli, url, "pw-lab", "ls")
    assert listed.startswith("exit 0"), listed
    assert re.findall(r"\S*" + HEX + r"-relax", listed) == [job_of("lab")], listed
    shown = await asyncio.to_thread(_history_cli, url, "pw-lab", "show", job_of("lab"))
    assert shown.startswith("exit 0") and "R-lab" in shown
    hidden = await asyncio.to_thread(_history_cli, url, "pw-lab", "show", job_of("lab-a"))
    assert not hidden.startswith("exit 0") and "no job" in hidden


def test_role_names_and_the_stacks_administrator(tmp_path: Path) -> None:
    stack = StackInfo(
        nats_url="nats://x",
        database_url="postgresql://lab1_reader@/mdq?host=/s",
        namespace="mdq",
        metrics_url="",
        state_dir=str(tmp_path),
        logs_dir="",
        data_dir="",
        backend="local",
        pid=1,
        embedded_nats=True,
        embedded_postgres=True,
    )
    assert role_names_for(stack, {}).tenant("alice") == "lab1_tenant_alice"
    assert role_names_for(stack, {"MDQ_DB_ROLE_PREFIX": "x"}).tenants == "x_tenants"
    assert role_names_for(None, {}).tenant("a-b") == "mdq_tenant_a-b"
    with pytest.raises(NoDatabaseAdmin, match=r"admin\.password"):
        database_admin(stack, tmp_path, None, {})
    folder = tmp_path / "secrets" / "postgres"
    folder.mkdir(parents=True)
    (folder / "admin.password").write_text("s3cret\n")
    assert database_admin(stack, tmp_path, None, {}).url == (
        "postgresql://postgres:s3cret@/mdq?host=/s"
    )
    env = {"MDQ_PG_ADMIN_PASSWORD": "p"}
    given = database_admin(stack, tmp_path, "postgresql://root@db/mdq", env)
    assert given.url == "postgresql://root:p@db/mdq"
    with pytest.raises(NoDatabaseAdmin, match="MDQ_PG_ADMIN_URL"):
        database_admin(None, tmp_path, None, {})
    with pytest.raises(NoDatabaseAdmin, match="MDQ_PG_ADMIN_URL"):
        database_admin(replace(stack, embedded_postgres=False), tmp_path, None, {})


async def test_add_tenant_database_keeps_its_password_private(
    installation: Installation, tmp_path: Path
) -> None:
    admin = DatabaseAdmin(installation.admin, installation.names)
    made = await add_tenant_database("lab-a", admin=admin, state_dir=tmp_path)
    again = await add_tenant_database("lab-a", admin=admin, state_dir=tmp_path)
    assert made == again and made.role == installation.names.tenant("lab-a")
    assert made.password_file == tmp_path / "secrets/postgres/tenants/lab-a.password"
    assert stat.S_IMODE(made.password_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(made.password_file.parent.stat().st_mode) == 0o700
    password = made.password_file.read_text().strip()
    assert password not in made.url and len(password) >= 40
    url = role_url(made.url, user=made.role, password=password)
    assert await _owners_seen(url, "attempt_history") == {"lab-a"}


@pytest.fixture
def closed_bus(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A nats-server that trusts only what ``mdq.bus.security.auth`` signs (as
    test_tenants.py's)."""
    secrets = tmp_path / "secrets"
    generated = generate(secrets)
    server = start_nats(tmp_path / "nats", auth=generated.server_block.read_text())
    yield server.url, secrets
    server.stop()


def _tenant_add(url: str, secrets: Path, prefix: str, state: Path, *extra: str) -> tuple[int, str]:
    args = ["--nats-url", url, "--state-dir", str(state), "tenant", "add", "lab-a"]
    env = {"COLUMNS": "300", ENV_PREFIX: prefix, ENV_ADMIN_URL: None, ENV_ADMIN_PASSWORD: None}
    result = CliRunner().invoke(cli, [*args, "--secrets", str(secrets), *extra], env=env)
    return result.exit_code, result.output


async def test_mdq_tenant_add_makes_the_login_or_says_why_not(
    closed_bus: tuple[str, Path], installation: Installation, namespace: str, tmp_path: Path
) -> None:
    url, secrets = closed_bus
    await prepare_bus(url, namespace="mdq", creds=secrets / "admin.creds")
    state = tmp_path / "state"
    made, down, none = [
        await asyncio.to_thread(_tenant_add, url, secrets, namespace, state, *extra)
        for extra in (
            ("--database-admin-url", installation.admin),
            ("--database-admin-url", "postgresql://x@127.0.0.1:9/x"),
            (),
        )
    ]
    code, output = made
    role = installation.names.tenant("lab-a")
    password_file = state / "secrets/postgres/tenants/lab-a.password"
    assert code == 0 and f"role {role}" in output and str(password_file) in output, output
    password = password_file.read_text().strip()
    assert password not in output
    tenant_url = role_url(installation.admin, user=role, password=password)
    assert await _owners_seen(tenant_url, "jobs") == {"lab-a"}
    code, output = down  # the database cannot be reached: said, and the NATS part is done
    assert code == 1 and "no login made" in output and "NATS part is done" in output, output
    assert "credentials" in output and (secrets / "tenants" / "lab-a.creds").exists()
    code, output = none  # no stack, no administrator: said, not an error
    assert code == 0 and "no PostgreSQL login was made" in output, output


async def test_on_the_embedded_stack_the_login_is_made_as_its_superuser(
    tmp_path: Path, nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``mdq up``'s own PostgreSQL (passwords required): found from stack.json, reached as its
    superuser; the tenant connects with its password, and with no other."""
    monkeypatch.delenv("DATABASE_URL", raising=False)
    monkeypatch.delenv(ENV_PREFIX, raising=False)
    state = tmp_path / ".mdq"
    stack = Stack(state_dir=state, nats_url=nats_url, services=(), metrics_port=0, grace_s=15.0)
    info = await stack.start()
    try:
        admin = database_admin(info, state, None, {})
        made = await add_tenant_database("lab-7", admin=admin, state_dir=state)
        password = made.password_file.read_text().strip()
        assert made.role == "mdq_tenant_lab-7" and made.url.startswith("postgresql://mdq_tenant")
        tenant = await asyncpg.connect(
            asyncpg_dsn(role_url(made.url, user=made.role, password=password))
        )
        try:
            assert await tenant.fetchval("SELECT public.mdq_current_tenant()") == "lab-7"
            assert await tenant.fetchval("SELECT count(*) FROM job_timeline") == 0
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await tenant.execute("CREATE TEMPORARY TABLE scratch (x int)")
        finally:
            await tenant.close()
        with pytest.raises(asyncpg.InvalidPasswordError):
            await asyncpg.connect(asyncpg_dsn(role_url(made.url, user=made.role, password="no")))
        # the server is the stack's: no other database lets a tenant in (nor make temporary
        # tables there); red while PostgreSQL's default CONNECT for PUBLIC stood
        mine = urlsplit(role_url(made.url, user=made.role, password=password))
        for database in ("postgres", "template1"):
            elsewhere = urlunsplit(mine._replace(path=f"/{database}"))
            with pytest.raises(asyncpg.InsufficientPrivilegeError, match="permission denied"):
                await asyncpg.connect(asyncpg_dsn(elsewhere))
    finally:
        await stack.stop()
