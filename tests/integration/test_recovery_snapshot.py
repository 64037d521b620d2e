"""Recovery restarts from its snapshot plus the log's tail and decides exactly what a replay of
the whole log decides; the snapshot holds the live jobs only; a missing or corrupt snapshot
falls back to a full replay and says so."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import pytest
from nats.aio.client import Client

from mdq.bus.snapshots import SnapshotStore
from mdq.bus.subjects import Subjects
from mdq.contracts import pb
from mdq.core.recovery import RecoveryPolicy
from mdq.core.snapshot import chunk_key
from services.recovery.app import Recovery
from tests.helpers import (
    event,
    events_of,
    publisher,
    recovery_of,
    running,
    snapshot_store,
    submitted,
    wait_for,
)


def store(nc: Client, subjects: Subjects) -> SnapshotStore:
    return snapshot_store(nc.jetstream(), subjects, subjects.recovery_snapshot_bucket)


def make_recovery(nc: Client, subjects: Subjects, *, snapshots: bool = True) -> Recovery:
    return recovery_of(
        nc.jetstream(),
        subjects,
        RecoveryPolicy(backoff_base_s=0.0),
        snapshots=store(nc, subjects) if snapshots else None,
        snapshot_interval_s=0.1,
    )


async def last_sequence(nc: Client, subjects: Subjects) -> int:
    return (await nc.jetstream().stream_info(subjects.jobs_stream)).state.last_seq or 0


async def run_job(nc: Client, subjects: Subjects, job: str, *, ends: bool) -> None:
    bus = publisher(nc.jetstream(), subjects)
    await bus.publish(submitted(job))
    await bus.publish(event("bound", pb.JobBound(node="n1"), job=job, attempt=1))
    await bus.publish(event("started", pb.JobStarted(node="n1"), job=job, attempt=1))
    if ends:
        await bus.publish(event("succeeded", pb.JobSucceeded(final_step=10), job=job, attempt=1))


async def crash(nc: Client, subjects: Subjects, job: str, attempt: int = 1) -> None:
    failure = pb.AttemptFailed(reason=pb.FAILURE_CRASHED, node="n1", last_step=100)
    await publisher(nc.jetstream(), subjects).publish(
        event("attempt_failed", failure, job=job, attempt=attempt)
    )


async def requeued(nc: Client, subjects: Subjects, job: str) -> list[pb.Event]:
    return await events_of(nc.jetstream(), subjects, "requeued", job)


async def snapshot_of_the_whole_log(nc: Client, subjects: Subjects, recovery: Recovery) -> int:
    """Wait until ``recovery`` wrote a snapshot at the log's last sequence; return it."""

    async def written() -> bool:
        loaded = await store(nc, subjects).load()
        return loaded.resume.after == await last_sequence(nc, subjects)

    await wait_for(written, what="a snapshot of the whole log")
    return (await store(nc, subjects).load()).resume.after


async def test_a_restart_from_the_snapshot_decides_what_a_full_replay_decides(
    nc: Client, subjects: Subjects, caplog: pytest.LogCaptureFixture
) -> None:
    for index in range(20):
        await run_job(nc, subjects, f"rs-done{index}", ends=True)
    await run_job(nc, subjects, "rs-a", ends=False)
    await run_job(nc, subjects, "rs-b", ends=False)
    await crash(nc, subjects, "rs-a")
    first = make_recovery(nc, subjects)
    async with running(first.run()):

        async def a_requeued() -> bool:
            return len(await requeued(nc, subjects, "rs-a")) == 1

        await wait_for(a_requeued, what="rs-a requeued")
        sequence = await snapshot_of_the_whole_log(nc, subjects, first)
    loaded = await store(nc, subjects).load()
    assert loaded.state is not None
    held = {raw["job_id"]: raw["state"] for raw in loaded.state["jobs"]}
    assert held == {"rs-a": "PENDING", "rs-b": "RUNNING"}, "ended jobs are not in it"

    # while recovery is down: rs-b crashes, and a new job runs
    await crash(nc, subjects, "rs-b")
    await run_job(nc, subjects, "rs-c", ends=False)
    caplog.set_level(logging.INFO, logger="mdq.recovery")
    second = make_recovery(nc, subjects)
    async with running(second.run()):

        async def b_requeued() -> bool:
            return len(await requeued(nc, subjects, "rs-b")) == 1

        await wait_for(b_requeued, what="rs-b requeued after the restart")
        await crash(nc, subjects, "rs-c")

        async def c_requeued() -> bool:
            return len(await requeued(nc, subjects, "rs-c")) == 1

        await wait_for(c_requeued, what="rs-c requeued while running")
        final = await last_sequence(nc, subjects)

        async def folded() -> bool:
            return second.state.last_sequence >= final

        await wait_for(folded, what="the log folded")
    assert second.restored_sequence == sequence
    assert f"replaying the jobs log from sequence {sequence + 1}" in caplog.text
    assert second.decisions == 2 and len(await requeued(nc, subjects, "rs-a")) == 1
    assert second.first_sequence_read == sequence + 1, "only the tail was read"

    # a recovery that replays the whole log knows the same and decides nothing more
    replay = make_recovery(nc, subjects, snapshots=False)
    async with running(replay.run()):

        async def replayed() -> bool:
            return replay.state.last_sequence >= final

        await wait_for(replayed, what="the full replay")
    assert replay.decisions == 0 and replay.first_sequence_read == 1
    assert replay.state.snapshot() == second.state.snapshot()
    assert replay.state.forgotten == 20 and sorted(replay.state.book.jobs) == [
        "rs-a",
        "rs-b",
        "rs-c",
    ]


async def test_without_a_usable_snapshot_the_whole_log_is_replayed_and_said(
    nc: Client, subjects: Subjects, caplog: pytest.LogCaptureFixture
) -> None:
    await run_job(nc, subjects, "rf-a", ends=False)
    caplog.set_level(logging.INFO, logger="mdq.recovery")
    first = make_recovery(nc, subjects)
    async with running(first.run()):
        await snapshot_of_the_whole_log(nc, subjects, first)
    assert "full replay of the jobs log: no snapshot" in caplog.text

    # the snapshot's only chunk is damaged: unreadable, so the whole log is read again
    head = await store(nc, subjects).load()
    assert head.state is not None
    kv = await nc.jetstream().key_value(subjects.recovery_snapshot_bucket)
    for slot in ("a", "b"):
        try:
            entry = await kv.get(chunk_key(slot, 0))
        except Exception:
            continue
        await kv.put(chunk_key(slot, 0), (entry.value or b"")[:-4] + b"xxxx")
    await crash(nc, subjects, "rf-a")
    caplog.clear()
    second = make_recovery(nc, subjects)
    async with running(second.run()):

        async def a_requeued() -> bool:
            return len(await requeued(nc, subjects, "rf-a")) == 1

        await wait_for(a_requeued, what="rf-a requeued after a full replay")
    assert second.restored_sequence == 0
    assert "full replay of the jobs log: snapshot unreadable" in caplog.text


class _DroppingStore(SnapshotStore):
    """A snapshot store whose write loses the cancellation that lands in it, as nats-py's
    requests can on Python 3.11 (their ``asyncio.wait_for`` returns the answer instead)."""

    entered = asyncio.Event()

    async def write(self, *args: object, **kwargs: object) -> None:
        self.entered.set()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(30)


async def test_recovery_stops_when_a_snapshot_write_drops_its_cancel(
    nc: Client, subjects: Subjects
) -> None:
    await run_job(nc, subjects, "rc-a", ends=False)
    js = nc.jetstream()
    store = _DroppingStore(
        js, bucket=subjects.recovery_snapshot_bucket, stream=subjects.jobs_stream, replicas=1
    )
    recovery = recovery_of(js, subjects, snapshots=store, snapshot_interval_s=0.05)
    task = asyncio.create_task(recovery.run())

    async def folded() -> bool:
        return recovery.state.last_sequence > 0

    await wait_for(folded, what="the log folded")
    await asyncio.wait_for(store.entered.wait(), timeout=20)  # inside its (dropping) write
    task.cancel()
    done, _ = await asyncio.wait([task], timeout=5)
    assert done, "recovery did not stop after its cancel"
