"""``node_hours``: what ended attempts added to each node's hours, per owner, kept by triggers on
``attempts``. ``node_utilisation_since`` adds them up and spreads only the running attempts, and
must give what spreading every attempt gives after any statement: multi-row upserts, an attempt
that starts, ends, moves or is deleted, rewrites with the same values, an attempt over several
hours; the same tallies from scratch; apart per owner."""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest

from mdq.store.schema_sql import SPREAD
from tests.helpers import insert_job_rows

HOUR = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
UPSERT = (
    "INSERT INTO attempts (job_id, attempt, node, started_at, ended_at, resumed_from_step, "
    "steps_lost, last_step) "
    "SELECT j, a, n, s, e, 0, 0, 0 FROM unnest($1::text[], $2::int[], $3::text[], "
    "$4::timestamptz[], $5::timestamptz[]) AS u(j, a, n, s, e) "
    "ON CONFLICT (job_id, attempt) DO UPDATE SET node = EXCLUDED.node, "
    "started_at = EXCLUDED.started_at, ended_at = EXCLUDED.ended_at"
)
SPREAD_EVERY_ATTEMPT = """
    SELECT a.node, h.hour, count(*) AS attempts,
           sum(EXTRACT(EPOCH FROM (
               LEAST(COALESCE(a.ended_at, now()), h.hour + interval '1 hour')
               - GREATEST(a.started_at, h.hour)))) AS busy_s,
           sum(COALESCE((j.spec->'resources'->>'cpu')::float8, 1.0) * EXTRACT(EPOCH FROM (
               LEAST(COALESCE(a.ended_at, now()), h.hour + interval '1 hour')
               - GREATEST(a.started_at, h.hour)))) AS cpu_core_s
    FROM attempts a
    JOIN jobs j ON j.job_id = a.job_id
    CROSS JOIN LATERAL generate_series(
        date_trunc('hour', GREATEST(a.started_at, since)), COALESCE(a.ended_at, now()),
        interval '1 hour'
    ) AS h(hour)
    WHERE a.started_at IS NOT NULL AND a.node IS NOT NULL
      AND (a.ended_at > date_trunc('hour', since) OR a.ended_at IS NULL)
    GROUP BY a.node, h.hour
"""
"""Every attempt of the window from ``since`` spread over its hours, each time: what the node
hours must add up to."""
FROM_SCRATCH = f"""
    INSERT INTO node_hours (hour, node, tenant_prefix, attempts, busy_s, cpu_core_s)
    SELECT hour, node, tenant_prefix, count(*), sum(busy_s), sum(busy_s * cores)
    FROM ({SPREAD.format(attempts="attempts", sign="1", end="a.ended_at", since="a.started_at")}
          WHERE a.node IS NOT NULL AND a.started_at IS NOT NULL AND a.ended_at IS NOT NULL
         ) spread
    GROUP BY hour, node, tenant_prefix
"""
"""The node hours of every ended attempt there is, at once: what the triggers must have kept."""
SINCE = HOUR - timedelta(hours=30)
ROWS = "SELECT node, hour, attempts, busy_s, cpu_core_s FROM {} ORDER BY node, hour"


async def _jobs(connection: asyncpg.Connection, jobs: list[str]) -> None:
    """The jobs' rows, asking for 1, 2 and 3 cores in turn."""
    specs = {job: json.dumps({"resources": {"cpu": 1 + i % 3}}) for i, job in enumerate(jobs)}
    await insert_job_rows(connection, specs)


async def _upsert(connection: asyncpg.Connection, rows: list[tuple[Any, ...]]) -> None:
    await connection.execute(UPSERT, *(list(column) for column in zip(*rows, strict=True)))


def _attempt(job: str, rng: random.Random) -> tuple[Any, ...]:
    """An attempt of ``job`` somewhere in the last day: not started, running, or ended after up
    to three hours, on one of three nodes."""
    started = HOUR - timedelta(minutes=rng.randrange(0, 24 * 60))
    ended = started + timedelta(seconds=rng.randrange(1, 3 * 3600))
    state = rng.choice(("pending", "running", "ended", "ended", "ended"))
    node = None if state == "pending" and rng.random() < 0.5 else rng.choice(("n1", "n2", "n3"))
    return (
        job,
        rng.randint(1, 2),
        node,
        None if state == "pending" else started,
        ended if state == "ended" else None,
    )


async def _compare(connection: asyncpg.Connection) -> tuple[list[Any], list[Any]]:
    """Per node and hour from ``SINCE``: from the tallies, and spreading every attempt. The
    figures are rounded to the microsecond: the core-seconds of the spread are ``float8``."""
    async with connection.transaction():  # one now() for both
        tallied = await connection.fetch(ROWS.format("node_utilisation_since($1)"), SINCE)
        spread = await connection.fetch(
            ROWS.format(f"({SPREAD_EVERY_ATTEMPT.replace('since', '$1::timestamptz')}) s"),
            SINCE,
        )

    def rounded(rows: list[asyncpg.Record]) -> list[tuple[Any, ...]]:
        return [
            (
                r["node"],
                r["hour"],
                r["attempts"],
                round(float(r["busy_s"]), 6),
                round(float(r["cpu_core_s"]), 6),
            )
            for r in rows
        ]

    return rounded(tallied), rounded(spread)


async def test_the_tallies_give_what_spreading_every_attempt_gives_after_any_statement(
    connection: asyncpg.Connection,
) -> None:
    rng = random.Random(20)
    jobs = [f"{owner}{index:012x}-md" for owner in ("", "alice.") for index in range(15)]
    await _jobs(connection, jobs)
    for step in range(50):
        kind = rng.choice(("batch", "batch", "one", "same", "end", "delete"))
        if kind == "batch":
            picked = rng.sample(jobs, 8)
            rows = {(row[0], row[1]): row for row in (_attempt(j, rng) for j in picked)}
            await _upsert(connection, list(rows.values()))
        elif kind == "one":
            await _upsert(connection, [_attempt(rng.choice(jobs), rng)])
        elif kind == "same":  # the watcher writes a job's attempts back whole
            await connection.execute(
                "UPDATE attempts SET node = node WHERE job_id = ANY($1::text[])",
                rng.sample(jobs, 6),
            )
        elif kind == "end":  # running attempts end (start and node as they were)
            await connection.execute(
                "UPDATE attempts SET ended_at = started_at + interval '47 minutes' "
                "WHERE ended_at IS NULL AND started_at IS NOT NULL "
                "AND job_id = ANY($1::text[])",
                rng.sample(jobs, 10),
            )
        else:
            await connection.execute("DELETE FROM attempts WHERE job_id = $1", rng.choice(jobs))
        tallied, spread = await _compare(connection)
        assert tallied == spread, (step, kind)
    ended = await connection.fetchval(
        "SELECT count(*) FROM attempts WHERE ended_at IS NOT NULL AND node IS NOT NULL"
    )
    live = await connection.fetch("SELECT * FROM node_hours WHERE attempts > 0 ORDER BY 1, 2, 3")
    await connection.execute("TRUNCATE node_hours")
    await connection.execute(FROM_SCRATCH)
    from_scratch = await connection.fetch("SELECT * FROM node_hours ORDER BY 1, 2, 3")
    assert ended > 10, "the sequence left ended attempts"
    assert [tuple(r) for r in live] == [tuple(r) for r in from_scratch], "the same from scratch"


async def test_an_attempt_over_three_hours_counts_in_each_and_each_owner_apart(
    connection: asyncpg.Connection,
) -> None:
    jobs = ["000000000001-md", "alice.000000000002-md"]
    await _jobs(connection, jobs)  # cores 1 and 2
    start = HOUR - timedelta(hours=5, minutes=30)
    await _upsert(
        connection,
        [
            (jobs[0], 1, "n1", start, start + timedelta(hours=2)),
            (jobs[1], 1, "n1", start, start + timedelta(minutes=10)),
        ],
    )
    rows = await connection.fetch(
        "SELECT hour, tenant_prefix, attempts, busy_s, cpu_core_s FROM node_hours "
        "ORDER BY hour, tenant_prefix"
    )
    [first] = await connection.fetch(
        "SELECT * FROM node_utilisation WHERE hour = $1", start.replace(minute=0)
    )
    h = start.replace(minute=0)
    assert [tuple(r) for r in rows] == [
        (h, "", 1, 1800, 1800),
        (h, "alice.", 1, 600, 1200),
        (h + timedelta(hours=1), "", 1, 3600, 3600),
        (h + timedelta(hours=2), "", 1, 1800, 1800),
    ]
    assert (first["attempts"], first["busy_s"], first["cpu_core_s"]) == (2, 2400, 3000.0)


async def test_attempts_that_end_on_the_hour_count_in_it_and_in_the_hour_they_end_in(
    connection: asyncpg.Connection,
) -> None:
    jobs = [f"{index:012x}-md" for index in range(3)]
    await _jobs(connection, jobs)
    start = HOUR - timedelta(hours=2)
    await _upsert(connection, [(j, 1, "n1", start, start + timedelta(hours=1)) for j in jobs])
    rows = await connection.fetch(ROWS.format("node_utilisation"))
    tallies = await connection.fetchval("SELECT count(*) FROM node_hours")
    assert tuple(rows[0])[:4] == ("n1", start, 3, 3 * 3600)
    assert tallies == 2, "the hour it ended in counts it too (busy 0): as spreading it does"


@pytest.mark.parametrize("since", [SINCE, HOUR + timedelta(hours=2)], ids=["day", "future"])
async def test_the_function_reads_node_hours_by_hour_not_every_attempt(
    connection: asyncpg.Connection, since: datetime
) -> None:
    await connection.execute("SET enable_seqscan = off")
    plan = await connection.fetchval(
        "EXPLAIN (FORMAT JSON) SELECT * FROM node_utilisation_since($1)", since
    )
    assert "pk_node_hours" in plan and "ix_attempts_ended_at" in plan, plan
