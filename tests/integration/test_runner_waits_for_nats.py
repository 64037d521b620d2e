"""The runner started while NATS is not there: it waits (one log line per try, with backoff)
and runs no MD until it can report; it runs the job once a server starts on its URL; SIGTERM
during the wait ends it with PREEMPTED, having computed nothing."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from mdq.bus.connect import connect
from mdq.bus.subjects import Subjects
from mdq.core.exit_codes import RunnerExit
from mdq.core.runner_task import RunnerTask
from mdq.embedded import EmbeddedNats, free_port, start_nats
from tests.helpers import read_all, wait_for
from tests.integration.test_runner import (
    Runner,
    kill_running,
    make_task,
    md_spec,
    runner_process,
)


@pytest.fixture
async def late_nats(tmp_path: Path) -> AsyncIterator[tuple[str, list[EmbeddedNats]]]:
    """A NATS URL nobody listens on yet, and a list the test adds the server it starts to."""
    servers: list[EmbeddedNats] = []
    yield f"nats://127.0.0.1:{free_port()}", servers
    for server in servers:
        await asyncio.to_thread(server.stop)


@pytest.fixture
async def runners() -> AsyncIterator[list[Runner]]:
    """The runners a test started; any still running at the end is killed."""
    started: list[Runner] = []
    yield started
    await kill_running(started)


async def start_runner(
    task: RunnerTask, nats_url: str, subjects: Subjects, log: Path, started: list[Runner]
) -> Runner:
    """``runner_process`` of ``task``, added to ``started``."""
    started.append(await runner_process(task, nats_url, subjects, log))
    return started[-1]


async def waiting(runner: Runner, nats_url: str) -> None:
    """Until the runner has said twice that NATS is not reachable (and is still alive)."""

    async def said_twice() -> bool:
        assert runner.process.returncode is None, f"the runner exited:\n{runner.stderr}"
        return runner.stderr.count(f"NATS at {nats_url} not reachable") >= 2

    await wait_for(said_twice, timeout=60, what="the runner to wait for NATS")


async def test_runner_waits_for_nats_then_runs_the_job(
    late_nats: tuple[str, list[EmbeddedNats]],
    runners: list[Runner],
    subjects: Subjects,
    data_dir: Path,
    tmp_path: Path,
) -> None:
    url, servers = late_nats
    spec = md_spec("late", steps=200, report_interval_steps=50, checkpoint_interval_steps=100)
    task = make_task(data_dir, "job-late-nats", spec)
    runner = await start_runner(task, url, subjects, tmp_path / "runner.log", runners)
    await waiting(runner, url)
    files = [path for path in task.job_dir.rglob("*") if path.is_file()]
    assert files == [], "the runner ran MD before it could report it"
    port = int(url.rsplit(":", 1)[1])
    servers.append(await asyncio.to_thread(start_nats, tmp_path / "nats", port=port))
    # A fresh server: make the streams (the services do that in a real deployment); the
    # runner is still building its system, and its outbox retries a publish that comes early.
    client = await connect(url, name="check", subjects=subjects)
    try:
        assert await runner.wait() == RunnerExit.OK, runner.stderr
        reports = await read_all(client.jetstream(), subjects.progress(task.job_id))
    finally:
        await client.close()
    steps = [report.progress.step for report in reports]
    assert steps and steps[-1] == 200, steps


async def test_sigterm_while_waiting_for_nats_exits_preempted(
    late_nats: tuple[str, list[EmbeddedNats]],
    runners: list[Runner],
    subjects: Subjects,
    data_dir: Path,
    tmp_path: Path,
) -> None:
    url, _ = late_nats
    task = make_task(data_dir, "job-never-nats", md_spec("never", steps=200))
    runner = await start_runner(task, url, subjects, tmp_path / "runner.log", runners)
    await waiting(runner, url)
    runner.process.send_signal(signal.SIGTERM)
    assert await runner.wait(within_s=20) == RunnerExit.PREEMPTED, runner.stderr
    assert "stopped while waiting for NATS" in runner.stderr
