"""The ``mdq`` command (typer + rich).

Stack commands start everything on this machine (``mdq up``, ``status``, ``demo``); client
commands talk to a running mdq, or to the stack a running ``mdq up`` recorded (``submit``,
``watch``, ``ls``, ``show``, ``nodes``, ...); job control is ``mdq.cli.control``, tenants
``mdq.cli.tenants``; ``mdq credentials`` writes a deployment's NATS credentials.

Every command and option: README.md, "The command line"; job control: docs/control.md;
credentials: docs/security.md, "Deployments: compose and Kubernetes".
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from pathlib import Path
from typing import Annotated, Any, NoReturn, TypeVar
from urllib.parse import urlencode

import typer
from rich.console import Console
from rich.markup import escape
from rich.panel import Panel

from mdq.bus.connect import CREDS_ENV
from mdq.bus.inputs import Uploaded
from mdq.bus.security.auth import (
    SECRETS_DIR,
    ensure_token_file,
    generate,
    nats_secrets_dir,
    rotate,
)
from mdq.cli import history
from mdq.cli import recommend as recommendations
from mdq.cli import status as stack_status
from mdq.cli.args import job_id_argument, job_ids_argument
from mdq.cli.context import (
    Endpoints,
    GlobalOptions,
    NoEndpoint,
    resolve_endpoints,
    user_name,
)
from mdq.cli.control import register as register_control
from mdq.cli.errors import Commands, exit_codes_text
from mdq.cli.explain import explain as explain_command
from mdq.cli.explain import waiting_entry
from mdq.cli.live import follow_jobs, format_eta
from mdq.cli.plot import plot as plot_command
from mdq.cli.queues import queues_table, tenant_usages
from mdq.cli.replay import replay as replay_command
from mdq.cli.simulate import simulate as simulate_command
from mdq.cli.tables import columns_table
from mdq.cli.tenants import app as tenants_app
from mdq.contracts import pb
from mdq.core.recommend import UsageHistory
from mdq.core.state import JobState, JobView
from mdq.errors import (
    EXIT_FAILED,
    EXIT_OK,
    InvalidInput,
    MdqError,
    NotFound,
    PermissionDenied,
    Unavailable,
)
from mdq.sdk.client import (
    MdqClient,
    tenant_of_creds,
)
from mdq.sdk.inputs import LocalInput, resolve_inputs
from mdq.sdk.jobfile import load_job_file
from mdq.stack import (
    BACKENDS,
    CONSOLE_TOKEN_FILE,
    Stack,
    StackInfo,
    read_stack_info,
    read_stack_status,
    reload_embedded_nats,
)

EXIT_UNAVAILABLE = Unavailable.exit_code

MAX_LISTED = 10_000
"""The most jobs ``mdq ls`` lists and ``mdq watch`` follows at once (a terminal's worth)."""

DEMO_FILE = Path("examples/demo.yaml")
DEMO_FILES = {"openmm": DEMO_FILE, "lammps": Path("examples/lammps/demo.yaml")}
"""The demo campaign of each engine (``mdq demo --engine``)."""
DEMO_TIMEOUT_S = 540.0

_WIDTH = None if sys.stdout.isatty() else 160
# soft_wrap: paths and commands are printed whole, never broken at the width (tables still fit)
console = Console(width=_WIDTH, soft_wrap=True)
err_console = Console(stderr=True, width=_WIDTH, soft_wrap=True)
app = typer.Typer(
    name="mdq",
    help="Schedule, watch and recover molecular-dynamics jobs on NATS + PostgreSQL.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    cls=Commands,
    epilog=exit_codes_text(),
)

T = TypeVar("T")


@app.callback()
def main(
    ctx: typer.Context,
    nats_url: Annotated[
        str | None,
        typer.Option("--nats-url", envvar="NATS_URL", help="NATS server with JetStream."),
    ] = None,
    database_url: Annotated[
        str | None,
        typer.Option("--database-url", envvar="DATABASE_URL", help="PostgreSQL URL."),
    ] = None,
    namespace: Annotated[
        str | None,
        typer.Option(
            "--namespace", envvar="MDQ_NAMESPACE", help="Subject/stream prefix (default mdq)."
        ),
    ] = None,
    state_dir: Annotated[
        Path,
        typer.Option(
            "--state-dir",
            envvar="MDQ_STATE_DIR",
            help="Folder of the local stack (servers' data, logs, stack.json).",
        ),
    ] = Path(".mdq"),
    creds: Annotated[
        Path | None,
        typer.Option(
            "--creds",
            envvar=CREDS_ENV,
            help="NATS credentials (a tenant's, say; default: the running stack's CLI identity).",
        ),
    ] = None,
) -> None:
    """Schedule, watch and recover molecular-dynamics jobs."""
    ctx.obj = GlobalOptions(
        nats_url=nats_url or None,
        database_url=database_url or None,
        namespace=namespace or None,
        state_dir=state_dir.resolve(),
        nats_creds=str(creds) if creds else None,
    )


def _options(ctx: typer.Context) -> GlobalOptions:
    options = ctx.obj
    if not isinstance(options, GlobalOptions):
        raise typer.BadParameter("internal: global options missing")
    return options


def _endpoints(ctx: typer.Context, *, need_nats: bool = True) -> Endpoints:
    return resolve_endpoints(_options(ctx), need_nats=need_nats)


def _run(coroutine: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coroutine)


async def _with_client(endpoints: Endpoints, work: Callable[[MdqClient], Awaitable[T]]) -> T:
    async with await MdqClient.connect(
        endpoints.nats_url, endpoints.namespace, name="mdq-cli", creds=endpoints.nats_creds
    ) as client:
        return await work(client)


def _exit_with(endpoints: Endpoints, work: Callable[[MdqClient], Awaitable[int]]) -> NoReturn:
    """Run ``work`` with a client and exit with its code (an ``MdqError`` with its own:
    ``mdq.cli.errors``)."""
    raise typer.Exit(_run(_with_client(endpoints, work)))


def _print_stack(info: StackInfo) -> None:
    lines = [
        f"NATS        {info.nats_url}" + ("  (embedded)" if info.embedded_nats else ""),
        *([f"credentials {info.nats_creds}  (MDQ_NATS_CREDS)"] if info.nats_creds else []),
        f"PostgreSQL  {info.database_url}" + ("  (embedded)" if info.embedded_postgres else ""),
        *([f"password    {info.database_password_file}"] if info.database_password_file else []),
        f"metrics     {info.metrics_url}  (Authorization: Bearer <the token in "
        f"{Path(info.state_dir) / SECRETS_DIR / CONSOLE_TOKEN_FILE}>)",
        *([f"console     {info.console_link()}"] if info.console_url else []),
        f"namespace   {info.namespace}",
        f"backend     {info.backend}",
        f"logs        {info.logs_dir}",
        f"job data    {info.data_dir}",
    ]
    console.print(Panel("\n".join(lines), title="mdq stack", expand=False))


def _database_url(endpoints: Endpoints, *, hint: str = "") -> str:
    """The PostgreSQL URL, or ``NoEndpoint`` saying why there is none (and ``hint``)."""
    try:
        return endpoints.require_database()
    except NoEndpoint as error:
        if not hint:
            raise
        raise NoEndpoint(f"{error} {hint}") from None


def _final_code(views: dict[str, JobView], job_ids: list[str]) -> int:
    ok = all(job in views and views[job].state is JobState.SUCCEEDED for job in job_ids)
    return EXIT_OK if ok else EXIT_FAILED


# -- stack commands ------------------------------------------------------------------------
@app.command()
def up(
    ctx: typer.Context,
    backend: Annotated[
        str, typer.Option(help=f"Execution backend: {', '.join(BACKENDS)}.")
    ] = "local",
    nodes: Annotated[
        int,
        typer.Option(
            min=1, max=64, help="Virtual nodes of the local backend (of each local cluster)."
        ),
    ] = 2,
    clusters: Annotated[
        int,
        typer.Option(
            min=0,
            max=8,
            help="Run this many local execution clusters (lab1, lab2, ..., labelled site=lab1, "
            "...), each with its own node agent; 0: one unnamed cluster.",
        ),
    ] = 0,
    kubeconfig: Annotated[
        str,
        typer.Option(
            envvar="MDQ_K8S_KUBECONFIG",
            help="kubeconfig of the cluster (kubernetes backend); default ~/.kube/config.",
        ),
    ] = "",
) -> None:
    """Start the stack and keep it running until Ctrl-C.

    Embedded NATS + PostgreSQL under the state folder unless NATS_URL / DATABASE_URL are set,
    and every service, supervised. With --backend kubernetes no local node agent runs: the
    services create, bind and watch pods on the cluster of the kubeconfig (MDQ_K8S_* settings).
    """
    options = _options(ctx)
    stack = Stack(
        state_dir=options.state_dir,
        namespace=options.namespace,
        backend=backend,
        nats_url=options.nats_url,
        database_url=options.database_url,
        local_nodes=nodes,
        clusters=clusters,
        extra_env={"MDQ_K8S_KUBECONFIG": str(Path(kubeconfig).resolve())} if kubeconfig else None,
    )

    async def serve() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        async with stack as running:
            _print_stack(running.info)
            console.print("mdq is up; press Ctrl-C to stop.")
            await stop.wait()
            console.print("stopping ...")

    _run(serve())


@app.command()
def status(ctx: typer.Context) -> None:
    """How the running stack is: every part (servers included) with pid, restarts, uptime and
    last exit, and whether NATS and PostgreSQL answer. Exit 0 when all is well, 1 when a part
    is down or a server does not answer, 3 when no stack runs on the state folder."""
    options = _options(ctx)
    info = read_stack_info(options.state_dir)
    found = read_stack_status(options.state_dir) if info is not None else None
    if info is None or found is None:
        err_console.print(f"[red]no running stack on {options.state_dir}[/] (start one: mdq up)")
        raise typer.Exit(EXIT_UNAVAILABLE)
    _updated_at, parts = found
    probes = _run(
        stack_status.probe_servers(
            info.nats_url,
            info.database_dsn(),
            creds=info.nats_creds,
            shown_database_url=info.database_url,
            password_file=info.database_password_file,
        )
    )
    stack_status.render(console, parts, probes, now=time.time())
    raise typer.Exit(EXIT_OK if stack_status.healthy(parts, probes) else EXIT_FAILED)


@app.command("console")
def console_command(ctx: typer.Context) -> None:
    """Print the running stack's web console link: its address with the access token (read
    from the state folder's secrets, so only the account that runs the stack can). Exit 3 when
    no stack with a console runs on the state folder."""
    info = read_stack_info(_options(ctx).state_dir)
    if info is None or not info.console_url:
        err_console.print("[red]no running stack with a console[/] (start one: mdq up)")
        raise typer.Exit(EXIT_UNAVAILABLE)
    try:
        link = info.console_link()
    except OSError as error:
        err_console.print(f"[red]cannot read the console's token[/]: {error}")
        raise typer.Exit(EXIT_UNAVAILABLE) from None
    console.print(link, soft_wrap=True)


@app.command("console-token")
def console_token(
    out: Annotated[
        Path, typer.Option("--out", help="The token file (kept when it already holds one).")
    ],
    group_readable: Annotated[
        bool,
        typer.Option(
            "--group-readable", help="0640 in a 0750 folder, for containers given your group."
        ),
    ] = False,
) -> None:
    """Make the web console's access token for a deployment that is not ``mdq up`` (compose:
    ``make compose-secrets``); the console reads it from MDQ_CONSOLE_ACCESS_TOKEN_FILE and its
    link is its address with ``?token=`` and the file's content."""
    ensure_token_file(out, group_readable=group_readable)
    console.print(f"console token in {out}", soft_wrap=True)


def _demo_file(path: Path) -> Path:
    if path.exists() or path.is_absolute():
        return path
    bundled = Path(__file__).resolve().parents[3] / path
    return bundled if bundled.exists() else path


@app.command()
def demo(
    ctx: typer.Context,
    file: Annotated[
        Path | None,
        typer.Option(help="The campaign to run (default: the engine's demo campaign)."),
    ] = None,
    engine: Annotated[
        str,
        typer.Option(
            help="The demo campaign's engine: openmm (examples/demo.yaml) or lammps "
            "(examples/lammps/demo.yaml: copper with EAM, a minimise → run → analyse chain)."
        ),
    ] = "openmm",
    timeout: Annotated[
        float, typer.Option(min=0, help="Seconds to wait for the jobs.")
    ] = DEMO_TIMEOUT_S,
    backend: Annotated[str, typer.Option(help="Execution backend.")] = "local",
    keep_up: Annotated[
        bool,
        typer.Option(
            "--keep-up", help="Keep the stack (and its web console) up until Ctrl-C afterwards."
        ),
    ] = False,
) -> None:
    """Run the demo campaign on a fresh stack (what `make run` does).

    Starts the stack, submits examples/demo.yaml (``--engine lammps``:
    examples/lammps/demo.yaml, uploading its input files), shows live progress, prints the
    history read back from PostgreSQL and the campaign's page in the web console, and stops
    (with ``--keep-up``: after Ctrl-C). Exit 0 if every job succeeded, else 1.
    """
    options = _options(ctx)
    if engine not in DEMO_FILES:
        raise InvalidInput(
            f"must be one of {', '.join(DEMO_FILES)}, got {engine!r}", field="--engine"
        )
    path = _demo_file(file or DEMO_FILES[engine])
    request = load_job_file(path)
    files = resolve_inputs(request, path.parent, source=str(path))
    stamp = time.strftime("%Y%m%d-%H%M%S")
    request.idempotency_key = f"{request.idempotency_key or 'demo'}-{stamp}-{secrets.token_hex(2)}"
    request.submitted_by = request.submitted_by or user_name()
    running = read_stack_info(options.state_dir)
    code = _run(
        _demo(
            options,
            request,
            files=files,
            running=running,
            limit_s=timeout,
            backend=backend,
            keep_up=keep_up,
        )
    )
    raise typer.Exit(code)


async def _demo(
    options: GlobalOptions,
    request: pb.SubmitRequest,
    *,
    files: Sequence[LocalInput] = (),
    running: StackInfo | None,
    limit_s: float,
    backend: str,
    keep_up: bool = False,
) -> int:
    task = asyncio.current_task()
    loop = asyncio.get_running_loop()
    if task is not None:
        loop.add_signal_handler(signal.SIGTERM, task.cancel)
    if running is not None:
        console.print(f"using the stack already running on {running.state_dir}")
        return await _demo_campaign(running, request, files=files, limit_s=limit_s)
    stack = Stack(
        state_dir=options.state_dir,
        namespace=options.namespace,
        backend=backend,
        nats_url=options.nats_url,
        database_url=options.database_url,
    )
    console.print("starting the stack ...")
    async with stack:
        _print_stack(stack.info)
        code = await _demo_campaign(stack.info, request, files=files, limit_s=limit_s)
        if keep_up:
            console.print("the stack stays up; press Ctrl-C to stop it")
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.Event().wait()
        console.print("stopping the stack ...")
    return code


def campaign_url(info: StackInfo, request: pb.SubmitRequest) -> str:
    """The console's page of the submit's campaign (its jobs' ``campaign`` label), or of its
    jobs list; "" when the stack runs no console."""
    if not info.console_url:
        return ""
    labels = {job.labels["campaign"] for job in request.jobs if "campaign" in job.labels}
    if len(labels) == 1:
        return info.console_link(f"campaigns?{urlencode({'label': f'campaign={labels.pop()}'})}")
    return info.console_link("jobs")


async def _demo_campaign(
    info: StackInfo,
    request: pb.SubmitRequest,
    *,
    files: Sequence[LocalInput] = (),
    limit_s: float,
) -> int:
    started = time.monotonic()
    async with await MdqClient.connect(
        info.nats_url, info.namespace, name="mdq-demo", creds=info.nats_creds
    ) as client:
        if files:
            _print_uploaded(await client.upload_inputs(files))
        job_ids = await client.submit_when_ready(request, within_s=60.0)
        names = dict(zip(job_ids, (job.name for job in request.jobs), strict=True))
        console.print(f"submitted {len(job_ids)} jobs (key {request.idempotency_key})")
        remaining = max(1.0, limit_s - (time.monotonic() - started))
        views = await follow_jobs(client, job_ids, names=names, limit_s=remaining, console=console)
    details = await history.wait_for_projection(info.database_dsn(), job_ids, within_s=30.0)
    console.print(history.detail_table(details, title="history (read back from PostgreSQL)"))
    missing = sorted(set(job_ids) - {detail.job.job_id for detail in details})
    if missing:
        console.print(f"[red]not in PostgreSQL: {', '.join(missing)}[/]")
    elapsed = time.monotonic() - started
    code = _final_code(views, job_ids)
    verdict = (
        "[green]all jobs succeeded[/]" if code == EXIT_OK else "[red]not all jobs succeeded[/]"
    )
    console.print(f"{verdict} in {elapsed:.0f} s")
    if url := campaign_url(info, request):
        console.print(f"the campaign in the web console: {url}")
    return code


def _print_uploaded(uploaded: Sequence[Uploaded]) -> None:
    """One line on stderr: the input files sent, and those the bucket had already."""
    sent = [file for file in uploaded if file.sent]
    err_console.print(
        f"input files: {len(sent)} uploaded ({sum(file.size_bytes for file in sent)} bytes), "
        f"{len(uploaded) - len(sent)} already there",
        highlight=False,
    )


# -- client commands -----------------------------------------------------------------------
@app.command()
def submit(
    ctx: typer.Context,
    file: Annotated[Path, typer.Argument(help="Job file: YAML or JSON (protobuf JSON mapping).")],
    wait: Annotated[bool, typer.Option("--wait", help="Follow the jobs until they end.")] = False,
    key: Annotated[
        str | None, typer.Option("--key", help="Idempotency key (default: the file's, or new).")
    ] = None,
    timeout: Annotated[float, typer.Option(min=0, help="Seconds to wait with --wait.")] = 3600.0,
) -> None:
    """Submit the jobs of FILE and print their ids.

    The input files the jobs name (``inputs``, a LAMMPS job's script) are read relative to
    FILE, checked, and uploaded first (docs/engines.md). Exit 2 with the field and message
    when the submit is refused.
    """
    request = load_job_file(file)
    files = resolve_inputs(request, file.parent, source=str(file))
    if key:
        request.idempotency_key = key
    request.submitted_by = request.submitted_by or user_name()
    endpoints = _endpoints(ctx)

    async def work(client: MdqClient) -> int:
        if files:
            _print_uploaded(await client.upload_inputs(files))
        job_ids = await client.submit(request)
        for job_id in job_ids:
            console.print(job_id, highlight=False)
        if not wait:
            return EXIT_OK
        names = dict(zip(job_ids, (job.name for job in request.jobs), strict=True))
        try:
            views = await follow_jobs(
                client, job_ids, names=names, limit_s=timeout, console=console
            )
        except MdqError:
            err_console.print(
                f"the submit was accepted: {len(job_ids)} job(s) {', '.join(job_ids)}; "
                f"following them failed (mdq watch {' '.join(job_ids)}):",
                highlight=False,
            )
            raise
        return _final_code(views, job_ids)

    _exit_with(endpoints, work)


@app.command()
def watch(
    ctx: typer.Context,
    job_ids: Annotated[
        list[str] | None,
        typer.Argument(
            help="Job ids to follow; none: every job not finished yet (from PostgreSQL)."
        ),
    ] = None,
    timeout: Annotated[float, typer.Option(min=0, help="Seconds to wait.")] = 3600.0,
    limit: Annotated[
        int, typer.Option(min=1, max=MAX_LISTED, help="Most jobs followed without ids.")
    ] = 50,
) -> None:
    """Live progress bars of jobs (step/target, energy, ns/day, ETA) until they end.

    Without job ids, follows every job that is not finished when it starts (read from the
    watcher's tables). Exit 0 if they all succeeded; 5 at once if a job named is not in the
    log these credentials read.
    """
    wanted = job_ids_argument(job_ids or [])
    endpoints = _endpoints(ctx)
    if not wanted:
        database_url = _database_url(endpoints, hint="(or name the jobs to watch)")
        wanted = _run(history.active_job_ids(database_url, limit=limit))
        if not wanted:
            console.print("no job is waiting, queued or running")
            raise typer.Exit(EXIT_OK)

    async def work(client: MdqClient) -> int:
        await client.require_in_log(wanted)  # exit 5 at once, as the SDK's wait
        views = await follow_jobs(client, wanted, limit_s=timeout, console=console)
        return _final_code(views, wanted)

    _exit_with(endpoints, work)


@app.command("ls")
def list_jobs(
    ctx: typer.Context,
    limit: Annotated[
        int, typer.Option(min=1, max=MAX_LISTED, help="How many of the latest jobs.")
    ] = 50,
) -> None:
    """The latest jobs, from PostgreSQL."""
    endpoints = _endpoints(ctx, need_nats=False)
    database_url = _database_url(endpoints)
    jobs = _run(history.list_jobs(database_url, limit=limit))
    console.print(history.summary_table(jobs, title=f"jobs (latest {limit})"))


@app.command()
def recommend(
    ctx: typer.Context,
    file: Annotated[Path, typer.Argument(help="Job file: YAML or JSON (protobuf JSON mapping).")],
    days: Annotated[
        int, typer.Option(min=1, max=3650, help="How far back the usage history reaches.")
    ] = 90,
) -> None:
    """Print the resources history recommends for each job of FILE, and their evidence.

    Reads the measured usage from PostgreSQL when one is known (DATABASE_URL, --database-url,
    a running stack); without one, the physical estimate alone. Exit 2 naming the field when a
    job does not validate.
    """
    request = load_job_file(file)
    endpoints = _endpoints(ctx, need_nats=False)
    history = UsageHistory([])
    source = "no database: physical estimate only"
    if endpoints.database_url:
        try:
            history = _run(recommendations.read_history(endpoints.database_url, days=days))
            source = f"{len(history)} measured attempts of the last {days} days"
        except Exception as error:  # the estimate is still worth printing
            err_console.print(f"(usage history not read: {error})")
    table = recommendations.recommendations_table(request, history=history, source=source)
    console.print(table)


@app.command()
def show(
    ctx: typer.Context,
    job_id: Annotated[str, typer.Argument(help="The job id.")],
) -> None:
    """One job from PostgreSQL: state, attempts, node, last progress, timeline."""
    job_id = job_id_argument(job_id)
    endpoints = _endpoints(ctx, need_nats=False)
    database_url = _database_url(endpoints)
    detail, timeline = _run(history.job_detail(database_url, job_id))
    if detail is None:
        raise NotFound(f"no job {job_id} in PostgreSQL")
    console.print(history.show_panel(detail, timeline))
    for entry in timeline:
        if entry.kind == "submitted" and (line := recommendations.recorded_choice(entry.body)):
            console.print(line, highlight=False)
    if detail.job.state in ("PENDING", "WAITING") and endpoints.nats_url:
        try:
            waiting = _run(
                waiting_entry(
                    endpoints.nats_url, endpoints.namespace, job_id, creds=endpoints.nats_creds
                )
            )
        except Exception as error:  # the history is shown; this line is a bonus
            err_console.print(f"(why it waits: NATS not reachable: {error})")
            return
        if waiting is not None and waiting.attempt == detail.job.attempt:
            console.print(f"why it waits (placement): {waiting.summary}  — mdq explain {job_id}")


@app.command()
def nodes(ctx: typer.Context) -> None:
    """The latest load of every node (from the NODES stream)."""
    endpoints = _endpoints(ctx)

    async def work(client: MdqClient) -> dict[str, pb.Event]:
        return await client.node_loads()

    loads = _run(_with_client(endpoints, work))
    clustered = any(event.node_load.cluster for event in loads.values())
    troubled = any(event.node_load.problem for event in loads.values())
    table = columns_table(
        "nodes",
        (
            ("node", "left"),
            *((("cluster", "left"), ("labels", "left")) if clustered else ()),
            ("ready", "left"),
            *((("problem (takes no new pods)", "left"),) if troubled else ()),
            ("cpu load", "right"),
            ("cpu capacity", "right"),
            ("memory load", "right"),
            ("memory capacity", "right"),
            ("reported", "left"),
        ),
    )
    now = time.time()
    for name, event in loads.items():
        load = event.node_load
        age = now - event.time.ToSeconds() if event.HasField("time") else 0.0
        labels = ",".join(f"{k}={v}" for k, v in sorted(load.cluster_labels.items()))
        table.add_row(
            name,
            *((load.cluster or "-", labels or "-") if clustered else ()),
            ("[yellow]cordoned[/]" if load.cordoned else "[green]yes[/]")
            if load.ready
            else "[red]no[/]",
            *((f"[red]{escape(load.problem)}[/]" if load.problem else "-",) if troubled else ()),
            f"{load.cpu_load:.0%}",
            f"{load.cpu_capacity:g} cores",
            f"{load.memory_load:.0%}",
            f"{load.memory_capacity_mb} MiB",
            f"{format_eta(age)} ago" if age >= 1 else "just now",
        )
    if not loads:
        console.print("no node has reported its load yet")
        return
    console.print(table)


@app.command()
def queues(ctx: typer.Context) -> None:
    """Each tenant's weight, jobs running and queued, share of the cluster and fair share
    (placement's last count, from its waiting bucket)."""
    endpoints = _endpoints(ctx)
    if tenant := tenant_of_creds(endpoints.nats_creds):
        raise PermissionDenied(
            f"the tenants' shares are the operator's to read; tenant {tenant}'s "
            "credentials may not (docs/security.md, Tenants)"
        )
    usages = _run(
        tenant_usages(endpoints.nats_url, endpoints.namespace, creds=endpoints.nats_creds)
    )
    if not usages:
        console.print("no tenant has jobs queued or running (or placement has not counted yet)")
        return
    console.print(queues_table(usages))


@app.command()
def credentials(
    ctx: typer.Context,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            help="Folder of the deployment's NATS material (made 0700 if missing; default: "
            "the local stack's, <state dir>/secrets/nats).",
        ),
    ] = None,
    namespace: Annotated[
        str | None,
        typer.Option("--namespace", help="The deployment's namespace (default: the global one)."),
    ] = None,
    group_readable: Annotated[
        bool,
        typer.Option(
            "--group-readable",
            help="0640 files in a 0750 folder, for containers given your group (compose).",
        ),
    ] = False,
    rotate_identities: Annotated[
        list[str] | None,
        typer.Option(
            "--rotate",
            help="Replace this identity's credentials (intake, tenant.alice, ...) and revoke "
            "the old ones once the server reloads. Repeatable.",
        ),
    ] = None,
) -> None:
    """Write a deployment's NATS trust chain and credentials: nats-auth.conf (the server's
    block, public), one <identity>.creds per identity and runner-issuer.json (0600). The same
    generator as `mdq up`; idempotent (an existing trust and unchanged credentials are kept).
    With --rotate, replace identities' credentials and revoke the old ones."""
    chosen = namespace or _options(ctx).namespace or "mdq"
    folder = out or nats_secrets_dir(_options(ctx).state_dir)
    try:
        generated = generate(folder, chosen, group_readable=group_readable)
        rotated = [
            rotate(folder, identity, chosen, group_readable=group_readable)
            for identity in rotate_identities or []
        ]
    except FileNotFoundError as error:
        raise InvalidInput(str(error)) from error
    wrote = ", ".join(generated.written) or "nothing (all kept)"
    console.print(f"NATS credentials of namespace {chosen} in {folder}: wrote {wrote}")
    console.print(f"NATS account {generated.trust.account_public} (KEDA's trigger account)")
    for each in rotated:
        console.print(f"rotated {each.identity}: new {each.creds}; revoked key {each.revoked_key}")
    state_dir = _options(ctx).state_dir
    if not rotated:
        return
    if folder.resolve() == nats_secrets_dir(state_dir).resolve() and reload_embedded_nats(
        state_dir
    ):
        console.print("the stack's NATS reloaded: the old credentials no longer connect")
    else:
        console.print(
            "the old credentials stop working once the server reloads nats-auth.conf: "
            "`nats-server --signal reload`, a rollout of its pods, or restarting `mdq up`"
        )


def _run_control(ctx: typer.Context, work: Callable[[MdqClient], Awaitable[int]]) -> int:
    """Run a job-control command's ``work`` with a client of the context's endpoints."""
    return _run(_with_client(_endpoints(ctx), work))


register_control(app, run=_run_control, console=console, err=err_console)
app.add_typer(tenants_app, name="tenant")
app.command("explain")(explain_command)
app.command("replay")(replay_command)
app.command("plot")(plot_command)
app.command("simulate")(simulate_command)
