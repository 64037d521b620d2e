"""The watcher's projector against real NATS JetStream and a fresh PostgreSQL database per test.

Histories are built with ``mdq.core.events.make_event`` at fixed times, published like the
services publish them, and the resulting tables are checked; redelivery, republishing, stale
attempts and kill -9 in the middle of a batch must leave every event projected exactly once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from google.protobuf import json_format
from google.protobuf.message import Message
from nats.js import JetStreamContext

from mdq.bus.codec import encode
from mdq.bus.connect import connect
from mdq.bus.publisher import EventPublisher
from mdq.bus.subjects import Subjects
from mdq.contracts import pb
from mdq.core.events import make_event
from mdq.core.ids import pod_name
from mdq.core.producers import owner_of
from mdq.embedded import start_nats
from mdq.store import queries
from mdq.store.engine import create_engine, create_writer_pool
from mdq.store.migrate import upgrade_async
from services.watcher.projector import Projector
from tests.helpers import OwnersPublisher, reconnected

T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
REPO = Path(__file__).resolve().parents[2]
TABLES = ("jobs", "attempts", "events", "progress", "checkpoints", "placements", "rejections")


class History:
    """Events of one job at increasing, fixed times (one second apart)."""

    def __init__(self, name: str, *, steps: int = 1000, request_id: str = "0123456789ab") -> None:
        self.request_id = request_id
        self.job_id = f"{request_id}-{name}"
        self.spec = pb.JobSpec(name=name, steps=steps, report_interval_steps=100)
        self.spec.resources.cpu = 1
        self.spec.resources.memory_mb = 1024
        self.spec.priority_class = "high"
        self.clock = T0
        self.times: dict[str, datetime] = {}

    def event(
        self, kind: str, body: Message, attempt: int, detail: str | int | None = None
    ) -> pb.Event:
        self.clock += timedelta(seconds=1)
        self.times[f"{kind}:{attempt}" + ("" if detail is None else f":{detail}")] = self.clock
        return make_event(
            kind,
            body,
            job_id=self.job_id,
            attempt=attempt,
            producer=owner_of(kind),
            at=self.clock,
            detail=detail,
        )

    def submitted(self) -> pb.Event:
        body = pb.JobSubmitted(
            spec=self.spec,
            request_id=self.request_id,
            idempotency_key="key-1",
            submitted_by="alice",
        )
        return self.event("submitted", body, 0)

    def bound(self, attempt: int, node: str) -> pb.Event:
        body = pb.JobBound(
            node=node,
            pod_name=pod_name(self.job_id, attempt),
            candidates=[
                pb.NodeScore(node=node, score=0.75, cpu_load=0.2, memory_load=0.1),
                pb.NodeScore(node="n-busy", filtered="insufficient cpu", cpu_load=0.97),
            ],
        )
        return self.event("bound", body, attempt)

    def started(self, attempt: int, node: str) -> pb.Event:
        body = pb.JobStarted(node=node, pod_name=pod_name(self.job_id, attempt))
        return self.event("started", body, attempt)

    def began(self, node: str = "n1") -> list[pb.Event]:
        """Submitted, then its first attempt bound to ``node`` and started there."""
        return [self.submitted(), self.bound(1, node), self.started(1, node)]

    def progress(self, attempt: int, step: int, done_reason: str = "", units: str = "") -> pb.Event:
        body = pb.Progress(
            units=units,
            step=step,
            target_steps=self.spec.steps,
            time_ps=step * 0.002,
            potential_kj_mol=-1000.0 - step / 10,
            kinetic_kj_mol=500.0 + step / 100,
            temperature_k=300.0 + step / 1000,
            ns_per_day=30.0 + attempt,
            done_reason=done_reason,
        )
        return self.event("progress", body, attempt, detail=step)

    def checkpoint(self, attempt: int, step: int) -> pb.Event:
        body = self.checkpoint_body(step)
        return self.event("checkpoint", body, attempt, detail=step)

    def checkpoint_body(self, step: int) -> pb.Checkpoint:
        return pb.Checkpoint(
            step=step,
            path=f"/data/{self.job_id}/checkpoints/{step}.chk",
            sha256="ab" * 32,
            size_bytes=4096,
            time_ps=step * 0.002,
        )

    def succeeded(self, attempt: int, final_step: int) -> pb.Event:
        body = pb.JobSucceeded(final_step=final_step, reason="steps_reached", output_dir="/out")
        return self.event("succeeded", body, attempt)

    def attempt_failed(self, attempt: int, node: str, last_step: int) -> pb.Event:
        body = pb.AttemptFailed(
            reason=pb.FAILURE_OOM_KILLED,
            exit_code=137,
            message="memory limit exceeded",
            node=node,
            last_step=last_step,
        )
        return self.event("attempt_failed", body, attempt)

    def requeued(self, attempt: int, resume_step: int, steps_lost: int) -> pb.Event:
        body = pb.JobRequeued(
            resume_from=self.checkpoint_body(resume_step),
            after=pb.FAILURE_OOM_KILLED,
            steps_lost=steps_lost,
            avoid_nodes=["n1"],
        )
        body.resources.memory_mb = 2048
        return self.event("requeued", body, attempt)

    def failed(self, attempt: int) -> pb.Event:
        body = pb.JobFailed(reason=pb.FAILURE_UNSTABLE, message="energy is NaN")
        return self.event("failed", body, attempt)


# -- fixtures and helpers ---------------------------------------------------------------


@pytest.fixture
def publisher(js: JetStreamContext, subjects: Subjects) -> EventPublisher:
    return OwnersPublisher(js=js, subjects=subjects)


@contextlib.asynccontextmanager
async def running(
    js: JetStreamContext, subjects: Subjects, pool: asyncpg.Pool, *, batch_size: int = 200
) -> AsyncIterator[Projector]:
    projector = Projector(js=js, subjects=subjects, pool=pool, batch_size=batch_size)
    task = asyncio.create_task(projector.run())
    try:
        yield projector
    finally:
        projector.stop()
        await asyncio.wait_for(task, timeout=10)


@pytest.fixture
async def projector(
    js: JetStreamContext, subjects: Subjects, pool: asyncpg.Pool
) -> AsyncIterator[Projector]:
    async with running(js, subjects, pool) as projector:
        yield projector


@contextlib.asynccontextmanager
async def history_projected(
    js: JetStreamContext,
    subjects: Subjects,
    pool: asyncpg.Pool,
    events: list[pb.Event],
    *,
    within: float = 20.0,
) -> AsyncIterator[None]:
    """``events`` published as their producers publish them and a projector running (its
    default batches) until PostgreSQL stores every one of them, within ``within`` seconds;
    the projector stops when the block ends."""
    publisher = OwnersPublisher(js=js, subjects=subjects)
    for event in events:
        await publisher.publish(event)
    projector = Projector(js=js, subjects=subjects, pool=pool)
    task = asyncio.create_task(projector.run())
    try:
        deadline = asyncio.get_running_loop().time() + within
        while await pool.fetchval("SELECT count(*) FROM events") < len(events):
            assert asyncio.get_running_loop().time() < deadline, "the history was projected"
            await asyncio.sleep(0.05)
        yield
    finally:
        projector.stop()
        await asyncio.wait_for(task, timeout=10)


@contextlib.asynccontextmanager
async def projected_as_administrator(
    js: JetStreamContext, subjects: Subjects, database_url: str, events: list[pb.Event]
) -> AsyncIterator[asyncpg.Pool]:
    """The database at ``database_url`` migrated and ``events`` projected into it
    (``history_projected``), by a pool connected as whoever ``database_url`` names (the
    administrator: no roles of the deployment's); the pool closes when the block ends."""
    await upgrade_async(database_url)
    pool = await create_writer_pool(database_url, size=2)
    try:
        async with history_projected(js, subjects, pool, events):
            yield pool
    finally:
        await pool.close()


async def wait_projected(
    js: JetStreamContext, subjects: Subjects, pool: asyncpg.Pool, timeout: float = 30.0
) -> None:
    """Until PostgreSQL holds both streams up to their last message."""
    deadline = asyncio.get_running_loop().time() + timeout
    wanted: dict[str, int] = {}
    while True:
        for stream in (subjects.jobs_stream, subjects.progress_stream):
            wanted[stream] = (await js.stream_info(stream)).state.last_seq
        rows = await pool.fetch("SELECT stream, last_seq FROM consumer_offsets")
        have = {row["stream"]: row["last_seq"] for row in rows}
        if all(have.get(stream, 0) >= last for stream, last in wanted.items()):
            return
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"not projected in {timeout}s: want {wanted}, have {have}")
        await asyncio.sleep(0.05)


async def publish_in_order(publisher: EventPublisher, events: list[pb.Event]) -> None:
    for event in events:
        await publisher.publish(event)


Project = Callable[[list[pb.Event]], Awaitable[None]]


@pytest.fixture
def project(
    publisher: EventPublisher, js: JetStreamContext, subjects: Subjects, pool: asyncpg.Pool
) -> Project:
    """Publish a batch of events in order and wait until PostgreSQL holds both streams up to
    their last message (``wait_projected``): one step of a history as a projector sees it."""

    async def publish(events: list[pb.Event]) -> None:
        await publish_in_order(publisher, events)
        await wait_projected(js, subjects, pool)

    return publish


async def dump(pool: asyncpg.Pool) -> dict[str, list[tuple[Any, ...]]]:
    """Every projected table (not the offsets), rows sorted, for before/after comparisons."""
    tables = {}
    for table in TABLES:
        rows = await pool.fetch(f"SELECT * FROM {table}")
        tables[table] = sorted(tuple(str(value) for value in row.values()) for row in rows)
    return tables


async def job_row(pool: asyncpg.Pool, job_id: str) -> asyncpg.Record:
    row = await pool.fetchrow("SELECT * FROM jobs WHERE job_id = $1", job_id)
    assert row is not None, f"job {job_id} not projected"
    return row


async def attempt_rows(pool: asyncpg.Pool, job_id: str) -> dict[int, asyncpg.Record]:
    rows = await pool.fetch("SELECT * FROM attempts WHERE job_id = $1", job_id)
    return {row["attempt"]: row for row in rows}


def requeue_history(history: History) -> tuple[list[pb.Event], list[pb.Event]]:
    """A first attempt that runs out of memory, a second that succeeds (in two phases)."""
    first = [
        *history.began(),
        *(history.progress(1, step) for step in (100, 200, 300)),
        history.checkpoint(1, 200),
        history.attempt_failed(1, "n1", last_step=300),
        history.requeued(2, resume_step=200, steps_lost=100),
        history.bound(2, "n2"),
        history.started(2, "n2"),
        *(history.progress(2, step) for step in range(300, 1001, 100)),
    ]
    second = [history.succeeded(2, final_step=1000)]
    return first, second


# -- tests ------------------------------------------------------------------------------


async def test_a_job_reporting_in_reduced_units_says_so_in_its_row(
    projector: Projector, pool: asyncpg.Pool, project: Project
) -> None:
    history = History("lj-melt")
    events = [
        *history.began(),
        *(history.progress(1, step, units="lj") for step in (100, 200)),
    ]
    await project(events)
    job = await job_row(pool, history.job_id)
    assert (job["last_step"], job["units"]) == (200, "lj")


async def test_a_successful_history_becomes_rows(
    projector: Projector, pool: asyncpg.Pool, database_url: str, project: Project
) -> None:
    history = History("md")
    running_events = [
        *history.began(),
        *(history.progress(1, step) for step in range(100, 901, 100)),
        history.progress(1, 1000, done_reason="steps_reached"),
        history.checkpoint(1, 500),
    ]
    await project(running_events)
    await project([history.succeeded(1, final_step=1000)])

    job = await job_row(pool, history.job_id)
    assert job["state"] == "SUCCEEDED"
    assert job["attempt"] == 1
    assert (job["node"], job["pod_name"]) == ("n1", pod_name(history.job_id, 1))
    assert (job["task"], job["priority_class"], job["target_steps"]) == ("TASK_MD", "high", 1000)
    assert job["last_step"] == 1000
    assert job["last_potential_kj_mol"] == pytest.approx(-1100.0)
    assert job["last_temperature_k"] == pytest.approx(301.0)
    assert job["last_ns_per_day"] == pytest.approx(31.0)
    assert job["last_progress_at"] == history.times["progress:1:1000"]
    assert job["done_reason"] == "steps_reached"
    assert job["latest_checkpoint_step"] == 500
    assert job["final_reason"] is None
    assert job["submitted_by"] == "alice"
    assert job["submitted_at"] == history.times["submitted:0"]
    assert job["updated_at"] == history.times["succeeded:1"]
    assert job["units"] is None  # in the units the column names say

    attempts = await attempt_rows(pool, history.job_id)
    assert list(attempts) == [1]
    first = attempts[1]
    assert (first["node"], first["pod_name"]) == ("n1", pod_name(history.job_id, 1))
    assert first["bound_at"] == history.times["bound:1"]
    assert first["started_at"] == history.times["started:1"]
    assert first["ended_at"] == history.times["succeeded:1"]
    assert first["last_step"] == 1000
    assert first["failure_reason"] is None

    assert await pool.fetchval("SELECT count(*) FROM progress") == 10
    assert await pool.fetchval("SELECT count(*) FROM events") == len(running_events) + 1
    placement = await pool.fetchrow("SELECT * FROM placements")
    assert placement["node"] == "n1"
    assert '"insufficient cpu"' in placement["candidates"]
    checkpoint = await pool.fetchrow("SELECT * FROM checkpoints")
    assert (checkpoint["step"], checkpoint["size_bytes"]) == (500, 4096)

    engine = create_engine(database_url)
    try:
        listed = await queries.list_jobs(engine)
        assert [summary.job_id for summary in listed] == [history.job_id]
        assert listed[0].fraction_done == 1.0
        detail = await queries.job_detail(engine, history.job_id)
        assert detail is not None
        assert detail.job.state == "SUCCEEDED"
        assert detail.job.spec["name"] == "md"
        assert [attempt.attempt for attempt in detail.attempts] == [1]
        assert detail.last_progress is not None and detail.last_progress.step == 1000
        assert detail.latest_checkpoint is not None and detail.latest_checkpoint.step == 500
        timeline = await queries.job_timeline(engine, history.job_id)
        kinds = [entry.kind for entry in timeline]
        assert kinds[:3] == ["submitted", "bound", "started"]
        assert kinds[-2:] == ["checkpoint", "succeeded"]
        assert kinds.count("progress") == 10
        assert timeline[-1].body["final_step"] == "1000"
        trace = await queries.progress_trace(engine, history.job_id)
        assert [point.step for point in trace] == list(range(100, 1001, 100))
    finally:
        await engine.dispose()

    lags = await projector.lag()
    assert {lag.consumer for lag in lags} == {"watcher-jobs", "watcher-progress"}
    assert all(lag.total == 0 for lag in lags)


async def test_a_rejected_submit_is_recorded(
    projector: Projector,
    publisher: EventPublisher,
    js: JetStreamContext,
    subjects: Subjects,
    pool: asyncpg.Pool,
) -> None:
    body = pb.JobRejected(
        request_id="feedfacecafe",
        idempotency_key="bad-1",
        error=pb.SubmitError(field="jobs[0].resources.cpu", message="must be between 0.1 and 256"),
    )
    event = make_event(
        "rejected", body, job_id="", attempt=0, producer="intake", at=T0, detail="feedfacecafe"
    )
    await publisher.publish(event)
    await wait_projected(js, subjects, pool)

    row = await pool.fetchrow("SELECT * FROM rejections")
    assert (row["request_id"], row["field"]) == ("feedfacecafe", "jobs[0].resources.cpu")
    assert await pool.fetchval("SELECT count(*) FROM jobs") == 0
    assert await pool.fetchval("SELECT job_id FROM events") is None


async def test_intakes_claims_in_the_jobs_stream_are_passed_over_as_no_events(
    projector: Projector,
    publisher: EventPublisher,
    js: JetStreamContext,
    subjects: Subjects,
    pool: asyncpg.Pool,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The jobs stream keeps intake's claims beside the events (``Subjects.claim``): the
    projector covers their sequences without storing, counting or logging them as events."""
    history = History("claimed")
    await js.publish(subjects.claim("0123456789ab"), b"\x0a\x0c0123456789ab")
    await publisher.publish(history.submitted())
    await js.publish(subjects.claim("alice.0123456789ab"), b"not an event")
    await wait_projected(js, subjects, pool)

    assert await pool.fetchval("SELECT count(*) FROM events") == 1
    assert (await job_row(pool, history.job_id))["state"] == "PENDING"
    assert projector.foreign_events == 0
    assert "skipped" not in caplog.text and "undecodable" not in caplog.text


async def test_an_attempt_without_started_starts_at_its_first_report_whatever_the_order(
    projector: Projector, pool: asyncpg.Pool, project: Project
) -> None:
    """Attempt 1 crashed before its ``started`` was published; its reports reach the
    projection only after the job moved on to attempt 2 (the order a rebuild may take). The
    attempt still started at its first report, as it does when the reports come first."""
    history = History("nostart")
    reports = [history.progress(1, step) for step in (100, 200)]
    jobs = [
        history.submitted(),
        history.bound(1, "n1"),
        history.attempt_failed(1, "n1", last_step=200),
        history.requeued(2, resume_step=0, steps_lost=200),
    ]
    await project(jobs)
    await project(reports)
    attempts = await attempt_rows(pool, history.job_id)
    assert attempts[1]["started_at"] == history.times["progress:1:100"]


@pytest.mark.parametrize("reports_first", [False, True], ids=["jobs-first", "reports-first"])
async def test_a_started_published_after_the_reports_leaves_the_same_progress_in_both_orders(
    projector: Projector, pool: asyncpg.Pool, reports_first: bool, project: Project
) -> None:
    """The pod was seen running only after its runner had reported (a node agent restarted in
    between): ``started`` is later than every report. Live, the reports come first and the
    late ``started`` changes nothing; a rebuild may fold ``started`` first. Either way the job's
    progress columns are its last report's."""
    history = History(f"late-started-{int(reports_first)}")
    jobs = [history.submitted(), history.bound(1, "n1")]
    reports = [history.progress(1, step) for step in (100, 200)]
    jobs += [history.started(1, "n1"), history.succeeded(1, final_step=200)]
    for batch in (reports, jobs) if reports_first else (jobs, reports):
        await project(batch)
    job = await job_row(pool, history.job_id)
    assert (job["state"], job["last_step"]) == ("SUCCEEDED", 200)
    assert job["last_progress_at"] == history.times["progress:1:200"]
    assert job["last_potential_kj_mol"] == -1020.0
    assert job["last_temperature_k"] == 300.2


@pytest.mark.parametrize("reports_first", [False, True], ids=["jobs-first", "reports-first"])
async def test_a_report_after_the_attempt_ended_counts_in_neither_order(
    projector: Projector, pool: asyncpg.Pool, reports_first: bool, project: Project
) -> None:
    """A runner that went on after its attempt failed (it was not stopped yet) reported step
    300 after the failure. Live, the fold sees that report after the failure and fences it; a
    rebuild may fold it first. Either way the attempt and the job end at step 200."""
    history = History(f"late-{int(reports_first)}")
    jobs = history.began()
    reports = [history.progress(1, step) for step in (100, 200)]
    jobs.append(history.attempt_failed(1, "n1", last_step=150))
    reports.append(history.progress(1, 300))  # after the failure
    for batch in (reports, jobs) if reports_first else (jobs, reports):
        await project(batch)
    job = await job_row(pool, history.job_id)
    assert (job["state"], job["last_step"]) == ("RECOVERING", 200)
    assert job["last_progress_at"] == history.times["progress:1:200"]
    assert (await attempt_rows(pool, history.job_id))[1]["last_step"] == 200


@pytest.mark.parametrize("reports_first", [False, True], ids=["jobs-first", "reports-first"])
async def test_a_late_report_of_an_attempt_already_requeued_counts_in_both_orders(
    projector: Projector, pool: asyncpg.Pool, reports_first: bool, project: Project
) -> None:
    """A runner cut off from the bus reported steps 100 and 200 before its node was declared
    lost, but its reports reached the log only after the job was requeued (a chaos campaign's
    NATS outage of 20 s). Live, the fold sees them after the requeue; a rebuild may fold them
    first. Either way attempt 1 ends at step 200."""
    history = History(f"cut-off-{int(reports_first)}")
    reports = [history.progress(1, step) for step in (100, 200)]
    jobs = [
        *history.began(),
        history.attempt_failed(1, "n1", last_step=0),
        history.requeued(2, resume_step=0, steps_lost=0),
        history.bound(2, "n2"),
    ]
    # the reports were made before the failure: their times come first
    for report, at in zip(reports, (jobs[2], jobs[2]), strict=True):
        report.time.CopyFrom(at.time)
    for batch in (reports, jobs) if reports_first else (jobs, reports):
        await project(batch)
    attempts = await attempt_rows(pool, history.job_id)
    assert attempts[1]["last_step"] == 200
    assert (await job_row(pool, history.job_id))["attempt"] == 2


@pytest.mark.parametrize("reports_first", [False, True], ids=["jobs-first", "reports-first"])
async def test_a_target_reached_while_a_cancel_was_on_its_way_is_the_same_in_both_orders(
    projector: Projector, pool: asyncpg.Pool, reports_first: bool, project: Project
) -> None:
    """The runner reached its step target just as its cancel arrived (a chaos soak, seed
    532494194): its last report says ``steps_reached``, the job ends CANCELLED. Live, that report
    is folded before the attempt's end; a rebuild folds the jobs stream first and finds the
    report after it. Either way the job keeps the report's done reason."""
    history = History(f"raced-{int(reports_first)}")
    origin = pb.ControlOrigin(control_id="c1", requested_by="ann", reason="typo")
    jobs = [
        *history.began(),
        history.event("cancel_requested", pb.CancelRequested(origin=origin), 1, detail="c1"),
    ]
    report = history.progress(1, 1000, done_reason="steps_reached")
    stopped = pb.AttemptFailed(
        reason=pb.FAILURE_STOPPED, exit_code=5, message="stopped", node="n1", last_step=1000
    )
    jobs += [
        history.event("attempt_failed", stopped, 1),
        history.event("cancelled", pb.JobCancelled(origin=origin, message="cancelled by ann"), 1),
    ]
    for batch in ([report], jobs) if reports_first else (jobs, [report]):
        await project(batch)
    row = await job_row(pool, history.job_id)
    figures = (row["state"], row["done_reason"], row["last_step"])
    assert figures == ("CANCELLED", "steps_reached", 1000)


async def test_an_attempt_failing_in_the_batch_that_inserts_the_next_failed_counts_one_job(
    publisher: EventPublisher,
    js: JetStreamContext,
    subjects: Subjects,
    pool: asyncpg.Pool,
) -> None:
    """One batch fails a stored attempt and inserts the next, failed for the same reason: the
    job is one job in ``failure_tallies``. The tallies' triggers count a job from the table as
    each statement leaves it, so the projector must not insert and update a job's attempts in
    one statement."""
    history = History("twice")
    async with running(js, subjects, pool):
        await publish_in_order(publisher, history.began())
        await wait_projected(js, subjects, pool)
    await publish_in_order(  # one batch: no projector runs while they are published
        publisher,
        [
            history.attempt_failed(1, "n1", last_step=0),
            history.requeued(2, resume_step=0, steps_lost=0),
            history.bound(2, "n2"),
            history.started(2, "n2"),
            history.attempt_failed(2, "n2", last_step=0),
        ],
    )
    async with running(js, subjects, pool):
        await wait_projected(js, subjects, pool)
    tallies = await pool.fetch("SELECT reason, attempts, jobs FROM failure_tallies")
    assert [tuple(row) for row in tallies] == [("FAILURE_OOM_KILLED", 2, 1)]


async def test_failure_then_requeue_fills_both_attempts(
    projector: Projector, pool: asyncpg.Pool, project: Project
) -> None:
    history = History("md")
    first, second = requeue_history(history)
    await project(first)
    await project(second)

    job = await job_row(pool, history.job_id)
    assert (job["state"], job["attempt"], job["node"]) == ("SUCCEEDED", 2, "n2")
    assert job["last_step"] == 1000
    assert job["latest_checkpoint_step"] == 200

    attempts = await attempt_rows(pool, history.job_id)
    assert sorted(attempts) == [1, 2]
    failed, retried = attempts[1], attempts[2]
    assert failed["node"] == "n1"
    assert failed["failure_reason"] == "FAILURE_OOM_KILLED"
    assert failed["exit_code"] == 137
    assert failed["failure_message"] == "memory limit exceeded"
    assert failed["started_at"] == history.times["started:1"]
    assert failed["ended_at"] == history.times["attempt_failed:1"]
    assert failed["steps_lost"] == 100
    assert failed["last_step"] == 300
    assert failed["resumed_from_step"] == 0
    assert retried["node"] == "n2"
    assert retried["resumed_from_step"] == 200
    assert retried["bound_at"] == history.times["bound:2"]
    assert retried["started_at"] == history.times["started:2"]
    assert retried["ended_at"] == history.times["succeeded:2"]
    assert retried["failure_reason"] is None
    assert retried["last_step"] == 1000
    assert await pool.fetchval("SELECT count(*) FROM placements") == 2

    # A job that fails for good is FAILED, and nothing changes it afterwards.
    doomed = History("doomed")
    await project([*doomed.began(), doomed.failed(1)])
    await project([doomed.succeeded(1, final_step=1000)])
    row = await job_row(pool, doomed.job_id)
    assert (row["state"], row["final_reason"]) == ("FAILED", "FAILURE_UNSTABLE")
    assert row["final_message"] == "energy is NaN"
    assert row["updated_at"] == doomed.times["failed:1"]
    assert (await attempt_rows(pool, doomed.job_id))[1]["ended_at"] == doomed.times["failed:1"]


async def test_events_of_a_stale_attempt_do_not_change_the_job(
    projector: Projector, pool: asyncpg.Pool, project: Project
) -> None:
    history = History("md")
    first, _ = requeue_history(history)
    await project(first)
    job_before = dict(await job_row(pool, history.job_id))
    attempts_before = {k: dict(v) for k, v in (await attempt_rows(pool, history.job_id)).items()}
    assert (job_before["state"], job_before["attempt"]) == ("RUNNING", 2)

    # The zombie first attempt keeps reporting, checkpoints and even claims success.
    stale = [
        history.progress(1, 900),
        history.checkpoint(1, 800),
        history.bound(1, "n9"),
        history.succeeded(1, final_step=1000),
        history.attempt_failed(1, "n1", last_step=950),
    ]
    # attempt_failed:1 and bound:1 repeat earlier event ids: JetStream drops them.
    await project(stale)

    assert dict(await job_row(pool, history.job_id)) == job_before
    attempts_after = {k: dict(v) for k, v in (await attempt_rows(pool, history.job_id)).items()}
    assert attempts_after == attempts_before
    # ... but the facts are in the log's projection, under their own attempt.
    assert (
        await pool.fetchval("SELECT count(*) FROM progress WHERE attempt = 1 AND step = 900") == 1
    )
    assert await pool.fetchval("SELECT count(*) FROM events WHERE kind = 'succeeded'") == 1


async def publish_copies(
    js: JetStreamContext, subjects: Subjects, events: list[pb.Event], *, suffix: str
) -> None:
    """Publish ``events`` again under their own ids, each with a message id of its own
    (``<event id>:<suffix>``), so that JetStream stores the copies instead of dropping them as
    duplicates: only the projector is left to tell them apart."""
    for event in events:
        await js.publish(
            subjects.for_event(event),
            encode(event),
            headers={"Nats-Msg-Id": f"{event.event_id}:{suffix}"},
        )


async def test_redelivery_and_replay_change_nothing(
    js: JetStreamContext, subjects: Subjects, pool: asyncpg.Pool, project: Project
) -> None:
    history = History("md")
    first, second = requeue_history(history)
    events = first + second
    async with running(js, subjects, pool):
        await project(first)
        await project(second)
        before = await dump(pool)
        assert len(before["events"]) == len(events)

        # The same events again, with new Nats-Msg-Ids so JetStream stores the copies.
        await publish_copies(js, subjects, events, suffix="again")
        await wait_projected(js, subjects, pool)
        assert await dump(pool) == before

        # A lifecycle event re-emitted later under its id (a watcher restarted after the
        # dedup window) carries a new time: job_events is partitioned by time, so only the id
        # lookup keeps it out, whatever month the new time falls in.
        later: list[pb.Event] = []
        for event in events:
            if event.WhichOneof("body") == "progress":
                continue
            copy = pb.Event()
            copy.CopyFrom(event)
            copy.time.FromSeconds(event.time.seconds + 40 * 24 * 3600)
            later.append(copy)
        await publish_copies(js, subjects, later, suffix="later")
        await wait_projected(js, subjects, pool)
        assert await dump(pool) == before

    # Forget the offsets: the restarted projector replays both streams from the start.
    await pool.execute("UPDATE consumer_offsets SET last_seq = 0")
    async with running(js, subjects, pool, batch_size=7):
        await wait_projected(js, subjects, pool)
        assert await dump(pool) == before


PROJECTOR_PROCESS = """
import asyncio, logging, sys
from mdq.bus.connect import connect
from mdq.bus.subjects import Subjects
from mdq.store.engine import create_writer_pool
from services.watcher.projector import Projector

async def main() -> None:
    nats_url, namespace, database_url = sys.argv[1:4]
    subjects = Subjects(namespace)
    client = await connect(nats_url, name="projector-under-test", subjects=subjects)
    pool = await create_writer_pool(database_url)
    projector = Projector(js=client.jetstream(), subjects=subjects, pool=pool, batch_size=50)
    await projector.run()

logging.basicConfig(level=logging.INFO)
asyncio.run(main())
"""


async def test_kill_9_mid_batch_loses_and_duplicates_nothing(
    publisher: EventPublisher,
    js: JetStreamContext,
    subjects: Subjects,
    pool: asyncpg.Pool,
    nats_url: str,
    namespace: str,
    database_url: str,
    tmp_path: Path,
) -> None:
    histories = [History(f"md{i}", steps=100_000) for i in range(5)]
    lifecycle = [event for history in histories for event in history.began()]
    await publish_in_order(publisher, lifecycle)
    steps_per_job = 800
    progress = [
        history.progress(1, step)
        for step in range(10, 10 * steps_per_job + 1, 10)
        for history in histories
    ]

    def start() -> subprocess.Popen[bytes]:
        log = (tmp_path / "projector.log").open("ab")
        return subprocess.Popen(
            [sys.executable, "-c", PROJECTOR_PROCESS, nats_url, namespace, database_url],
            cwd=REPO,
            stdout=log,
            stderr=log,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )

    async def progress_rows() -> int:
        return int(await pool.fetchval("SELECT count(*) FROM progress"))

    async def kill_when_busy(process: subprocess.Popen[bytes], at_least: int) -> int:
        deadline = asyncio.get_running_loop().time() + 30
        while (count := await progress_rows()) < at_least:
            assert process.poll() is None, (tmp_path / "projector.log").read_text()
            assert asyncio.get_running_loop().time() < deadline, "projector made no progress"
            await asyncio.sleep(0.005)
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
        return count

    chunks = [progress[i : i + 500] for i in range(0, len(progress), 500)]
    process = start()
    try:
        kills = []
        for number, chunk in enumerate(chunks):
            await publisher.publish_all(chunk)
            if number in (2, 5):
                kills.append(
                    await kill_when_busy(process, at_least=len(progress) // 8 * number // 2)
                )
                process = start()
        await wait_projected(js, subjects, pool, timeout=45)
    finally:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGKILL)
            process.wait()

    assert all(count < len(progress) for count in kills), kills  # killed while projecting
    assert await progress_rows() == len(progress)
    assert await pool.fetchval("SELECT count(*) FROM events") == len(lifecycle) + len(progress)
    stored = {row["event_id"] for row in await pool.fetch("SELECT event_id FROM events")}
    assert stored == {event.event_id for event in lifecycle + progress}
    for history in histories:
        job = await job_row(pool, history.job_id)
        assert (job["state"], job["last_step"]) == ("RUNNING", 10 * steps_per_job)
        assert (await attempt_rows(pool, history.job_id))[1]["last_step"] == 10 * steps_per_job


REPORT_BODIES = {
    "typical": pb.Progress(step=100, target_steps=1000, potential_kj_mol=-41_000.25),
    "tiny-huge-escaped": pb.Progress(
        step=1, time_ps=1e-7, eta_s=3e20, done_reason='steps "reached"\n'
    ),
    "zeros-left-out": pb.Progress(step=7, kinetic_kj_mol=0.0, ns_per_day=31.5),
    "nan": pb.Progress(temperature_k=math.nan, step=5),
    "infinity": pb.Progress(step=3, potential_kj_mol=-math.inf),
    "unicode": pb.Progress(step=9, done_reason="größer"),
    "full-precision": pb.Progress(
        step=2**40, target_steps=2**41, time_ps=0.1 + 0.2, potential_kj_mol=-1 / 3
    ),
}


async def test_a_report_is_stored_once_and_the_events_view_shows_its_body(
    projector: Projector, subjects: Subjects, pool: asyncpg.Pool, project: Project
) -> None:
    """Progress goes to ``progress`` only; the ``events`` view rebuilds each report's body as
    the protobuf JSON mapping, as ``job_events.body`` holds every other event's."""
    sent = {
        name: make_event(
            "progress",
            body,
            job_id=f"0123456789ab-{name}",
            attempt=1,
            producer="runner",
            at=T0,
            detail=body.step,
        )
        for name, body in REPORT_BODIES.items()
    }
    await project(list(sent.values()))

    assert await pool.fetchval("SELECT count(*) FROM job_events") == 0
    assert await pool.fetchval("SELECT count(*) FROM progress") == len(sent)
    rows = await pool.fetch(
        "SELECT event_id, job_id, stream, producer, body::text FROM events WHERE kind = 'progress'"
    )
    shown = {row["job_id"].split("-", 1)[1]: row for row in rows}
    for name, event in sent.items():
        row = shown[name]
        mapping = json_format.MessageToJson(
            event.progress, preserving_proto_field_name=True, indent=None
        )
        assert json.loads(row["body"]) == json.loads(mapping), name
        assert (row["event_id"], row["stream"], row["producer"]) == (
            event.event_id,
            subjects.progress_stream,
            "runner",
        )


async def test_a_consumer_deleted_under_the_projector_is_recreated_at_the_offset(
    projector: Projector,
    js: JetStreamContext,
    subjects: Subjects,
    pool: asyncpg.Pool,
    project: Project,
) -> None:
    history = History("md")
    first, second = requeue_history(history)
    await project(first)

    await js.delete_consumer(subjects.jobs_stream, "watcher-jobs")
    await js.delete_consumer(subjects.progress_stream, "watcher-progress")
    await project(second)

    job = await job_row(pool, history.job_id)
    assert (job["state"], job["last_step"]) == ("SUCCEEDED", 1000)
    assert await pool.fetchval("SELECT count(*) FROM events") == len(first) + len(second)


async def test_text_postgresql_refuses_and_impossible_times_do_not_stop_the_projection(
    projector: Projector,
    publisher: EventPublisher,
    js: JetStreamContext,
    subjects: Subjects,
    pool: asyncpg.Pool,
) -> None:
    """A NUL in a string (a pod's termination message, a runner's report) is stored as U+FFFD;
    an event whose time no datetime can hold is skipped; a report without a job id, on a job's
    subject, is skipped as foreign (its envelope does not match its subject); the events after
    them are projected."""
    history = History("md")
    failed = history.attempt_failed(1, "n1", last_step=300)
    failed.attempt_failed.message = "killed\x00by the kernel"
    report = history.progress(1, 100, done_reason="odd\x00")
    impossible = history.progress(1, 200)
    impossible.time.seconds = 400_000_000_000  # year ~14,700
    impossible.event_id += ":impossible"
    anonymous = history.progress(1, 150)
    anonymous.job_id, anonymous.event_id = "", "progress:-:1:150"  # a producer's bug
    events = [
        *history.began(),
        report,
        impossible,
        failed,
    ]
    await publish_in_order(publisher, events[:-1])
    # on the job's progress subject, but without the job id in the envelope
    await js.publish(subjects.progress(history.job_id), encode(anonymous))
    await publisher.publish(events[-1])
    await wait_projected(js, subjects, pool)

    stored = await pool.fetchval(
        "SELECT failure_message FROM attempts WHERE job_id = $1 AND attempt = 1", history.job_id
    )
    assert stored == "killed\ufffdby the kernel"
    reasons = await pool.fetch("SELECT step, done_reason FROM progress ORDER BY step")
    assert [(row["step"], row["done_reason"]) for row in reasons] == [(100, "odd\ufffd")]
    job = await job_row(pool, history.job_id)
    assert job["state"] == "RECOVERING"
    kept = await pool.fetchval("SELECT count(*) FROM job_events WHERE kind = 'progress'")
    assert kept == 0  # the report without a job id is not what its subject says
    assert projector.foreign_events == 1


async def test_the_projection_survives_a_nats_server_restart(
    tmp_path: Path, subjects: Subjects, pool: asyncpg.Pool
) -> None:
    """kill -9 of the NATS server mid-stream: the projector's fetches are lost with the
    connection; after the restart it asks again and projects the rest, each event once."""
    server = start_nats(tmp_path / "nats")
    client = await connect(server.url, name="projector-restart", subjects=subjects)
    try:
        js = client.jetstream()
        publisher = OwnersPublisher(js=js, subjects=subjects)
        history = History("md")
        first, second = requeue_history(history)
        async with running(js, subjects, pool):
            await publish_in_order(publisher, first)
            await wait_projected(js, subjects, pool)

            server.kill()
            await asyncio.sleep(1.0)  # an outage, not a blip: clients notice the server gone
            server = start_nats(tmp_path / "nats", port=server.port)
            await reconnected(client)

            await publish_in_order(publisher, second)
            await wait_projected(js, subjects, pool, timeout=30)
        job = await job_row(pool, history.job_id)
        assert (job["state"], job["last_step"]) == ("SUCCEEDED", 1000)
        assert await pool.fetchval("SELECT count(*) FROM events") == len(first) + len(second)
    finally:
        await client.close()
        server.stop()


async def test_an_event_its_producer_may_not_emit_or_on_another_jobs_subject_changes_nothing(
    projector: Projector,
    publisher: EventPublisher,
    js: JetStreamContext,
    subjects: Subjects,
    pool: asyncpg.Pool,
) -> None:
    """Behind the server's permissions: a ``succeeded`` that says intake made it, and a real
    ``succeeded`` of one job delivered onto another job's subject (what a JetStream reply
    aimed at a stream subject stores), are skipped and counted; the jobs stay RUNNING."""
    history, other = History("victim"), History("other")
    for events in (history, other):
        await publish_in_order(publisher, events.began())
    forged = history.succeeded(1, final_step=1000)
    forged.producer = "intake"
    forged.event_id += ":forged"
    await js.publish(subjects.for_event(forged), encode(forged))
    real_of_other = other.succeeded(1, final_step=1000)
    await js.publish(subjects.job(history.job_id, "succeeded"), encode(real_of_other))
    await wait_projected(js, subjects, pool)
    assert (await job_row(pool, history.job_id))["state"] == "RUNNING"
    assert (await job_row(pool, other.job_id))["state"] == "RUNNING"
    assert projector.foreign_events == 2
