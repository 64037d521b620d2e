"""``failure_tallies``: failed attempts per owner and reason, kept by triggers on ``attempts``;
``failures_by_reason`` adds them up and must say what counting ``attempts`` itself says, whatever
statements wrote the attempts (multi-row upserts, rewrites with the same values, a reason changed
or cleared, a latest end moved back, deletes), the same tallies as from scratch, apart per owner;
two writers on different jobs at once neither deadlock nor miscount."""

from __future__ import annotations

import asyncio
import random
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg

from mdq.store.migrate import upgrade_async
from mdq.store.schema_sql import TENANT_PREFIX
from tests.helpers import insert_job_rows

NOW = datetime(2026, 12, 4, 12, tzinfo=UTC)
REASONS = ("FAILURE_OOM_KILLED", "FAILURE_CRASHED", "FAILURE_EVICTED", None)
OWNERS = ("", "alice.", "lab.")
UPSERT = (
    "INSERT INTO attempts (job_id, attempt, node, ended_at, resumed_from_step, steps_lost, "
    "last_step, failure_reason) "
    "SELECT * FROM unnest($1::text[], $2::int[], $3::text[], $4::timestamptz[], $5::int[], "
    "$6::int[], $7::int[], $8::text[]) "
    "ON CONFLICT (job_id, attempt) DO UPDATE SET ended_at = EXCLUDED.ended_at, "
    "steps_lost = EXCLUDED.steps_lost, failure_reason = EXCLUDED.failure_reason"
)
BY_REASON = "SELECT reason, attempts, jobs, steps_lost, last_at FROM failures_by_reason"
TALLIES = "SELECT * FROM failure_tallies"
COUNTED = """
    SELECT a.failure_reason AS reason, count(*) AS attempts,
           count(DISTINCT a.job_id) AS jobs, sum(a.steps_lost) AS steps_lost,
           max(a.ended_at) AS last_at
    FROM attempts a
    WHERE a.failure_reason IS NOT NULL
    GROUP BY a.failure_reason
"""
"""Failed attempts by reason, counted from ``attempts`` itself: what the view must say."""
FROM_SCRATCH = f"""
    INSERT INTO failure_tallies (tenant_prefix, reason, attempts, jobs, steps_lost, last_at)
    SELECT {TENANT_PREFIX.format(j="job_id")}, failure_reason, count(*), count(DISTINCT job_id),
           sum(steps_lost), max(ended_at)
    FROM attempts WHERE failure_reason IS NOT NULL
    GROUP BY 1, 2
"""
"""The tallies of every attempt there is, at once: what the triggers must have kept."""


async def _jobs(connection: asyncpg.Connection, jobs: list[str]) -> None:
    await insert_job_rows(connection, dict.fromkeys(jobs, "{}"))


def _row(job: str, attempt: int, rng: random.Random) -> tuple[Any, ...]:
    """One attempt row with a random reason, steps lost and end."""
    reason = rng.choice(REASONS)
    lost = rng.choice((0, 10, 250))
    ended = NOW + timedelta(minutes=rng.randrange(-60, 60))
    return (job, attempt, "n1", ended, 0, lost, 0, reason)


async def _upsert(connection: asyncpg.Connection, rows: list[tuple[Any, ...]]) -> None:
    columns = list(zip(*rows, strict=True))
    await connection.execute(UPSERT, *(list(column) for column in columns))


async def _both(connection: asyncpg.Connection) -> tuple[set[tuple[Any, ...]], set[Any]]:
    """The view as the tallies give it, and as counting ``attempts`` gives it."""
    tallied = {tuple(row.values()) for row in await connection.fetch(BY_REASON)}
    counted = {tuple(row.values()) for row in await connection.fetch(COUNTED)}
    return tallied, counted


async def test_the_view_says_what_counting_the_attempts_says_after_any_statement(
    connection: asyncpg.Connection,
) -> None:
    rng = random.Random(19)
    jobs = [f"{owner}{index:012x}-md" for owner in OWNERS for index in range(12)]
    await _jobs(connection, jobs)
    for step in range(60):
        kind = rng.choice(("batch", "batch", "one", "same", "delete", "move_latest_back"))
        if kind == "batch":  # a batch of upserts, new attempts and rewritten ones
            picked = rng.sample(jobs, 8)
            await _upsert(connection, [_row(job, rng.randint(1, 3), rng) for job in picked])
        elif kind == "one":
            await _upsert(connection, [_row(rng.choice(jobs), rng.randint(1, 3), rng)])
        elif kind == "same":  # the watcher writes a job's attempts back whole
            await connection.execute(
                "UPDATE attempts SET node = node WHERE job_id = ANY($1::text[])",
                rng.sample(jobs, 6),
            )
        elif kind == "delete":
            await connection.execute(
                "DELETE FROM attempts WHERE job_id = $1 AND attempt = $2",
                rng.choice(jobs),
                rng.randint(1, 3),
            )
        else:  # the attempt holding a reason's latest end ends earlier
            await connection.execute(
                "UPDATE attempts SET ended_at = ended_at - interval '3 hours' "
                "WHERE (failure_reason, ended_at) IN (SELECT failure_reason, max(ended_at) "
                "FROM attempts WHERE failure_reason IS NOT NULL GROUP BY failure_reason "
                "LIMIT 1)"
            )
        tallied, counted = await _both(connection)
        assert tallied == counted, (step, kind)
    failed = await connection.fetchval(
        "SELECT count(*) FROM attempts WHERE failure_reason IS NOT NULL"
    )
    live = {tuple(row.values()) for row in await connection.fetch(TALLIES)}
    await connection.execute("TRUNCATE failure_tallies")
    await connection.execute(FROM_SCRATCH)
    from_scratch = {tuple(row.values()) for row in await connection.fetch(TALLIES)}
    assert failed > 20, "the sequence left failed attempts of several jobs"
    assert {row for row in live if row[2] > 0} == from_scratch, "the same tallies from scratch"


async def test_each_owner_has_its_own_tallies(connection: asyncpg.Connection) -> None:
    jobs = ["000000000001-md", "alice.000000000001-md", "alice.000000000002-md"]
    await _jobs(connection, jobs)
    rows = [(job, 1, "n1", NOW, 0, 5, 0, "FAILURE_CRASHED") for job in jobs]
    rows.append((jobs[1], 2, "n1", NOW + timedelta(minutes=1), 0, 0, 0, "FAILURE_CRASHED"))
    await _upsert(connection, rows)
    tallies = {
        row["tenant_prefix"]: tuple(row.values())[2:] for row in await connection.fetch(TALLIES)
    }
    [view] = await connection.fetch(BY_REASON)
    assert tallies == {
        "": (1, 1, 5, NOW),
        "alice.": (3, 2, 10, NOW + timedelta(minutes=1)),
    }
    assert tuple(view.values()) == ("FAILURE_CRASHED", 4, 3, 15, NOW + timedelta(minutes=1))


async def test_two_writers_on_different_jobs_at_once_count_every_attempt(
    database_url: str,
) -> None:
    """Two writers upsert failed attempts of their own jobs, the same owner's and the same
    reasons (their rows in opposite orders), in transactions that overlap, as two watchers'
    batches would: no deadlock, and the totals are the attempts'."""
    await upgrade_async(database_url)
    setup = await asyncpg.connect(database_url)
    jobs = {side: [f"{side}{index:011x}-md" for index in range(20)] for side in ("a", "b")}
    await _jobs(setup, jobs["a"] + jobs["b"])
    reasons = ["FAILURE_CRASHED", "FAILURE_OOM_KILLED", "FAILURE_EVICTED"]

    async def writer(side: str, order: list[str]) -> None:
        connection = await asyncpg.connect(database_url)
        try:
            for attempt in range(1, 6):
                rows = [
                    (job, attempt, "n", NOW, 0, 1, 0, order[index % len(order)])
                    for index, job in enumerate(jobs[side])
                ]
                async with connection.transaction():
                    await _upsert(connection, rows)
                    await asyncio.sleep(0.01)  # hold the tallies while the other one writes
        finally:
            await connection.close()

    try:
        await asyncio.wait_for(
            asyncio.gather(writer("a", reasons), writer("b", reasons[::-1])), timeout=60
        )
        tallied, counted = await _both(setup)
    finally:
        await setup.close()
    assert tallied == counted
    assert sum(row[1] for row in tallied) == 2 * 20 * 5
    assert sum(row[2] for row in tallied) == 2 * 20, "every job once per reason"
