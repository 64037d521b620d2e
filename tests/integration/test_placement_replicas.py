"""Placement replicas, kill -9, preemption, cordon and silence, and ``mdq explain``, on a real
JetStream (and the real local backend for the kill -9 test)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from nats.aio.client import Client
from nats.js import JetStreamContext

from mdq.backends.local.api import LocalBackend
from mdq.bus.kv import bucket_keys
from mdq.bus.publisher import EventPublisher
from mdq.bus.subjects import Subjects
from mdq.contracts import pb
from mdq.core.events import make_event
from services.placement.app import Placement
from tests.helpers import (
    RecordingBackend,
    event,
    events_of,
    node_load,
    placement_of,
    publisher,
    read_all,
    running,
    submitted,
    wait_for,
    wait_for_events,
)

REPO = Path(__file__).resolve().parents[2]


def make_placement(
    js: JetStreamContext,
    subjects: Subjects,
    backend: RecordingBackend | None = None,
    **settings: Any,
) -> Placement:
    """A placement replica whose lease runs out 1.5 s after its leader stops renewing it."""
    return placement_of(js, subjects, backend, lease_ttl_s=1.5, **settings)


@contextlib.asynccontextmanager
async def fresh_loads(nc: Client, subjects: Subjects, *names: str) -> AsyncIterator[None]:
    """Keep publishing an idle, big load report for each node (the metrics service's job)."""
    bus = publisher(nc.jetstream(), subjects)

    async def loop() -> None:
        while True:
            await bus.publish_all(
                [node_load(name, cpu_capacity=1000, memory_mb=10_000_000) for name in names]
            )
            await asyncio.sleep(1.0)

    task = asyncio.create_task(loop())
    try:
        await asyncio.sleep(0.1)
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def assert_bound_once(bound: list[pb.Event], backend: RecordingBackend) -> None:
    """One bound event per job; its pod exists, on the bound node."""
    per_job = Counter(e.job_id for e in bound)
    assert max(per_job.values()) == 1, [job for job, n in per_job.items() if n > 1]
    assert len(backend.pods) == len(bound)
    for e in bound:
        assert backend.pods[e.bound.pod_name].node == e.bound.node


async def test_two_replicas_with_the_lease_never_double_bind_and_hand_over(
    nc: Client, subjects: Subjects, js: JetStreamContext, bus: EventPublisher
) -> None:
    cluster = RecordingBackend()  # one cluster, two placement replicas
    a = make_placement(js, subjects, cluster)
    b = make_placement(js, subjects, cluster)
    async with fresh_loads(nc, subjects, "n1", "n2", "n3"):
        async with running(a.run()) as task_a, running(b.run()) as task_b:
            await bus.publish_all([submitted(f"rp1-j{i}") for i in range(150)])

            await wait_for_events(js, subjects, "bound", count=150, what="150 bound")
            assert sorted([a.leader, b.leader]) == [False, True]
            leader_task, leader, follower = (task_a, a, b) if a.leader else (task_b, b, a)
            assert leader.bound_total == 150 and follower.bound_total == 0
            # the leader goes away: the follower takes the lease and binds what comes next
            leader_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await leader_task
            await bus.publish_all([submitted(f"rp1-k{i}") for i in range(30)])

            await wait_for_events(
                js, subjects, "bound", count=180, what="30 more bound by the new leader"
            )
            assert follower.leader and follower.bound_total == 30
        bound = await events_of(js, subjects, "bound")
    assert_bound_once(bound, cluster)


async def test_active_active_replicas_are_fenced_per_job(
    js: JetStreamContext, bus: EventPublisher, subjects: Subjects
) -> None:
    """Two replicas with the same view decide at the same moment, without the lease: the fence
    on the bound event (expected last subject sequence) lets exactly one bind each job."""
    await bus.publish_all([node_load("n1", cpu_capacity=1000, memory_mb=10_000_000)])
    await bus.publish_all([submitted(f"rp2-j{i}") for i in range(200)])
    log = await events_of(js, subjects, "*")
    loads = await read_all(js, subjects.node_load("*"))
    cluster = RecordingBackend()
    replicas = [make_placement(js, subjects, cluster, leader_election=False) for _ in range(2)]
    for replica in replicas:
        for sequence, e in enumerate(log, start=1):
            await replica.on_job_event(sequence, e)
        for e in loads:
            await replica.on_node_event(0, e)
    counts = await asyncio.gather(*(replica.reconcile() for replica in replicas))
    assert counts == [200, 200]  # both decided to bind every job ...
    bound = await events_of(js, subjects, "bound")
    assert len(bound) == 200  # ... and each job was bound once
    assert_bound_once(bound, cluster)
    assert sum(r.bound_total for r in replicas) == 200
    assert sum(r.fenced_total for r in replicas) == 200


async def test_kill_9_during_a_burst_loses_no_job_and_binds_none_twice(
    nc: Client,
    subjects: Subjects,
    js: JetStreamContext,
    bus: EventPublisher,
    data_dir: Path,
    nats_url: str,
) -> None:
    env = os.environ | {
        "NATS_URL": nats_url,
        "MDQ_NAMESPACE": subjects.namespace,
        "MDQ_DATA_DIR": str(data_dir),
        "MDQ_PLACEMENT_BACKEND": "local",
        "MDQ_PLACEMENT_LEASE_TTL_S": "1.5",
        "PYTHONPATH": str(REPO),
    }

    def start() -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, "-m", "services.placement"],
            cwd=REPO,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    total = 400
    async with fresh_loads(nc, subjects, "n1", "n2", "n3"):
        process = start()
        try:
            for chunk in range(0, total, 50):
                await bus.publish_all([submitted(f"rp3-j{i}") for i in range(chunk, chunk + 50)])
                if chunk == 100:

                    async def some_bound() -> bool:
                        return len(await events_of(js, subjects, "bound")) >= 20

                    await wait_for(some_bound, timeout=30, what="first bindings")
                    process.send_signal(signal.SIGKILL)
                    process.wait()
                    killed_after = len(await events_of(js, subjects, "bound"))
                    process = start()
                await asyncio.sleep(0.05)

            async def all_bound() -> bool:
                return len(await events_of(js, subjects, "bound")) >= total

            await wait_for(all_bound, timeout=40, what=f"{total} bound after the kill")
            # The newest job is bound in the last batch of a pass, and its pod created once
            # that batch's bound events are all stored: when its pod exists, any second bind
            # of an older job (an earlier pass or batch) is in the log.
            await bus.publish(submitted("rp3-marker"))
            backend = LocalBackend(nc=nc, subjects=subjects)

            async def marker_pod() -> bool:
                return await backend.get_pod("mdq-rp3-marker-1") is not None

            await wait_for(marker_pod, timeout=40, what="the marker job's pod")
        finally:
            process.send_signal(signal.SIGKILL)
            process.wait()
    assert 0 < killed_after < total
    bound = await events_of(js, subjects, "bound")
    per_job = Counter(e.job_id for e in bound)
    assert len(per_job) == total + 1 and max(per_job.values()) == 1
    for e in bound:
        pod = await backend.get_pod(e.bound.pod_name)
        assert pod is not None, f"pod of {e.job_id} missing"
        assert pod.node == e.bound.node
    pods = await bucket_keys((await backend.buckets()).pods)
    assert len(pods) == total + 1


async def test_high_priority_job_preempts_low_priority_work(
    js: JetStreamContext, bus: EventPublisher, backend: RecordingBackend, subjects: Subjects
) -> None:
    # "m" takes only the 1-CPU marker job (below), never a 2-CPU one
    await bus.publish_all([node_load("n1", cpu_capacity=2), node_load("m", cpu_capacity=1)])
    await bus.publish(submitted("rp4-low", cpu=2, priority="low"))
    await bus.publish(event("bound", pb.JobBound(node="n1"), job="rp4-low", attempt=1))
    await bus.publish(event("started", pb.JobStarted(node="n1"), job="rp4-low", attempt=1))
    await bus.publish(submitted("rp4-normal", cpu=2, priority="normal"))
    placement = make_placement(js, subjects, backend)
    async with running(placement.run()):
        await bus.publish(submitted("rp4-high", cpu=2, priority="high"))

        async def low_deleted() -> bool:
            return "mdq-rp4-low-1" in backend.deleted

        await wait_for(low_deleted, what="the low job's pod deleted")
        assert await events_of(js, subjects, "bound", "rp4-high") == []
        # the runner checkpoints and exits; the watcher reports it, recovery requeues it
        failed = pb.AttemptFailed(reason=pb.FAILURE_EVICTED, node="n1")
        await bus.publish(event("attempt_failed", failed, job="rp4-low", attempt=1))

        await wait_for_events(
            js, subjects, "bound", "rp4-high", count=1, what="the high job bound in the freed room"
        )
        # A later job placement must handle after everything above: once its pass has bound
        # it (bound_total counts a batch after all its publishes), no pass before it bound
        # the normal job, nor did its own.
        await bus.publish(submitted("rp4-marker", cpu=1, priority="low"))

        async def marker_bound() -> bool:
            return placement.bound_total == 2 and bool(
                await events_of(js, subjects, "bound", "rp4-marker")
            )

        await wait_for(marker_bound, what="the marker job bound (high + marker)")
    # the room was held for the preemptor: the normal job (waiting longer) did not take it
    assert await events_of(js, subjects, "bound", "rp4-normal") == []
    assert placement.bound_total == 2
    assert backend.deleted == ["mdq-rp4-low-1"]
    assert (await events_of(js, subjects, "bound", "rp4-high"))[0].bound.node == "n1"


async def test_cordoned_and_silent_nodes_are_not_chosen_and_explained(
    js: JetStreamContext, bus: EventPublisher, subjects: Subjects, nats_url: str
) -> None:
    cordoned = node_load("cordoned")
    cordoned.node_load.cordoned = True
    silent = make_event(
        "node_load",
        pb.NodeLoad(node="silent", cpu_capacity=4, memory_capacity_mb=8192, ready=True),
        job_id="",
        attempt=0,
        producer="metrics",
        at=datetime.now(UTC) - timedelta(minutes=5),
        detail="silent:old",
    )
    await bus.publish_all([cordoned, silent, node_load("good"), node_load("down", ready=False)])
    await bus.publish(submitted("dddddddddd05-a"))
    async with running(make_placement(js, subjects).run()):
        await wait_for_events(
            js, subjects, "bound", "dddddddddd05-a", count=1, what="dddddddddd05-a bound"
        )
    decision = (await events_of(js, subjects, "bound", "dddddddddd05-a"))[0].bound
    assert decision.node == "good"
    reasons = {c.node: c.filtered for c in decision.candidates}
    assert reasons == {
        "good": "",
        "cordoned": "cordoned",
        "silent": "load report too old",
        "down": "not ready",
    }
    assert decision.nodes_total == 4
    assert dict(decision.filtered_counts) == {
        "cordoned": 1,
        "load report too old": 1,
        "not ready": 1,
    }
    output = await _explain(nats_url, subjects, "dddddddddd05-a")
    assert "bound to good" in output
    assert "filtered: cordoned" in output and "filtered: load report too old" in output


async def test_without_fail_on_dependency_failure_the_chain_runs_on(
    js: JetStreamContext, bus: EventPublisher, subjects: Subjects
) -> None:
    await bus.publish_all([node_load("n1")])
    await bus.publish(submitted("rp6-init"))
    await bus.publish(submitted("rp6-run", depends_on=("rp6-init",)))
    await bus.publish(
        event("failed", pb.JobFailed(reason=pb.FAILURE_UNSTABLE), job="rp6-init", attempt=1)
    )
    placement = make_placement(js, subjects, fail_on_dependency_failure=False)
    async with running(placement.run()):
        await wait_for_events(
            js, subjects, "bound", "rp6-run", count=1, what="the dependent job released and bound"
        )
    assert await events_of(js, subjects, "failed", "rp6-run") == []
    assert len(await events_of(js, subjects, "released", "rp6-run")) == 1


async def _explain(nats_url: str, subjects: Subjects, job_id: str) -> str:
    """What ``mdq explain job_id`` prints; it must exit 0."""
    env = os.environ | {"NATS_URL": nats_url, "MDQ_NAMESPACE": subjects.namespace}
    shown = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "mdq.cli",
        "explain",
        job_id,
        cwd=REPO,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output = (await shown.communicate())[0].decode()
    assert shown.returncode == 0, output
    return output


async def test_a_waiting_job_is_explained_node_by_node_and_by_what_it_waits_for(
    js: JetStreamContext, bus: EventPublisher, subjects: Subjects, nats_url: str
) -> None:
    """Every node cordoned: ``mdq explain`` of the pending job says so the way Kubernetes does
    for a Pending pod, node by node; its dependent job is shown waiting for it."""
    loads = [node_load("n1"), node_load("n2")]
    for load in loads:
        load.node_load.cordoned = True
    await bus.publish_all(loads)
    await bus.publish(submitted("dddddddddd09-first"))
    await bus.publish(submitted("dddddddddd09-then", depends_on=("dddddddddd09-first",)))
    placement = make_placement(js, subjects, explain_waiting_interval_s=0.2)
    async with running(placement.run()):
        kv = None

        async def explained() -> bool:
            nonlocal kv
            try:
                kv = kv or await js.key_value(subjects.waiting_bucket)
                entry = await kv.get("dddddddddd09-first")
            except Exception:
                return False
            return b"2 cordoned" in (entry.value or b"")

        await wait_for(explained, what="placement to explain why dddddddddd09-first waits")
        waiting = await _explain(nats_url, subjects, "dddddddddd09-first")
        chained = await _explain(nats_url, subjects, "dddddddddd09-then")
    assert "dddddddddd09-first: PENDING, attempt 1" in waiting, waiting
    assert "0/2 nodes are available: 2 cordoned" in waiting, waiting
    assert waiting.count("filtered: cordoned") == 2, waiting
    assert "waits for its dependencies to succeed: dddddddddd09-first (PENDING)" in chained, chained
    assert await events_of(js, subjects, "bound", "dddddddddd09-first") == []
