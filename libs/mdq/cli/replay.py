"""``mdq replay``: a job's whole history straight from the JetStream log, and rebuilding the
PostgreSQL projection from the log into a fresh database.

``mdq replay JOB`` reads the job's subjects of the JOBS and PROGRESS streams (a tenant's: of
its own stream) with ordered consumers, deleted once read (not PostgreSQL: the log is the
source of truth), folds them with the same state machine as the services (``JobView.apply``)
and prints one line per event with the state it led to; events the state machine ignores (a
stale attempt, a terminal job) are marked.

``mdq replay --rebuild`` runs the watcher's projection (``mdq.store.projection.Projector``) on
both streams from their first message into a fresh database, until it holds everything the
streams held when it started, then stores the offsets under the watcher's consumer names (so
a watcher pointed at the new database resumes from there). ``--compare`` then checks that the
rebuilt tables equal the live ones. Without ``--into`` the new database is created on the live
one's server by a role that may (CREATEDB): ``--database-admin-url`` / ``MDQ_PG_ADMIN_URL``,
else a running ``mdq up`` stack's embedded administrator when the database URL is the stack's
(its reader may not), else ``DATABASE_URL``'s own role; one that may not is told so (exit 4)
with the ways to run it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated

import asyncpg
import typer
from nats.js import JetStreamContext
from rich.console import Console
from rich.table import Table

from mdq.bus.codec import decode_event, to_dict
from mdq.bus.connect import connect
from mdq.bus.subjects import Subjects
from mdq.cli.args import job_id_argument
from mdq.cli.context import Endpoints, GlobalOptions, resolve_endpoints
from mdq.cli.live import state_text
from mdq.contracts import pb
from mdq.core.state import JobView, event_time
from mdq.errors import NotFound, PermissionDenied
from mdq.sdk.client import tenant_of_creds
from mdq.sdk.consumers import read_stored
from mdq.store.engine import asyncpg_dsn, create_writer_pool
from mdq.store.migrate import upgrade_async
from mdq.store.projection import BATCH_SIZE, JOBS_CONSUMER, PROGRESS_CONSUMER, Projector
from mdq.store.roles import ENV_ADMIN_PASSWORD, ENV_ADMIN_URL, url_user, without_password
from mdq.tenancy import NoDatabaseAdmin, database_admin

PROJECTED_TABLES = (
    "jobs",
    "attempts",
    "events",
    "progress",
    "checkpoints",
    "placements",
    "rejections",
    "usage_samples",
    "usage_summaries",
    "failure_tallies",
    "node_hours",
)


@dataclass(frozen=True, slots=True)
class LoggedEvent:
    """One event as the log holds it."""

    stream: str
    sequence: int
    event: pb.Event

    @property
    def kind(self) -> str:
        return self.event.WhichOneof("body") or ""

    @property
    def at(self) -> datetime:
        return event_time(self.event)


@dataclass(frozen=True, slots=True)
class ReplayLine:
    """An event and what the state machine made of it."""

    logged: LoggedEvent
    applied: bool
    state: str
    attempt: int


async def read_subjects(
    js: JetStreamContext, stream: str, subjects: Sequence[str]
) -> list[LoggedEvent]:
    """Every message stored on ``subjects`` of ``stream`` now, in stream order (one ordered
    consumer, deleted before it returns)."""
    logged: list[LoggedEvent] = []
    for message in await read_stored(js, stream, subjects):
        with contextlib.suppress(Exception):
            logged.append(
                LoggedEvent(
                    stream=stream,
                    sequence=message.metadata.sequence.stream,
                    event=decode_event(message.data),
                )
            )
    return logged


async def read_job_log(
    js: JetStreamContext, subjects: Subjects, job_id: str, *, tenant: str = ""
) -> list[LoggedEvent]:
    """The job's lifecycle and progress events, merged in the order they happened (as
    ``tenant``: from its own stream, the only one it may read, through one consumer; the
    operator's: one on each of the jobs and progress streams)."""
    jobs = subjects.tenant_stream(tenant) if tenant else subjects.jobs_stream
    progress_stream = subjects.tenant_stream(tenant) if tenant else subjects.progress_stream
    if jobs == progress_stream:
        both = await read_subjects(js, jobs, [subjects.job_all(job_id), subjects.progress(job_id)])
    else:
        lifecycle, progress = await asyncio.gather(
            read_subjects(js, jobs, [subjects.job_all(job_id)]),
            read_subjects(js, progress_stream, [subjects.progress(job_id)]),
        )
        both = lifecycle + progress
    return sorted(both, key=lambda item: (item.at, item.stream, item.sequence))


def fold(logged: Sequence[LoggedEvent]) -> list[ReplayLine]:
    """Fold the events with ``JobView.apply``; the state after each one."""
    view: JobView | None = None
    lines: list[ReplayLine] = []
    for item in logged:
        if item.kind == "submitted":
            applied = view is None
            view = view or JobView.from_submitted(item.event)
        else:
            applied = view is not None and view.apply(item.event)
        state = view.state.value if view is not None else "-"
        lines.append(
            ReplayLine(
                logged=item, applied=applied, state=state, attempt=view.attempt if view else 0
            )
        )
    return lines


def _detail(event: pb.Event) -> str:
    kind = event.WhichOneof("body") or ""
    if kind == "progress":
        body = event.progress
        return (
            f"step {body.step}/{body.target_steps}  E {body.potential_kj_mol:,.1f} kJ/mol  "
            f"T {body.temperature_k:.1f} K  {body.ns_per_day:.1f} ns/day"
            + (f"  {body.done_reason}" if body.done_reason else "")
        )
    values = to_dict(getattr(event, kind)) if kind else {}
    parts = []
    for key, value in values.items():
        if isinstance(value, (dict, list)):
            if key in ("resume_from",) and isinstance(value, dict):
                parts.append(f"resume_from.step={value.get('step', 0)}")
            continue
        parts.append(f"{key}={value}")
    return " ".join(parts)


def timeline_table(job_id: str, lines: Sequence[ReplayLine], *, progress_every: int = 1) -> Table:
    """The replay as a table; with ``progress_every`` > 1 only every n-th progress report
    (and the last one of each attempt) is shown."""
    table = Table(title=f"replay of {job_id} from the log ({len(lines)} events)")
    for column in ("time", "stream:seq", "att", "event", "state"):
        table.add_column(column, no_wrap=True)
    table.add_column("detail", overflow="fold")  # whole: wrapped at the width, never cut
    seen_progress = 0
    for index, line in enumerate(lines):
        item = line.logged
        if item.kind == "progress":
            seen_progress += 1
            following = lines[index + 1] if index + 1 < len(lines) else None
            last_of_run = following is None or following.logged.kind != "progress"
            if progress_every > 1 and seen_progress % progress_every and not last_of_run:
                continue
        kind = item.kind if line.applied else f"[dim]{item.kind} (ignored)[/]"
        table.add_row(
            item.at.astimezone(UTC).strftime("%H:%M:%S.%f")[:-3],
            f"{item.stream.rsplit('_', 1)[-1]}:{item.sequence}",
            str(item.event.attempt),
            kind,
            state_text(line.state),
            _detail(item.event),
        )
    return table


# -- rebuilding ----------------------------------------------------------------------------
async def caught_up(
    pool: asyncpg.Pool | asyncpg.Connection,
    wanted: dict[str, int],
    projector: asyncio.Task[None],
    *,
    poll_s: float,
    timeout_s: float | None = None,
) -> None:
    """Until the projection's ``consumer_offsets`` reach ``wanted`` (stream -> last sequence),
    checked every ``poll_s`` seconds (on ``pool``: the projection's own pool, or a connection
    of the caller's). The ``projector`` task's error is raised if it ends first
    (a ``RuntimeError`` if it ends without one), a ``TimeoutError`` after ``timeout_s``."""
    started = time.monotonic()
    while True:
        rows = await pool.fetch("SELECT stream, last_seq FROM consumer_offsets")
        have = {row["stream"]: row["last_seq"] for row in rows}
        if all(have.get(stream, 0) >= last for stream, last in wanted.items()):
            return
        if projector.done():
            projector.result()
            raise RuntimeError("the projection stopped before it caught up")
        if timeout_s is not None and time.monotonic() - started > timeout_s:
            raise TimeoutError(f"not rebuilt within {timeout_s:g} s: {have} of {wanted}")
        await asyncio.sleep(poll_s)


@dataclass(frozen=True, slots=True)
class RebuildReport:
    """What a rebuild did."""

    database_url: str
    events: int
    seconds: float
    last_seq: dict[str, int]


async def _fresh_database(database_url: str) -> str:
    """Create an empty database next to ``database_url``'s; return its URL."""
    name = "mdq_rebuild_" + time.strftime("%Y%m%d_%H%M%S") + "_" + uuid.uuid4().hex[:4]
    admin = await asyncpg.connect(asyncpg_dsn(database_url))
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    base, _, query = database_url.partition("?")
    return base.rsplit("/", 1)[0] + f"/{name}" + (f"?{query}" if query else "")


async def rebuild(
    js: JetStreamContext,
    subjects: Subjects,
    database_url: str,
    *,
    batch_size: int = BATCH_SIZE,
    timeout_s: float = 600.0,
) -> RebuildReport:
    """Project both streams from the start into ``database_url`` (migrated here; it must hold
    no jobs yet) until it has what the streams held at the start."""
    await upgrade_async(database_url)
    pool = await create_writer_pool(database_url, size=2)
    token = uuid.uuid4().hex[:8]
    names = {
        subjects.jobs_stream: (f"rebuild-jobs-{token}", JOBS_CONSUMER),
        subjects.progress_stream: (f"rebuild-progress-{token}", PROGRESS_CONSUMER),
    }
    try:
        if await pool.fetchval("SELECT count(*) FROM jobs"):
            raise ValueError("the database to rebuild into already holds jobs: use a fresh one")
        await pool.execute("DELETE FROM consumer_offsets")
        wanted = {stream: (await js.stream_info(stream)).state.last_seq or 0 for stream in names}
        projector = Projector(
            js=js,
            subjects=subjects,
            pool=pool,
            batch_size=batch_size,
            jobs_consumer=names[subjects.jobs_stream][0],
            progress_consumer=names[subjects.progress_stream][0],
        )
        started = time.monotonic()
        task = asyncio.create_task(projector.run())
        try:
            await caught_up(pool, wanted, task, poll_s=0.05, timeout_s=timeout_s)
        finally:
            projector.stop()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(task, timeout=30)
            for stream, (temporary, _) in names.items():
                with contextlib.suppress(Exception):
                    await js.delete_consumer(stream, temporary)
        seconds = time.monotonic() - started
        for temporary, live in names.values():
            await pool.execute(
                "UPDATE consumer_offsets SET consumer = $2 WHERE consumer = $1", temporary, live
            )
        return RebuildReport(
            database_url=database_url,
            events=projector.events_projected,
            seconds=seconds,
            last_seq=wanted,
        )
    finally:
        await pool.close()


async def table_contents(database_url: str) -> dict[str, list[tuple[str, ...]]]:
    """Every projected table (not the offsets), rows as sorted text tuples."""
    connection = await asyncpg.connect(asyncpg_dsn(database_url))
    try:
        tables: dict[str, list[tuple[str, ...]]] = {}
        for table in PROJECTED_TABLES:
            rows = await connection.fetch(f"SELECT * FROM {table}")
            tables[table] = sorted(tuple(str(value) for value in row.values()) for row in rows)
        return tables
    finally:
        await connection.close()


async def compare(live_url: str, rebuilt_url: str) -> dict[str, tuple[int, int]]:
    """Tables that differ: {table: (rows only in live, rows only in rebuilt)}."""
    live, rebuilt = await asyncio.gather(table_contents(live_url), table_contents(rebuilt_url))
    differences: dict[str, tuple[int, int]] = {}
    for table in PROJECTED_TABLES:
        only_live = set(live[table]) - set(rebuilt[table])
        only_rebuilt = set(rebuilt[table]) - set(live[table])
        if only_live or only_rebuilt:
            differences[table] = (len(only_live), len(only_rebuilt))
    return differences


# -- the command ---------------------------------------------------------------------------
# soft_wrap: a path or a command is printed whole on its line, never broken for the
# terminal's width (it is there to be copied). A terminal's own width; else (a pipe, a file)
def _width() -> int | None:
    """$COLUMNS, or the terminal's width, or 160 off a terminal (as mdq's other commands; Rich
    would take 80). Read when the command prints, not when the module is imported."""
    if columns := os.environ.get("COLUMNS", ""):
        return int(columns) if columns.isdigit() else None
    return None if sys.stdout.isatty() else 160


def _console(*, stderr: bool = False) -> Console:
    return Console(stderr=stderr, width=_width(), soft_wrap=True)


def _endpoints(ctx: typer.Context) -> Endpoints:
    options = ctx.obj
    if not isinstance(options, GlobalOptions):
        raise typer.BadParameter("internal: global options missing")
    return resolve_endpoints(options)


async def _replay_job(endpoints: Endpoints, job_id: str, progress_every: int) -> int:
    subjects = Subjects(endpoints.namespace)
    nc = await connect(endpoints.nats_url, name="mdq-replay", creds=endpoints.nats_creds or None)
    try:
        tenant = tenant_of_creds(endpoints.nats_creds)
        logged = await read_job_log(nc.jetstream(), subjects, job_id, tenant=tenant)
    finally:
        await nc.drain()
    if not logged:
        _console(stderr=True).print(f"[red]no events of job {job_id} in the log[/]")
        return NotFound.exit_code
    _console().print(timeline_table(job_id, fold(logged), progress_every=progress_every))
    return 0


HOW_TO_REBUILD = (
    f"give a role that may create databases with --database-admin-url URL (or {ENV_ADMIN_URL}, "
    f"its password in {ENV_ADMIN_PASSWORD}), run it where the `mdq up` stack's state folder "
    "(--state-dir) is readable (its administrator's password is kept there), or create an "
    "empty database yourself and give it with --into URL"
)


def _database_creator(
    endpoints: Endpoints, options: GlobalOptions, admin_url: str | None
) -> str | None:
    """The URL of the role that creates the database to rebuild into: ``admin_url``, else the
    running stack's embedded administrator when the database URL is the stack's (its reader's,
    which may not create one), else ``DATABASE_URL`` itself; None, said on the console, when
    the stack's administrator is not to be had."""
    from_stack = not options.database_url and endpoints.stack is not None
    if not admin_url and not from_stack:
        return endpoints.database_url
    try:
        return database_admin(endpoints.stack, options.state_dir, admin_url, dict(os.environ)).url
    except NoDatabaseAdmin as error:
        _console(stderr=True).print(
            f"[red]--rebuild makes a new database, which the stack's reader role may not "
            f"create, and no administrator is at hand ({error}): {HOW_TO_REBUILD}[/]"
        )
        return None


async def _rebuild(
    endpoints: Endpoints,
    into: str | None,
    check: bool,
    batch_size: int,
    *,
    creator: str | None = None,
) -> int:
    live_url = endpoints.database_url
    if into is None:
        creator = creator or live_url
        if not creator:
            _console(stderr=True).print(
                "[red]--rebuild needs --into URL or a DATABASE_URL to sit next to[/]"
            )
            return 3
        try:
            into = await _fresh_database(creator)
        except asyncpg.InsufficientPrivilegeError as error:
            _console(stderr=True).print(
                f"[red]--rebuild makes a new database, and the role {url_user(creator)!r} may "
                f"not create one ({error}): {HOW_TO_REBUILD}[/]"
            )
            return PermissionDenied.exit_code
    subjects = Subjects(endpoints.namespace)
    creds = endpoints.nats_admin_creds or endpoints.nats_creds or None
    nc = await connect(endpoints.nats_url, name="mdq-rebuild", creds=creds)  # makes consumers
    try:
        report = await rebuild(nc.jetstream(), subjects, into, batch_size=batch_size)
    finally:
        await nc.drain()
    rate = report.events / report.seconds if report.seconds else 0.0
    _console().print(
        f"rebuilt {report.events} events into {without_password(report.database_url)} in "
        f"{report.seconds:.1f} s "
        f"({rate:,.0f} events/s); stream positions {report.last_seq}"
    )
    if not check:
        return 0
    if not live_url:
        _console(stderr=True).print("[red]--compare needs the live DATABASE_URL[/]")
        return 3
    differences = await compare(live_url, into)
    if differences:
        for table, (only_live, only_rebuilt) in differences.items():
            _console().print(
                f"[red]{table}[/]: {only_live} rows only in the live projection, "
                f"{only_rebuilt} only in the rebuilt one"
            )
        return 1
    _console().print("[green]the rebuilt projection equals the live one[/]")
    return 0


def replay(
    ctx: typer.Context,
    job_id: Annotated[str | None, typer.Argument(help="The job to replay.")] = None,
    rebuild_flag: Annotated[
        bool, typer.Option("--rebuild", help="Rebuild the PostgreSQL projection from the log.")
    ] = False,
    into: Annotated[
        str | None,
        typer.Option(help="Database to rebuild into (default: a new one on the same server)."),
    ] = None,
    check: Annotated[
        bool, typer.Option("--compare", help="After --rebuild, compare with the live database.")
    ] = False,
    progress_every: Annotated[
        int,
        typer.Option(min=1, help="Show every n-th progress report (and the last of each run)."),
    ] = 1,
    batch_size: Annotated[
        int, typer.Option(min=1, max=100_000, help="Events per transaction when rebuilding.")
    ] = BATCH_SIZE,
    database_admin_url: Annotated[
        str | None,
        typer.Option(
            "--database-admin-url",
            envvar=ENV_ADMIN_URL,
            help="PostgreSQL role that may create databases (CREATEDB): it creates the one "
            f"--rebuild fills without --into, and fills it (password: {ENV_ADMIN_PASSWORD}; "
            "default: the running stack's embedded server's administrator, else DATABASE_URL).",
        ),
    ] = None,
) -> None:
    """A job's whole timeline from the JetStream log, or --rebuild the projection from it."""
    endpoints = _endpoints(ctx)
    if rebuild_flag:
        creator = None
        if into is None:
            creator = _database_creator(endpoints, ctx.obj, database_admin_url)
            if creator is None:
                raise typer.Exit(PermissionDenied.exit_code)
        code = asyncio.run(_rebuild(endpoints, into, check, batch_size, creator=creator))
    elif job_id:
        job_id = job_id_argument(job_id)
        code = asyncio.run(_replay_job(endpoints, job_id, max(1, progress_every)))
    else:
        _console(stderr=True).print("[red]give a JOB to replay, or --rebuild[/]")
        code = 2
    raise typer.Exit(code)
