"""``mdq replay``: a job's timeline from the log, and a rebuilt projection equal to the live one.

A live projector projects histories (a retried job, a failed one, a rejected submit, progress
of several jobs) while they are published; then the projection is rebuilt from the log into a
fresh database, with another batch size, and every projected table must be identical.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import asyncpg
import pytest
from nats.js import JetStreamContext
from typer.testing import CliRunner

from mdq.bus.subjects import Subjects
from mdq.cli.main import app
from mdq.cli.plot import draw
from mdq.cli.replay import compare, fold, read_job_log, rebuild, table_contents
from mdq.contracts import pb
from mdq.core.events import make_event
from mdq.errors import NotFound
from mdq.store import queries
from mdq.store.engine import asyncpg_dsn, create_engine
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
