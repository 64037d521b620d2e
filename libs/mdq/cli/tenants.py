"""``mdq tenant add NAME``: a tenant's NATS identity, its own stream, and its policy.

A tenant submits on its own subjects and reads its own stream, nothing else
(``mdq.bus.permissions.tenant_permissions``). Adding one, as the operator:

1. mints the tenant's credentials with the deployment's trust chain (``mdq.auth``): the
   running stack's (``<state>/secrets/nats``) or a folder made by ``mdq credentials --out``
   (``--secrets``), into ``<secrets>/tenants/<name>.creds`` (0600), for the operator to hand
   to the tenant. No server restart: the server trusts what the account key signs;
2. creates the tenant's stream (``Subjects.tenant_stream``), which the server fills from the
   jobs and progress streams with the tenant's events only, connected as admin.

The tenant then uses mdq with ``MDQ_NATS_CREDS=<that file>`` (or ``--creds``): ``mdq submit``,
``mdq watch`` and the SDK find the tenant in the credentials.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from mdq.auth import CREDS_SUFFIX, TRUST_FILE, Trust, issue, nats_secrets_dir
from mdq.bus.connect import connect
from mdq.bus.permissions import tenant_permissions
from mdq.bus.streams import ensure_tenant_stream
from mdq.bus.subjects import Subjects
from mdq.cli.context import GlobalOptions, NoEndpoint, resolve_endpoints
from mdq.core.tenants import TenantNameError, validate_tenant_name

TENANTS_DIR = "tenants"
"""Where, in a secrets folder, the tenants' credentials are written."""

console = Console()
err_console = Console(stderr=True)
app = typer.Typer(help="Tenants: who may submit, and read their own jobs only.")


@dataclass(frozen=True, slots=True)
class AddedTenant:
    """What ``add_tenant`` made."""

    tenant: str
    creds: Path
    stream: str


def tenant_creds_path(secrets: Path, tenant: str) -> Path:
    """Where the credentials of ``tenant`` are kept in a secrets folder."""
    return secrets / TENANTS_DIR / f"{tenant}{CREDS_SUFFIX}"


async def add_tenant(
    tenant: str,
    *,
    secrets: Path,
    nats_url: str,
    namespace: str,
    admin_creds: Path | str | None,
    replicas: int = 1,
) -> AddedTenant:
    """Mint ``tenant``'s credentials from the trust chain in ``secrets`` and create its stream
    (connected with ``admin_creds``). Idempotent: run again, it mints fresh credentials (the
    old ones stay valid) and leaves the stream as it is."""
    validate_tenant_name(tenant)
    if not (secrets / TRUST_FILE).exists():
        raise FileNotFoundError(
            f"no NATS trust chain in {secrets} (made by `mdq up` or `mdq credentials --out`)"
        )
    subjects = Subjects(namespace)
    trust = Trust.load_or_create(secrets, namespace)
    path = tenant_creds_path(secrets, tenant)
    path.parent.mkdir(mode=0o700, exist_ok=True)
    issue(trust, tenant_permissions(subjects, tenant), path)
    client = await connect(nats_url, name="mdq-tenant-add", creds=admin_creds or None)
    try:
        await ensure_tenant_stream(client.jetstream(), subjects, tenant, replicas=replicas)
    finally:
        await client.close()
    return AddedTenant(tenant, path, subjects.tenant_stream(tenant))


@app.command("add")
def add(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="The tenant (lowercase letters, digits, '-').")],
    secrets: Annotated[
        Path | None,
        typer.Option(
            "--secrets",
            help="Folder of the deployment's NATS material (default: the running stack's).",
        ),
    ] = None,
) -> None:
    """Add a tenant: its credentials (<secrets>/tenants/NAME.creds) and its own stream."""
    options = ctx.obj
    if not isinstance(options, GlobalOptions):
        raise typer.BadParameter("internal: global options missing")
    try:
        validate_tenant_name(name)
        endpoints = resolve_endpoints(options)
    except (TenantNameError, NoEndpoint) as error:
        err_console.print(f"[red]{error}[/]")
        raise typer.Exit(2) from None
    folder = secrets or nats_secrets_dir(options.state_dir)
    admin = endpoints.nats_admin_creds or str(folder / f"admin{CREDS_SUFFIX}")
    try:
        added = asyncio.run(
            add_tenant(
                name,
                secrets=folder,
                nats_url=endpoints.nats_url,
                namespace=endpoints.namespace,
                admin_creds=admin,
            )
        )
    except FileNotFoundError as error:
        err_console.print(f"[red]{error}[/]")
        raise typer.Exit(2) from None
    console.print(f"tenant {added.tenant}: credentials {added.creds}, stream {added.stream}")
    console.print(f"  use: MDQ_NATS_CREDS={added.creds} mdq submit FILE", highlight=False)
