"""End to end through the Kubernetes path: the real services (``Stack(backend="kubernetes")``)
on real NATS and PostgreSQL, against the Kubernetes API emulator with two simulated kubelets
that run the runner pods as local processes (real OpenMM on a small water box).

A job runs to SUCCEEDED through a pod created with mdq's schedulerName and bound via Binding,
surviving a watch that expires (410) mid-run with every lifecycle event published once; a node
that goes NotReady under a running job loses it, and the job is retried from its checkpoint
on the other node without counting against its retries.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from mdq.contracts import pb
from mdq.sdk.client import MdqClient
from mdq.stack import Stack
from mdq.testing.cluster import SimulatedCluster
from tests.e2e.stacks import session_stack, wait_for_state
from tests.helpers import read_all, wait_for
from tests.log_agreement import assert_postgres_agrees_with_log
from tools.submitting import submit_request, water_job

pytestmark = pytest.mark.e2e

K8S_NAMESPACE = "mdq"
NODES = ("ip-10-0-1-17.ec2.internal", "ip-10-0-2-33.ec2.internal")
"""Named as EKS names its nodes: DNS subdomains, whose dots a subject token may not hold."""


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[SimulatedCluster]:
    async with SimulatedCluster(
        work_dir=tmp_path / "cluster",
        namespace=K8S_NAMESPACE,
        nodes=NODES,
        cpu_per_node=2.0,
        memory_mb_per_node=4096,
        heartbeat_s=0.3,
        # a node is lost after 5 s without heartbeat (every 0.3 s): at 1.5 s, a loaded 2-core
        # machine stalled the heartbeats long enough to lose healthy nodes
        node_monitor_grace_s=5.0,
        bookmark_interval_s=0.5,
    ) as the_cluster:
        yield the_cluster


@pytest.fixture
async def stack(
    cluster: SimulatedCluster, nats_url: str, database_url: str, namespace: str, tmp_path: Path
) -> AsyncIterator[Stack]:
    env = {
        "MDQ_K8S_KUBECONFIG": str(cluster.kubeconfig),
        "MDQ_K8S_NAMESPACE": K8S_NAMESPACE,
        "MDQ_K8S_NODE_LOST_AFTER_S": "1",
        "MDQ_K8S_TERMINATION_GRACE_S": "3",
        "MDQ_K8S_RETRY_BACKOFF_S": "0.2",
        "MDQ_RECOVERY_BACKOFF_BASE_S": "1",
        "MDQ_METRICS_INTERVAL_S": "1",
    }
    async with session_stack(
        nats_url, database_url, namespace, tmp_path, backend="kubernetes", extra_env=env
    ) as the_stack:
        yield the_stack


def md_job(name: str, *, steps: int, **extra: Any) -> dict[str, object]:
    fields = {"report_interval_steps": 250, "checkpoint_interval_steps": 500, **extra}
    return water_job(name, steps=steps, box_nm=1.5, task="TASK_MD", temperature_k=300, **fields)


def kinds_per_attempt(events: list[pb.Event]) -> Counter[tuple[str, int]]:
    return Counter((str(e.WhichOneof("body")), e.attempt) for e in events)


async def test_a_job_runs_through_kubernetes_and_survives_a_watch_expiry(
    stack: Stack, cluster: SimulatedCluster, database_url: str
) -> None:
    async with await MdqClient.connect(stack.info.nats_url, stack.namespace) as client:
        request = submit_request(md_job("water", steps=1500), key="k8s-e2e")
        [job_id] = await client.submit_when_ready(request, within_s=500)
        js = client.nc.jetstream()

        async def started() -> bool:
            return bool(await read_all(js, client.subjects.job(job_id, "started")))

        await wait_for(started, timeout=60, what="the job to start")
        cluster.api.expire_watches()  # mid-run: every watch ends, resuming answers 410
        states = await client.wait([job_id], timeout=120)
        events = await read_all(js, client.subjects.job_all(job_id))
        # PostgreSQL holds exactly what the log holds: every event once, per kind and attempt
        # and by id (a duplicate or a missing row fails), and the same state and steps.
        [facts] = (
            await assert_postgres_agrees_with_log(database_url, js, client.subjects, [job_id])
        ).values()
    assert str(states[job_id]) == "SUCCEEDED", states
    # What the log holds: each lifecycle event once; 1500 steps make 6 reports (every 250)
    # and 3 checkpoints (500, 1000 and the last step's, which an extend continues from).
    assert {kind: n for kind, n in facts.events.items() if kind[0] != "pod"} == {
        ("submitted", 0): 1,
        ("bound", 1): 1,
        ("started", 1): 1,
        ("progress", 1): 6,
        ("checkpoint", 1): 3,
        ("copied", 1): 3,  # each copied to the shared store (never skipped)
        ("outputs", 1): 1,
        ("usage", 1): 1,
        ("succeeded", 1): 1,
    }
    assert facts.final_steps == (1500,) and (facts.state, facts.last_step) == ("SUCCEEDED", 1500)

    pod_name = f"mdq-{job_id}-1"
    pod = cluster.api.pod(pod_name, K8S_NAMESPACE)
    assert pod is not None
    assert pod["spec"]["schedulerName"] == "mdq-scheduler"
    assert pod["spec"]["nodeName"] in NODES
    assert pod["status"]["phase"] == "Succeeded"
    bindings = cluster.api.requests_where(
        method="POST", path_suffix=f"/{pod_name}/binding", user_agent="mdq-kubernetes-backend"
    )
    assert [r.status for r in bindings] == [201]
    # The watcher's pod watch was answered 410 and re-listed; nothing was published twice.
    assert "mdq-kubernetes-backend" in cluster.api.expired
    counts = kinds_per_attempt(events)
    assert counts[("bound", 1)] == 1
    assert counts[("started", 1)] == 1
    assert counts[("succeeded", 1)] == 1
    pod_events = [e.pod for e in events if e.WhichOneof("body") == "pod"]
    phases = Counter(pb.PodPhase.Name(p.phase) for p in pod_events)
    assert phases["POD_RUNNING"] == 1 and phases["POD_SUCCEEDED"] == 1
    assert set(phases.values()) == {1}, phases  # no phase twice (PENDING may or may not show)
    assert {p.node for p in pod_events} == {pod["spec"]["nodeName"]}

    db = await asyncpg.connect(database_url)
    try:
        await wait_for_state(
            db, job_id, "SUCCEEDED", timeout=30, what="the job SUCCEEDED in PostgreSQL"
        )
        row = await db.fetchrow("SELECT * FROM attempts WHERE job_id = $1", job_id)
        assert row["node"] == pod["spec"]["nodeName"] and row["pod_name"] == pod_name
        assert await db.fetchval("SELECT last_step FROM jobs WHERE job_id = $1", job_id) == 1500
    finally:
        await db.close()


async def test_a_node_going_not_ready_moves_the_job_to_the_other_node(
    stack: Stack, cluster: SimulatedCluster, database_url: str
) -> None:
    # max_retries 0: had the lost node counted against the job, it would fail for good.
    job = md_job("moved", steps=4000, max_retries=0)
    async with await MdqClient.connect(stack.info.nats_url, stack.namespace) as client:
        request = submit_request(job, key="k8s-e2e-node")
        [job_id] = await client.submit_when_ready(request, within_s=500)
        js = client.nc.jetstream()

        async def checkpointed() -> bool:
            return bool(await read_all(js, client.subjects.job(job_id, "checkpoint")))

        await wait_for(checkpointed, timeout=90, what="a first checkpoint")
        first_node = cluster.node_of(f"mdq-{job_id}-1")
        assert first_node in NODES
        await cluster.fail_node(first_node)
        states = await client.wait([job_id], timeout=150)
        events = await read_all(js, client.subjects.job_all(job_id))
        [facts] = (
            await assert_postgres_agrees_with_log(database_url, js, client.subjects, [job_id])
        ).values()
    assert str(states[job_id]) == "SUCCEEDED", states
    assert facts.final_steps == (4000,) and [a[:2] for a in facts.attempts] == [
        (1, first_node),
        (2, cluster.node_of(f"mdq-{job_id}-2")),
    ]

    [failure] = [e for e in events if e.WhichOneof("body") == "attempt_failed"]
    assert failure.attempt == 1 and failure.attempt_failed.reason == pb.FAILURE_NODE_LOST
    assert failure.attempt_failed.node == first_node
    [requeued] = [e for e in events if e.WhichOneof("body") == "requeued"]
    assert requeued.attempt == 2 and requeued.requeued.after == pb.FAILURE_NODE_LOST
    assert first_node in requeued.requeued.avoid_nodes
    [second_bound] = [e for e in events if e.WhichOneof("body") == "bound" and e.attempt == 2]
    other_node = second_bound.bound.node
    assert other_node != first_node
    assert cluster.node_of(f"mdq-{job_id}-2") == other_node
    resumed = second_bound.bound.resume_from.step
    assert resumed >= 500  # from the checkpoint, not from zero
    counts = kinds_per_attempt(events)
    assert counts[("started", 1)] == counts[("started", 2)] == 1
    assert counts[("succeeded", 2)] == 1 and counts[("succeeded", 1)] == 0
