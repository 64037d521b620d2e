"""Placement against a real JetStream: binding, spreading, chains, backoff and restarts."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext

from mdq.bus.connect import connect
from mdq.bus.publisher import EventPublisher
from mdq.bus.requests import Requests
from mdq.bus.subjects import Subjects
from mdq.contracts import pb
from mdq.core.placement import NodeScore
from mdq.embedded import start_nats
from services.placement.app import REPLAY_PRUNE_BATCH, Placement, candidate_entry
from services.placement.settings import PlacementSettings
from tests.helpers import (
    RecordingBackend,
    event,
    events_of,
    node_load,
    placement_of,
    placement_settled,
    publisher,
    reconnected,
    running,
    submitted,
    wait_for,
    wait_for_events,
)


async def test_binds_pending_jobs_spread_over_nodes_with_pods(
    js: JetStreamContext, bus: EventPublisher, backend: RecordingBackend, subjects: Subjects
) -> None:
    await bus.publish_all([node_load("n1"), node_load("n2")])
    await bus.publish_all([submitted(f"r1-job{i}") for i in range(6)])
    async with running(placement_of(js, subjects, backend).run()):
        await wait_for_events(js, subjects, "bound", count=6, what="6 bound events")
    bound = await events_of(js, subjects, "bound")
    assert Counter(e.bound.node for e in bound) == {"n1": 3, "n2": 3}
    assert sorted(backend.pods) == sorted(f"mdq-r1-job{i}-1" for i in range(6))
    pod = backend.pods["mdq-r1-job0-1"]
    # the pod describes the attempt (no command, no environment: the backend builds those)
    assert (pod.job_id, pod.attempt, pod.spec.name, pod.threads) == ("r1-job0", 1, "job0", 1)
    assert {c.node for c in bound[0].bound.candidates} == {"n1", "n2"}


async def test_a_pass_s_bindings_are_stored_as_one_atomic_batch(
    nc: Client, subjects: Subjects, js: JetStreamContext, bus: EventPublisher
) -> None:
    """Over ``Requests`` (as the service runs), the ``bound`` events of one pass go to the log
    as one atomic batch: one flush for all of them (docs/durability.md, "Group commit"), each
    still fenced and stored once."""
    await bus.publish_all([node_load("n1", cpu_capacity=64, memory_mb=1_000_000)])
    await bus.publish_all([submitted(f"r8-job{i}") for i in range(12)])
    requests = await Requests(nc).start()
    placement = Placement(
        js=js,
        subjects=subjects,
        publisher=EventPublisher(js=requests, subjects=subjects, producer="placement"),
        backend=RecordingBackend(),
        settings=PlacementSettings(reconcile_interval_s=0.2),
        namespace=subjects.namespace,
    )
    try:
        async with running(placement.run()):
            await wait_for_events(js, subjects, "bound", count=12, what="12 bound events")
    finally:
        await requests.close()
    batches: Counter[str] = Counter()
    info = await js.stream_info(subjects.jobs_stream)
    for sequence in range(1, info.state.last_seq + 1):
        stored = await js.get_msg(subjects.jobs_stream, sequence)
        if stored.subject and stored.subject.endswith(".bound"):
            batches[(stored.headers or {}).get("Nats-Batch-Id", "")] += 1
    assert "" not in batches and sum(batches.values()) == 12
    assert max(batches.values()) > 1  # more than one binding per flush


async def test_a_node_named_with_dots_is_followed_and_bound_to(
    js: JetStreamContext, bus: EventPublisher, backend: RecordingBackend, subjects: Subjects
) -> None:
    """Kubernetes names nodes with DNS subdomains (EKS: ``ip-10-0-0-1.ec2.internal``): the
    node's load is stored, followed by placement and bound to under its own name, although
    its name's dots would split a subject into more tokens than the nodes stream captures."""
    node = "ip-10-0-0-1.ec2.internal"
    await bus.publish_all([node_load(node)])
    await bus.publish_all([submitted("r1-dotted")])
    async with running(placement_of(js, subjects, backend).run()):
        await wait_for_events(js, subjects, "bound", count=1, what="the job bound")
    [event] = await events_of(js, subjects, "bound")
    assert event.bound.node == node
    assert backend.pods["mdq-r1-dotted-1"].node == node


async def test_full_nodes_leave_jobs_pending_until_capacity_frees(
    js: JetStreamContext, bus: EventPublisher, backend: RecordingBackend, subjects: Subjects
) -> None:
    await bus.publish_all([node_load("n1", cpu_capacity=2)])
    await bus.publish_all([submitted(f"r2-j{i}") for i in range(3)])
    async with running(placement_of(js, subjects, backend).run()):
        await wait_for_events(js, subjects, "bound", count=2, what="2 bound")
        marker = await placement_settled(js, subjects)
        bound = {e.job_id for e in await events_of(js, subjects, "bound")} - {marker}
        assert len(bound) == 2, "the third job stays pending while the node is full"
        first = (await events_of(js, subjects, "bound"))[0]
        await bus.publish(
            event("succeeded", pb.JobSucceeded(final_step=1000), job=first.job_id, attempt=1)
        )

        async def three_bound() -> bool:
            bound = await events_of(js, subjects, "bound")
            return len([e for e in bound if e.job_id.startswith("r2-")]) == 3

        await wait_for(three_bound, what="the third job bound once a slot freed")


async def test_chain_waits_for_its_dependency(
    js: JetStreamContext, bus: EventPublisher, backend: RecordingBackend, subjects: Subjects
) -> None:
    await bus.publish_all([node_load("n1")])
    await bus.publish(submitted("r3-init"))
    await bus.publish(submitted("r3-run", depends_on=("r3-init",)))
    async with running(placement_of(js, subjects, backend).run()):
        await wait_for_events(js, subjects, "bound", "r3-init", count=1, what="init bound")
        assert await events_of(js, subjects, "bound", "r3-run") == []
        await bus.publish(
            event("succeeded", pb.JobSucceeded(final_step=1), job="r3-init", attempt=1)
        )

        await wait_for_events(
            js, subjects, "bound", "r3-run", count=1, what="run bound after init succeeded"
        )
    assert len(await events_of(js, subjects, "released", "r3-run")) == 1
    assert backend.pods["mdq-r3-run-1"].depends_on == ("r3-init",)


async def test_dependency_failure_fails_the_chain(
    js: JetStreamContext, bus: EventPublisher, subjects: Subjects
) -> None:
    await bus.publish(submitted("r4-init"))
    await bus.publish(submitted("r4-run", depends_on=("r4-init",)))
    await bus.publish(
        event("failed", pb.JobFailed(reason=pb.FAILURE_UNSTABLE), job="r4-init", attempt=1)
    )
    async with running(placement_of(js, subjects).run()):
        await wait_for_events(
            js, subjects, "failed", "r4-run", count=1, what="dependent job failed"
        )
    failure = (await events_of(js, subjects, "failed", "r4-run"))[0].failed
    assert failure.reason == pb.FAILURE_DEPENDENCY_FAILED and "r4-init" in failure.message


async def test_backoff_not_before_is_honoured(
    js: JetStreamContext, bus: EventPublisher, backend: RecordingBackend, subjects: Subjects
) -> None:
    await bus.publish_all([node_load("n1")])
    await bus.publish(submitted("r5-a"))
    await bus.publish(event("bound", pb.JobBound(node="n1"), job="r5-a", attempt=1))
    await bus.publish(
        event("attempt_failed", pb.AttemptFailed(reason=pb.FAILURE_CRASHED), job="r5-a", attempt=1)
    )
    requeue = pb.JobRequeued()
    requeue.not_before.FromDatetime(datetime.now(UTC) + timedelta(seconds=2))
    requeue.resources.cpu, requeue.resources.memory_mb = 1, 512
    await bus.publish(event("requeued", requeue, job="r5-a", attempt=2))
    started = datetime.now(UTC)
    async with running(placement_of(js, subjects, backend).run()):

        async def attempt2_bound() -> bool:
            return any(e.attempt == 2 for e in await events_of(js, subjects, "bound", "r5-a"))

        await wait_for(attempt2_bound, what="attempt 2 bound")
    assert datetime.now(UTC) - started >= timedelta(seconds=1.5)
    assert "mdq-r5-a-2" in backend.pods


async def test_restart_binds_no_job_twice_and_repairs_missing_pods(
    js: JetStreamContext, bus: EventPublisher, subjects: Subjects
) -> None:
    await bus.publish_all([node_load("n1", cpu_capacity=64, memory_mb=1_000_000)])
    await bus.publish_all([submitted(f"r6-j{i}") for i in range(40)])
    first = RecordingBackend()
    async with running(placement_of(js, subjects, first).run()):

        async def some_bound() -> bool:
            return len(await events_of(js, subjects, "bound")) >= 1

        await wait_for(some_bound, what="first bindings")
    # A new incarnation with an empty backend: it must bind the rest and recreate every pod.
    second = RecordingBackend()
    await bus.publish_all([submitted(f"r6-k{i}") for i in range(10)])
    async with running(placement_of(js, subjects, second).run()):
        await wait_for_events(js, subjects, "bound", count=50, what="50 bound")

        async def all_pods() -> bool:
            return len(second.pods) == 50

        await wait_for(all_pods, what=f"every pod present after the restart ({len(second.pods)})")
        marker = await placement_settled(js, subjects)
    bound = [e.job_id for e in await events_of(js, subjects, "bound") if e.job_id != marker]
    assert Counter(bound) == Counter(
        [f"r6-j{i}" for i in range(40)] + [f"r6-k{i}" for i in range(10)]
    ), "every job bound exactly once across the restart"


async def test_placement_keeps_binding_after_a_nats_server_restart(
    tmp_path: Path, subjects: Subjects
) -> None:
    """kill -9 of the NATS server: placement's log consumers resume where they were, so jobs
    submitted after the restart are bound and none bound before is bound again."""
    server = start_nats(tmp_path / "nats")
    client = await connect(server.url, name="placement-restart", subjects=subjects)
    try:
        js = client.jetstream()
        bus = publisher(js, subjects)
        await bus.publish_all([node_load("n1"), node_load("n2")])
        await bus.publish_all([submitted(f"r7-before{i}") for i in range(3)])
        backend = RecordingBackend()
        async with running(placement_of(client.jetstream(), subjects, backend).run()):

            async def bound(count: int) -> bool:
                return len(await events_of(js, subjects, "bound")) >= count

            await wait_for(lambda: bound(3), what="3 bound events before the restart")
            server.kill()
            await asyncio.sleep(1.0)  # an outage, not a blip: clients notice the server gone
            server = start_nats(tmp_path / "nats", port=server.port)
            await reconnected(client)
            await bus.publish_all([node_load("n1"), node_load("n2")])
            await bus.publish_all([submitted(f"r7-after{i}") for i in range(3)])
            await wait_for(lambda: bound(6), timeout=40, what="3 more bound events")
        jobs = [event.job_id for event in await events_of(js, subjects, "bound")]
        assert sorted(jobs) == sorted(
            [f"r7-before{i}" for i in range(3)] + [f"r7-after{i}" for i in range(3)]
        )
    finally:
        await client.close()
        server.stop()


def test_encoded_candidate_entries_concatenate_into_the_explanation() -> None:
    """bound events take their candidates from per-score encoded entries: the result is the
    message built field by field, byte for byte."""
    scores = [
        NodeScore("n1", 55.5, "", 0.1, 0.2),
        NodeScore("n2", 0.0, "insufficient cpu", 0.3, 0.4),
        NodeScore("n-3", -4.25, "", 0.0, 1.0),
    ]
    built = pb.JobBound(node="n1", nodes_total=3)
    for score in scores:
        built.candidates.add(
            node=score.node,
            score=score.score,
            filtered=score.filtered,
            cpu_load=score.cpu_load,
            memory_load=score.memory_load,
        )
    merged = pb.JobBound(node="n1", nodes_total=3)
    merged.MergeFromString(b"".join(candidate_entry(score) for score in scores))
    assert merged.SerializeToString(deterministic=True) == built.SerializeToString(
        deterministic=True
    )


async def test_a_submitted_event_with_an_invalid_spec_is_never_bound(
    js: JetStreamContext, bus: EventPublisher, backend: RecordingBackend, subjects: Subjects
) -> None:
    """Only intake may publish ``submitted``, but placement validates the spec it acts on
    again: a forged one (here: a negative temperature and 10^6 cores) is skipped, counted and
    logged; a valid job submitted after it is bound as usual."""
    await bus.publish_all([node_load("n1")])
    forged = submitted("r9-forged")
    forged.submitted.spec.temperature_k = -5.0
    forged.submitted.spec.resources.cpu = 1e6
    await bus.publish(forged)
    await bus.publish(submitted("r9-honest"))
    placement = placement_of(js, subjects, backend)
    async with running(placement.run()):
        await wait_for_events(
            js, subjects, "bound", "r9-honest", count=1, what="the valid job bound"
        )
    assert await events_of(js, subjects, "bound", "r9-forged") == []
    assert sorted(backend.pods) == ["mdq-r9-honest-1"]
    assert placement.invalid_specs_total == 1
    assert "r9-forged" not in placement.book.jobs


async def test_a_dependency_forgotten_long_ago_is_read_from_the_log(
    js: JetStreamContext,
    bus: EventPublisher,
    backend: RecordingBackend,
    subjects: Subjects,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Placement remembers no ended job here (``ended_memory`` 0): a chain whose dependency
    ended before the chain was submitted has its final state read from the jobs log."""
    await bus.publish(node_load("n1"))
    await bus.publish_all([submitted("r9-old"), submitted("r9-bad")])
    placement = placement_of(js, subjects, backend, reconcile_interval_s=0.1, ended_memory=0)
    caplog.set_level(logging.WARNING, logger="mdq.placement")
    async with running(placement.run()):
        await wait_for_events(js, subjects, "bound", count=2, what="the two dependencies bound")
        await bus.publish(
            event("succeeded", pb.JobSucceeded(final_step=1), job="r9-old", attempt=1)
        )
        await bus.publish(
            event("failed", pb.JobFailed(reason=pb.FAILURE_UNSTABLE), job="r9-bad", attempt=1)
        )

        async def forgotten() -> bool:
            return placement.state.sizes()["jobs"] == 0

        await wait_for(forgotten, what="both ended and forgotten")
        assert placement.state.sizes()["ended"] == 0
        await bus.publish_all(
            [
                submitted("r9-next", depends_on=("r9-old",)),
                submitted("r9-doomed", depends_on=("r9-bad",)),
                submitted("r9-orphan", depends_on=("r9-ghost",)),
            ]
        )

        async def decided() -> bool:
            return bool(
                await events_of(js, subjects, "bound", "r9-next")
                and await events_of(js, subjects, "failed", "r9-doomed")
            )

        await wait_for(decided, what="next released and bound, doomed failed")

        async def orphan_said() -> bool:
            return "dependency r9-ghost is neither live nor ended" in caplog.text

        await wait_for(orphan_said, what="the orphan's missing dependency logged")
    assert len(await events_of(js, subjects, "released", "r9-next")) == 1
    failure = (await events_of(js, subjects, "failed", "r9-doomed"))[0].failed
    assert failure.reason == pb.FAILURE_DEPENDENCY_FAILED and "r9-bad" in failure.message
    assert await events_of(js, subjects, "released", "r9-orphan") == []
    assert await events_of(js, subjects, "failed", "r9-orphan") == []
    assert caplog.text.count("dependency r9-ghost is neither") == 1, "asked once"


async def test_a_cold_replay_lets_ended_jobs_go_as_it_reads(
    js: JetStreamContext, bus: EventPublisher, subjects: Subjects
) -> None:
    """With no snapshot placement folds the whole log: ended jobs are forgotten every
    ``REPLAY_PRUNE_BATCH`` as it reads, so what it holds follows the live jobs, not the
    history (``make bench-scale`` measures the RSS)."""
    await bus.publish(node_load("n1"))
    history = 3 * REPLAY_PRUNE_BATCH
    for start in range(0, history, 500):
        await bus.publish_all(
            [
                each
                for index in range(start, min(start + 500, history))
                for each in (
                    submitted(f"r{index}-old"),
                    event(
                        "failed",
                        pb.JobFailed(reason=pb.FAILURE_UNSTABLE),
                        job=f"r{index}-old",
                        attempt=0,
                    ),
                )
            ]
        )
    placement = placement_of(js, subjects)
    held: list[int] = []
    fold = placement.on_job_event

    async def folding(sequence: int, event: pb.Event) -> None:
        await fold(sequence, event)
        held.append(placement.state.sizes()["jobs"])

    placement.on_job_event = folding  # type: ignore[method-assign]
    async with running(placement.run()):

        async def replayed() -> bool:
            return len(held) >= 2 * history

        await wait_for(replayed, timeout=60, what="the whole history folded")
    assert max(held) <= REPLAY_PRUNE_BATCH + 1, max(held)
    assert placement.state.sizes()["jobs"] <= REPLAY_PRUNE_BATCH


async def test_a_job_waiting_as_long_as_the_jobs_log_keeps_is_ended(
    js: JetStreamContext, bus: EventPublisher, subjects: Subjects
) -> None:
    """Submitted 400 days ago and never run (no node; a dependency that never ends): failed
    with FAILURE_EXPIRED while the log still holds it. A job submitted now waits on."""
    long_ago = datetime.now(UTC) - timedelta(days=400)
    for submit in (
        submitted("r9-pending"),
        submitted("r9-waiting", depends_on=("r9-never",)),
        submitted("r9-never"),
    ):
        submit.time.FromDatetime(long_ago)
        await bus.publish(submit)
    await bus.publish(submitted("r9-young"))
    async with running(placement_of(js, subjects).run()):
        await wait_for_events(js, subjects, "failed", count=3, what="the three old jobs to end")
    failed = {event.job_id: event.failed for event in await events_of(js, subjects, "failed")}
    assert set(failed) == {"r9-pending", "r9-waiting", "r9-never"}
    assert {failure.reason for failure in failed.values()} == {pb.FAILURE_EXPIRED}
    assert "the jobs log keeps 365 days" in failed["r9-pending"].message
