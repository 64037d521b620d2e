"""Does PostgreSQL agree with the log? For end-to-end and fault tests.

The log (JetStream) is the source of truth and PostgreSQL a projection of it, so after a fault
the two must hold the same story for every job. ``facts_from_log`` folds a job's events with
the services' own state machine (``mdq.core.state.JobView``, through ``mdq.cli.replay``'s
reader); ``facts_from_postgres`` reads the same facts from the projected tables;
``assert_postgres_agrees_with_log`` waits (with a deadline) until the projection has caught
up with everything the log holds, then compares them exactly, job by job.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

import asyncpg
from nats.js import JetStreamContext

from mdq.bus.subjects import Subjects
from mdq.cli.replay import read_job_log
from mdq.core.state import JobView


@dataclass(frozen=True)
class JobFacts:
    """What one job's history comes to, as the log or PostgreSQL tells it."""

    state: str
    attempt: int
    last_step: int
    final_steps: tuple[int, ...]
    """``final_step`` of every ``succeeded`` event, sorted (one for a job that succeeded)."""
    attempts: tuple[tuple[int, str, int, int], ...]
    """(attempt, node, resumed from step, steps lost) of every attempt."""
    events: Counter[tuple[str, int]]
    """Events per (kind, attempt), progress reports included."""
    event_ids: frozenset[str]


async def facts_from_log(js: JetStreamContext, subjects: Subjects, job_id: str) -> JobFacts:
    logged = await read_job_log(js, subjects, job_id)
    submitted = [item.event for item in logged if item.kind == "submitted"]
    assert submitted, f"{job_id}: no submitted event in the log"
    view = JobView.from_submitted(submitted[0])
    # The projector folds each stream in its own order; lifecycle events in stream order
    # first, then the progress reports, gives the same final view for an ended job.
    for item in sorted(logged, key=lambda i: (i.stream != subjects.jobs_stream, i.sequence)):
        if item.kind != "submitted":
            view.apply(item.event)
    return JobFacts(
        state=view.state.value,
        attempt=view.attempt,
        last_step=view.last_step,
        final_steps=tuple(
            sorted(item.event.succeeded.final_step for item in logged if item.kind == "succeeded")
        ),
        attempts=tuple(
            (number, record.node, record.resumed_from_step, record.steps_lost)
            for number, record in sorted(view.attempts.items())
        ),
        events=Counter((item.kind, item.event.attempt) for item in logged),
        event_ids=frozenset(item.event.event_id for item in logged),
    )


async def facts_from_postgres(db: asyncpg.Connection, job_id: str) -> JobFacts | None:
    job = await db.fetchrow("SELECT state, attempt, last_step FROM jobs WHERE job_id = $1", job_id)
    if job is None:
        return None
    attempts = await db.fetch(
        "SELECT attempt, node, resumed_from_step, steps_lost FROM attempts WHERE job_id = $1"
        " ORDER BY attempt",
        job_id,
    )
    events = await db.fetch(
        "SELECT event_id, kind, attempt, (body->>'final_step')::bigint AS final_step"
        " FROM events WHERE job_id = $1 ORDER BY stream, stream_seq",
        job_id,
    )
    return JobFacts(
        state=job["state"],
        attempt=job["attempt"],
        last_step=job["last_step"],
        final_steps=tuple(
            sorted(row["final_step"] or 0 for row in events if row["kind"] == "succeeded")
        ),
        attempts=tuple(
            (row["attempt"], row["node"] or "", row["resumed_from_step"], row["steps_lost"])
            for row in attempts
        ),
        events=Counter((row["kind"], row["attempt"]) for row in events),
        event_ids=frozenset(row["event_id"] for row in events),
    )


async def projected_up_to(db: asyncpg.Connection, js: JetStreamContext, subjects: Subjects) -> bool:
    """Whether PostgreSQL has projected both streams up to their last message."""
    wanted = {
        stream: (await js.stream_info(stream)).state.last_seq or 0
        for stream in (subjects.jobs_stream, subjects.progress_stream)
    }
    rows = await db.fetch(
        "SELECT stream, max(last_seq) AS seq FROM consumer_offsets GROUP BY stream"
    )
    have = {row["stream"]: row["seq"] for row in rows}
    return all(have.get(stream, 0) >= last for stream, last in wanted.items())


async def assert_postgres_agrees_with_log(
    database_url: str,
    js: JetStreamContext,
    subjects: Subjects,
    job_ids: Iterable[str],
    *,
    timeout: float = 60.0,
) -> dict[str, JobFacts]:
    """Wait until PostgreSQL has projected everything the log holds (failing after
    ``timeout`` seconds, saying how far it got), then assert that, for every job, it holds
    the facts the log folds to: state, attempt, last step, the final step of each
    ``succeeded`` event, every attempt, and every event once (per kind and attempt, and by
    id). Returns the log's facts per job."""
    jobs = sorted(job_ids)
    db = await asyncpg.connect(database_url)
    try:
        deadline = time.monotonic() + timeout
        while not await projected_up_to(db, js, subjects):
            if time.monotonic() > deadline:
                offsets = await db.fetch("SELECT stream, consumer, last_seq FROM consumer_offsets")
                raise AssertionError(
                    f"PostgreSQL did not catch up with the log in {timeout}s: "
                    f"offsets {[tuple(row) for row in offsets]}"
                )
            await asyncio.sleep(0.1)
        logged = {job: await facts_from_log(js, subjects, job) for job in jobs}
        stored = {job: await facts_from_postgres(db, job) for job in jobs}
    finally:
        await db.close()
    differences = {job: (logged[job], stored[job]) for job in jobs if stored[job] != logged[job]}
    assert not differences, "PostgreSQL disagrees with the log (log, postgres): " + "\n".join(
        f"{job}: {log!r}\n{' ' * len(job)}  {pg!r}" for job, (log, pg) in differences.items()
    )
    return logged
