"""kill -9 of the node agent on the default two-node stack, under running MD jobs.

One agent serves both nodes; its runners die with it (PR_SET_PDEATHSIG) and the stack restarts
it. Every interrupted job must be bound and running again promptly — well before a five-minute
cordon would lapse — so placement must not cordon the nodes on the failures the kill produces.
Placement runs with a hair-trigger threshold (two failed jobs on a node make it suspect) and
two runners per node, so the kill alone gives each node enough failures to be cordoned if they
counted.
"""

from __future__ import annotations

import os
import signal
from datetime import UTC, datetime
from pathlib import Path

import pytest
from google.protobuf import json_format

from mdq.contracts import pb
from mdq.core.state import event_time
from mdq.sdk.client import MdqClient
from mdq.stack import Stack
from tests.e2e.test_stack import md_job
from tests.helpers import read_all, wait_for

pytestmark = pytest.mark.e2e

NODES = ("local-1", "local-2")
PROMPTLY_S = 60.0
"""Rebinding after the kill must take less than this: a fifth of the cordon (300 s)."""
RUNNING_AGAIN_S = 120.0
"""Every job reports progress of its next attempt within this of the kill."""


def small_job(name: str, steps: int) -> dict[str, object]:
    job = md_job(name, steps=steps)
    job["report_interval_steps"] = 200
    job["checkpoint_interval_steps"] = 1000
    job["resources"] = {"cpu": 0.5, "memory_mb": 512}  # two runners per 1-CPU node
    return job


async def events(client: MdqClient, job_id: str, kind: str) -> list[pb.Event]:
    return await read_all(client.nc.jetstream(), client.subjects.job(job_id, kind))


@pytest.mark.expected_crashes({"local-backend": 1})
async def test_agent_killed_under_running_jobs_cordons_no_node(
    nats_url: str, database_url: str, namespace: str, tmp_path: Path
) -> None:
    stack = Stack(
        state_dir=tmp_path / "state",
        namespace=namespace,
        nats_url=nats_url,
        database_url=database_url,
        local_nodes=len(NODES),
        metrics_port=0,
        grace_s=15.0,
        extra_env={
            "MDQ_LOCAL_CPU_PER_NODE": "1",
            "MDQ_METRICS_INTERVAL_S": "1",
            "MDQ_RECOVERY_BACKOFF_BASE_S": "0.5",
            "MDQ_PLACEMENT_NODE_FAILURES_TO_CORDON": "2",
        },
    )
    await stack.start()
    try:
        async with await MdqClient.connect(nats_url, namespace) as client:
            running = [small_job(f"kill-agent-{i}", steps=4000) for i in range(4)]
            request = {"idempotency_key": "agent-kill", "jobs": running}
            job_ids = await client.submit_when_ready(
                json_format.ParseDict(request, pb.SubmitRequest())
            )

            async def all_progressing() -> bool:
                for job in job_ids:
                    progress = await read_all(client.nc.jetstream(), client.subjects.progress(job))
                    if not [p for p in progress if p.attempt == 1]:
                        return False
                return True

            await wait_for(all_progressing, timeout=180, what="four runners reporting")
            first = {job: (await events(client, job, "bound"))[0].bound.node for job in job_ids}
            assert sorted(first.values()) == sorted(NODES * 2), "two runners on each node"

            agent = stack.child_pid("local-backend")
            assert agent is not None
            killed_at = datetime.now(UTC)
            os.kill(agent, signal.SIGKILL)  # its runners die with it

            async def rebound() -> list[pb.Event]:
                found = [b for job in job_ids for b in await events(client, job, "bound")]
                return [b for b in found if b.attempt >= 2]

            async def full_again() -> bool:
                """Every interrupted job bound again, on both nodes: the whole cluster takes
                work (with a node cordoned, the other's two slots would hold only two)."""
                again = await rebound()
                return len(again) == len(job_ids) and {b.bound.node for b in again} == set(NODES)

            await wait_for(full_again, timeout=PROMPTLY_S, what="every job bound again")

            async def running_again() -> bool:
                for job in job_ids:
                    progress = await read_all(client.nc.jetstream(), client.subjects.progress(job))
                    if not [p for p in progress if p.attempt == 2]:
                        return False
                return True

            await wait_for(running_again, timeout=RUNNING_AGAIN_S, what="every job running again")

            failures = [f for job in job_ids for f in await events(client, job, "attempt_failed")]
            bindings = [b for job in job_ids for b in await events(client, job, "bound")]
    finally:
        await stack.stop()

    # What the kill produces: each runner's pod ends NodeLost (the restarted agent finds it
    # claimed with no process), i.e. FAILURE_NODE_LOST: infrastructure, not the node's fault.
    assert sorted(f.job_id for f in failures) == sorted(job_ids), "one failure per runner"
    assert {f.attempt_failed.reason for f in failures} == {pb.FAILURE_NODE_LOST}
    assert {f.attempt_failed.node for f in failures} == set(NODES)
    after = [b for b in bindings if event_time(b) > killed_at]
    assert sorted(b.job_id for b in after) == sorted(job_ids), "each job bound again, once"
    for binding in after:
        assert binding.attempt == 2
        assert (event_time(binding) - killed_at).total_seconds() < PROMPTLY_S
        cordoned = [c.node for c in binding.bound.candidates if c.filtered == "cordoned"]
        assert not cordoned, f"{binding.job_id} bound with {cordoned} cordoned"
