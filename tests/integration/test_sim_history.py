"""``mdq simulate --from-history``: the workload exported from rows the watcher's projection
wrote into a real PostgreSQL (events published as the services publish them)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from nats.aio.client import Client
from typer.testing import CliRunner

from mdq.bus.subjects import Subjects
from mdq.cli.main import app
from mdq.contracts import pb
from mdq.sim.config import SimConfig
from mdq.sim.engine import simulate
from mdq.sim.history import HistoryOptions, export_history
from mdq.store.engine import create_engine
from mdq.store.migrate import upgrade_async
from tests.integration.test_history_views import USAGE
from tests.integration.test_projector import (
    History,
    projected_as_administrator,
    requeue_history,
)


def crash_history(history: History) -> list[pb.Event]:
    """A first attempt that crashes at step 40 on n1, a second that succeeds there."""
    crashed = pb.AttemptFailed(
        reason=pb.FAILURE_CRASHED, exit_code=1, message="segfault", node="n1", last_step=40
    )
    return [
        *history.began(),
        history.event("attempt_failed", crashed, 1),
        history.requeued(2, resume_step=0, steps_lost=40),
        history.bound(2, "n1"),
        history.started(2, "n1"),
        history.progress(2, 500),
        history.succeeded(2, final_step=1000),
    ]


@pytest.fixture
async def history_url(nc: Client, subjects: Subjects, database_url: str) -> AsyncIterator[str]:
    retried = History("retried")
    first, second = requeue_history(retried)
    crashy = History("crashy", request_id="ba9876543210")
    crashy.clock = retried.clock  # its events follow the other's twenty, a second apart
    events = [*first, *second, retried.event("usage", USAGE, 2), *crash_history(crashy)]
    async with projected_as_administrator(nc.jetstream(), subjects, database_url, events):
        yield database_url


async def test_history_becomes_a_workload(history_url: str) -> None:
    engine = create_engine(history_url)
    try:
        workload = await export_history(
            engine, HistoryOptions(days=3650, node_cpu=4.0, node_memory_mb=8192)
        )
    finally:
        await engine.dispose()
    jobs = {job.job_id: job for job in workload.jobs}
    retried, crashy = jobs["0123456789ab-retried"], jobs["ba9876543210-crashy"]
    assert retried.arrival_s == 0.0
    # retried's submit was its first event, crashy's came a second after retried's twentieth
    assert crashy.arrival_s == pytest.approx(20.0)
    # the successful attempt ran steps 200..1000 from its start to its end, 9 s apart
    assert retried.steps == 1000
    assert retried.steps_per_s == pytest.approx(800 / 9)
    assert (retried.peak_memory_mb, retried.cores_used) == (612.5, 1.0)  # cores: at most the cpu
    assert (retried.cpu, retried.memory_mb, retried.priority_class) == (1.0, 1024, "high")
    assert retried.crash_at_steps == ()
    assert crashy.crash_at_steps == (40,)
    assert crashy.steps_per_s == pytest.approx(1000 / 2)  # started, progress, succeeded
    assert [node.name for node in workload.nodes] == ["n1", "n2"]
    assert {node.cpu for node in workload.nodes} == {4.0}
    assert workload.notes["start_delay_s"] == "1.000"  # bound to started, one second apart
    metrics = simulate(workload, SimConfig("replay", start_delay_s=1.0))
    assert metrics.succeeded == 2
    assert metrics.crashes == 1


async def test_an_empty_history_is_named(database_url: str) -> None:
    await upgrade_async(database_url)
    engine = create_engine(database_url)
    try:
        with pytest.raises(ValueError, match="no job was submitted in the window"):
            await export_history(engine, HistoryOptions(days=1))
    finally:
        await engine.dispose()


def test_the_command_replays_the_history(history_url: str, tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app,
        [
            "--database-url",
            history_url,
            "--state-dir",
            str(tmp_path / "no-stack"),
            "simulate",
            "--from-history",
            "--days",
            "3650",
            "--node-cpu",
            "4",
            "--node-memory-mb",
            "8192",
            "--extra-nodes",
            "2",
            "-c",
            "fifo",
        ],
    )
    assert result.exit_code == 0, result.output
    line = json.loads(result.stdout.splitlines()[0])
    assert line["workload"]["source"] == "history"
    assert (line["workload"]["jobs"], line["workload"]["nodes"]) == (2, 4)
    (fifo,) = line["configs"]
    assert (fifo["succeeded"], fifo["crashes"]) == (2, 1)
