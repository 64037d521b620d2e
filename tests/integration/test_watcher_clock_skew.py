"""A runner on a node whose clock is off: the watcher judges its silence on its own clock.

The runner stamps each progress report with its node's time; a node whose time service failed
may be minutes behind or ahead of the watcher. Behind, every report looked minutes old, so each
attempt was declared lost at the first check and the job never finished; ahead, a runner that
died was kept alive until its clock's lead ran out.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from nats.aio.client import Client

from mdq.bus.subjects import Subjects
from mdq.contracts import pb
from mdq.core.state import JobState
from services.watcher.lifecycle import LostRunPolicy
from tests.helpers import (
    RecordingBackend,
    event,
    events_of,
    publisher,
    running,
    submitted,
    wait_for,
)
from tests.integration.test_watcher_lifecycle import CountingLifecycle, lifecycle_of

LOST = LostRunPolicy(min_silence_s=1.0, interval_factor=5.0)
"""Lost after a second of silence (or five report intervals), checked every 0.2 s."""
SKEW = timedelta(minutes=10)


async def running_job(nc: Client, subjects: Subjects, job: str) -> None:
    bus = publisher(nc.jetstream(), subjects)
    await bus.publish(submitted(job))
    await bus.publish(
        event("bound", pb.JobBound(node="n1", pod_name=f"mdq-{job}-1"), job=job, attempt=1)
    )
    await bus.publish(event("started", pb.JobStarted(node="n1"), job=job, attempt=1))


def report(job: str, step: int, at: datetime) -> pb.Event:
    made = event(
        "progress", pb.Progress(step=step, target_steps=10**6), job=job, attempt=1, detail=step
    )
    made.time.FromDatetime(at)
    return made


async def test_a_runner_whose_clock_is_behind_is_not_lost_while_it_reports(
    nc: Client, subjects: Subjects
) -> None:
    job = "cs1-md"
    await running_job(nc, subjects, job)
    bus = publisher(nc.jetstream(), subjects)
    backend = RecordingBackend()
    lifecycle = lifecycle_of(CountingLifecycle, nc, subjects, backend, LOST)
    async with running(lifecycle.run()):
        for step in range(1, 16):  # three seconds of reports, each ten minutes "old"
            await bus.publish(report(job, step * 100, datetime.now(UTC) - SKEW))
            await asyncio.sleep(0.2)
        checks = lifecycle.checks

        async def checked_twice_more() -> bool:
            return lifecycle.checks >= checks + 2

        await wait_for(checked_twice_more, what="two more lost-run checks")
        view = lifecycle.book.jobs[job]
        assert view.state is JobState.RUNNING and view.last_step == 1500
    assert await events_of(nc.jetstream(), subjects, "attempt_failed", job) == []
    assert backend.deleted == []


async def test_a_runner_whose_clock_is_ahead_is_lost_once_it_falls_silent(
    nc: Client, subjects: Subjects
) -> None:
    job = "cs2-md"
    await running_job(nc, subjects, job)
    bus = publisher(nc.jetstream(), subjects)
    for step in (100, 200):  # two reports ten minutes "from now", then nothing
        await bus.publish(report(job, step, datetime.now(UTC) + SKEW))
    backend = RecordingBackend()
    lifecycle = lifecycle_of(CountingLifecycle, nc, subjects, backend, LOST)
    async with running(lifecycle.run()):

        async def ended() -> bool:
            view = lifecycle.book.jobs.get(job)
            return view is not None and view.state is not JobState.RUNNING

        await wait_for(ended, what="the silent job declared lost")
    failed = await events_of(nc.jetstream(), subjects, "attempt_failed", job)
    assert [each.attempt_failed.reason for each in failed] == [pb.FAILURE_LOST]
    assert f"mdq-{job}-1" in backend.deleted
