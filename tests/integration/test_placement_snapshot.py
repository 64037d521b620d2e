"""Placement restarts from its snapshot plus the log's tail, and binds exactly what a replay of
the whole log binds; a snapshot that is missing, corrupt, too old or of another stream falls
back to a full replay and says so; a snapshot is written only when the state changed."""

from __future__ import annotations

import dataclasses
import logging
from collections import Counter
from datetime import timedelta
from typing import Any

import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.kv import KeyValue

from mdq.bus.snapshots import HEAD_KEY, SnapshotStore
from mdq.bus.subjects import Subjects
from mdq.contracts import pb
from mdq.core.snapshot import Head
from mdq.core.state import JobBook
from services.placement.app import Placement
from tests.helpers import (
    event,
    events_of,
    node_load,
    placement_of,
    placement_settled,
    publisher,
    running,
    snapshot_store,
    submitted,
    wait_for,
)


def make_placement(nc: Client, subjects: Subjects, *, interval_s: float = 0.1) -> Placement:
    return placement_of(
        nc.jetstream(),
        subjects,
        reconcile_interval_s=0.1,
        snapshot_interval_s=interval_s,
        leader_election=False,
        load_settle_s=0.0,
    )


def store(nc: Client, subjects: Subjects) -> SnapshotStore:
    return snapshot_store(nc.jetstream(), subjects, subjects.placement_snapshot_bucket)


async def bound_counts(nc: Client, subjects: Subjects) -> Counter[str]:
    return Counter(e.job_id for e in await events_of(nc.jetstream(), subjects, "bound"))


async def last_job_sequence(nc: Client, subjects: Subjects) -> int:
    return (await nc.jetstream().stream_info(subjects.jobs_stream)).state.last_seq or 0


def outcome(placement: Placement) -> dict[str, tuple[Any, ...]]:
    """Every job placement knows: its state (and attempt and node while it has not ended)."""
    known: dict[str, tuple[Any, ...]] = {
        job: (state,) for job, state in placement.state.snapshot()["ended"]
    }
    for view in placement.book.jobs.values():
        ended = view.state.terminal
        known[view.job_id] = (view.state.value,) if ended else (view.state.value, view.node)
    return known


async def caught_up(nc: Client, subjects: Subjects, placement: Placement) -> None:
    """Wait until ``placement`` folded the whole jobs log as it is now."""
    last = await last_job_sequence(nc, subjects)

    async def folded() -> bool:
        return placement.book.last_sequence >= last

    await wait_for(folded, what=f"the log folded up to {last}")


async def decided(placement: Placement, *, times: int) -> None:
    """Until ``placement`` decided ``times`` more times whether to write a snapshot: the
    positive marker that intervals passed (and what they wrote can be counted)."""
    start = placement.snapshot_decisions

    async def enough() -> bool:
        return placement.snapshot_decisions >= start + times

    await wait_for(enough, what=f"{times} snapshot decisions")


async def first_run(nc: Client, subjects: Subjects) -> int:
    """One node with room for two jobs; three submitted: two bound, one pending. Returns the
    sequence of the snapshot that holds both bindings."""
    bus = publisher(nc.jetstream(), subjects)
    await bus.publish(node_load("n1", cpu_capacity=2))
    await bus.publish_all([submitted(f"r1-j{i}") for i in range(3)])
    placement = make_placement(nc, subjects)
    async with running(placement.run()):

        async def written() -> bool:
            loaded = await store(nc, subjects).load()
            jobs = {raw["job_id"]: raw["state"] for raw in (loaded.state or {}).get("jobs", [])}
            return sorted(jobs.values()) == ["BOUND", "BOUND", "PENDING"] and (
                loaded.resume.after == await last_job_sequence(nc, subjects)
            )

        await wait_for(written, what="a snapshot of the whole log, with two jobs bound")
    loaded = await store(nc, subjects).load()
    assert loaded.resume.after > 0
    return loaded.resume.after


async def test_a_restart_from_the_snapshot_binds_what_a_full_replay_binds(
    nc: Client, subjects: Subjects, caplog: pytest.LogCaptureFixture
) -> None:
    sequence = await first_run(nc, subjects)
    bus = publisher(nc.jetstream(), subjects)
    # while placement is down: one bound job ends (its room frees), another job is submitted
    bound = sorted(await bound_counts(nc, subjects))
    await bus.publish(event("succeeded", pb.JobSucceeded(final_step=1000), job=bound[0], attempt=1))
    await bus.publish(submitted("r1-j3"))
    caplog.set_level(logging.INFO, logger="mdq.placement")
    restarted = make_placement(nc, subjects)
    async with running(restarted.run()):

        async def three_bound() -> bool:
            return len(await bound_counts(nc, subjects)) == 3

        await wait_for(three_bound, what="the pending job bound in the room that freed")
        marker = await placement_settled(nc.jetstream(), subjects, tag=1)
    assert restarted.restored_sequence == sequence
    assert f"replaying the jobs log from sequence {sequence + 1}" in caplog.text
    counts = await bound_counts(nc, subjects)
    assert counts == {"r1-j0": 1, "r1-j1": 1, "r1-j2": 1, marker: 1}, "none twice, j3 waits"
    assert restarted.fenced_total == 0

    # a placement that replays the whole log knows the same, and binds nothing more
    kv = await nc.jetstream().key_value(subjects.placement_snapshot_bucket)
    await kv.delete(HEAD_KEY)
    caplog.clear()
    replayed = make_placement(nc, subjects, interval_s=0)
    async with running(replayed.run()):
        second_marker = await placement_settled(nc.jetstream(), subjects, tag=2)
    assert replayed.restored_sequence == 0
    assert "full replay of the jobs log: no snapshot" in caplog.text
    replayed_knows = outcome(replayed)
    assert replayed_knows.pop(second_marker) == ("BOUND", "marker2")
    assert replayed_knows == outcome(restarted)
    assert outcome(restarted)["r1-j3"] == ("PENDING", "")
    assert await bound_counts(nc, subjects) == counts + Counter({second_marker: 1})


async def rewrite_head(kv: KeyValue, **changes: Any) -> Head:
    head = Head.from_json((await kv.get(HEAD_KEY)).value or b"")
    await kv.put(HEAD_KEY, dataclasses.replace(head, **changes).to_json())
    return head


async def tamper(case: str, nc: Client, subjects: Subjects, sequence: int) -> None:
    js = nc.jetstream()
    kv = await js.key_value(subjects.placement_snapshot_bucket)
    if case == "missing":
        await kv.delete(HEAD_KEY)
    elif case == "corrupt":
        head = Head.from_json((await kv.get(HEAD_KEY)).value or b"")
        await kv.put(f"{head.slot}.0", b"not zlib")
    elif case == "bad head":
        await kv.put(HEAD_KEY, b"{not json")
    elif case == "another stream":
        head = Head.from_json((await kv.get(HEAD_KEY)).value or b"")
        await rewrite_head(kv, stream_created=head.stream_created - timedelta(seconds=1))
    elif case == "too old":
        # two more events after the snapshot, then everything before the second one expires
        bus = publisher(js, subjects)
        await bus.publish_all([submitted("r1-j8"), submitted("r1-j9")])
        await js.purge_stream(subjects.jobs_stream, seq=sequence + 2)
    else:
        raise AssertionError(case)


@pytest.mark.parametrize(
    ("case", "reason"),
    [
        ("missing", "full replay of the jobs log: no snapshot"),
        ("corrupt", "full replay of the jobs log: snapshot unreadable: does not decompress"),
        ("bad head", "full replay of the jobs log: snapshot unreadable: head does not parse"),
        ("another stream", "full replay of the jobs log: snapshot of another stream"),
        ("too old", "full replay of the jobs log: snapshot older than the log's first message"),
    ],
)
async def test_an_unusable_snapshot_falls_back_to_a_full_replay(
    nc: Client,
    subjects: Subjects,
    js: JetStreamContext,
    caplog: pytest.LogCaptureFixture,
    case: str,
    reason: str,
) -> None:
    sequence = await first_run(nc, subjects)
    await tamper(case, nc, subjects, sequence)
    caplog.set_level(logging.INFO, logger="mdq.placement")
    restarted = make_placement(nc, subjects)
    async with running(restarted.run()):
        await placement_settled(nc.jetstream(), subjects)
    assert restarted.restored_sequence == 0
    assert reason in caplog.text
    assert "restored from the snapshot" not in caplog.text
    # what it knows is the log as it is now, folded from its first message
    book = JobBook()
    info = await js.stream_info(subjects.jobs_stream)
    for seq in range(info.state.first_seq or 1, (info.state.last_seq or 0) + 1):
        message = await js.get_msg(subjects.jobs_stream, seq=seq)
        if not (message.subject or "").startswith(subjects.claim_prefix):  # not an event
            book.apply(seq, pb.Event.FromString(message.data or b""))
    assert {job: view.state.value for job, view in book.jobs.items()} == {
        job: known[0] for job, known in outcome(restarted).items()
    }
    counts = await bound_counts(nc, subjects)
    assert set(counts.values()) == {1}, "no job bound twice"


async def test_a_snapshot_is_written_only_when_the_state_changed(
    nc: Client, subjects: Subjects
) -> None:
    await first_run(nc, subjects)
    # restored from a snapshot that covers the whole log: nothing changes, nothing is written
    restarted = make_placement(nc, subjects)
    async with running(restarted.run()):
        await caught_up(nc, subjects, restarted)
        await decided(restarted, times=5)
        assert restarted.restored_sequence > 0
        assert restarted.snapshots_written == 0
        await publisher(nc.jetstream(), subjects).publish(submitted("r1-j5"))

        async def written() -> bool:
            return restarted.snapshots_written == 1

        await wait_for(written, what="a snapshot once a job was submitted")
        await decided(restarted, times=5)
        assert restarted.snapshots_written == 1
    loaded = await store(nc, subjects).load()
    assert loaded.resume.after == await last_job_sequence(nc, subjects)
    assert "r1-j5" in {raw["job_id"] for raw in (loaded.state or {})["jobs"]}
