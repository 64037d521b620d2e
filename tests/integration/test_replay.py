"""``mdq replay``: a job's timeline from the log, and a rebuilt projection equal to the live one.

A live projector projects histories (a retried job, a failed one, a rejected submit, progress
of several jobs) while they are published; then the projection is rebuilt from the log into a
fresh database, with another batch size, and every projected table must be identical.
"""

from __future__ import annotations

import asyncio
import os
import re
from pathlib import Path
from urllib.parse import unquote, urlsplit

import asyncpg
import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext
from typer.testing import CliRunner, Result

from mdq.bus.subjects import Subjects
from mdq.cli.main import app
from mdq.cli.plot import draw
from mdq.cli.replay import compare, fold, read_job_log, rebuild, table_contents
from mdq.contracts import pb
from mdq.core.events import make_event
from mdq.errors import NotFound, PermissionDenied
from mdq.stack import StackInfo
from mdq.store import queries
from mdq.store.engine import asyncpg_dsn, create_engine
from mdq.store.roles import RoleUrls, without_password
from tests.helpers import OwnersPublisher
from tests.integration.test_projector import (
    T0,
    History,
    requeue_history,
    running,
    wait_projected,
)


async def assert_rebuilt_equals_live(database_url: str, rebuilt_url: str) -> None:
    """The rebuilt database holds the live one's rows, table by table; the rows that differ
    are printed when it does not."""
    differences = await compare(database_url, rebuilt_url)
    if differences:
        live, again = await table_contents(database_url), await table_contents(rebuilt_url)
        for table in differences:
            print("LIVE", sorted(set(live[table]) - set(again[table])))
            print("REBUILT", sorted(set(again[table]) - set(live[table])))
    assert differences == {}


def campaign() -> tuple[History, list[pb.Event]]:
    retried = History("retried")
    first, second = requeue_history(retried)
    doomed = History("doomed", request_id="ba9876543210")
    busy = [History(f"busy{i}", steps=5000, request_id="cafecafecafe") for i in range(3)]
    events = [*first, *second]
    events += [doomed.submitted(), doomed.bound(1, "n2"), doomed.started(1, "n2")]
    events += [doomed.progress(1, 100), doomed.failed(1)]
    for job in busy:
        events += [job.submitted(), job.bound(1, "n1"), job.started(1, "n1")]
    for step in range(50, 2001, 50):
        events += [job.progress(1, step) for job in busy]
    events.append(
        make_event(
            "rejected",
            pb.JobRejected(
                request_id="feedfacecafe",
                error=pb.SubmitError(field="jobs[0].steps", message="must be positive"),
            ),
            job_id="",
            attempt=0,
            producer="intake",
            at=T0,
            detail="feedfacecafe",
        )
    )
    return retried, events


async def test_rebuilt_projection_equals_the_live_one(
    js: JetStreamContext,
    subjects: Subjects,
    pool: asyncpg.Pool,
    database_url: str,
    spare_database: str,
) -> None:
    retried, events = campaign()
    publisher = OwnersPublisher(js=js, subjects=subjects)
    async with running(js, subjects, pool, batch_size=37):
        for start in range(0, len(events), 25):  # published while the projector runs
            for event in events[start : start + 25]:
                await publisher.publish(event)
            await asyncio.sleep(0.01)
        await wait_projected(js, subjects, pool)

    report = await rebuild(js, subjects, spare_database, batch_size=500)
    assert report.events == len(events)
    await assert_rebuilt_equals_live(database_url, spare_database)
    rebuilt = await asyncpg.connect(asyncpg_dsn(spare_database))
    try:
        state = await rebuilt.fetchval("SELECT state FROM jobs WHERE job_id = $1", retried.job_id)
        offsets = {
            row["consumer"]: row["last_seq"]
            for row in await rebuilt.fetch("SELECT consumer, last_seq FROM consumer_offsets")
        }
    finally:
        await rebuilt.close()
    assert state == "SUCCEEDED"
    assert set(offsets) == {"watcher-jobs", "watcher-progress"}  # a watcher resumes there
    assert (
        offsets["watcher-progress"]
        == (await js.stream_info(subjects.progress_stream)).state.last_seq
    )

    # Rebuilding into a database that already holds jobs is refused.
    with pytest.raises(ValueError, match="already holds jobs"):
        await rebuild(js, subjects, spare_database)

    # A projection that lost a row is told apart from the log.
    # (as the administrator: the watcher's role may not delete)
    admin = await asyncpg.connect(database_url)
    try:
        await admin.execute("DELETE FROM progress WHERE step = 2000")
    finally:
        await admin.close()
    assert (await compare(database_url, spare_database))["progress"] == (0, 3)


async def test_replay_reads_the_job_from_the_log_and_folds_it(
    js: JetStreamContext, subjects: Subjects, nats_url: str, namespace: str, tmp_path: Path
) -> None:
    retried, events = campaign()
    publisher = OwnersPublisher(js=js, subjects=subjects)
    await publisher.publish_all(events)
    zombie = retried.progress(1, 950)  # the first attempt, after the job moved on
    await publisher.publish(zombie)

    logged = await read_job_log(js, subjects, retried.job_id)
    mine = [event for event in events if event.job_id == retried.job_id] + [zombie]
    assert len(logged) == len(mine)
    times = [item.at for item in logged]
    assert times == sorted(times)
    lines = fold(logged)
    assert lines[0].logged.kind == "submitted" and lines[0].state == "PENDING"
    assert lines[-1].logged.event.event_id == zombie.event_id
    assert not lines[-1].applied  # fenced: attempt 1 is stale
    final = [line for line in lines if line.logged.kind == "succeeded"]
    assert final[0].state == "SUCCEEDED" and final[0].attempt == 2
    assert {line.state for line in lines} >= {"BOUND", "RUNNING", "RECOVERING", "PENDING"}

    runner = CliRunner()
    result = await asyncio.to_thread(
        runner.invoke,
        app,
        ["--nats-url", nats_url, "--namespace", namespace, "replay", retried.job_id],
        env={"COLUMNS": "200"},
    )
    assert result.exit_code == 0, result.output
    assert "requeued" in result.output and "SUCCEEDED" in result.output
    assert "(ignored)" in result.output
    # not a terminal (a pipe, a file): as wide as mdq's other commands, not Rich's 80
    # columns; a progress report's detail fits on its row, whole
    assert re.search(
        r"step \d+/\d+ +E [-\d,.]+ kJ/mol +T [\d.]+ K +[\d.]+ ns/day", result.output
    ), result.output
    for command in ("replay", "explain"):  # a well-formed id with nothing in the log
        missing = await asyncio.to_thread(
            runner.invoke,
            app,
            ["--nats-url", nats_url, "--namespace", namespace, command, "0123456789ab-nosuch"],
        )
        assert missing.exit_code == NotFound.exit_code, (command, missing.output)


async def test_plot_draws_energy_and_temperature(
    js: JetStreamContext, subjects: Subjects, pool: asyncpg.Pool, database_url: str, tmp_path: Path
) -> None:
    retried, events = campaign()
    publisher = OwnersPublisher(js=js, subjects=subjects)
    await publisher.publish_all([event for event in events if event.job_id == retried.job_id])
    async with running(js, subjects, pool):
        await wait_projected(js, subjects, pool)
    engine = create_engine(database_url)
    try:
        trace = await queries.progress_trace(engine, retried.job_id)
    finally:
        await engine.dispose()
    assert {point.attempt for point in trace} == {1, 2}
    image = draw(retried.job_id, trace, tmp_path / "plots" / "energy.png")
    data = image.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000

    result = await asyncio.to_thread(
        CliRunner().invoke,
        app,
        [
            "--database-url",
            database_url,
            "--nats-url",
            "nats://unused:4222",
            "plot",
            retried.job_id,
            "-o",
            str(tmp_path / "cli.svg"),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "<svg" in (tmp_path / "cli.svg").read_text()


def fake_stack(
    state_dir: Path, *, nats_url: str, namespace: str, reader_url: str, embedded: bool
) -> None:
    """``state_dir`` as a running ``mdq up`` leaves it for the CLI: ``stack.json`` naming the
    reader (its password in a file beside it) and, for an embedded PostgreSQL, the
    administrator's password under ``secrets/postgres/`` (the test server trusts its socket;
    the password is the test server's own, when it has one)."""
    secrets = state_dir / "secrets" / "postgres"
    secrets.mkdir(parents=True)
    split = urlsplit(reader_url)
    (secrets / "reader.password").write_text(unquote(split.password or ""))
    (secrets / "admin.password").write_text("unused")
    stack = StackInfo(
        nats_url=nats_url,
        database_url=without_password(reader_url),
        namespace=namespace,
        metrics_url="",
        state_dir=str(state_dir),
        logs_dir=str(state_dir / "logs"),
        data_dir=str(state_dir / "data"),
        backend="local",
        pid=os.getpid(),
        embedded_nats=True,
        embedded_postgres=embedded,
        database_password_file=str(secrets / "reader.password"),
    )
    (state_dir / "stack.json").write_text(stack.to_json())


def rebuilt_database(output: str) -> str:
    """The database ``mdq replay --rebuild`` says it rebuilt into."""
    found = re.search(r"into postgresql://\S*/(mdq_rebuild_\w+)", output)
    assert found, output
    return found[1]


async def drop_database(admin_url: str, name: str) -> None:
    admin = await asyncpg.connect(asyncpg_dsn(admin_url))
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


def mdq_cli(args: list[str], **env: str) -> Result:
    return CliRunner().invoke(
        app, args, env={"COLUMNS": "400", "MDQ_PG_ADMIN_URL": "", **env}, catch_exceptions=True
    )


async def test_rebuild_as_a_reader_says_what_rights_it_needs(
    nc: Client, nats_url: str, namespace: str, database_roles: RoleUrls, tmp_path: Path
) -> None:
    """A role that may not create a database (the reader, as stack.json names it): a clear
    refusal with the ways to run it and exit 4, not asyncpg's InsufficientPrivilegeError."""
    reader = {"NATS_URL": nats_url, "DATABASE_URL": database_roles.reader}
    result = await asyncio.to_thread(
        mdq_cli,
        ["--namespace", namespace, "--state-dir", str(tmp_path / "none"), "replay", "--rebuild"],
        **reader,
    )
    assert result.exit_code == PermissionDenied.exit_code, result.output
    assert not isinstance(result.exception, asyncpg.PostgresError), result.exception
    assert f"the role '{namespace}_reader' may not create one" in result.output, result.output
    assert "--database-admin-url" in result.output and "--into URL" in result.output

    # A stack whose PostgreSQL is not its own keeps no administrator: said, exit 4.
    state = tmp_path / "given"
    fake_stack(
        state,
        nats_url=nats_url,
        namespace=namespace,
        reader_url=database_roles.reader,
        embedded=False,
    )
    given = await asyncio.to_thread(
        mdq_cli, ["--state-dir", str(state), "replay", "--rebuild"], NATS_URL="", DATABASE_URL=""
    )
    assert given.exit_code == PermissionDenied.exit_code, given.output
    assert "no administrator is at hand" in given.output and "MDQ_PG_ADMIN_URL" in given.output


async def test_rebuild_on_an_mdq_up_stack_creates_its_database_as_the_administrator(
    nc: Client,
    nats_url: str,
    namespace: str,
    database_url: str,
    database_roles: RoleUrls,
    tmp_path: Path,
) -> None:
    """The attacker's case: ``mdq replay --rebuild --compare`` on the default stack, whose
    stack.json gives the CLI the reader: the embedded server's administrator (its password
    in the state folder) creates and fills the new database; the password is never printed."""
    state = tmp_path / "state"
    fake_stack(
        state,
        nats_url=nats_url,
        namespace=namespace,
        reader_url=database_roles.reader,
        embedded=True,
    )
    result = await asyncio.to_thread(
        mdq_cli,
        ["--state-dir", str(state), "replay", "--rebuild", "--compare"],
        NATS_URL="",
        DATABASE_URL="",
    )
    name = rebuilt_database(result.output)
    try:
        assert result.exit_code == 0, result.output
        assert "into postgresql://postgres@/" in result.output  # no password shown
        assert "the rebuilt projection equals the live one" in result.output
    finally:
        await drop_database(database_url, name)
