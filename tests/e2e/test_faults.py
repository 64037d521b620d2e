"""Fault tests with real processes on the whole stack: a node dies, a runner is killed at a
random step while recovery itself is killed, a job exceeds its memory limit, the NATS server
crashes under running jobs. After each, every job succeeded exactly once at its final step and
PostgreSQL agrees with the log about every job (``tests.log_agreement``)."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from mdq.backends.local.launcher import start_agent
from mdq.contracts import pb
from mdq.core.runner_task import job_dir
from mdq.embedded import start_nats
from mdq.sdk.client import MdqClient
from mdq.stack import Stack
from mdq.testing.runner_files import last_energy_step, newest_checkpoint_step
from tests.e2e.test_stack import md_job
from tests.helpers import read_all, wait_for
from tests.log_agreement import assert_postgres_agrees_with_log
from tools.processes import runner_pid
from tools.submitting import submit_request

pytestmark = pytest.mark.e2e

KILL_LOOP_S = 240.0
"""How long the random-kill test may wait for every runner to reach its kill step."""

FAST_RECOVERY = {
    "MDQ_RECOVERY_BACKOFF_BASE_S": "0.5",
    "MDQ_METRICS_INTERVAL_S": "1",
    "MDQ_LOCAL_CPU_PER_NODE": "1",
}


@pytest.fixture
def extra_agents() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.kill()
            process.wait()


async def start_stack(
    nats_url: str, database_url: str, namespace: str, state: Path, **env: str
) -> Stack:
    stack = Stack(
        state_dir=state,
        namespace=namespace,
        nats_url=nats_url,
        database_url=database_url,
        local_nodes=2,
        metrics_port=0,
        extra_env=FAST_RECOVERY | env,
        grace_s=15.0,
    )
    await stack.start()
    return stack


@pytest.fixture
async def stack(
    nats_url: str, database_url: str, namespace: str, tmp_path: Path
) -> AsyncIterator[Stack]:
    the_stack = await start_stack(nats_url, database_url, namespace, tmp_path / "state")
    try:
        yield the_stack
    finally:
        await the_stack.stop()


async def attempt_events(client: MdqClient, job_id: str, kind: str) -> list[pb.Event]:
    return await read_all(client.nc.jetstream(), client.subjects.job(job_id, kind))


async def assert_succeeded_once_and_projected(
    client: MdqClient, database_url: str, job_ids: list[str], *, steps: int
) -> None:
    """Every job succeeded exactly once, at its final step, and PostgreSQL agrees with the
    log about each (state, attempt, last step, final step, attempts, every event once)."""
    facts = await assert_postgres_agrees_with_log(
        database_url, client.nc.jetstream(), client.subjects, job_ids
    )
    for job, fact in facts.items():
        assert (fact.state, fact.last_step, fact.final_steps) == ("SUCCEEDED", steps, (steps,)), (
            job,
            fact,
        )


async def test_dead_node_moves_its_job_elsewhere_from_the_checkpoint(
    nats_url: str,
    database_url: str,
    namespace: str,
    tmp_path: Path,
    extra_agents: list[subprocess.Popen[bytes]],
) -> None:
    stack = await start_stack(
        nats_url, database_url, namespace, tmp_path / "state", MDQ_LOCAL_NODE_NAMES="local-1"
    )
    try:
        doomed = start_agent(
            nats_url=nats_url,
            namespace=namespace,
            data_dir=stack.data_dir,
            node_names=("local-2",),
            settings={"cpu_per_node": "1"},
        )
        extra_agents.append(doomed)
        async with await MdqClient.connect(nats_url, namespace) as client:

            async def both_ready() -> bool:
                loads = await client.node_loads(fetch_timeout_s=1)
                return {"local-1", "local-2"} <= {n for n, e in loads.items() if e.node_load.ready}

            await wait_for(both_ready, timeout=60, what="both nodes ready")
            jobs = [md_job(f"job-{i}", steps=6000) for i in range(2)]
            for job in jobs:
                job["checkpoint_interval_steps"] = 1000
            job_ids = await client.submit_when_ready(submit_request(*jobs, key="faults-node"))

            async def both_bound() -> bool:
                return all([await attempt_events(client, j, "bound") for j in job_ids])

            await wait_for(both_bound, timeout=60, what="both jobs bound")
            on_node = {(await attempt_events(client, j, "bound"))[0].bound.node: j for j in job_ids}
            victim = on_node["local-2"]

            async def checkpointed() -> bool:
                return bool(await attempt_events(client, victim, "checkpoint"))

            await wait_for(checkpointed, timeout=120, what="a checkpoint on the doomed node")
            os.kill(doomed.pid, signal.SIGKILL)  # the node dies; its runner dies with it
            states = await client.wait(job_ids, timeout=300)
            assert {str(s) for s in states.values()} == {"SUCCEEDED"}
            failures = await attempt_events(client, victim, "attempt_failed")
            bound = await attempt_events(client, victim, "bound")
            checkpoints = [
                e.checkpoint.step
                for e in await attempt_events(client, victim, "checkpoint")
                if e.attempt == 1
            ]
            progress = await read_all(client.nc.jetstream(), client.subjects.progress(victim))
            await assert_succeeded_once_and_projected(client, database_url, job_ids, steps=6000)
    finally:
        await stack.stop()
    assert [f.attempt_failed.reason for f in failures] == [pb.FAILURE_NODE_LOST]
    assert [(b.attempt, b.bound.node) for b in bound] == [(1, "local-2"), (2, "local-1")]
    resumed = [p.progress.step for p in progress if p.attempt == 2]
    assert resumed[0] > max(checkpoints) and resumed[-1] == 6000


def wait_gone(pid: int, timeout_s: float = 10.0) -> None:
    """Until process ``pid`` is gone or a zombie (killed: its files are final)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return
        if state == "Z":
            return
        time.sleep(0.02)
    raise AssertionError(f"process {pid} still there {timeout_s} s after SIGKILL")


async def test_runners_killed_at_random_steps_while_recovery_is_killed_too(
    stack: Stack, database_url: str, kills: Counter[str]
) -> None:
    rng = random.Random(7)
    interval = 1000
    jobs = [md_job(f"kill-{i}", steps=6000) for i in range(3)]
    for spec in jobs:
        spec["checkpoint_interval_steps"] = interval
        spec["report_interval_steps"] = 100
    async with await MdqClient.connect(stack.info.nats_url, stack.namespace) as client:
        job_ids = await client.submit_when_ready(submit_request(*jobs, key="faults-random"))
        js = client.nc.jetstream()
        kill_at = {job: rng.randrange(1200, 4500, 100) for job in job_ids}
        pending = set(job_ids)
        last_step = dict.fromkeys(job_ids, 0)
        on_disk: dict[str, tuple[int, int]] = {}
        """job -> (the last step in the killed runner's energy table, its newest checkpoint
        file's step), read from disk once it is dead"""
        deadline = time.monotonic() + KILL_LOOP_S
        while pending:
            for job in sorted(pending):
                steps = [
                    p.progress.step
                    for p in await read_all(js, client.subjects.progress(job))
                    if p.attempt == 1
                ]
                last_step[job] = steps[-1] if steps else 0
                if (
                    last_step[job] >= kill_at[job]
                    and (pid := runner_pid(job, stack.namespace)) is not None
                ):
                    os.kill(pid, signal.SIGKILL)
                    await asyncio.to_thread(wait_gone, pid)
                    folder = job_dir(stack.data_dir, job)
                    on_disk[job] = (
                        last_energy_step(folder / "energies.csv"),
                        newest_checkpoint_step(folder / "checkpoints"),
                    )
                    recovery = stack.child_pid("recovery")
                    if recovery is not None:
                        os.kill(recovery, signal.SIGKILL)  # recovery dies mid-decision
                        kills["recovery"] += 1
                    pending.discard(job)
                elif last_step[job] >= 6000 or time.monotonic() > deadline:
                    raise AssertionError(
                        f"no kill of {job} in time: its runner reached step {last_step[job]} "
                        f"(kill due at {kill_at[job]}, "
                        f"runner pid {runner_pid(job, stack.namespace)}) "
                        f"{KILL_LOOP_S - (deadline - time.monotonic()):.0f}s into the loop "
                        f"(limit {KILL_LOOP_S:.0f}s); still to kill: "
                        + ", ".join(f"{j} at {last_step[j]}/{kill_at[j]}" for j in sorted(pending))
                    )
            await asyncio.sleep(0.1)
        states = await client.wait(job_ids, timeout=400)
        assert {str(s) for s in states.values()} == {"SUCCEEDED"}, states
        for job in job_ids:
            requeues = await attempt_events(client, job, "requeued")
            assert [r.attempt for r in requeues] == [2], f"{job}: exactly one resubmission"
            failure = (await attempt_events(client, job, "attempt_failed"))[0].attempt_failed
            resume = requeues[0].requeued.resume_from.step
            assert failure.reason == pb.FAILURE_CRASHED
            assert 0 <= failure.last_step - resume <= interval, (
                "lost work ≤ one checkpoint interval"
            )
            assert requeues[0].requeued.steps_lost == failure.last_step - resume
            # and from outside: the dead runner's files agree, and lost at most one interval
            reached, newest_checkpoint = on_disk[job]
            assert resume == newest_checkpoint, "resumed from the newest checkpoint on disk"
            assert 0 <= reached - newest_checkpoint <= interval, "lost work ≤ one interval"
            assert failure.last_step <= reached
            progress = await read_all(js, client.subjects.progress(job))
            second = [p.progress.step for p in progress if p.attempt == 2]
            assert second[0] > resume and second[-1] == 6000
        await assert_succeeded_once_and_projected(client, database_url, job_ids, steps=6000)
    assert any(s.restarts >= 1 for s in stack.status() if s.name == "recovery")


async def test_out_of_memory_retries_with_more_memory_and_succeeds(
    nats_url: str, database_url: str, namespace: str, tmp_path: Path
) -> None:
    # A runner peaks near 110 MiB: 64 MiB is killed, 64 x 2.5 = 160 MiB is enough.
    stack = await start_stack(
        nats_url, database_url, namespace, tmp_path / "state", MDQ_RECOVERY_OOM_MEMORY_FACTOR="2.5"
    )
    try:
        job = md_job("hungry", steps=1000)
        job["resources"] = {"cpu": 1, "memory_mb": 64}
        async with await MdqClient.connect(nats_url, namespace) as client:
            [job_id] = await client.submit_when_ready(submit_request(job, key="faults-oom"))
            states = await client.wait([job_id], timeout=240)
            failures = await attempt_events(client, job_id, "attempt_failed")
            requeues = await attempt_events(client, job_id, "requeued")
            await assert_succeeded_once_and_projected(client, database_url, [job_id], steps=1000)
    finally:
        await stack.stop()
    assert str(states[job_id]) == "SUCCEEDED"
    assert failures[0].attempt_failed.reason == pb.FAILURE_OOM_KILLED
    assert requeues[0].requeued.resources.memory_mb == 160


async def test_the_whole_stack_rides_out_a_nats_server_crash(
    database_url: str, namespace: str, tmp_path: Path
) -> None:
    """kill -9 of the NATS server while jobs run, restarted on the same store a second later:
    every service reconnects, the runners' reports buffered meanwhile arrive, every job
    succeeds, and PostgreSQL ends up agreeing with the log."""
    server = start_nats(tmp_path / "nats")
    stack = await start_stack(server.url, database_url, namespace, tmp_path / "state")
    try:
        async with await MdqClient.connect(server.url, namespace) as client:
            jobs = [md_job(f"crash-{i}", steps=4000) for i in range(2)]
            job_ids = await client.submit_when_ready(submit_request(*jobs, key="faults-nats"))

            async def reporting() -> bool:
                progress = [
                    await read_all(client.nc.jetstream(), client.subjects.progress(job))
                    for job in job_ids
                ]
                return all(progress)

            await wait_for(reporting, timeout=120, what="both jobs reporting progress")
            server.kill()
            await asyncio.sleep(1.0)  # an outage, not a blip: clients notice the server gone
            server = start_nats(tmp_path / "nats", port=server.port)

            states = await client.wait(job_ids, timeout=300)
            assert {str(state) for state in states.values()} == {"SUCCEEDED"}
            await assert_succeeded_once_and_projected(client, database_url, job_ids, steps=4000)
    finally:
        await stack.stop()
        server.stop()
