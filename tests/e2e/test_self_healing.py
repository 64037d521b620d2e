"""End to end: `mdq up`'s embedded servers heal themselves.

A stack with its own NATS and PostgreSQL runs two small campaigns; kill -9 hits the NATS
server during the first and the PostgreSQL postmaster during the second. The stack must restart
each in place (same port, same data folder, so every URL stays valid), every client must
reconnect on its own, and the campaigns must end as if nothing happened: every job SUCCEEDED
exactly once, no MD work lost beyond one checkpoint interval, the history complete. The time
from each kill to the server answering again is measured here, from outside, and reported.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import asyncpg
import pytest
from typer.testing import CliRunner

from mdq.cli.main import app
from mdq.cli.status import probe_nats, probe_postgres
from mdq.sdk.client import MdqClient
from mdq.stack import NATS_SERVER, POSTGRES, Stack
from tests.e2e.stacks import operator_client
from tests.e2e.test_stack import md_job
from tests.helpers import read_all, wait_for
from tests.stack_health import fail_unless_healthy
from tools.submitting import submit_request

pytestmark = pytest.mark.e2e

CHECKPOINT_INTERVAL = 500
STEPS = 3000


@pytest.fixture
def state_dir(request: pytest.FixtureRequest) -> Iterator[Path]:
    """The stack's state folder, outside pytest's temporary root: a pytest session starting
    meanwhile resets that root to mode 0700, which the embedded PostgreSQL (run as its own
    user) could then no longer cross. Checked for crashes before it is removed."""
    folder = Path(tempfile.mkdtemp(prefix="mdq-heal-"))
    try:
        yield folder
        fail_unless_healthy(request.node, [folder])
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
async def stack(
    state_dir: Path, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Stack]:
    monkeypatch.delenv("NATS_URL", raising=False)  # this stack embeds both servers
    monkeypatch.delenv("DATABASE_URL", raising=False)
    async with Stack(
        state_dir=state_dir,
        namespace=namespace,
        local_nodes=2,
        metrics_port=0,
        extra_env={"MDQ_RECOVERY_BACKOFF_BASE_S": "1", "MDQ_METRICS_INTERVAL_S": "1"},
        grace_s=15.0,
    ) as the_stack:
        yield the_stack


def _server(stack: Stack, name: str) -> tuple[int, int]:
    """(pid, restarts) of an embedded server, from the stack's own status."""
    [part] = [part for part in stack.status() if part.name == name]
    assert part.kind == "server" and part.running and part.pid is not None, part
    return part.pid, part.restarts


async def _campaign_through_a_kill(
    stack: Stack, client: MdqClient, *, key: str, victim: str
) -> tuple[list[str], float]:
    """Submit two MD jobs, kill -9 ``victim`` once both report progress, wait until both end.
    Return the job ids and the seconds from the kill until the server answered again."""
    jobs = [
        md_job(f"{key}-{name}", steps=STEPS, checkpoint_interval_steps=CHECKPOINT_INTERVAL)
        for name in ("a", "b")
    ]
    job_ids = await client.submit_when_ready(submit_request(*jobs, key=key))

    async def reporting() -> bool:
        progress = [
            await read_all(client.nc.jetstream(), client.subjects.progress(job)) for job in job_ids
        ]
        return all(progress)

    await wait_for(reporting, timeout=120, what=f"both {key} jobs reporting progress")
    pid, restarts = _server(stack, victim)
    os.kill(pid, signal.SIGKILL)
    killed_at = time.monotonic()
    info = stack.info

    async def answers() -> bool:
        if victim == NATS_SERVER:
            return (await probe_nats(info.nats_url, limit_s=1.0, creds=info.nats_creds)).ok
        return (await probe_postgres(info.database_dsn(), limit_s=1.0)).ok

    async def killed() -> bool:
        return not await answers()

    await wait_for(killed, timeout=10, what=f"{victim} to stop answering after kill -9")
    await wait_for(answers, timeout=60, interval=0.2, what=f"{victim} to answer again")
    back_after = time.monotonic() - killed_at

    async def restarted_once() -> bool:
        [part] = [part for part in stack.status() if part.name == victim]
        return part.running and part.restarts == restarts + 1 and part.pid != pid

    await wait_for(restarted_once, timeout=30, what=f"the stack to report {victim} restarted")
    states = await client.wait(job_ids, timeout=300)
    assert {str(state) for state in states.values()} == {"SUCCEEDED"}, states
    return job_ids, back_after


@pytest.mark.expected_crashes({NATS_SERVER: 1, POSTGRES: 1})
async def test_killed_servers_are_restarted_in_place_and_campaigns_finish(
    stack: Stack, state_dir: Path, record_property: Callable[[str, object], None]
) -> None:
    info = stack.info
    async with await operator_client(stack) as client:
        first, nats_back_s = await _campaign_through_a_kill(
            stack, client, key="heal-nats", victim=NATS_SERVER
        )
        second, postgres_back_s = await _campaign_through_a_kill(
            stack, client, key="heal-pg", victim=POSTGRES
        )
        job_ids = first + second
        succeeded = {
            job: len(await read_all(client.nc.jetstream(), client.subjects.job(job, "succeeded")))
            for job in job_ids
        }
        progress_in_log = {
            job: len(await read_all(client.nc.jetstream(), client.subjects.progress(job)))
            for job in job_ids
        }
    record_property("nats_back_after_s", round(nats_back_s, 2))
    record_property("postgres_back_after_s", round(postgres_back_s, 2))
    print(f"\nNATS answered {nats_back_s:.2f} s after kill -9, PostgreSQL {postgres_back_s:.2f} s")
    assert succeeded == dict.fromkeys(job_ids, 1)  # exactly one success per job

    assert json.loads((state_dir / "stack.json").read_text())["nats_url"] == info.nats_url
    database = await asyncpg.connect(info.database_dsn())
    try:

        async def complete() -> bool:
            rows = await database.fetch(
                "SELECT j.job_id, j.state, j.last_step, count(p.step) AS reports "
                "FROM jobs j LEFT JOIN progress p USING (job_id) "
                "WHERE j.job_id = ANY($1::text[]) GROUP BY j.job_id",
                job_ids,
            )
            return {r["job_id"]: (r["state"], r["last_step"], r["reports"]) for r in rows} == {
                job: ("SUCCEEDED", STEPS, progress_in_log[job]) for job in job_ids
            }

        await wait_for(complete, timeout=90, what="the whole history in PostgreSQL")
        lost = await database.fetchval(
            "SELECT coalesce(max(steps_lost), 0) FROM attempts WHERE job_id = ANY($1::text[])",
            job_ids,
        )
    finally:
        await database.close()
    assert lost <= CHECKPOINT_INTERVAL

    result = await asyncio.to_thread(
        CliRunner().invoke, app, ["--state-dir", str(state_dir), "status"]
    )
    assert result.exit_code == 0, result.output
    for name in (NATS_SERVER, POSTGRES):
        [row] = [line for line in result.output.splitlines() if f"│ {name} " in line]
        cells = [cell.strip() for cell in row.split("│")[1:-1]]
        assert cells[1] == "server" and cells[3] == "running" and cells[4] == "1", cells
    assert "does not answer" not in result.output


async def test_status_says_when_a_server_is_down_and_when_no_stack_runs(
    stack: Stack, state_dir: Path, tmp_path: Path
) -> None:
    runner = CliRunner()
    nobody = await asyncio.to_thread(runner.invoke, app, ["--state-dir", str(tmp_path), "status"])
    assert nobody.exit_code == 3 and "no running stack" in nobody.output

    healthy = await asyncio.to_thread(runner.invoke, app, ["--state-dir", str(state_dir), "status"])
    assert healthy.exit_code == 0, healthy.output
    for part in ("nats-server", "postgres", "intake", "placement", "watcher", "local-backend"):
        assert f"│ {part} " in healthy.output, healthy.output

    pid, _ = _server(stack, NATS_SERVER)
    os.kill(pid, signal.SIGSTOP)  # alive but silent: only asking the server itself tells
    try:
        stalled = await asyncio.to_thread(
            runner.invoke, app, ["--state-dir", str(state_dir), "status"]
        )
    finally:
        os.kill(pid, signal.SIGCONT)
    assert stalled.exit_code == 1, stalled.output
    assert "NATS" in stalled.output and "does not answer" in stalled.output
