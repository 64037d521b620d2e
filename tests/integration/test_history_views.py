"""The history views (docs/history.md), on a projection of real
events.

A job that ran out of memory on n1 and succeeded on n2, and one that failed for good, are
projected by the watcher's projector; the views must answer the questions they are for.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg
import pytest
from nats.aio.client import Client

from mdq.bus.subjects import Subjects
from mdq.contracts import pb
from mdq.core.spec import normalize_job
from mdq.store.engine import create_engine
from mdq.store.queries import usage_history
from tests.integration.test_projector import (
    History,
    projected_as_administrator,
    requeue_history,
)

USAGE = pb.AttemptUsage(
    peak_memory_mb=612.5,
    cpu_seconds=90.0,
    wall_seconds=60.0,
    mean_cores=1.5,
    ns_per_day=31.0,
    source="rusage",
    memory_limit_mb=2048,
    cpu_limit=2.0,
    exit_code=0,
    steps=800,
)


@pytest.fixture
async def projected(
    nc: Client, subjects: Subjects, database_url: str
) -> AsyncIterator[tuple[asyncpg.Pool, History, History]]:
    retried = History("retried")
    first, second = requeue_history(retried)
    doomed = History("doomed", request_id="ba9876543210")
    outputs = pb.JobOutputs(
        final_step=1000,
        output_dir=f"/data/jobs/{retried.job_id}",
        files=[
            pb.OutputFile(
                kind="trajectory",
                path="trajectory.dcd",
                sha256="cd" * 32,
                size_bytes=123_456,
                format="dcd",
                frames=40,
            ),
            pb.OutputFile(kind="final_state", path="final.xml", sha256="ef" * 32, format="xml"),
        ],
    )
    events = [
        *first,
        *second,
        retried.event("outputs", outputs, 2),
        retried.event("usage", USAGE, 2),
        doomed.submitted(),
        doomed.bound(1, "n1"),
        doomed.started(1, "n1"),
        doomed.attempt_failed(1, "n1", last_step=40),
        doomed.failed(1),
    ]
    async with projected_as_administrator(nc.jetstream(), subjects, database_url, events) as pool:
        yield pool, retried, doomed


async def test_job_timeline_is_the_jobs_events_in_order(
    projected: tuple[asyncpg.Pool, History, History],
) -> None:
    pool, retried, _ = projected
    rows = await pool.fetch(
        "SELECT kind, attempt, time FROM job_timeline WHERE job_id = $1 ORDER BY time, stream_seq",
        retried.job_id,
    )
    kinds = [row["kind"] for row in rows if row["kind"] != "progress"]
    assert kinds == [
        "submitted",
        "bound",
        "started",
        "checkpoint",
        "attempt_failed",
        "requeued",
        "bound",
        "started",
        "succeeded",
        "outputs",
        "usage",
    ]
    assert sum(row["kind"] == "progress" for row in rows) == 11
    assert rows[-1]["time"] == retried.times["usage:2"]


async def test_attempt_history_has_placement_checkpoint_and_loss(
    projected: tuple[asyncpg.Pool, History, History],
) -> None:
    pool, retried, _ = projected
    rows = await pool.fetch(
        "SELECT * FROM attempt_history WHERE job_id = $1 ORDER BY attempt", retried.job_id
    )
    first, second = rows
    assert (first["node"], first["failure_reason"], first["steps_lost"]) == (
        "n1",
        "FAILURE_OOM_KILLED",
        100,
    )
    assert first["placement_score"] == pytest.approx(0.75)
    assert first["placement_candidates"] == 2
    assert second["checkpoint_step_used"] == 200
    started, ended = retried.times["started:2"], retried.times["succeeded:2"]
    assert float(second["run_s"]) == pytest.approx((ended - started).total_seconds())
    assert float(second["start_delay_s"]) == pytest.approx(1.0)  # bound one second before


async def test_failures_by_reason_counts_attempts_jobs_and_lost_steps(
    projected: tuple[asyncpg.Pool, History, History],
) -> None:
    pool, _, doomed = projected
    rows = {row["reason"]: row for row in await pool.fetch("SELECT * FROM failures_by_reason")}
    assert set(rows) == {"FAILURE_OOM_KILLED"}  # both failed attempts ran out of memory
    oom = rows["FAILURE_OOM_KILLED"]
    assert (oom["attempts"], oom["jobs"], oom["steps_lost"]) == (2, 2, 100)
    assert oom["last_at"] == max(doomed.times["attempt_failed:1"], oom["last_at"])


async def test_node_utilisation_adds_up_busy_time_per_node_and_hour(
    projected: tuple[asyncpg.Pool, History, History],
) -> None:
    pool, retried, doomed = projected
    rows = await pool.fetch("SELECT * FROM node_utilisation ORDER BY node, hour")
    by_node = {row["node"]: row for row in rows}
    assert set(by_node) == {"n1", "n2"}  # all within one hour
    n1_busy = (retried.times["attempt_failed:1"] - retried.times["started:1"]) + (
        doomed.times["attempt_failed:1"] - doomed.times["started:1"]
    )
    assert by_node["n1"]["attempts"] == 2
    assert float(by_node["n1"]["busy_s"]) == pytest.approx(n1_busy.total_seconds())
    n2_busy = retried.times["succeeded:2"] - retried.times["started:2"]
    assert float(by_node["n2"]["cpu_core_s"]) == pytest.approx(n2_busy.total_seconds() * 1.0)
    assert by_node["n2"]["hour"] + timedelta(hours=1) > retried.times["succeeded:2"]


async def test_node_utilisation_since_is_the_view_from_that_hour_on(
    projected: tuple[asyncpg.Pool, History, History],
) -> None:
    """The function docs/history.md uses for "the last 24 hours" gives the view's rows from
    the hour of its argument on, without spreading the whole history over its hours."""
    pool, retried, doomed = projected
    oldest = min(doomed.times["started:1"], retried.times["started:1"])
    for since in (oldest - timedelta(hours=2), oldest, datetime.now(UTC) + timedelta(hours=2)):
        view = await pool.fetch(
            "SELECT node, hour, attempts, busy_s, cpu_core_s FROM node_utilisation "
            "WHERE hour >= date_trunc('hour', $1::timestamptz) ORDER BY node, hour",
            since,
        )
        function = await pool.fetch(
            "SELECT node, hour, attempts, busy_s, cpu_core_s FROM node_utilisation_since($1) "
            "ORDER BY node, hour",
            since,
        )
        assert [tuple(row) for row in function] == [tuple(row) for row in view], since
    assert view == [] and function == []  # the last since is in the future
    everything = await pool.fetchval("SELECT count(*) FROM node_utilisation_since($1)", oldest)
    assert everything == 2  # n1's hour and n2's: the test's history, all of it


async def test_job_outputs_lists_each_reported_file(
    projected: tuple[asyncpg.Pool, History, History],
) -> None:
    pool, retried, doomed = projected
    rows = await pool.fetch(
        "SELECT attempt, output_dir, final_step, kind, path, format, size_bytes, sha256, frames "
        "FROM job_outputs WHERE job_id = $1 ORDER BY kind",
        retried.job_id,
    )
    assert [tuple(row.values()) for row in rows] == [
        (
            2,
            f"/data/jobs/{retried.job_id}",
            1000,
            "final_state",
            "final.xml",
            "xml",
            0,
            "ef" * 32,
            0,
        ),
        (
            2,
            f"/data/jobs/{retried.job_id}",
            1000,
            "trajectory",
            "trajectory.dcd",
            "dcd",
            123_456,
            "cd" * 32,
            40,
        ),
    ]
    assert (
        await pool.fetchval("SELECT count(*) FROM job_outputs WHERE job_id = $1", doomed.job_id)
        == 0
    )


DOCS = Path(__file__).resolve().parents[2] / "docs"


def trajectory_example() -> tuple[str, str]:
    """docs/history.md's query for where a job's trajectory is, and the words before it."""
    text = (DOCS / "history.md").read_text()
    after = text.partition("Where a job's trajectory is")[2]
    return after.split("```sql", 1)[0], after.split("```sql", 1)[1].split("```", 1)[0]


async def test_the_trajectory_example_says_when_it_returns_nothing(
    projected: tuple[asyncpg.Pool, History, History],
) -> None:
    """The docs' query, as a reader pastes it: a row for a job that wrote a trajectory,
    nothing for one that did not, which is every job by default (trajectories are off unless
    ``trajectory_interval_steps`` is set), and the docs say so next to it."""
    pool, retried, doomed = projected
    words, query = trajectory_example()
    assert "trajectory_interval_steps" in words and "returns nothing" in words, words
    example_id = re.search(r"job_id = '([^']+)'", query)
    assert example_id is not None, query
    for job, rows in ((retried, 1), (doomed, 0)):
        found = await pool.fetch(query.replace(example_id.group(1), job.job_id))
        assert len(found) == rows, (job.job_id, found)
    default = normalize_job(pb.JobSpec(name="a"), "jobs[0]")
    assert default.trajectory_interval_steps == 0


async def test_attempt_usage_and_the_history_the_recommender_reads(
    projected: tuple[asyncpg.Pool, History, History], database_url: str
) -> None:
    pool, retried, _ = projected
    [row] = await pool.fetch("SELECT * FROM attempt_usage WHERE job_id = $1", retried.job_id)
    assert (row["attempt"], row["peak_memory_mb"], row["mean_cores"]) == (2, 612.5, 1.5)
    assert (row["memory_limit_mb"], row["cpu_limit"], row["steps"]) == (2048, 2.0, 800)
    assert (row["ns_per_day"], row["source"], row["exit_code"]) == (31.0, "rusage", 0)
    engine = create_engine(database_url)
    try:
        samples = (await usage_history(engine, days=100_000)).samples()
    finally:
        await engine.dispose()
    measured = [sample for sample in samples if not sample.oom_killed]
    oom = [sample for sample in samples if sample.oom_killed]
    assert [(s.peak_memory_mb, s.mean_cores, s.cpu_limit) for s in measured] == [(612.5, 1.5, 2.0)]
    assert measured[0].fingerprint.threads == 2  # the CPU it ran with
    # both OOM-killed attempts (retried's first, doomed's only) with the limit they ran under
    assert sorted(s.memory_limit_mb for s in oom) == [1024.0, 1024.0]
