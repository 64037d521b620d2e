"""The coalescing fold of progress reports leaves the jobs' rows that folding each report does.

A PROGRESS batch's transaction stores its reports and queues their attempts; the jobs' rows
catch up with them later, in one fold of many batches (``jobs.fold_unfolded``). Each named
history below is split into its JOBS and PROGRESS streams, as the services publish them, and
the two are interleaved at random into batches; the batches are projected twice into two
fresh databases: once folding every report as its batch is stored (``jobs.fold_jobs``, report
by report), once through the ``Writer`` with the folds coalesced at random points (and at the
end, as a projector that catches up or stops does). The ``jobs`` and ``attempts`` tables must
be identical, every column.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator, Callable
from typing import Any, cast

import asyncpg
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from mdq.backoff import DEFAULT_BACKOFF
from mdq.bus.codec import encode
from mdq.bus.subjects import Subjects
from mdq.contracts import pb
from mdq.store.engine import asyncpg_dsn, create_writer_pool
from mdq.store.migrate import upgrade_async
from mdq.store.projection.feed import Feed
from mdq.store.projection.jobs import fold_jobs, fold_unfolded
from mdq.store.projection.writer import Batch, Writer, store_progress
from services.watcher.projector import Projector
from tests.helpers import OwnersPublisher, wait_for
from tests.integration.test_projector import History, running, wait_projected

JOBS_STREAM, PROGRESS_STREAM = "T_JOBS", "T_PROGRESS"
ROUNDS = 6


def to_success(h: History) -> list[pb.Event]:
    steps = range(100, 1001, 100)
    reports = [h.progress(1, s, done_reason="steps_reached" if s == 1000 else "") for s in steps]
    return [*h.began(), *reports, h.succeeded(1, 1000)]


def requeued_then_success(h: History) -> list[pb.Event]:
    return [
        *h.began(),
        *[h.progress(1, s) for s in (100, 200, 300)],
        h.checkpoint(1, 200),
        h.attempt_failed(1, "n1", 300),
        h.requeued(2, 200, 100),
        h.bound(2, "n2"),
        h.started(2, "n2"),
        *[h.progress(2, s) for s in (300, 400, 500)],
        h.succeeded(2, 500),
    ]


def runner_went_on_after_cancel(h: History) -> list[pb.Event]:
    origin = pb.ControlOrigin(control_id="c1", requested_by="ann", reason="typo")
    stopped = pb.AttemptFailed(reason=pb.FAILURE_STOPPED, node="n1", last_step=300)
    return [
        *h.began(),
        *[h.progress(1, s) for s in (100, 200)],
        h.event("cancel_requested", pb.CancelRequested(origin=origin), 1, detail="c1"),
        h.progress(1, 300, done_reason="steps_reached"),
        h.event("attempt_failed", stopped, 1),
        h.event("cancelled", pb.JobCancelled(origin=origin, message="cancelled"), 1),
        *[h.progress(1, s) for s in (400, 500)],  # after the end: counted in neither fold
    ]


def done_reason_then_more(h: History) -> list[pb.Event]:
    """A report names a done reason the reports after it do not, the last names no target."""
    last = h.progress(1, 400, units="lj")
    last.progress.target_steps = 0
    return [
        *h.began(),
        h.progress(1, 100, units="lj"),
        h.progress(1, 200, done_reason="converged", units="lj"),
        h.progress(1, 300, units="lj"),
        last,
    ]


def still_running(h: History) -> list[pb.Event]:
    return [h.submitted(), h.bound(1, "n1"), *[h.progress(1, s) for s in range(50, 801, 50)]]


def failed_for_good(h: History) -> list[pb.Event]:
    return [
        *h.began(),
        *[h.progress(1, s) for s in (100, 200)],
        h.failed(1),
        h.progress(1, 300),
    ]


CASES: dict[str, Callable[[History], list[pb.Event]]] = {
    "runs to success": to_success,
    "fails, is requeued and succeeds": requeued_then_success,
    "the runner goes on after a cancel": runner_went_on_after_cancel,
    "a done reason, units and a target the later reports drop": done_reason_then_more,
    "still running, never started": still_running,
    "fails for good, a report after": failed_for_good,
}


def interleaved(events: list[pb.Event], rng: random.Random) -> list[tuple[str, list[pb.Event]]]:
    """The history's two streams, each in its own order, cut into batches interleaved at
    random: (stream, events) in the order a projector would write them."""
    streams = {
        PROGRESS_STREAM: [e for e in events if e.WhichOneof("body") == "progress"],
        JOBS_STREAM: [e for e in events if e.WhichOneof("body") != "progress"],
    }
    batches = []
    while any(streams.values()):
        stream = rng.choice([name for name, left in streams.items() if left])
        size = rng.randint(1, 4)
        batches.append((stream, streams[stream][:size]))
        streams[stream] = streams[stream][size:]
    return batches


def feed(stream: str, pool: asyncpg.Pool, history: str) -> Feed:
    return Feed(
        stream=stream,
        consumer=f"{history}-{stream}",
        js=cast(JetStreamContext, None),
        pool=pool,
        batch_size=100,
        batch_wait_s=0.1,
        ack_wait_s=30,
        continuity_check_s=10,
    )


def as_batch(events: list[pb.Event], first_seq: int) -> Batch:
    messages = [
        Msg(cast(Client, None), subject=f"t.{event.job_id}", data=encode(event)) for event in events
    ]
    return [(first_seq + i, (m, e)) for i, (m, e) in enumerate(zip(messages, events, strict=True))]


async def fold_each_report(pool: asyncpg.Pool, batch: Batch) -> None:
    """A PROGRESS batch stored and folded report by report, in its own transaction."""
    reports = [(sequence, event) for sequence, (_, event) in batch if event is not None]
    async with pool.acquire() as connection, connection.transaction():
        new = await store_progress(connection, PROGRESS_STREAM, reports, careful=True)
        await fold_jobs(connection, [event for _, event in new])


async def project(
    pool: asyncpg.Pool,
    history: str,
    batches: list[tuple[str, list[pb.Event]]],
    rng: random.Random | None,
) -> None:
    """Every batch in order (consumers of their own per ``history``); without ``rng``, each
    PROGRESS batch folded report by report, with it, through the ``Writer``, folded (with
    what is queued) at random points."""
    stopping = asyncio.Event()
    writer = Writer(pool=pool, database="test", reconnect=DEFAULT_BACKOFF, stopping=stopping)
    feeds = {name: feed(name, pool, history) for name in (JOBS_STREAM, PROGRESS_STREAM)}
    next_seq = dict.fromkeys(feeds, 1)
    for stream, events in batches:
        batch = as_batch(events, next_seq[stream])
        next_seq[stream] += len(events)
        if stream == JOBS_STREAM:
            await writer.project(feeds[stream], batch, catch_up=True)
        elif rng is None:
            await fold_each_report(pool, batch)
        else:
            fold = rng.random() < 0.3
            await writer.project(feeds[stream], batch, catch_up=False, fold=fold)
    if rng is not None:
        await writer.fold_queued()


async def rows(pool: asyncpg.Pool) -> dict[str, list[tuple[Any, ...]]]:
    tables = {}
    for table in ("jobs", "attempts"):
        records = await pool.fetch(f"SELECT * FROM {table}")
        tables[table] = sorted(tuple(record.values()) for record in records)
    return tables


@pytest.fixture
async def two_pools(
    pool: asyncpg.Pool, spare_database: str
) -> AsyncIterator[tuple[asyncpg.Pool, asyncpg.Pool]]:
    await upgrade_async(spare_database)
    spare = await create_writer_pool(asyncpg_dsn(spare_database), size=2)
    try:
        yield pool, spare
    finally:
        await spare.close()


async def test_coalesced_folds_leave_the_rows_of_a_fold_per_report(
    two_pools: tuple[asyncpg.Pool, asyncpg.Pool],
) -> None:
    coalesced, per_report = two_pools
    rng = random.Random(20261205)
    for round_ in range(ROUNDS):
        for number, (name, history) in enumerate(CASES.items()):
            job = f"r{round_}c{number}"
            batches = interleaved(history(History(job)), rng)
            await project(per_report, job, batches, None)
            await project(coalesced, job, batches, random.Random(rng.random()))
            expected, got = await rows(per_report), await rows(coalesced)
            assert len(expected["jobs"]) == round_ * len(CASES) + number + 1
            assert got == expected, f"{name}, round {round_}: {batches}"
            assert not await coalesced.fetchval("SELECT count(*) FROM progress_unfolded")


async def test_reports_stored_by_a_watcher_killed_before_its_fold_are_folded_on_start(
    js: JetStreamContext, subjects: Subjects, pool: asyncpg.Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A watcher killed after a PROGRESS batch's commit (reports, offset, queue) and before the
    jobs caught up: the next one folds the queued attempts as soon as it is caught up, though
    nothing new arrives."""
    history = History("killed")
    publisher = OwnersPublisher(js=js, subjects=subjects)
    with monkeypatch.context() as never:  # a watcher that queues and never folds
        never.setattr(Projector, "_fold_now", lambda self, last: False)
        never.setattr(Projector, "_fold_due", lambda self, feed: False)
        dying = Projector(js=js, subjects=subjects, pool=pool)
        task = asyncio.create_task(dying.run())
        for event in history.began():
            await publisher.publish(event)
        await wait_projected(js, subjects, pool)  # the job first: no catch-up of its reports
        for step in range(100, 1001, 100):
            await publisher.publish(history.progress(1, step))
        await wait_projected(js, subjects, pool)
        task.cancel()  # no stop(): it dies with its reports stored, not folded
        with contextlib.suppress(asyncio.CancelledError):
            await task
    job = "SELECT last_step FROM jobs WHERE job_id = $1"
    assert await pool.fetchval(job, history.job_id) == 0
    assert await pool.fetchval("SELECT count(*) FROM progress_unfolded") == 1

    async def folded() -> bool:
        return bool(await pool.fetchval(job, history.job_id) == 1000)

    async with running(js, subjects, pool):
        await wait_for(folded, timeout=10, what="the queued reports folded on start")
        assert await pool.fetchval("SELECT count(*) FROM progress_unfolded") == 0


async def test_a_replica_folds_what_another_queued_and_left_killed(pool: asyncpg.Pool) -> None:
    """Watcher replicas share ``progress_unfolded``: reports another replica stored and queued
    before it was killed are folded by this one's next folding batch, though this one has
    queued nothing itself."""
    left, going_on = History("left-by-a-dead-replica"), History("going-on")
    stopping = asyncio.Event()
    dead = Writer(pool=pool, database="test", reconnect=DEFAULT_BACKOFF, stopping=stopping)
    alive = Writer(pool=pool, database="test", reconnect=DEFAULT_BACKOFF, stopping=stopping)
    alive.queued = False  # caught up, nothing of its own queued
    jobs, progress = feed(JOBS_STREAM, pool, "replicas"), feed(PROGRESS_STREAM, pool, "replicas")
    lifecycle = [event for history in (left, going_on) for event in history.began()]
    await alive.project(jobs, as_batch(lifecycle, 1), catch_up=True)
    reports = [left.progress(1, step) for step in (100, 200, 300)]
    await dead.project(progress, as_batch(reports, 1), catch_up=False, fold=False)
    assert await pool.fetchval("SELECT count(*) FROM progress_unfolded") == 1

    await alive.project(progress, as_batch([going_on.progress(1, 50)], 4), catch_up=False)

    last_step = "SELECT last_step FROM jobs WHERE job_id = $1"
    assert await pool.fetchval(last_step, left.job_id) == 300
    assert await pool.fetchval(last_step, going_on.job_id) == 50
    assert await pool.fetchval("SELECT count(*) FROM progress_unfolded") == 0


_PROGRESS_ROWS_READ = """
SELECT sum(idx_tup_fetch + seq_tup_read) FROM pg_stat_xact_user_tables
WHERE relid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = 'progress'::regclass)
"""
"""Rows of ``progress`` (of its partitions) this backend has read and not yet reported."""


async def test_a_fold_reads_an_open_attempts_new_reports_not_its_history(
    pool: asyncpg.Pool,
) -> None:
    """A job that runs long has most of its reports folded already: the next fold looks for a
    done reason and a target among the reports from the step its row has seen up, not through
    the attempt's whole history (a fold a second would otherwise read every report of every
    running job whose reports name no done reason, again and again); the done reason an early
    report gave stays."""
    history = History("long-run")
    stopping = asyncio.Event()
    writer = Writer(pool=pool, database="test", reconnect=DEFAULT_BACKOFF, stopping=stopping)
    jobs, progress = feed(JOBS_STREAM, pool, "long"), feed(PROGRESS_STREAM, pool, "long")
    lifecycle = history.began()
    await writer.project(jobs, as_batch(lifecycle, 1), catch_up=True)
    folded = [history.progress(1, step) for step in range(10, 20_001, 10)]
    folded[5].progress.done_reason = "converged"  # early: the reports after it name none
    await writer.project(progress, as_batch(folded, 1), catch_up=False, fold=True)
    new = [history.progress(1, step) for step in range(20_010, 20_051, 10)]
    await writer.project(progress, as_batch(new, len(folded) + 1), catch_up=False, fold=False)

    async with pool.acquire() as connection, connection.transaction():
        before = await connection.fetchval(_PROGRESS_ROWS_READ)
        await fold_unfolded(connection, {(history.job_id, 1)})
        read = await connection.fetchval(_PROGRESS_ROWS_READ) - before
    job = await pool.fetchrow(
        "SELECT last_step, done_reason FROM jobs WHERE job_id = $1", history.job_id
    )
    assert (job["last_step"], job["done_reason"]) == (20_050, "converged")
    assert read <= 2 * len(new), f"the fold read {read} reports of {len(folded) + len(new)}"
