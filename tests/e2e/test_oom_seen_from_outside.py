"""An OOM kill seen from outside mdq, as bench-requests counts it: a real runner asks for less
memory than OpenMM needs, the local node agent (its parent) kills it for its memory, and the
agent's own record of the process's end (``mdq.testing.agent_log``: reason, pid, the status the
kernel gave, SIGKILL's) names that very runner process, seen in the process table while it ran.
mdq's attempts table must say the same, attempt by attempt."""

from __future__ import annotations

import asyncio

import asyncpg

from mdq.core.ids import pod_name
from mdq.core.state import JobState
from mdq.stack import Stack
from mdq.stack.files import LOCAL_AGENT
from mdq.testing.agent_log import read_pod_ends
from tests.e2e.stacks import operator_client, wait_for_state
from tests.e2e.test_stack import md_job
from tests.helpers import wait_for
from tools.processes import runner_pid
from tools.submitting import submit_request

MEMORY_MB = 64
"""The least a job may ask for; a runner importing OpenMM and building a water box needs more."""


async def test_an_oom_kill_is_the_agents_sigkill_of_the_runner_seen_running(
    stack: Stack, database_url: str
) -> None:
    job = md_job("hungry", steps=2000)
    job["resources"] = {"cpu": 1, "memory_mb": MEMORY_MB}
    job["max_retries"] = 0  # an OOM kill is the job's own: the first ends it
    async with await operator_client(stack) as client:
        [job_id] = await client.submit_when_ready(submit_request(job, key="e2e-oom"))
        seen: set[int] = set()

        async def sample_until_done() -> None:
            while True:
                pid = await asyncio.to_thread(runner_pid, job_id, stack.namespace)
                if pid is not None:
                    seen.add(pid)
                await asyncio.sleep(0.02)

        sampler = asyncio.create_task(sample_until_done())
        try:
            states = await client.wait([job_id], timeout=180)
        finally:
            sampler.cancel()
    assert states[job_id] == JobState.FAILED, states
    assert seen, "the sampler never saw the runner process"
    agent_log = stack.logs_dir / f"{LOCAL_AGENT}.log"
    pod = pod_name(job_id, 1)

    async def recorded() -> bool:
        ends = await asyncio.to_thread(read_pod_ends, agent_log)
        return any(end.pod == pod for end in ends)

    await wait_for(recorded, timeout=30, what="the agent's record of the runner's end")
    [end] = [end for end in read_pod_ends(agent_log) if end.pod == pod]
    assert end.oom_killed, end
    assert end.pid in seen  # the process killed is the runner that was seen running
    connection = await asyncpg.connect(database_url)
    try:
        await wait_for_state(
            connection, job_id, "FAILED", timeout=30, what="the projection of the job's end"
        )
        rows = await connection.fetch(
            "SELECT attempt, failure_reason FROM attempts WHERE job_id = $1 ORDER BY attempt",
            job_id,
        )
    finally:
        await connection.close()
    assert [(row["attempt"], row["failure_reason"]) for row in rows] == [(1, "FAILURE_OOM_KILLED")]
