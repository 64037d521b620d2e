"""``mdq tenant add | rm | ls``: the commands over ``mdq.tenancy``, which owns a tenant (its
NATS identity, streams, policy and PostgreSQL login); here are the options, what is printed and
the exit codes. docs/security.md, "Adding a tenant" and "Removing a tenant".
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Coroutine
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console

from mdq.bus.security.auth import CREDS_SUFFIX, nats_secrets_dir
from mdq.cli.context import Endpoints, GlobalOptions, resolve_endpoints
from mdq.core.tenants import (
    DEFAULT_POLICY,
    TenantNameError,
    TenantPolicy,
    validate_tenant_name,
)
from mdq.errors import NotFound
from mdq.stack import reload_embedded_nats
from mdq.store.roles import ENV_ADMIN_PASSWORD, ENV_ADMIN_URL
from mdq.tenancy import (
    DatabaseAdmin,
    NoDatabaseAdmin,
    add_tenant,
    add_tenant_database,
    database_admin,
    remove_tenant,
    remove_tenant_database,
    tenant_policies,
)

# soft_wrap: a path or a command is printed whole on its line, never broken for the
# terminal's width (it is there to be copied)
console = Console(soft_wrap=True)
err_console = Console(stderr=True, soft_wrap=True)
app = typer.Typer(help="Tenants: who may submit, and read their own jobs only.")
Done = TypeVar("Done")


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
) -> bool | None:
    """The PostgreSQL part of ``rm``, reported on the console: True when a login was dropped,
    None when there was none (or no administrator to ask), False when it failed."""
    if (admin := _database_admin_or_say(endpoints, state_dir, admin_url)) is None:
        return None
    try:
        role = asyncio.run(remove_tenant_database(name, admin=admin, state_dir=state_dir))
    except Exception as error:  # reported: the NATS part is done, and rm may run again
        err_console.print(
            f"[red]PostgreSQL: the login of {name} was not dropped ({type(error).__name__}: "
            f"{error}); the NATS part is done, run `mdq tenant rm` again once the database "
            "answers[/]"
        )
        return False
    if role is None:
        console.print(f"  PostgreSQL: no login of {name}", highlight=False)
        return None
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
    database = _database_removal(name, endpoints, options.state_dir, database_admin_url)
    if database is False:
        raise typer.Exit(1)
    if database is None and not (keys or removed.stream_deleted or removed.policy_deleted):
        err_console.print(f"no tenant {name}: nothing to remove", highlight=False)
        raise typer.Exit(NotFound.exit_code)


@app.command("ls")
def list_tenants(ctx: typer.Context) -> None:
    """Every tenant's policy (from the tenants bucket; the admin's credentials)."""
    endpoints = _endpoints_of(ctx)
    admin = endpoints.nats_admin_creds or endpoints.nats_creds
    policies = asyncio.run(tenant_policies(endpoints.nats_url, endpoints.namespace, admin))
    for tenant, policy in sorted(policies.items()):
        typer.echo(f"{tenant}  {policy.to_json().decode()}")  # one line each, for scripts


def _options_of(ctx: typer.Context) -> GlobalOptions:
    options = ctx.obj
    if not isinstance(options, GlobalOptions):
        raise typer.BadParameter("internal: global options missing")
    return options


def _endpoints_of(ctx: typer.Context) -> Endpoints:
    return resolve_endpoints(_options_of(ctx))
