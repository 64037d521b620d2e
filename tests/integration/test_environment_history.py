"""Attempts that ended on the environment's failure say so everywhere the history is read.

A job whose first attempt could not start (its node's data disk full: the node agent's
StartError) and whose second stopped on a full disk mid-run (the runner's exit 7) before the
third succeeded: PostgreSQL ``attempts`` holds FAILURE_ENVIRONMENT with the message naming the
disk, and ``mdq show`` and the console's job page show both, marked "not charged to the job";
a crash of the job's own is not so marked.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import asyncpg
from nats.aio.client import Client
from nats.js import JetStreamContext
from typer.testing import CliRunner

from mdq.bus.subjects import Subjects
from mdq.cli.main import app as cli
from mdq.contracts import pb
from mdq.core.recovery import NOT_CHARGED
from mdq.store.engine import create_engine
from mdq.store.roles import RoleUrls
from services.console.app import Console
from tests.helpers import OwnersPublisher
from tests.integration.test_console import get, serve_console
from tests.integration.test_projector import History, running, wait_projected

STARTED_NOT = "on n1: data disk full (ENOSPC): No space left on device: /data/jobs"
STOPPED = "exited with 7: the data disk was full (ENOSPC/EDQUOT)"
CRASHED = "exited with 1"


def environment_query() -> str:
    """docs/history.md's query of the attempts the environment failed."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "history.md").read_text()
    after = text.split("Attempts the environment failed", 1)[1]
    return after.split("```sql", 1)[1].split("```", 1)[0]


def history_of(job: History) -> list[pb.Event]:
    def failed(attempt: int, reason: int, code: int, message: str, step: int) -> pb.Event:
        body = pb.AttemptFailed(
            reason=reason,  # type: ignore[arg-type]
            exit_code=code,
            message=message,
            node="n1",
            last_step=step,
        )
        return job.event("attempt_failed", body, attempt)

    def requeued(attempt: int, after: int) -> pb.Event:
        return job.event("requeued", pb.JobRequeued(after=after), attempt)  # type: ignore[arg-type]

    return [
        job.submitted(),
        job.bound(1, "n1"),
        failed(1, pb.FAILURE_ENVIRONMENT, 126, STARTED_NOT, 0),
        requeued(2, pb.FAILURE_ENVIRONMENT),
        job.bound(2, "n2"),
        job.started(2, "n2"),
        job.progress(2, 100),
        failed(2, pb.FAILURE_ENVIRONMENT, 7, STOPPED, 100),
        requeued(3, pb.FAILURE_ENVIRONMENT),
        job.bound(3, "n2"),
        job.started(3, "n2"),
        job.progress(3, 200),
        failed(3, pb.FAILURE_CRASHED, 1, CRASHED, 200),
        requeued(4, pb.FAILURE_CRASHED),
        job.bound(4, "n2"),
        job.started(4, "n2"),
        job.progress(4, 1000, done_reason="steps_reached"),
        job.succeeded(4, final_step=1000),
    ]


async def test_environment_failures_are_named_and_not_charged_in_the_history(
    nc: Client,
    js: JetStreamContext,
    subjects: Subjects,
    pool: asyncpg.Pool,
    database_url: str,
    database_roles: RoleUrls,
    tmp_path: Path,
) -> None:
    job = History("disk")
    publisher = OwnersPublisher(js=js, subjects=subjects)
    async with running(js, subjects, pool):
        for event in history_of(job):
            await publisher.publish(event)
        await wait_projected(js, subjects, pool)

    rows = await pool.fetch(
        "SELECT attempt, exit_code, failure_reason, failure_message FROM attempts "
        "WHERE job_id = $1 ORDER BY attempt",
        job.job_id,
    )
    assert [tuple(row) for row in rows] == [
        (1, 126, "FAILURE_ENVIRONMENT", STARTED_NOT),
        (2, 7, "FAILURE_ENVIRONMENT", STOPPED),
        (3, 1, "FAILURE_CRASHED", CRASHED),
        (4, None, None, None),
    ]

    documented = await pool.fetch(environment_query())
    assert [(r["node"], r["attempts"], r["jobs"]) for r in documented] in (
        [("n1", 1, 1), ("n2", 1, 1)],
        [("n2", 1, 1), ("n1", 1, 1)],
    )
    assert {r["latest"] for r in documented} == {STARTED_NOT, STOPPED}

    env = {"DATABASE_URL": database_url, "COLUMNS": "250"}
    shown = await asyncio.to_thread(
        CliRunner().invoke,
        cli,
        ["--state-dir", "/nonexistent/mdq-state", "show", job.job_id],
        env=env,
    )
    assert shown.exit_code == 0, shown.output
    lines: dict[str, str] = {}  # a wrapped row's lines joined, by its first cell
    row = ""
    for line in shown.output.splitlines():
        cells = line.split("│")
        if len(cells) < 3:
            continue
        row = cells[1].strip() or row
        lines[row] = f"{lines.get(row, '')} {line}"
    lines = {key: " ".join(value.replace("│", " ").split()) for key, value in lines.items()}
    assert "ENOSPC" in lines["1"] and NOT_CHARGED in lines["1"], lines["1"]
    assert "exited with 7" in lines["2"] and NOT_CHARGED in lines["2"], lines["2"]
    assert "FAILURE_CRASHED" in lines["3"] and NOT_CHARGED not in lines["3"], lines["3"]

    engine = create_engine(database_roles.reader)
    server, serving, url = await serve_console(
        Console(engine=engine, nc=nc, subjects=subjects, data_dir=tmp_path)
    )
    try:
        status, html = await get(f"{url}/jobs/{job.job_id}")
    finally:
        server.should_exit = True
        await asyncio.wait_for(serving, timeout=10)
        await engine.dispose()
    assert status == 200
    shown_rows = dict(re.findall(r'<tr id="attempt-(\d+)">(.*?)</tr>', html, re.S))
    assert "FAILURE_ENVIRONMENT" in shown_rows["1"] and "ENOSPC" in shown_rows["1"]
    assert NOT_CHARGED in shown_rows["1"] and NOT_CHARGED in shown_rows["2"]
    assert "FAILURE_CRASHED" in shown_rows["3"] and NOT_CHARGED not in shown_rows["3"]
