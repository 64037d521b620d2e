"""Tenant policies on a real JetStream: the tenants bucket and its live directory, and
placement holding a tenant at its CPU quota while other tenants' jobs bind."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.errors import BucketNotFoundError, KeyNotFoundError
from rich.console import Console

from mdq.bus.publisher import EventPublisher
from mdq.bus.setup import prepare_bus
from mdq.bus.subjects import Subjects
from mdq.bus.tenants import TenantDirectory, ensure_tenants_bucket, put_policy, remove_policy
from mdq.cli.queues import queues_table, tenant_usages
from mdq.contracts import pb
from mdq.core import ids
from mdq.core.tenants import DEFAULT_POLICY, TenantPolicy, TenantUsage, usage_key
from services.placement.app import Placement
from tests.helpers import (
    RecordingBackend,
    event,
    node_load,
    placement_of,
    read_all,
    running,
    submitted,
    wait_for,
)

ALICE_QUOTA = TenantPolicy(max_running_cpu=2.0)


async def test_the_admin_setup_makes_the_tenants_bucket(nats_url: str, subjects: Subjects) -> None:
    await prepare_bus(nats_url, namespace=subjects.namespace)
    from mdq.bus.connect import connect

    client = await connect(nats_url, name="test-tenants")
    try:
        kv = await client.jetstream().key_value(subjects.tenants_bucket)
        assert (await kv.status()).bucket == f"{subjects.namespace}_tenants"
    finally:
        await client.close()


async def test_policies_apply_live_without_a_restart(
    js: JetStreamContext, subjects: Subjects
) -> None:
    directory = TenantDirectory(js, subjects, retry_s=0.1)
    try:
        # no bucket yet (the admin's setup has not run): every tenant has the default policy
        assert await directory.wait_synced(5.0)
        assert directory.policy("alice") == DEFAULT_POLICY
        await ensure_tenants_bucket(js, subjects)
        await put_policy(js, subjects, "alice", ALICE_QUOTA)

        async def alice_read() -> bool:
            return directory.policy("alice") == ALICE_QUOTA

        await wait_for(alice_read, timeout=10, what="alice's policy once the bucket exists")
        generous = TenantPolicy(allow_high=True, max_running_cpu=None)
        await put_policy(js, subjects, "alice", generous)

        async def changed() -> bool:
            return directory.policy("alice") == generous

        await wait_for(changed, timeout=10, what="alice's new policy")
        assert directory.policy("bob") == DEFAULT_POLICY
        kv = await js.key_value(subjects.tenants_bucket)
        await kv.put("bob", b'{"max_gpus": 1}')  # malformed: bob keeps the default
        await put_policy(js, subjects, "carol", ALICE_QUOTA)

        async def carol_read() -> bool:
            return directory.policy("carol") == ALICE_QUOTA

        await wait_for(carol_read, timeout=10, what="carol's policy")
        assert directory.policy("bob") == DEFAULT_POLICY
        await remove_policy(js, subjects, "alice")

        async def removed() -> bool:
            return directory.policy("alice") == DEFAULT_POLICY

        await wait_for(removed, timeout=10, what="alice back to the default policy")
        assert directory.policies == {"carol": ALICE_QUOTA}
    finally:
        await directory.close()


async def test_put_policy_refuses_a_bad_tenant_name(
    js: JetStreamContext, subjects: Subjects
) -> None:
    await ensure_tenants_bucket(js, subjects)
    with pytest.raises(ValueError, match="tenant name"):
        await put_policy(js, subjects, "Alice", ALICE_QUOTA)


async def more_passes(placement: Placement, passes: int = 3) -> None:
    """Wait until placement has begun ``passes`` more reconcile passes (and so finished the
    ones before): what did not happen in them is not going to for lack of a pass."""
    target = placement.passes_total + passes

    async def done() -> bool:
        return placement.passes_total >= target

    await wait_for(done, what=f"{passes} more placement passes")


def job(tenant: str, name: str) -> str:
    return f"{tenant}.0123456789ab-{name}"


TENANT_BOUND = "{}.job.*.*.bound"
"""The bound events of tenants' jobs (their ids are two subject tokens)."""


async def tenant_jobs_bound(nc: Client, subjects: Subjects) -> set[str]:
    bound = await read_all(nc.jetstream(), TENANT_BOUND.format(subjects.namespace))
    return {e.job_id for e in bound}


async def wait_bound(nc: Client, subjects: Subjects, expected: set[str], *, what: str) -> None:
    """Until the tenants' jobs bound are ``expected``."""

    async def bound() -> bool:
        return await tenant_jobs_bound(nc, subjects) == expected

    await wait_for(bound, what=what)


async def wait_count_bound(nc: Client, subjects: Subjects, count: int, *, what: str) -> None:
    """Until ``count`` of the tenants' jobs are bound."""

    async def bound() -> bool:
        return len(await tenant_jobs_bound(nc, subjects)) == count

    await wait_for(bound, what=what)


async def waiting_value(js: JetStreamContext, subjects: Subjects, key: str) -> bytes:
    """What placement wrote under ``key`` in its waiting bucket (a job's ``JobWaiting``, a
    tenant's usage); empty while it wrote nothing there."""
    try:
        kv = await js.key_value(subjects.waiting_bucket)
        return (await kv.get(key)).value or b""
    except (BucketNotFoundError, KeyNotFoundError):
        # placement makes its waiting bucket with its first write: none yet, nothing yet
        return b""


async def wait_explained(
    js: JetStreamContext, subjects: Subjects, job_id: str, says: str, *, what: str
) -> None:
    """Until placement says why ``job_id`` waits (``mdq explain``), in words that hold
    ``says``."""

    async def explained() -> bool:
        summary = pb.JobWaiting.FromString(await waiting_value(js, subjects, job_id)).summary
        return summary != "" and says in summary

    await wait_for(explained, what=what)


async def test_a_tenant_at_its_cpu_quota_waits_while_others_bind(
    nc: Client, subjects: Subjects, js: JetStreamContext, bus: EventPublisher, data_dir: Path
) -> None:
    """alice may run 2 cores: two of her three 1-core jobs bind, the third waits with the
    reason in the waiting bucket (``mdq explain``) while bob's job, submitted after it, binds;
    it binds once one of alice's jobs ends. Her usage is written for intake all along."""
    await ensure_tenants_bucket(js, subjects)
    await put_policy(js, subjects, "alice", ALICE_QUOTA)
    await bus.publish_all([node_load("n1", cpu_capacity=32, memory_mb=100_000)])
    alice = [job("alice", f"a{i}") for i in range(3)]
    for job_id in alice:
        await bus.publish(submitted(job_id))
        await asyncio.sleep(0.01)  # oldest first in the queue
    await bus.publish(submitted(job("bob", "b0")))
    placement = placement_of(
        js,
        subjects,
        explain_waiting_interval_s=0.2,
        tenant_usage_interval_s=0.2,
    )

    async def bound_jobs() -> set[str]:
        return await tenant_jobs_bound(nc, subjects)

    async with running(placement.run()):
        await wait_bound(
            nc,
            subjects,
            {alice[0], alice[1], job("bob", "b0")},
            what="alice's first two jobs and bob's bound",
        )

        await wait_explained(js, subjects, alice[2], "", what="why alice's third job waits")
        waiting = pb.JobWaiting.FromString(await waiting_value(js, subjects, alice[2]))
        assert waiting.summary == "tenant alice is at its CPU quota: 2 of 2 cores running"
        assert waiting.attempt == 1

        async def usage_written() -> bool:
            value = await waiting_value(js, subjects, usage_key("alice"))
            if not value:
                return False
            usage = TenantUsage.from_json(value)
            return (usage.queued_jobs, usage.running_cpu) == (1, 2.0)

        await wait_for(usage_written, what="alice's usage: 1 queued, 2 cores running")
        bob = TenantUsage.from_json(await waiting_value(js, subjects, usage_key("bob")))
        assert (bob.queued_jobs, bob.running_cpu) == (0, 1.0)
        await more_passes(placement)  # still held
        assert alice[2] not in await bound_jobs()

        await bus.publish(
            event("succeeded", pb.JobSucceeded(final_step=1000), job=alice[0], attempt=1)
        )

        async def third_bound() -> bool:
            return alice[2] in await bound_jobs()

        await wait_for(third_bound, what="alice's third job bound once her first ended")

        async def usage_follows() -> bool:
            value = await waiting_value(js, subjects, usage_key("alice"))
            usage = TenantUsage.from_json(value)
            return (usage.queued_jobs, usage.running_cpu) == (0, 2.0)

        await wait_for(usage_follows, what="alice's usage: nothing queued, 2 cores running")
    assert len(await read_all(js, TENANT_BOUND.format(subjects.namespace))) == 4


async def test_a_policy_raised_live_releases_the_held_jobs(
    nc: Client, subjects: Subjects, js: JetStreamContext, bus: EventPublisher, data_dir: Path
) -> None:
    await ensure_tenants_bucket(js, subjects)
    await put_policy(js, subjects, "alice", TenantPolicy(max_running_cpu=1.0))
    await bus.publish_all([node_load("n1", cpu_capacity=32, memory_mb=100_000)])
    alice = [job("alice", f"a{i}") for i in range(3)]
    await bus.publish_all([submitted(job_id) for job_id in alice])
    placement = placement_of(js, subjects)
    async with running(placement.run()):
        await wait_count_bound(nc, subjects, 1, what="one of alice's jobs bound")
        await more_passes(placement)
        assert len(await tenant_jobs_bound(nc, subjects)) == 1
        await put_policy(js, subjects, "alice", TenantPolicy(max_running_cpu=3.0))

        await wait_bound(
            nc, subjects, set(alice), what="alice's other jobs bound once her quota was raised"
        )


async def test_a_high_job_held_by_its_tenants_quota_preempts_nobody(
    nc: Client,
    subjects: Subjects,
    js: JetStreamContext,
    bus: EventPublisher,
    backend: RecordingBackend,
    data_dir: Path,
) -> None:
    """alice may submit high jobs but run 1 core: her second high job waits for her quota,
    and must not preempt the operator's low job to make room it could not use."""
    await ensure_tenants_bucket(js, subjects)
    await put_policy(js, subjects, "alice", TenantPolicy(allow_high=True, max_running_cpu=1.0))
    await bus.publish_all([node_load("n1", cpu_capacity=3)])
    running_jobs = [("0123456789ab-low", 2, "low"), (job("alice", "h0"), 1, "high")]
    for job_id, cpu, priority in running_jobs:  # the operator's low job, alice's high one
        await bus.publish(submitted(job_id, cpu=cpu, priority=priority))
        await bus.publish(event("bound", pb.JobBound(node="n1"), job=job_id, attempt=1))
        await bus.publish(event("started", pb.JobStarted(node="n1"), job=job_id, attempt=1))
    await bus.publish(submitted(job("alice", "h1"), cpu=1, priority="high"))
    placement = placement_of(js, subjects, backend=backend)
    async with running(placement.run()):

        async def caught_up() -> bool:
            return placement.tenant_usage("alice") == (1, 1.0)

        await wait_for(caught_up, what="placement folded alice's jobs")
        await more_passes(placement, 5)
    assert backend.deleted == []
    assert await tenant_jobs_bound(nc, subjects) == {job("alice", "h0")}


async def test_a_full_cluster_is_shared_by_weight_and_a_weight_changes_live(
    nc: Client,
    nats_url: str,
    subjects: Subjects,
    js: JetStreamContext,
    bus: EventPublisher,
    data_dir: Path,
) -> None:
    """8 free cores, alice (weight 1) floods first, bob (weight 3) after her: bob gets 6 and
    alice 2, not alice all 8. Then the weights are swapped in the tenants bucket (no restart)
    and a second node of 8 cores comes: all 8 go to alice, now far below her share (with the
    old weights they would have been split 4:4)."""
    await ensure_tenants_bucket(js, subjects)
    await put_policy(js, subjects, "bob", TenantPolicy(weight=3.0))
    await bus.publish_all([node_load("n1", cpu_capacity=8, memory_mb=100_000)])
    alice = [job("alice", f"a{i}") for i in range(10)]
    bob = [job("bob", f"b{i}") for i in range(10)]
    for job_id in [*alice, *bob]:
        await bus.publish(submitted(job_id))
    placement = placement_of(js, subjects, explain_waiting_interval_s=0.2)

    async def split() -> dict[str, int]:
        counts: dict[str, int] = {}
        for job_id in await tenant_jobs_bound(nc, subjects):
            tenant = job_id.partition(".")[0]
            counts[tenant] = counts.get(tenant, 0) + 1
        return counts

    async with running(placement.run()):

        async def full() -> bool:
            return sum((await split()).values()) == 8

        await wait_for(full, what="8 jobs bound on the 8 cores")
        await more_passes(placement)  # nothing more fits
        assert await split() == {"alice": 2, "bob": 6}

        # mdq queues: what placement wrote for each tenant
        async def counted() -> bool:
            usages = await tenant_usages(nats_url, subjects.namespace)
            return {t: u.running_jobs for t, u in usages.items()} == {"alice": 2, "bob": 6}

        await wait_for(counted, what="placement's count of both tenants in its waiting bucket")
        usages = await tenant_usages(nats_url, subjects.namespace)
        alice_usage, bob_usage = usages["alice"], usages["bob"]
        assert (alice_usage.weight, alice_usage.queued_jobs) == (1.0, 8)
        assert (alice_usage.share, alice_usage.fair_share) == (0.25, 0.25)
        assert (bob_usage.weight, bob_usage.share, bob_usage.fair_share) == (3.0, 0.75, 0.75)
        assert bob_usage.running_cpu == 6.0
        wide = Console(width=200, record=True)
        wide.print(queues_table(usages))
        text = wide.export_text()
        assert "alice" in text and "25.0%" in text and "75.0%" in text

        await put_policy(js, subjects, "alice", TenantPolicy(weight=3.0))
        await put_policy(js, subjects, "bob", TenantPolicy(weight=1.0))

        async def followed() -> bool:
            return (
                placement.tenants.policy("alice").weight == 3.0
                and placement.tenants.policy("bob").weight == 1.0
            )

        await wait_for(followed, what="placement's directory has the new weights")

        # bob now holds 75 % against a fair 25 %: mdq explain says so of his waiting jobs
        await wait_explained(
            js,
            subjects,
            bob[6],
            "fair share: tenant bob holds 75%",
            what="why bob's next job waits: his share is above his due",
        )
        # one event, so one pass sees all 8 new cores at once
        await bus.publish(node_load("n2", cpu_capacity=8, memory_mb=100_000))

        async def full_again() -> bool:
            return sum((await split()).values()) == 16

        await wait_for(full_again, what="8 more jobs bound on the second node")
        await more_passes(placement)
        assert await split() == {"alice": 10, "bob": 6}


async def test_a_tenant_below_its_share_gets_room_back_and_no_more(
    nc: Client,
    subjects: Subjects,
    js: JetStreamContext,
    bus: EventPublisher,
    backend: RecordingBackend,
    data_dir: Path,
) -> None:
    """alice runs 8 jobs on the 8 cores; bob submits 6: half the cluster is his due, so
    placement stops 4 of alice's (their pods deleted: SIGTERM, a checkpoint, requeued by
    recovery) with the room held for 4 of bob's, and stops nothing more in the passes while
    they leave (the stopped ones and the held room count as gone and as bob's)."""
    await bus.publish_all([node_load("n1", cpu_capacity=8, memory_mb=100_000)])
    alice = [job("alice", f"a{i}") for i in range(8)]
    await bus.publish_all([submitted(job_id) for job_id in alice])
    placement = placement_of(js, subjects, fair_share_min_run_s=0, backend=backend)
    async with running(placement.run()):
        await wait_bound(nc, subjects, set(alice), what="alice's 8 jobs bound")
        await bus.publish_all(
            [
                event(
                    "started",
                    pb.JobStarted(node="n1", pod_name=ids.pod_name(j, 1)),
                    job=j,
                    attempt=1,
                )
                for j in alice
            ]
        )
        bob = [job("bob", f"b{i}") for i in range(6)]
        await bus.publish_all([submitted(job_id) for job_id in bob])

        async def reclaimed() -> bool:
            return len(backend.deleted) >= 4

        await wait_for(reclaimed, what="4 of alice's jobs stopped for bob")
        await more_passes(placement, 5)  # the victims have not left yet
        assert len(backend.deleted) == 4
        assert set(backend.deleted) <= {ids.pod_name(j, 1) for j in alice}
        assert placement.reclaimed_total == 4
        assert [placement.state.nominated(j) for j in bob] == [True] * 4 + [False] * 2


async def test_a_tenant_at_its_maximum_share_waits_and_says_why(
    nc: Client, subjects: Subjects, js: JetStreamContext, bus: EventPublisher, data_dir: Path
) -> None:
    """alice may hold a quarter of the 8 cores: 2 of her 6 jobs bind even with the cluster
    idle, and the others' explanation names the cap."""
    await ensure_tenants_bucket(js, subjects)
    await put_policy(js, subjects, "alice", TenantPolicy(max_share=0.25))
    await bus.publish_all([node_load("n1", cpu_capacity=8, memory_mb=100_000)])
    alice = [job("alice", f"a{i}") for i in range(6)]
    await bus.publish_all([submitted(job_id) for job_id in alice])
    placement = placement_of(js, subjects, explain_waiting_interval_s=0.2)
    async with running(placement.run()):
        await wait_count_bound(nc, subjects, 2, what="2 of alice's jobs bound")
        await wait_explained(
            js,
            subjects,
            alice[2],
            "tenant alice is at its maximum share: it holds 25% of the cluster",
            what="why alice's third job waits: her maximum share",
        )
        assert len(await tenant_jobs_bound(nc, subjects)) == 2
