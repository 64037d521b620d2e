"""PostgreSQL roles: who may do what in mdq's database, decided and applied in one place.

The owner, the writer, the reader, the tenants' group and each tenant's login; which relation
each may use (``RELATIONS``); the row security that shows a tenant its own rows. The SQL is
built by pure functions (``provision_statements``, ``grant_statements``) and run, each in one
transaction, by thin async ones (``provision`` as an administrator, ``grant`` as the owner),
both idempotent and run on every start. Who connects as which role and why: docs/security.md,
"PostgreSQL roles" and "Tenants in PostgreSQL".
"""

from __future__ import annotations

import asyncio
import os
import re
import secrets
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from urllib.parse import quote, unquote, urlsplit, urlunsplit

from mdq.errors import MdqError

DEFAULT_PREFIX = "mdq"
PASSWORD_BYTES = 32
"""``secrets.token_urlsafe(32)``: 43 characters, 256 bits, safe in a URL as it is."""
_PREFIX = re.compile(r"^[a-z][a-z0-9_]{0,40}$")


class Access(Enum):
    """What the writer and the reader may do with one relation (the owner may do anything)."""

    WRITTEN = "written"
    """A table the projector writes: writer SELECT, INSERT, UPDATE; reader SELECT."""
    READ = "read"
    """A table or view for history queries: writer and reader SELECT."""
    SUMMARIZED = "summarized"
    """A table only the owner's functions write (the watcher calls them): writer and reader
    SELECT."""
    QUEUED = "queued"
    """Work the projector queues and clears (``progress_unfolded``): writer SELECT, INSERT,
    DELETE; reader SELECT."""
    OWNER_ONLY = "owner_only"
    """Neither: ``alembic_version``."""


RELATIONS: dict[str, Access] = {
    # the projection's tables (libs/mdq/store/projection/ writes every one of them)
    "jobs": Access.WRITTEN,
    "attempts": Access.WRITTEN,
    "job_events": Access.WRITTEN,
    "progress": Access.WRITTEN,
    "checkpoints": Access.WRITTEN,
    "placements": Access.WRITTEN,
    "rejections": Access.WRITTEN,
    "consumer_offsets": Access.WRITTEN,
    # the attempts whose reports the jobs' rows have not caught up with yet
    "progress_unfolded": Access.QUEUED,
    # kept by a trigger on job_events, as the writer inserts
    "usage_samples": Access.WRITTEN,
    # kept by a trigger on usage_samples
    "usage_summaries": Access.WRITTEN,
    # kept by triggers on attempts
    "failure_tallies": Access.WRITTEN,
    "node_hours": Access.WRITTEN,
    # written by mdq_rollup_progress, the owner's
    "progress_rollups": Access.SUMMARIZED,
    # the views of docs/history.md
    "events": Access.READ,
    "job_timeline": Access.READ,
    "attempt_history": Access.READ,
    "failures_by_reason": Access.READ,
    "node_utilisation": Access.READ,
    "job_outputs": Access.READ,
    "attempt_usage": Access.READ,
    # the migrations' own bookkeeping
    "alembic_version": Access.OWNER_ONLY,
}
"""Every relation of mdq's schema and who may use it."""

WRITER_FUNCTIONS = (
    "mdq_make_partitions(timestamptz, timestamptz)",
    "mdq_detach_partitions(timestamptz)",
    "mdq_rollup_progress(timestamptz, integer)",
)
"""The owner's functions the writer may execute (the watcher makes the months ahead, detaches
the expired ones and rolls the old months of progress up, with no DDL of its own); PUBLIC may
execute none."""

WRITER_TABLE_PRIVILEGES = ("SELECT", "INSERT", "UPDATE")
"""The projector inserts (COPY included) and upserts; it never deletes or truncates, but for
the queue of its own pending work (``WRITER_QUEUE_PRIVILEGES``)."""
WRITER_QUEUE_PRIVILEGES = ("SELECT", "INSERT", "DELETE")
"""A queue's rows are inserted and deleted, never updated."""

TENANT_ROWS: dict[str, str] = {
    "jobs": "job_id",
    "attempts": "job_id",
    "job_events": "job_id",
    "progress": "job_id",
    "checkpoints": "job_id",
    "placements": "job_id",
    "rejections": "request_id",
    "usage_samples": "job_id",
    "usage_summaries": "job_id",
    "failure_tallies": "tenant_prefix",
    "node_hours": "tenant_prefix",
    "progress_rollups": "job_id",
    "progress_unfolded": "job_id",
}
"""The tables of per-job rows (the migration puts them under row security), each with the
column that names its job or submit (a tally: its owner, ``<tenant>.``): a tenant sees a row
only when that starts with ``<tenant>.``. A row whose column is NULL (an event of no job) is
no tenant's."""

READER_POLICY = "reader_rows"
TENANT_POLICY = "tenant_rows"
"""The policies' names (the same on every table)."""
TENANT_ROLE_INFIX = "_tenant_"
MAX_ROLE_NAME = 63
"""PostgreSQL's NAMEDATALEN - 1: a longer name would be cut, and two tenants could meet."""


class RoleError(MdqError, RuntimeError):
    """The roles cannot be set up (a missing role, a bad prefix, no password)."""


@dataclass(frozen=True, slots=True)
class RoleNames:
    """The three login roles of one mdq installation, and its tenants' group."""

    owner: str
    writer: str
    reader: str
    tenants: str
    """The NOLOGIN group of the tenants' logins."""

    @classmethod
    def with_prefix(cls, prefix: str = DEFAULT_PREFIX) -> RoleNames:
        if not _PREFIX.fullmatch(prefix):
            raise RoleError(
                f"role prefix {prefix!r}: lower-case letters, digits and _, starting with a "
                "letter, at most 41 characters"
            )
        return cls(
            owner=f"{prefix}_owner",
            writer=f"{prefix}_writer",
            reader=f"{prefix}_reader",
            tenants=f"{prefix}_tenants",
        )

    @property
    def prefix(self) -> str:
        return self.tenants.removesuffix("_tenants")

    def all(self) -> tuple[str, str, str]:
        """The three login roles (not the tenants' group)."""
        return (self.owner, self.writer, self.reader)

    def tenant(self, tenant: str) -> str:
        """The login role of ``tenant`` (``<prefix>_tenant_<name>``, the name's ``-`` kept:
        the SQL always quotes it). Raises ``RoleError`` for a name PostgreSQL would cut."""
        name = f"{self.prefix}{TENANT_ROLE_INFIX}{tenant}"
        if len(name.encode()) > MAX_ROLE_NAME:
            raise RoleError(
                f"role {name!r} is longer than PostgreSQL's {MAX_ROLE_NAME} bytes: take a "
                "shorter tenant name or role prefix"
            )
        return name


@dataclass(frozen=True, slots=True)
class RolePasswords:
    """The login passwords of the three roles."""

    owner: str
    writer: str
    reader: str

    @classmethod
    def generate(cls) -> RolePasswords:
        return cls(*(secrets.token_urlsafe(PASSWORD_BYTES) for _ in range(3)))


def quote_ident(name: str) -> str:
    """``name`` as a PostgreSQL identifier, always quoted."""
    return '"' + name.replace('"', '""') + '"'


def quote_literal(value: str) -> str:
    """``value`` as a PostgreSQL string literal (standard_conforming_strings, the default)."""
    if "\x00" in value:
        raise RoleError("a password may not contain NUL")
    return "'" + value.replace("'", "''") + "'"


def role_url(url: str, *, user: str, password: str | None) -> str:
    """``url`` with its user (and password) replaced: the same server and database as another
    role. Keeps the query (``?host=/socket/dir`` of the embedded PostgreSQL)."""
    split = urlsplit(url)
    host = split.netloc.rpartition("@")[2]
    credentials = quote(user, safe="")
    if password is not None:
        credentials += ":" + quote(password, safe="")
    return urlunsplit(split._replace(netloc=f"{credentials}@{host}"))


def url_user(url: str) -> str:
    """The user named in ``url`` ('' when none is)."""
    return unquote(urlsplit(url).username or "")


def without_password(url: str) -> str:
    """``url`` with its password left out (for stack.json and log lines)."""
    split = urlsplit(url)
    if split.password is None:
        return url
    return role_url(url, user=unquote(split.username or ""), password=None)


def _ensure_role(name: str) -> str:
    literal = quote_literal(name)
    return (
        f"DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = {literal}) "
        f"THEN CREATE ROLE {quote_ident(name)}; END IF; END $$"
    )


_TRANSFER_OWNERSHIP = """
DO $$
DECLARE r record;
BEGIN
  FOR r IN
    SELECT c.relname, c.relkind FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p', 'v', 'm', 'S')
      AND c.relowner <> {owner_oid}
      -- a partitioned table and its partitions have automatic dependencies, owned all the same
      AND (c.relispartition OR c.relkind = 'p'
           OR NOT EXISTS (SELECT FROM pg_depend d
                          WHERE d.classid = 'pg_class'::regclass AND d.objid = c.oid
                            AND d.deptype IN ('a', 'i')))
  LOOP
    EXECUTE format('ALTER %s %I OWNER TO %I',
      CASE r.relkind WHEN 'v' THEN 'VIEW' WHEN 'm' THEN 'MATERIALIZED VIEW'
                     WHEN 'S' THEN 'SEQUENCE' ELSE 'TABLE' END,
      r.relname, {owner});
  END LOOP;
  -- the schema's functions too: a SECURITY DEFINER one (the partitions') runs as its owner
  FOR r IN
    SELECT p.oid::regprocedure::text AS signature FROM pg_proc p
    JOIN pg_namespace n ON n.oid = p.pronamespace
    WHERE n.nspname = 'public' AND p.proowner <> {owner_oid}
      AND NOT EXISTS (SELECT FROM pg_depend d
                      WHERE d.classid = 'pg_proc'::regclass AND d.objid = p.oid
                        AND d.deptype = 'e')
  LOOP
    EXECUTE format('ALTER FUNCTION %s OWNER TO %I', r.signature, {owner});
  END LOOP;
END $$"""


_TENANTS_GROUP = (
    "ALTER ROLE {group} WITH NOLOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION "
    "NOBYPASSRLS PASSWORD NULL"
)


def provision_statements(names: RoleNames, passwords: RolePasswords) -> list[str]:
    """The administrator's SQL (run in one transaction in the database mdq uses)."""
    statements = [_ensure_role(name) for name in (*names.all(), names.tenants)]
    for name, password in zip(
        names.all(), (passwords.owner, passwords.writer, passwords.reader), strict=True
    ):
        if not password:
            raise RoleError(f"no password for {name}")
        # the writer alone bypasses row security (see the module doc)
        rls = "BYPASSRLS" if name == names.writer else "NOBYPASSRLS"
        statements.append(
            f"ALTER ROLE {quote_ident(name)} WITH LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE "
            f"NOREPLICATION {rls} INHERIT PASSWORD {quote_literal(password)}"
        )
    statements.append(_TENANTS_GROUP.format(group=quote_ident(names.tenants)))
    owner, writer, reader = (quote_ident(name) for name in names.all())
    tenants = quote_ident(names.tenants)
    database_privileges = (
        "DO $$ BEGIN "
        "EXECUTE format('REVOKE ALL ON DATABASE %I FROM PUBLIC', current_database()); "
        "EXECUTE format('GRANT CONNECT, TEMPORARY ON DATABASE %I TO %s', current_database(), "
        f"{quote_literal(owner)}); "
        "EXECUTE format('GRANT CONNECT ON DATABASE %I TO %s, %s, %s', current_database(), "
        f"{quote_literal(writer)}, {quote_literal(reader)}, {quote_literal(tenants)}); "
        "END $$"
    )
    statements += [
        database_privileges,
        f"ALTER SCHEMA public OWNER TO {owner}",
        "REVOKE ALL ON SCHEMA public FROM PUBLIC",
        _TRANSFER_OWNERSHIP.format(
            owner_oid=f"{quote_literal(names.owner)}::regrole", owner=quote_literal(names.owner)
        ),
    ]
    return statements


def grant_statements(
    names: RoleNames,
    existing: Iterable[str],
    *,
    secured: Iterable[str] = (),
    tenants: bool = False,
) -> list[str]:
    """The owner's SQL (one transaction): the writer's, the reader's and (with ``tenants``: the
    group exists) the tenants' privileges on the relations of the schema that exist
    (``existing``), from ``RELATIONS`` and ``TENANT_ROWS`` alone, and the row policies.

    ``secured``: the relations that are safe to show a tenant, the tables under row security
    and the views that are ``security_invoker`` (``schema_state``). The tenants get ``SELECT``
    on those of ``TENANT_ROWS`` and on the views among them, nothing else; every table under
    row security gets the reader's policy (every row) and the tenants' (their own rows)."""
    writer, reader = quote_ident(names.writer), quote_ident(names.reader)
    group = quote_ident(names.tenants)
    present, safe = set(existing), set(secured)
    everyone = f"{writer}, {reader}" + (f", {group}" if tenants else "")
    statements = [
        f"REVOKE ALL ON ALL TABLES IN SCHEMA public FROM {everyone}",
        f"REVOKE ALL ON ALL SEQUENCES IN SCHEMA public FROM {everyone}",
        f"REVOKE ALL ON SCHEMA public FROM {everyone}",
        f"GRANT USAGE ON SCHEMA public TO {everyone}",
        f"GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO {writer}",
    ]
    for relation, access in sorted(RELATIONS.items()):
        if relation not in present or access is Access.OWNER_ONLY:
            continue
        target = f"public.{quote_ident(relation)}"
        statements.append(f"GRANT SELECT ON {target} TO {reader}")
        writer_privileges = {
            Access.WRITTEN: WRITER_TABLE_PRIVILEGES,
            Access.QUEUED: WRITER_QUEUE_PRIVILEGES,
        }.get(access, ("SELECT",))
        statements.append(f"GRANT {', '.join(writer_privileges)} ON {target} TO {writer}")
        tenant_readable = relation in TENANT_ROWS or access is Access.READ
        if tenants and tenant_readable and relation in safe:
            statements.append(f"GRANT SELECT ON {target} TO {group}")
    for function in WRITER_FUNCTIONS:
        signature = quote_literal(f"public.{function}")
        statements.append(
            f"DO $$ BEGIN IF to_regprocedure({signature}) IS NOT NULL THEN "
            f"REVOKE ALL ON FUNCTION public.{function} FROM PUBLIC; "
            f"GRANT EXECUTE ON FUNCTION public.{function} TO {writer}; END IF; END $$"
        )
    policed = sorted(table for table in TENANT_ROWS if table in present and table in safe)
    if policed:
        statements.append(_DROP_POLICIES)
    for table in policed:
        target = f"public.{quote_ident(table)}"
        statements.append(
            f"CREATE POLICY {READER_POLICY} ON {target} FOR SELECT TO {reader} USING (true)"
        )
        if tenants:
            column = quote_ident(TENANT_ROWS[table])
            statements.append(
                f"CREATE POLICY {TENANT_POLICY} ON {target} FOR SELECT TO {group} "
                f"USING (starts_with({column}, (SELECT public.mdq_current_tenant()) || '.'))"
            )
    return statements


_DROP_POLICIES = """
DO $$
DECLARE r record;
BEGIN
  FOR r IN SELECT policyname, tablename FROM pg_policies WHERE schemaname = 'public'
  LOOP
    EXECUTE format('DROP POLICY %I ON public.%I', r.policyname, r.tablename);
  END LOOP;
END $$"""


def tenant_statements(names: RoleNames, tenant: str, password: str) -> list[str]:
    """The administrator's SQL (one transaction) that makes (or updates) ``tenant``'s login:
    a member of the tenants' group and nothing more. A role of that name that exists and is
    not in the group is refused, not taken over."""
    from mdq.core.tenants import validate_tenant_name

    validate_tenant_name(tenant)
    if not password:
        raise RoleError(f"no password for tenant {tenant}")
    role = names.tenant(tenant)
    role_literal, group_literal = quote_literal(role), quote_literal(names.tenants)
    return [
        "DO $$ BEGIN "
        f"IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = {group_literal}) THEN "
        f"RAISE EXCEPTION 'no role %: run the database setup of this mdq version first "
        f"(restart mdq up, or the migration step)', {group_literal}; END IF; "
        f"IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = {role_literal}) THEN "
        f"CREATE ROLE {quote_ident(role)}; "
        f"ELSIF NOT pg_has_role({role_literal}, {group_literal}, 'MEMBER') THEN "
        f"RAISE EXCEPTION 'role % exists and is not a tenant of this installation (not in %)', "
        f"{role_literal}, {group_literal}; END IF; END $$",
        f"ALTER ROLE {quote_ident(role)} WITH LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE "
        f"NOREPLICATION NOBYPASSRLS INHERIT PASSWORD {quote_literal(password)}",
        f"GRANT {quote_ident(names.tenants)} TO {quote_ident(role)}",
    ]


def drop_tenant_statements(names: RoleNames, tenant: str) -> list[str]:
    """The administrator's SQL that removes ``tenant``'s login: no more logins, its sessions
    ended (where the administrator may end them), the role dropped. A role of that name that is
    not in the tenants' group is refused, not dropped; no such role is no error."""
    from mdq.core.tenants import validate_tenant_name

    validate_tenant_name(tenant)
    role = names.tenant(tenant)
    role_literal, group_literal = quote_literal(role), quote_literal(names.tenants)
    return [
        "DO $$ BEGIN "
        f"IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = {role_literal}) THEN RETURN; END IF; "
        f"IF NOT pg_has_role({role_literal}, {group_literal}, 'MEMBER') THEN "
        f"RAISE EXCEPTION 'role % is not a tenant of this installation (not in %): not dropped', "
        f"{role_literal}, {group_literal}; END IF; "
        f"ALTER ROLE {quote_ident(role)} NOLOGIN; "
        "BEGIN "
        f"PERFORM pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = {role_literal}; "
        "EXCEPTION WHEN insufficient_privilege THEN "
        "RAISE NOTICE 'open sessions of % end when they disconnect', "
        f"{role_literal}; END; "
        f"DROP ROLE {quote_ident(role)}; END $$",
    ]


async def drop_tenant(admin_url: str, names: RoleNames, tenant: str) -> str:
    """Remove ``tenant``'s login (``drop_tenant_statements``); returns the role's name."""
    await _run_in_transaction(admin_url, drop_tenant_statements(names, tenant))
    return names.tenant(tenant)


async def tenant_role_exists(admin_url: str, names: RoleNames, tenant: str) -> bool:
    """Whether ``tenant``'s login role exists (read as the administrator)."""
    import asyncpg

    from mdq.store.engine import asyncpg_dsn

    connection = await asyncpg.connect(asyncpg_dsn(admin_url))
    try:
        role = names.tenant(tenant)
        return bool(await connection.fetchval("SELECT 1 FROM pg_roles WHERE rolname = $1", role))
    finally:
        await connection.close()


async def _run_in_transaction(url: str, statements: Sequence[str]) -> None:
    import asyncpg

    from mdq.store.engine import asyncpg_dsn

    connection = await asyncpg.connect(asyncpg_dsn(url))
    try:
        async with connection.transaction():
            for statement in statements:
                await connection.execute(statement)
    finally:
        await connection.close()


async def close_other_databases(admin_url: str) -> list[str]:
    """On a server mdq owns whole (``mdq up``'s embedded one), take ``CONNECT`` and
    ``TEMPORARY`` on every other database (``postgres``, ``template1``) from ``PUBLIC``, which
    PostgreSQL gives them by default: a tenant's login then reaches mdq's database alone, where
    it may make no temporary table either. As the administrator; returns the databases closed.
    Not for a server shared with others, whose other databases are not mdq's to close."""
    import asyncpg

    from mdq.store.engine import asyncpg_dsn

    connection = await asyncpg.connect(asyncpg_dsn(admin_url))
    try:
        others = await connection.fetch(
            "SELECT datname FROM pg_database WHERE datallowconn AND datname <> current_database()"
        )
        names = sorted(str(row["datname"]) for row in others)
        for name in names:
            await connection.execute(
                f"REVOKE CONNECT, TEMPORARY ON DATABASE {quote_ident(name)} FROM PUBLIC"
            )
    finally:
        await connection.close()
    return names


async def provision(admin_url: str, names: RoleNames, passwords: RolePasswords) -> None:
    """Create or update the roles and hand the schema to the owner (as an administrator)."""
    await _run_in_transaction(admin_url, provision_statements(names, passwords))


async def provision_tenant(admin_url: str, names: RoleNames, tenant: str, password: str) -> str:
    """Create or update ``tenant``'s login with ``password`` (as an administrator: a superuser,
    or a role with CREATEROLE that made the tenants' group); returns the role's name."""
    await _run_in_transaction(admin_url, tenant_statements(names, tenant, password))
    return names.tenant(tenant)


async def schema_relations(url: str) -> set[str]:
    """Names of the tables and views of the ``public`` schema."""
    import asyncpg

    from mdq.store.engine import asyncpg_dsn

    connection = await asyncpg.connect(asyncpg_dsn(url))
    try:
        rows = await connection.fetch(
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p', 'v', 'm') "
            "AND NOT c.relispartition"  # a partition is read through its table only
        )
        return {str(row["relname"]) for row in rows}
    finally:
        await connection.close()


@dataclass(frozen=True, slots=True)
class SchemaState:
    """What ``grant`` needs to know of the database (``schema_state``)."""

    relations: frozenset[str]
    """The tables and views of the ``public`` schema."""
    secured: frozenset[str]
    """The tables under row security and the ``security_invoker`` views."""
    tenants: bool
    """Whether the tenants' group exists."""
    writer_bypasses_rls: bool


_INVOKER = "ARRAY['security_invoker=true', 'security_invoker=on', 'security_invoker=1']"


async def schema_state(url: str, names: RoleNames) -> SchemaState:
    """The relations of the ``public`` schema, which are secured, and the roles' row-security
    facts."""
    import asyncpg

    from mdq.store.engine import asyncpg_dsn

    connection = await asyncpg.connect(asyncpg_dsn(url))
    try:
        rows = await connection.fetch(
            "SELECT c.relname, (c.relkind IN ('r', 'p') AND c.relrowsecurity) "
            f"OR (c.relkind = 'v' AND COALESCE(c.reloptions && {_INVOKER}, false)) AS secured "
            "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p', 'v', 'm') "
            "AND NOT c.relispartition"
        )
        roles = await connection.fetch(
            "SELECT rolname, rolbypassrls FROM pg_roles WHERE rolname = ANY($1::text[])",
            [names.writer, names.tenants],
        )
    finally:
        await connection.close()
    bypass = {str(row["rolname"]): bool(row["rolbypassrls"]) for row in roles}
    return SchemaState(
        relations=frozenset(str(row["relname"]) for row in rows),
        secured=frozenset(str(row["relname"]) for row in rows if row["secured"]),
        tenants=names.tenants in bypass,
        writer_bypasses_rls=bypass.get(names.writer, False),
    )


async def missing_roles(url: str, names: RoleNames) -> list[str]:
    """Which of the three roles the server does not have."""
    import asyncpg

    from mdq.store.engine import asyncpg_dsn

    connection = await asyncpg.connect(asyncpg_dsn(url))
    try:
        rows = await connection.fetch(
            "SELECT rolname FROM pg_roles WHERE rolname = ANY($1::text[])", list(names.all())
        )
    finally:
        await connection.close()
    present = {str(row["rolname"]) for row in rows}
    return [name for name in names.all() if name not in present]


async def grant(owner_url: str, names: RoleNames) -> None:
    """Give the writer, the reader and the tenants exactly their privileges and row policies
    (as the owner). Without the tenants' group (roles made by hand), tenants get nothing."""
    missing = await missing_roles(owner_url, names)
    if missing:
        raise RoleError(
            f"roles {', '.join(missing)} do not exist: run the setup with an administrator's "
            "URL (MDQ_PG_ADMIN_URL), or create them (docs/security.md, PostgreSQL roles)"
        )
    state = await schema_state(owner_url, names)
    if state.secured & set(TENANT_ROWS) and not state.writer_bypasses_rls:
        raise RoleError(
            f"{names.writer} needs BYPASSRLS (ALTER ROLE {names.writer} BYPASSRLS, as a "
            "superuser): the history tables are under row security, and PostgreSQL refuses "
            "the projector's COPY into them for a role it applies to"
        )
    await _run_in_transaction(
        owner_url,
        grant_statements(names, state.relations, secured=state.secured, tenants=state.tenants),
    )


@dataclass(frozen=True, slots=True)
class RoleUrls:
    """Where each role connects: the same server and database, its own user and password."""

    owner: str
    writer: str
    reader: str


def role_urls(base_url: str, names: RoleNames, passwords: RolePasswords) -> RoleUrls:
    """The three roles' URLs on the server and database of ``base_url``."""
    return RoleUrls(
        owner=role_url(base_url, user=names.owner, password=passwords.owner),
        writer=role_url(base_url, user=names.writer, password=passwords.writer),
        reader=role_url(base_url, user=names.reader, password=passwords.reader),
    )


async def setup_database_async(
    *, admin_url: str | None, owner_url: str, names: RoleNames, passwords: RolePasswords | None
) -> None:
    """Provision (when an administrator's URL is given), migrate as the owner, grant."""
    from mdq.store.migrate import upgrade_async

    if admin_url is not None:
        if passwords is None:
            raise RoleError("provisioning the roles needs their passwords")
        await provision(admin_url, names, passwords)
    await upgrade_async(owner_url)
    await grant(owner_url, names)


async def set_up_new_roles(admin_url: str, prefix: str) -> RoleUrls:
    """Roles named from ``prefix``, with new passwords, on the database of ``admin_url`` (the
    administrator's), set up as every deployment sets them up (``setup_database_async``); each
    role's URL."""
    names = RoleNames.with_prefix(prefix)
    passwords = RolePasswords.generate()
    urls = role_urls(admin_url, names, passwords)
    await setup_database_async(
        admin_url=admin_url, owner_url=urls.owner, names=names, passwords=passwords
    )
    return urls


def setup_database(
    *, admin_url: str | None, owner_url: str, names: RoleNames, passwords: RolePasswords | None
) -> None:
    """``setup_database_async`` for synchronous callers (no running event loop)."""
    asyncio.run(
        setup_database_async(
            admin_url=admin_url, owner_url=owner_url, names=names, passwords=passwords
        )
    )


# -- the deployments' entry point ---------------------------------------------------------------
ENV_ADMIN_URL = "MDQ_PG_ADMIN_URL"
ENV_ADMIN_PASSWORD = "MDQ_PG_ADMIN_PASSWORD"
ENV_PASSWORDS = ("MDQ_PG_OWNER_PASSWORD", "MDQ_PG_WRITER_PASSWORD", "MDQ_PG_READER_PASSWORD")
ENV_PREFIX = "MDQ_DB_ROLE_PREFIX"


def settings_from_env(
    env: dict[str, str],
) -> tuple[str | None, str, RoleNames, RolePasswords | None]:
    """``(admin_url, owner_url, names, passwords)`` from the environment of compose's
    ``migrate`` and the ``mdq-migrate`` Job:

    * ``MDQ_PG_ADMIN_URL`` (+ ``MDQ_PG_ADMIN_PASSWORD``): the administrator; when given, the
      roles are provisioned with ``MDQ_PG_OWNER_PASSWORD`` / ``_WRITER_`` / ``_READER_`` and the
      owner connects to the same server and database;
    * otherwise ``DATABASE_URL`` is the owner's URL (+ ``MDQ_PG_OWNER_PASSWORD``) and the roles
      must exist (made by the operator).
    """
    names = RoleNames.with_prefix(env.get(ENV_PREFIX) or DEFAULT_PREFIX)
    given = [env.get(name, "") for name in ENV_PASSWORDS]
    if admin := env.get(ENV_ADMIN_URL, ""):
        if admin_password := env.get(ENV_ADMIN_PASSWORD, ""):
            admin = role_url(admin, user=url_user(admin), password=admin_password)
        missing = [name for name, value in zip(ENV_PASSWORDS, given, strict=True) if not value]
        if missing:
            raise RoleError(f"{', '.join(missing)} not set (make compose-secrets)")
        passwords = RolePasswords(*given)
        return admin, role_url(admin, user=names.owner, password=passwords.owner), names, passwords
    owner = env.get("DATABASE_URL", "")
    if not owner:
        raise RoleError(f"set {ENV_ADMIN_URL} (to provision the roles) or DATABASE_URL (owner)")
    if given[0]:
        owner = role_url(owner, user=url_user(owner) or names.owner, password=given[0])
    return None, owner, names, None


ENV_FILE_KEYS = ("POSTGRES_PASSWORD", *ENV_PASSWORDS)
"""What ``write_env_file`` generates: the bundled PostgreSQL's superuser (the official image's
``POSTGRES_PASSWORD``) and the three roles'."""


def write_env_file(path: Path) -> list[str]:
    """Add a strong random password for each of ``ENV_FILE_KEYS`` that ``path`` (a
    ``KEY=value`` file: compose's ``.env``, the dev overlay's ``postgres.env``) lacks, keeping
    every line it has; the file is (made) mode 0600. Returns the keys added."""
    lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
    present = {line.split("=", 1)[0].strip() for line in lines if "=" in line}
    added = [key for key in ENV_FILE_KEYS if key not in present]
    lines += [f"{key}={secrets.token_urlsafe(PASSWORD_BYTES)}" for key in added]
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    os.fchmod(descriptor, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as file:
        file.truncate()
        file.write("\n".join(lines) + "\n")
    return added


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m mdq.store.roles``: provision (if an administrator is given), migrate, grant.
    ``python -m mdq.store.roles env-file PATH``: generate the passwords (``write_env_file``)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["env-file"] and len(args) == 2:
        added = write_env_file(Path(args[1]))
        print(f"{args[1]}: " + (f"added {', '.join(added)}" if added else "complete, unchanged"))
        return 0
    if args:
        print("usage: python -m mdq.store.roles [env-file PATH]", file=sys.stderr)
        return 2
    try:
        admin, owner, names, passwords = settings_from_env(dict(os.environ))
        setup_database(admin_url=admin, owner_url=owner, names=names, passwords=passwords)
    except RoleError as error:
        print(f"mdq.store.roles: {error}", file=sys.stderr)
        return 2
    print(f"migrated; roles {', '.join(names.all())} set up")
    return 0


if __name__ == "__main__":
    sys.exit(main())
