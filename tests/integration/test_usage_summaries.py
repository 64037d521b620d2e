"""``usage_summaries``: per kind of job, its newest samples as arrays, kept by a trigger on
``usage_samples``; the same whatever order the samples came in and as from the samples alone,
apart per owner; what ``usage_history`` reads."""

from __future__ import annotations

import asyncio
import json
import random
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg

from mdq.store.engine import create_engine
from mdq.store.migrate import upgrade_async
from mdq.store.queries import usage_history
from mdq.store.schema_sql import SAMPLES_PER_KIND, SUMMARIZE
from tests.helpers import insert_job_rows

SPEC = {"name": "md", "system": {"water_box": {"box_nm": 3.0}}, "resources": {"cpu": 2}}
NOW = datetime.now(UTC)
INSERT_USAGE = (
    "INSERT INTO job_events (event_id, stream, stream_seq, job_id, attempt, kind, time, "
    "producer, body) VALUES ($1, 'NS_JOBS', $2, $3, 1, 'usage', $4, 'test', $5::jsonb)"
)
SUMMARY = (
    "SELECT spec_key, cpu_limit, oom_killed, owner, job_id, newest, spec, peak_memory_mb, "
    "mean_cores, memory_limit_mb FROM usage_summaries ORDER BY owner, oom_killed"
)


async def _job(connection: asyncpg.Connection, job: str) -> None:
    await connection.execute(
        "INSERT INTO jobs (job_id, request_id, name, task, state, attempt, priority_class, "
        "spec, depends_on, submitted_at, updated_at, target_steps, last_step) VALUES ($1, $1, "
        "'md', 'TASK_MD', 'SUCCEEDED', 1, 'normal', $2::jsonb, '{}', now(), now(), 100, 100)",
        job,
        json.dumps(SPEC),
    )


def _usage(job: str, index: int) -> tuple[Any, ...]:
    """The usage event of ``job``: run ``index`` minutes ago, peak ``1000 - index`` MiB."""
    body = {
        "peak_memory_mb": 1000.0 - index,
        "mean_cores": 1.5,
        "cpu_seconds": 60.0,
        "wall_seconds": 40.0,
        "memory_limit_mb": "2048",
        "cpu_limit": 2.0,
    }
    return (f"usage:{job}:1", index + 1, job, NOW - timedelta(minutes=index), json.dumps(body))


async def _summaries(connection: asyncpg.Connection) -> list[tuple[Any, ...]]:
    return [tuple(row.values()) for row in await connection.fetch(SUMMARY)]


async def test_a_kind_keeps_its_newest_samples_newest_first_whatever_their_order(
    database_url: str,
) -> None:
    await upgrade_async(database_url)
    jobs = [f"{index:012x}-md" for index in range(40)]
    connection = await asyncpg.connect(database_url)
    try:
        for job in jobs:
            await _job(connection, job)
        shuffled = list(enumerate(jobs))
        random.Random(5).shuffle(shuffled)
        # one statement with ten samples, then one statement each
        await connection.executemany(INSERT_USAGE, [_usage(job, i) for i, job in shuffled[:10]])
        for index, job in shuffled[10:]:
            await connection.execute(INSERT_USAGE, *_usage(job, index))
        live = await _summaries(connection)
        await connection.execute("TRUNCATE usage_summaries")
        await connection.execute(SUMMARIZE.format(source="usage_samples"))
        from_scratch = await _summaries(connection)
    finally:
        await connection.close()

    [(_, cpu, oom, owner, job, newest, spec, peaks, cores, limits)] = live
    kept = SAMPLES_PER_KIND
    assert (cpu, oom, owner, job) == (2.0, False, "", jobs[0])
    assert newest == NOW - timedelta(minutes=0)
    assert peaks == [1000.0 - index for index in range(kept)], "the newest, newest first"
    assert cores == [1.5] * kept and limits == [2048.0] * kept
    assert json.loads(spec)["system"] == SPEC["system"]
    assert from_scratch == live, "the same summary from the samples alone"

    engine = create_engine(database_url)
    try:
        history = await usage_history(engine, days=1)
    finally:
        await engine.dispose()
    [group] = history.groups()
    assert list(group.peak_memory_mb) == peaks and group.fingerprint.threads == 2


async def test_each_owners_kinds_are_apart_and_an_oom_kill_keeps_its_limit(
    connection: asyncpg.Connection,
) -> None:
    """The same spec run by the operator and by tenant alice is two kinds (row security shows
    alice hers only, tests/integration/test_tenant_rows.py); an OOM kill (the attempts trigger)
    is a kind of its own with the limit it was killed at, and an ended attempt changed again
    (an UPDATE of its sample) is summarized again."""
    for job in ("000000000001-md", "alice.000000000002-md"):
        await _job(connection, job)
        await connection.execute(INSERT_USAGE, *_usage(job, 1))
    await _job(connection, "000000000003-md")
    bound = json.dumps({"node": "n", "resources": {"cpu": 2, "memory_mb": "512"}})
    await connection.execute(
        "INSERT INTO job_events (event_id, stream, stream_seq, job_id, attempt, kind, time, "
        "producer, body) VALUES ('bound:3', 'NS_JOBS', 9, '000000000003-md', 1, 'bound', "
        "now(), 'test', $1::jsonb)",
        bound,
    )
    for ended in (NOW - timedelta(minutes=5), NOW):
        await connection.execute(
            "INSERT INTO attempts (job_id, attempt, node, bound_at, ended_at, "
            "resumed_from_step, steps_lost, last_step, failure_reason) VALUES "
            "('000000000003-md', 1, 'n', now(), $1, 0, 0, 0, 'FAILURE_OOM_KILLED') "
            "ON CONFLICT (job_id, attempt) DO UPDATE SET ended_at = EXCLUDED.ended_at",
            ended,
        )
    rows = await connection.fetch(SUMMARY)
    kinds = {(row["owner"], row["oom_killed"]): row for row in rows}
    assert set(kinds) == {("", False), ("", True), ("alice", False)}
    assert kinds[("alice", False)]["job_id"] == "alice.000000000002-md"
    assert kinds[("", False)]["job_id"] == "000000000001-md"
    oom = kinds[("", True)]
    assert (oom["memory_limit_mb"], oom["newest"]) == ([512.0], NOW)
    assert len({row["spec_key"] for row in rows}) == 1, "one spec: one key"


async def test_each_new_sample_of_a_kind_joins_its_one_summary(
    connection: asyncpg.Connection,
) -> None:
    for index in range(3):
        job = f"{index:012x}-md"
        await _job(connection, job)
        await connection.execute(INSERT_USAGE, *_usage(job, index))
    before = await _summaries(connection)
    await _job(connection, "000000000003-md")
    await connection.execute(INSERT_USAGE, *_usage("000000000003-md", 3))
    after = await _summaries(connection)
    assert len(before) == 1 and len(before[0][7]) == 3
    assert len(after) == 1 and len(after[0][7]) == 4


async def test_two_writers_of_oom_kills_of_the_same_kinds_at_once_do_not_deadlock(
    database_url: str,
) -> None:
    """Two transactions write OOM-killed attempts of their own jobs, of the same five kinds of
    job, each in one statement (as the watcher writes a batch), their rows in opposite orders,
    again and again at the same time: each statement locks the kinds' summaries in key order,
    so one waits for the other instead of a cycle of waits (a deadlock PostgreSQL breaks by
    failing one of them)."""
    await upgrade_async(database_url)
    setup = await asyncpg.connect(database_url)
    kinds, rounds = 5, 15
    specs = [json.dumps(dict(SPEC, resources={"cpu": cpu})) for cpu in range(1, kinds + 1)]
    jobs = {
        side: [f"{side}{index:011x}-md" for index in range(kinds * rounds)] for side in ("a", "b")
    }
    await insert_job_rows(
        setup,
        {job: specs[index % kinds] for side in jobs for index, job in enumerate(jobs[side])},
        state="FAILED",
    )

    async def writer(side: str, reverse: bool) -> None:
        connection = await asyncpg.connect(database_url)
        try:
            for round_ in range(rounds):
                batch = jobs[side][round_ * kinds : (round_ + 1) * kinds]
                async with connection.transaction():
                    await connection.execute(
                        "INSERT INTO attempts (job_id, attempt, node, ended_at, "
                        "resumed_from_step, steps_lost, last_step, failure_reason) "
                        "SELECT j, 1, 'n', now(), 0, 0, 0, 'FAILURE_OOM_KILLED' "
                        "FROM unnest($1::text[]) AS j",
                        batch[::-1] if reverse else batch,
                    )
                    await asyncio.sleep(0.01)  # hold the summaries while the other one writes
        finally:
            await connection.close()

    try:
        await asyncio.wait_for(asyncio.gather(writer("a", False), writer("b", True)), timeout=60)
        summaries = await setup.fetch(
            "SELECT cardinality(memory_limit_mb) AS n FROM usage_summaries WHERE oom_killed"
        )
    finally:
        await setup.close()
    assert sorted(row["n"] for row in summaries) == [2 * rounds] * kinds
