"""``usage_samples`` (revision 0013): one row per usage event, kept by a trigger on job_events,
with the job's system; filled from existing events on upgrade, gone on downgrade."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import asyncpg
from alembic import command

from mdq.store.migrate import alembic_config, upgrade_async

WATER = {"water_box": {"box_nm": 3.0}}
INSERT_EVENT = (
    "INSERT INTO job_events (event_id, stream, stream_seq, job_id, attempt, kind, time, "
    "producer, body) VALUES ($1, 'NS_JOBS', $2, $3, $4, $5, now(), 'test', $6::jsonb)"
)
USAGE = {
    "peak_memory_mb": 812.5,
    "mean_cores": 3.5,
    "cpu_seconds": 70.0,
    "wall_seconds": 20.0,
    "memory_limit_mb": "2048",
    "cpu_limit": 4.0,
}


def _submitted(job: str, system: dict[str, Any]) -> tuple[Any, ...]:
    body = json.dumps({"spec": {"name": "md", "system": system}})
    return (f"submitted:{job}", 1, job, 0, "submitted", body)


def _usage(job: str, attempt: int, seq: int) -> tuple[Any, ...]:
    return (f"usage:{job}:{attempt}", seq, job, attempt, "usage", json.dumps(USAGE))


async def _samples(connection: asyncpg.Connection) -> list[tuple[Any, ...]]:
    rows = await connection.fetch(
        "SELECT job_id, attempt, system_kind, box_nm, peak_memory_mb, mean_cores, "
        "memory_limit_mb, cpu_limit FROM usage_samples ORDER BY job_id, attempt"
    )
    return [tuple(row.values()) for row in rows]


async def test_each_usage_event_is_one_sample_with_its_jobs_system(database_url: str) -> None:
    await upgrade_async(database_url)
    connection = await asyncpg.connect(database_url)
    try:
        # a job whose row is written (its spec in jobs), and one whose submitted event comes in
        # the same statement as its usage (the projector writes events before it folds jobs)
        await connection.execute(
            "INSERT INTO jobs (job_id, request_id, name, task, state, attempt, priority_class, "
            "spec, depends_on, submitted_at, updated_at, target_steps, last_step) VALUES "
            "('aaaa-md', 'aaaa', 'md', 'TASK_MD', 'SUCCEEDED', 1, 'normal', $1::jsonb, '{}', "
            "now(), now(), 100, 100)",
            json.dumps({"system": {"structure": {"pdb": "x.pdb"}}}),
        )
        await connection.executemany(
            INSERT_EVENT,
            [_usage("aaaa-md", 1, 2)],
        )
        # one statement: the submitted event and two attempts' usage
        await connection.execute(
            "INSERT INTO job_events (event_id, stream, stream_seq, job_id, attempt, kind, time, "
            "producer, body) SELECT e, 'NS_JOBS', s, j, a, k, now(), 'test', b::jsonb "
            "FROM unnest($1::text[], $2::bigint[], $3::text[], $4::int[], $5::text[], "
            "$6::text[]) AS u(e, s, j, a, k, b)",
            *zip(
                _submitted("bbbb-md", WATER),
                _usage("bbbb-md", 1, 3),
                _usage("bbbb-md", 2, 4),
                strict=True,
            ),
        )
        # an event of another kind is no sample
        await connection.execute(INSERT_EVENT, "bound:bbbb-md:3", 5, "bbbb-md", 3, "bound", "{}")
        first = await _samples(connection)
        # a redelivered usage event (a new time: not a key conflict in job_events) adds nothing
        await connection.execute(
            "INSERT INTO job_events (event_id, stream, stream_seq, job_id, attempt, kind, time, "
            "producer, body) VALUES ('usage:bbbb-md:1/again', 'NS_JOBS', 6, 'bbbb-md', 1, "
            "'usage', now() + interval '1 second', 'test', $1::jsonb)",
            json.dumps(USAGE),
        )
        again = await _samples(connection)
    finally:
        await connection.close()
    assert first == [
        ("aaaa-md", 1, "structure", None, 812.5, 3.5, 2048, 4.0),
        ("bbbb-md", 1, "water_box", 3.0, 812.5, 3.5, 2048, 4.0),
        ("bbbb-md", 2, "water_box", 3.0, 812.5, 3.5, 2048, 4.0),
    ]
    assert again == first


async def test_upgrade_fills_it_from_the_events_and_downgrade_removes_it(
    database_url: str,
) -> None:
    await asyncio.to_thread(command.upgrade, alembic_config(database_url), "0012_job_control")
    connection = await asyncpg.connect(database_url)
    try:
        await connection.executemany(
            INSERT_EVENT, [_submitted("cccc-md", WATER), _usage("cccc-md", 1, 2)]
        )
        await upgrade_async(database_url)
        filled = await _samples(connection)

        await asyncio.to_thread(command.downgrade, alembic_config(database_url), "0012_job_control")
        table = await connection.fetchval("SELECT to_regclass('usage_samples')")
        function = await connection.fetchval("SELECT to_regprocedure('mdq_usage_samples_insert()')")
        # events still insert without the trigger
        await connection.execute(*(INSERT_EVENT, *_usage("cccc-md", 2, 3)))
        events = await connection.fetchval("SELECT count(*) FROM job_events")
    finally:
        await connection.close()
    assert filled == [("cccc-md", 1, "water_box", 3.0, 812.5, 3.5, 2048, 4.0)]
    assert (table, function, events) == (None, None, 3)
