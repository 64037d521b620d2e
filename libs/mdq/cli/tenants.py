"""``mdq tenant add | rm | ls``: a tenant's NATS identity, its streams, its policy, its login.

``add`` mints the tenant's credentials with the deployment's trust chain (``mdq.auth``),
creates its streams and inputs bucket as admin, stores its policy in the tenants bucket and
makes its PostgreSQL login (``mdq.store.roles``); ``rm`` revokes every key it was given and
deletes what ``add`` made but its inputs bucket. Each step, and what the tenant then runs:
docs/security.md, "Adding a tenant", "Removing a tenant" and "Tenants in PostgreSQL".
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from nats.js.errors import KeyNotFoundError
from rich.console import Console

from mdq.auth import (
    CREDS_SUFFIX,
    TRUST_FILE,
    Trust,
    identity_creds_path,
    issue_recorded,
    nats_secrets_dir,
    revoke_identity,
)
from mdq.bus.connect import connect
from mdq.bus.inputs import ensure_inputs_bucket
from mdq.bus.kv import bucket_keys
from mdq.bus.permissions import tenant_identity, tenant_permissions
from mdq.bus.storage import StorageSettings
from mdq.bus.streams import ensure_tenant_stream, remove_tenant_streams
from mdq.bus.subjects import Subjects
from mdq.bus.tenants import ensure_tenants_bucket, put_policy, remove_policy
from mdq.cli.context import Endpoints, GlobalOptions, resolve_endpoints
from mdq.core.tenants import (
    DEFAULT_POLICY,
    TenantNameError,
    TenantPolicy,
    validate_tenant_name,
)
from mdq.errors import Unavailable
from mdq.stack import StackInfo, reload_embedded_nats
from mdq.store.roles import (
    DEFAULT_PREFIX,
    ENV_ADMIN_PASSWORD,
    ENV_ADMIN_URL,
    ENV_PREFIX,
    RoleNames,
    drop_tenant,
    provision_tenant,
    role_url,
    url_user,
)
from mdq.store.stack_database import (
    ADMIN_FILE,
    EMBEDDED_SUPERUSER,
    POSTGRES_SECRETS,
    SECRETS_DIR,
    load_or_create_tenant_password,
    tenant_password_file,
)

# soft_wrap: a path or a command is printed whole on its line, never broken for the
# terminal's width (it is there to be copied)
console = Console(soft_wrap=True)
err_console = Console(stderr=True, soft_wrap=True)
app = typer.Typer(help="Tenants: who may submit, and read their own jobs only.")
Done = TypeVar("Done")


@dataclass(frozen=True, slots=True)
class AddedTenant:
    """What ``add_tenant`` made."""

    tenant: str
    creds: Path
    stream: str


def tenant_creds_path(secrets: Path, tenant: str) -> Path:
    """Where the credentials of ``tenant`` are kept in a secrets folder."""
    return identity_creds_path(secrets, tenant_identity(tenant))


async def add_tenant(
    tenant: str,
    *,
    secrets: Path,
    nats_url: str,
    namespace: str,
    admin_creds: Path | str | None,
    policy: TenantPolicy = DEFAULT_POLICY,
    replicas: int = 1,
) -> AddedTenant:
    """Mint ``tenant``'s credentials from the trust chain in ``secrets``, create its stream
    and store its ``policy`` (connected with ``admin_creds``). Run again, it mints fresh
    credentials (the old ones stay valid), leaves the stream and replaces the policy."""
    validate_tenant_name(tenant)
    if not (secrets / TRUST_FILE).exists():
        raise FileNotFoundError(
            f"no NATS trust chain in {secrets} (made by `mdq up` or `mdq credentials --out`)"
        )
    subjects = Subjects(namespace)
    trust = Trust.load_or_create(secrets, namespace)
    path = issue_recorded(trust, tenant_permissions(subjects, tenant), secrets)
    client = await connect(nats_url, name="mdq-tenant-add", creds=admin_creds or None)
    try:
        js = client.jetstream()
        await ensure_tenant_stream(js, subjects, tenant, replicas=replicas)
        await ensure_inputs_bucket(
            js,
            subjects,
            tenant,
            max_bytes=int(StorageSettings().tenant_inputs_bytes),
            replicas=replicas,
        )
        await ensure_tenants_bucket(js, subjects, replicas=replicas)
        await put_policy(js, subjects, tenant, policy)
    finally:
        await client.close()
    return AddedTenant(tenant, path, subjects.tenant_stream(tenant))


@dataclass(frozen=True, slots=True)
class RemovedTenant:
    """What ``remove_tenant`` did."""

    tenant: str
    revoked_keys: tuple[str, ...]
    """Every key ever issued to the tenant, now on the revocation list."""
    server_block: Path
    """The server's block with the revocations: applied when the server reloads it."""
    stream_deleted: bool
    policy_deleted: bool


async def remove_tenant(
    tenant: str,
    *,
    secrets: Path,
    nats_url: str,
    namespace: str,
    admin_creds: Path | str | None,
) -> RemovedTenant:
    """Take ``tenant`` off the bus: revoke every credentials file ever issued to it (and
    delete the current one), then delete its stream and its policy (connected with
    ``admin_creds``). Its accepted jobs go on; its history stays in PostgreSQL. Run again, it
    finds nothing more to do."""
    validate_tenant_name(tenant)
    if not (secrets / TRUST_FILE).exists():
        raise FileNotFoundError(
            f"no NATS trust chain in {secrets} (made by `mdq up` or `mdq credentials --out`)"
        )
    subjects = Subjects(namespace)
    revoked = revoke_identity(secrets, tenant_identity(tenant), namespace)
    client = await connect(nats_url, name="mdq-tenant-rm", creds=admin_creds or None)
    try:
        js = client.jetstream()
        stream_deleted = await remove_tenant_streams(js, subjects, tenant)
        kv = await ensure_tenants_bucket(js, subjects)
        try:
            await kv.get(tenant)
        except KeyNotFoundError:
            policy_deleted = False
        else:
            await remove_policy(js, subjects, tenant)
            policy_deleted = True
    finally:
        await client.close()
    return RemovedTenant(
        tenant, revoked.revoked_keys, revoked.server_block, stream_deleted, policy_deleted
    )


# -- the tenant's PostgreSQL login ---------------------------------------------------------------
class NoDatabaseAdmin(Unavailable, RuntimeError):
    """Nothing says how to reach the database as an administrator (the reason is the text)."""


@dataclass(frozen=True, slots=True)
class DatabaseAdmin:
    """How ``mdq tenant add`` reaches the database to make a tenant's login."""

    url: str
    """An administrator's URL, password included (never printed)."""
    names: RoleNames


@dataclass(frozen=True, slots=True)
class TenantDatabase:
    """The tenant's PostgreSQL login that ``add_tenant_database`` made."""

    role: str
    url: str
    """The URL to hand over: the server and database, the tenant's user, no password."""
    password_file: Path


def role_names_for(stack: StackInfo | None, env: dict[str, str]) -> RoleNames:
    """The installation's role names: ``MDQ_DB_ROLE_PREFIX``, else the prefix of the running
    stack's reader (``<prefix>_reader``), else ``mdq``."""
    if prefix := env.get(ENV_PREFIX, ""):
        return RoleNames.with_prefix(prefix)
    reader = url_user(stack.database_url) if stack and stack.database_url else ""
    if reader.endswith("_reader"):
        return RoleNames.with_prefix(reader.removesuffix("_reader"))
    return RoleNames.with_prefix(DEFAULT_PREFIX)


def database_admin(
    stack: StackInfo | None, state_dir: Path, admin_url: str | None, env: dict[str, str]
) -> DatabaseAdmin:
    """The administrator's URL: ``admin_url`` (``--database-admin-url`` / ``MDQ_PG_ADMIN_URL``,
    its password from ``MDQ_PG_ADMIN_PASSWORD`` when given), else the running stack's embedded
    superuser (``<state>/secrets/postgres/admin.password``). Raises ``NoDatabaseAdmin``."""
    names = role_names_for(stack, env)
    if admin_url:
        if password := env.get(ENV_ADMIN_PASSWORD, ""):
            admin_url = role_url(admin_url, user=url_user(admin_url), password=password)
        return DatabaseAdmin(admin_url, names)
    if stack is None or not stack.database_url:
        raise NoDatabaseAdmin(
            f"no running stack in {state_dir} and no {ENV_ADMIN_URL}: no PostgreSQL login was made"
        )
    if not stack.embedded_postgres:
        raise NoDatabaseAdmin(
            "the stack's PostgreSQL is one it was given (DATABASE_URL), whose administrator it "
            f"does not keep: set {ENV_ADMIN_URL} (and {ENV_ADMIN_PASSWORD}) to make the login"
        )
    password_file = state_dir / SECRETS_DIR / POSTGRES_SECRETS / ADMIN_FILE
    try:
        password = password_file.read_text(encoding="utf-8").strip()
    except OSError as error:
        raise NoDatabaseAdmin(f"cannot read the embedded superuser's password: {error}") from None
    return DatabaseAdmin(
        role_url(stack.database_url, user=EMBEDDED_SUPERUSER, password=password), names
    )


async def add_tenant_database(
    tenant: str, *, admin: DatabaseAdmin, state_dir: Path
) -> TenantDatabase:
    """Make (or update) ``tenant``'s PostgreSQL login with the password kept under
    ``state_dir`` (made the first time)."""
    validate_tenant_name(tenant)
    names = admin.names
    names.tenant(tenant)  # a name too long for PostgreSQL: refused before a file is made
    path, password = load_or_create_tenant_password(state_dir, tenant)
    role = await provision_tenant(admin.url, names, tenant, password)
    url = role_url(admin.url, user=role, password=None)
    return TenantDatabase(role=role, url=url, password_file=path)


def _database_admin_or_say(
    endpoints: Endpoints, state_dir: Path, admin_url: str | None
) -> DatabaseAdmin | None:
    """The database's administrator for ``add`` and ``rm``; None, said on the console, when
    nothing says how to reach one (not an error: the NATS part stands alone)."""
    try:
        return database_admin(endpoints.stack, state_dir, admin_url, dict(os.environ))
    except NoDatabaseAdmin as error:
        console.print(f"  [yellow]PostgreSQL: {error}[/]")
        return None


def _run_as_admin(work: Coroutine[Any, Any, Done]) -> Done:
    """Run ``add``'s or ``rm``'s NATS part; a folder without a trust chain exits with 2."""
    try:
        return asyncio.run(work)
    except FileNotFoundError as error:
        err_console.print(f"[red]{error}[/]")
        raise typer.Exit(2) from None


def _admin_creds(endpoints: Endpoints, secrets: Path) -> str:
    """The admin's credentials: as the endpoints say, else the secrets folder's."""
    return endpoints.nats_admin_creds or str(secrets / f"admin{CREDS_SUFFIX}")


def _database_step(name: str, endpoints: Endpoints, state_dir: Path, admin_url: str | None) -> bool:
    """Step 4 of ``add``, reported on the console; False when the database could not do it."""
    if (admin := _database_admin_or_say(endpoints, state_dir, admin_url)) is None:
        return True
    try:
        made = asyncio.run(add_tenant_database(name, admin=admin, state_dir=state_dir))
    except Exception as error:  # reported: the NATS part is done, and add may run again
        err_console.print(
            f"[red]PostgreSQL: no login made for {name} ({type(error).__name__}: {error}); "
            "the NATS part is done, run `mdq tenant add` again once the database answers[/]"
        )
        return False
    console.print(
        f"  PostgreSQL: role {made.role}, password in {made.password_file}", highlight=False
    )
    console.print(
        f'  history: DATABASE_URL={made.url} PGPASSWORD="$(cat {made.password_file})" mdq ls',
        highlight=False,
    )
    return True


def _limit(value: float | None) -> int:
    """A default limit as the command line writes it (-1: unlimited)."""
    return -1 if value is None else int(value)


SecretsFolder = Annotated[
    Path | None,
    typer.Option(
        "--secrets",
        help="Folder of the deployment's NATS material (default: the running stack's).",
    ),
]
DatabaseAdminUrl = Annotated[
    str | None,
    typer.Option(
        "--database-admin-url",
        envvar=ENV_ADMIN_URL,
        help="PostgreSQL administrator (CREATEROLE) that makes or drops the tenant's login "
        f"(password: {ENV_ADMIN_PASSWORD}; default: the running stack's embedded server).",
    ),
]


@app.command("add")
def add(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="The tenant (lowercase letters, digits, '-').")],
    secrets: SecretsFolder = None,
    allow_high: Annotated[
        bool, typer.Option("--allow-high", help="May submit in the high class (it preempts).")
    ] = False,
    max_queued_jobs: Annotated[
        int, typer.Option(help="Jobs waiting at most (-1: unlimited).")
    ] = _limit(DEFAULT_POLICY.max_queued_jobs),
    max_running_cpu: Annotated[
        float, typer.Option(help="Cores running at once at most (-1: unlimited).")
    ] = _limit(DEFAULT_POLICY.max_running_cpu),
    submits_per_minute: Annotated[
        float, typer.Option(help="Submit rate (-1: unlimited).")
    ] = _limit(DEFAULT_POLICY.submits_per_minute),
    weight: Annotated[
        float,
        typer.Option(help="Fair-share weight: twice the weight, twice the share when full."),
    ] = DEFAULT_POLICY.weight,
    guaranteed_share: Annotated[
        float,
        typer.Option(
            help="Share of the cluster (0 to 1) it is due whatever the weights (0: none)."
        ),
    ] = 0.0,
    max_share: Annotated[
        float, typer.Option(help="Most of the cluster (0 to 1) it may hold at once (-1: no cap).")
    ] = -1.0,
    max_steps_per_job: Annotated[
        int, typer.Option(help="A job's step target at most (0: the operator's default).")
    ] = 0,
    max_wall_s: Annotated[
        float, typer.Option(help="Seconds a job may run (0: the operator's default).")
    ] = 0.0,
    max_disk_mb: Annotated[
        int, typer.Option(help="MiB a job's folder may hold (0: the operator's default).")
    ] = 0,
    database_admin_url: DatabaseAdminUrl = None,
) -> None:
    """Add a tenant (or change its limits): its credentials (<secrets>/tenants/NAME.creds),
    its own stream, its policy and its PostgreSQL login (history of its own jobs only)."""
    endpoints = _endpoints_of(ctx)
    options = _options_of(ctx)
    try:
        validate_tenant_name(name)
        policy = TenantPolicy(
            allow_high=allow_high,
            max_queued_jobs=None if max_queued_jobs < 0 else max_queued_jobs,
            max_running_cpu=None if max_running_cpu < 0 else max_running_cpu,
            submits_per_minute=None if submits_per_minute < 0 else submits_per_minute,
            weight=weight,
            guaranteed_share=guaranteed_share or None,
            max_share=None if max_share < 0 else max_share,
            max_steps_per_job=max_steps_per_job or None,
            max_wall_s=max_wall_s or None,
            max_disk_mb=max_disk_mb or None,
        )
    except (TenantNameError, ValueError) as error:
        err_console.print(f"[red]{error}[/]")
        raise typer.Exit(2) from None
    folder = secrets or nats_secrets_dir(options.state_dir)
    added = _run_as_admin(
        add_tenant(
            name,
            secrets=folder,
            nats_url=endpoints.nats_url,
            namespace=endpoints.namespace,
            admin_creds=_admin_creds(endpoints, folder),
            policy=policy,
        )
    )
    console.print(f"tenant {added.tenant}: credentials {added.creds}, stream {added.stream}")
    console.print(f"  policy: {policy.to_json().decode()}", highlight=False)
    console.print(f"  use: MDQ_NATS_CREDS={added.creds} mdq submit FILE", highlight=False)
    if not _database_step(name, endpoints, options.state_dir, database_admin_url):
        raise typer.Exit(1)


def _database_removal(
    name: str, endpoints: Endpoints, state_dir: Path, admin_url: str | None
) -> bool:
    """The PostgreSQL part of ``rm``, reported on the console; False when it failed."""
    if (admin := _database_admin_or_say(endpoints, state_dir, admin_url)) is None:
        return True
    try:
        role = asyncio.run(drop_tenant(admin.url, admin.names, name))
    except Exception as error:  # reported: the NATS part is done, and rm may run again
        err_console.print(
            f"[red]PostgreSQL: the login of {name} was not dropped ({type(error).__name__}: "
            f"{error}); the NATS part is done, run `mdq tenant rm` again once the database "
            "answers[/]"
        )
        return False
    tenant_password_file(state_dir, name).unlink(missing_ok=True)
    console.print(f"  PostgreSQL: role {role} dropped (its jobs' history stays)", highlight=False)
    return True


@app.command("rm")
def remove(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="The tenant to remove.")],
    secrets: SecretsFolder = None,
    database_admin_url: DatabaseAdminUrl = None,
) -> None:
    """Remove a tenant: revoke every credentials file it was given, delete its stream, its
    policy and its PostgreSQL login. Jobs it submitted go on; their history stays."""
    endpoints = _endpoints_of(ctx)
    options = _options_of(ctx)
    validate_tenant_name(name)
    stack_secrets = nats_secrets_dir(options.state_dir)
    folder = secrets or stack_secrets
    removed = _run_as_admin(
        remove_tenant(
            name,
            secrets=folder,
            nats_url=endpoints.nats_url,
            namespace=endpoints.namespace,
            admin_creds=_admin_creds(endpoints, folder),
        )
    )
    keys = len(removed.revoked_keys)
    console.print(
        f"tenant {name}: {keys} key(s) revoked, stream "
        f"{'deleted' if removed.stream_deleted else 'already gone'}, policy "
        f"{'deleted' if removed.policy_deleted else 'already gone'}",
        highlight=False,
    )
    if (
        keys
        and folder.resolve() == stack_secrets.resolve()
        and reload_embedded_nats(options.state_dir)
    ):
        console.print("  the stack's NATS reloaded: its credentials no longer connect")
    elif keys:
        console.print(
            f"  its credentials stop working once the server reloads {removed.server_block}: "
            "`nats-server --signal reload`, a rollout of the NATS pods, or restarting `mdq up`",
            highlight=False,
        )
    if not _database_removal(name, endpoints, options.state_dir, database_admin_url):
        raise typer.Exit(1)


@app.command("ls")
def list_tenants(ctx: typer.Context) -> None:
    """Every tenant's policy (from the tenants bucket; the admin's credentials)."""
    endpoints = _endpoints_of(ctx)
    admin = endpoints.nats_admin_creds or endpoints.nats_creds

    async def read() -> dict[str, TenantPolicy]:
        client = await connect(endpoints.nats_url, name="mdq-tenant-ls", creds=admin or None)
        try:
            kv = await ensure_tenants_bucket(client.jetstream(), Subjects(endpoints.namespace))
            found: dict[str, TenantPolicy] = {}
            for key in await bucket_keys(kv):
                entry = await kv.get(key)
                found[key] = TenantPolicy.from_json(entry.value or b"")
            return found
        finally:
            await client.close()

    for tenant, policy in sorted(asyncio.run(read()).items()):
        typer.echo(f"{tenant}  {policy.to_json().decode()}")  # one line each, for scripts


def _options_of(ctx: typer.Context) -> GlobalOptions:
    options = ctx.obj
    if not isinstance(options, GlobalOptions):
        raise typer.BadParameter("internal: global options missing")
    return options


def _endpoints_of(ctx: typer.Context) -> Endpoints:
    return resolve_endpoints(_options_of(ctx))
