"""``usage_samples``: one row per usage event, kept by a trigger on job_events, with the job's
system; one per OOM-killed attempt, kept by triggers on attempts, with the limits it was bound
with; what the recommender's history reads."""

from __future__ import annotations

import json
import math
from typing import Any

import asyncpg
from google.protobuf import json_format

from mdq.contracts import pb
from mdq.core.recommend import UsageSample, fingerprint_of
from mdq.store.engine import create_engine
from mdq.store.migrate import upgrade_async
from mdq.store.queries import usage_history

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


async def test_each_usage_event_is_one_sample_with_its_jobs_system(
    connection: asyncpg.Connection,
) -> None:
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
    assert first == [
        ("aaaa-md", 1, "structure", None, 812.5, 3.5, 2048, 4.0),
        ("bbbb-md", 1, "water_box", 3.0, 812.5, 3.5, 2048, 4.0),
        ("bbbb-md", 2, "water_box", 3.0, 812.5, 3.5, 2048, 4.0),
    ]
    assert again == first


async def test_an_oom_killed_attempt_is_a_sample_with_the_limits_it_was_bound_with(
    connection: asyncpg.Connection,
) -> None:
    bound = json.dumps({"resources": {"cpu": 3, "memory_mb": "768"}})
    await connection.executemany(
        INSERT_EVENT,
        [
            _submitted("cccc-md", WATER),
            _usage("cccc-md", 1, 2),
            ("bound:cccc-md:3", 9, "cccc-md", 3, "bound", bound),
        ],
    )
    await connection.execute(
        "INSERT INTO jobs (job_id, request_id, name, task, state, attempt, priority_class, "
        "spec, depends_on, submitted_at, updated_at, target_steps, last_step) VALUES "
        "('cccc-md', 'cccc', 'md', 'TASK_MD', 'FAILED', 3, 'normal', $1::jsonb, '{}', "
        "now(), now(), 100, 100)",
        json.dumps({"system": WATER}),
    )
    await connection.execute(
        "INSERT INTO attempts (job_id, attempt, node, bound_at, ended_at, resumed_from_step, "
        "steps_lost, last_step, failure_reason) "
        "VALUES ('cccc-md', 3, 'n', now(), now(), 0, 0, 0, 'FAILURE_OOM_KILLED')"
    )
    samples = await _samples(connection)
    assert samples == [
        ("cccc-md", 1, "water_box", 3.0, 812.5, 3.5, 2048, 4.0),
        ("cccc-md", 3, "water_box", 3.0, 0.0, 0.0, 768, 3.0),
    ]


OLD_USAGE_HISTORY = """
    (SELECT j.job_id, (j.spec - 'name' - 'labels' - 'steps')::text AS spec,
            u.peak_memory_mb, u.mean_cores, u.memory_limit_mb::double precision AS limit_mb,
            u.cpu_limit, false AS oom_killed
     FROM usage_samples u JOIN jobs j ON j.job_id = u.job_id
     WHERE NOT u.oom_killed AND u.peak_memory_mb > 0)
    UNION ALL
    (SELECT j.job_id, (j.spec - 'name' - 'labels' - 'steps')::text, 0.0, 0.0,
            COALESCE((b.body->'resources'->>'memory_mb')::double precision,
                     (j.spec->'resources'->>'memory_mb')::double precision, 0),
            COALESCE((b.body->'resources'->>'cpu')::double precision,
                     (j.spec->'resources'->>'cpu')::double precision, 0), true
     FROM attempts a
     JOIN jobs j ON j.job_id = a.job_id
     JOIN job_events b ON b.job_id = a.job_id AND b.attempt = a.attempt AND b.kind = 'bound'
     WHERE a.failure_reason = 'FAILURE_OOM_KILLED')
"""
"""What the recommender read before usage_samples held its whole input: every spec per sample
and the OOM kills' ``bound`` events from ``job_events`` (the time window left out: every row
here is recent)."""

SPECS = [
    # name, labels and step target differ job to job; the fingerprint does not read them
    {"name": "a", "steps": "1000", "system": WATER, "resources": {"cpu": 2, "memory_mb": "1024"}},
    {
        "name": "b",
        "steps": "9000",
        "labels": {"campaign": "x"},
        "system": WATER,
        "resources": {"cpu": 2, "memory_mb": "1024"},
    },
    {
        "name": "c",
        "system": {"water_box": {"box_nm": 5.0}},
        "cutoff_nm": 1.2,
        "resources": {"cpu": 4, "memory_mb": "4096"},
    },
    {
        "name": "d",
        "system": {"structure": {"pdb": "x.pdb"}},
        "platform": "CUDA",
        "resources": {"cpu": 1, "memory_mb": "2048"},
    },
]


async def test_the_recommenders_history_reads_the_same_samples_as_from_events(
    database_url: str,
) -> None:
    """``usage_history`` (one summary row per kind, one spec per kind) gives the samples that the
    spec of every sample's job and the OOM kills' ``bound`` events give: same fingerprints,
    figures, and the OOM-killed attempts' limits (a measured attempt's is not read)."""
    await upgrade_async(database_url)
    connection = await asyncpg.connect(database_url)
    try:
        for index in range(24):
            job = f"{index:04x}-md"
            spec = SPECS[index % len(SPECS)]
            await connection.execute(
                "INSERT INTO jobs (job_id, request_id, name, task, state, attempt, "
                "priority_class, spec, depends_on, submitted_at, updated_at, target_steps, "
                "last_step) VALUES ($1, $1, 'md', 'TASK_MD', 'SUCCEEDED', 2, 'normal', "
                "$2::jsonb, '{}', now(), now(), 100, 100)",
                job,
                json.dumps(spec),
            )
            bound = {"node": "n", "resources": {"cpu": 1 + index % 3, "memory_mb": "768"}}
            await connection.execute(
                INSERT_EVENT, f"bound:{job}:1", 100 * index + 1, job, 1, "bound", json.dumps(bound)
            )
            oom = index % 3 == 0
            if not oom:
                await connection.execute(INSERT_EVENT, *_usage(job, 1, 100 * index + 2))
            # OOM-killed for every third job: its bound event gives the limits
            await connection.execute(
                "INSERT INTO attempts (job_id, attempt, node, bound_at, ended_at, "
                "resumed_from_step, steps_lost, last_step, failure_reason) "
                "VALUES ($1, 1, 'n', now(), now(), 0, 0, 0, $2)",
                job,
                "FAILURE_OOM_KILLED" if oom else None,
            )
        old = await connection.fetch(OLD_USAGE_HISTORY)
    finally:
        await connection.close()
    engine = create_engine(database_url)
    try:
        new = (await usage_history(engine, days=1)).samples()
    finally:
        await engine.dispose()

    def key(sample: UsageSample) -> tuple[Any, ...]:
        return (
            repr(sample.fingerprint),
            sample.peak_memory_mb,
            sample.mean_cores,
            sample.memory_limit_mb,
            sample.cpu_limit,
            sample.oom_killed,
        )

    expected = []
    for row in old:
        spec = json_format.Parse(row["spec"], pb.JobSpec(), ignore_unknown_fields=True)
        cpu = row["cpu_limit"] or spec.resources.cpu
        expected.append(
            UsageSample(
                fingerprint=fingerprint_of(spec, threads=max(1, math.ceil(cpu))),
                peak_memory_mb=row["peak_memory_mb"],
                mean_cores=row["mean_cores"],
                memory_limit_mb=row["limit_mb"] if row["oom_killed"] else 0.0,
                cpu_limit=cpu,
                oom_killed=row["oom_killed"],
            )
        )
    assert len(new) == 24 and sum(sample.oom_killed for sample in new) == 8
    assert len({sample.fingerprint for sample in new}) > 3
    assert sorted(map(key, new)) == sorted(map(key, expected))
