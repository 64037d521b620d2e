"""A tenant, end to end: its NATS identity (credentials minted from the deployment's trust
chain, revoked on removal), its streams and inputs bucket, its policy in the tenants bucket, and
its PostgreSQL login. ``mdq tenant add | rm | ls`` (``mdq.cli.tenants``) calls these and prints
what they did; each step, and what the tenant then runs: docs/security.md, "Adding a tenant",
"Removing a tenant" and "Tenants in PostgreSQL".
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from nats.js.errors import KeyNotFoundError

from mdq.bus.connect import connect
from mdq.bus.inputs import ensure_inputs_bucket
from mdq.bus.kv import bucket_keys
from mdq.bus.security.auth import (
    TRUST_FILE,
    Trust,
    identity_creds_path,
    issue_recorded,
    revoke_identity,
)
from mdq.bus.security.permissions import tenant_identity, tenant_permissions
from mdq.bus.storage import StorageSettings
from mdq.bus.streams import ensure_tenant_stream, remove_tenant_streams
from mdq.bus.subjects import Subjects
from mdq.bus.tenants import ensure_tenants_bucket, put_policy, remove_policy
from mdq.core.tenants import DEFAULT_POLICY, TenantPolicy, validate_tenant_name
from mdq.errors import Unavailable
from mdq.stack import StackInfo
from mdq.store.roles import (
    DEFAULT_PREFIX,
    ENV_ADMIN_PASSWORD,
    ENV_ADMIN_URL,
    ENV_PREFIX,
    RoleNames,
    drop_tenant,
    provision_tenant,
    role_url,
    tenant_role_exists,
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


# -- on the bus ------------------------------------------------------------------------------
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


async def tenant_policies(
    nats_url: str, namespace: str, admin_creds: Path | str | None
) -> dict[str, TenantPolicy]:
    """Every tenant's policy, from the tenants bucket (connected with ``admin_creds``)."""
    client = await connect(nats_url, name="mdq-tenant-ls", creds=admin_creds or None)
    try:
        kv = await ensure_tenants_bucket(client.jetstream(), Subjects(namespace))
        found: dict[str, TenantPolicy] = {}
        for key in await bucket_keys(kv):
            entry = await kv.get(key)
            found[key] = TenantPolicy.from_json(entry.value or b"")
        return found
    finally:
        await client.close()


# -- in PostgreSQL ---------------------------------------------------------------------------
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


async def remove_tenant_database(
    tenant: str, *, admin: DatabaseAdmin, state_dir: Path
) -> str | None:
    """Drop ``tenant``'s PostgreSQL login (its jobs' history stays) and the password file kept
    for it under ``state_dir``; the role's name, or None when there was no such login."""
    existed = await tenant_role_exists(admin.url, admin.names, tenant)
    role = await drop_tenant(admin.url, admin.names, tenant)
    tenant_password_file(state_dir, tenant).unlink(missing_ok=True)
    return role if existed else None
