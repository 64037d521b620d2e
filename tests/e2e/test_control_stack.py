"""End to end: job control on the whole stack (every service, the local backend, real OpenMM on
NATS and PostgreSQL, docs/control.md) — a running job cancelled checkpoints first, keeps its
files, ends CANCELLED and leaves no runner; a held running job resumes from the checkpoint its
hold wrote once released; a succeeded job extended runs on from its final checkpoint."""

from __future__ import annotations

import asyncio
from pathlib import Path

import asyncpg
import psutil
import pytest

from mdq.contracts import pb
from mdq.sdk.client import MdqClient
from mdq.stack import Stack
from tests.e2e.stacks import operator_client, own_stack, wait_for_state
from tests.e2e.test_stack import md_job
from tests.helpers import read_all, wait_for
from tools.processes import runner_pid
from tools.submitting import submit_request

pytestmark = pytest.mark.e2e


def long_job(name: str, *, steps: int = 400_000) -> dict[str, object]:
    """A job that runs far longer than the test: it ends only because it is told to."""
    job = md_job(name, steps=steps)
    job["report_interval_steps"] = 100
    job["checkpoint_interval_steps"] = 1_000_000 if steps > 1_000_000 else steps
    job["trajectory_interval_steps"] = 100
    return job


async def running_pid(client: MdqClient, stack: Stack, job_id: str) -> int:
    """Once the job reports progress: its runner's pid."""

    async def reported() -> bool:
        return bool(await read_all(client.nc.jetstream(), client.subjects.progress(job_id)))

    await wait_for(reported, timeout=180, what=f"{job_id} running")
    pid = runner_pid(job_id, stack.namespace)
    assert pid is not None, "the job's runner process"
    return pid


async def gone(pid: int) -> None:
    def exited() -> bool:
        try:
            return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    async def check() -> bool:
        return await asyncio.to_thread(exited)

    await wait_for(check, timeout=30, what=f"runner {pid} gone")


async def test_a_running_job_cancelled_checkpoints_and_leaves_no_runner(
    stack: Stack, database_url: str
) -> None:
    async with await operator_client(stack) as client:
        [job_id] = await client.submit_when_ready(
            submit_request(long_job("endless", steps=10_000_000), key="ctl-cancel")
        )
        pid = await running_pid(client, stack, job_id)
        reply = await client.cancel([job_id], reason="wrong temperature", requested_by="ann")
        [outcome] = reply.outcomes
        assert (outcome.result, outcome.state) == (pb.CONTROL_STOPPING, "RUNNING")
        views = await client.wait_control("cancel", reply, timeout=60)
        assert views[job_id].state.value == "CANCELLED"
        await gone(pid)
        assert runner_pid(job_id, stack.namespace) is None
        log = await read_all(client.nc.jetstream(), client.subjects.job_all(job_id))
    kinds = [event.WhichOneof("body") for event in log]
    asked = kinds.index("cancel_requested")
    # the stop wrote a checkpoint (none was due for a million steps), then the attempt ended
    assert "checkpoint" in kinds[asked:], kinds
    checkpoint = next(e.checkpoint for e in log[asked:] if e.WhichOneof("body") == "checkpoint")
    assert checkpoint.step > 0
    assert kinds[-1] == "cancelled" or "cancelled" in kinds
    assert sum(kind in ("succeeded", "failed", "cancelled") for kind in kinds) == 1
    [failed] = [e.attempt_failed for e in log if e.WhichOneof("body") == "attempt_failed"]
    assert failed.reason == pb.FAILURE_STOPPED
    job_dir = stack.data_dir / "jobs" / job_id
    kept = await asyncio.to_thread(Path(checkpoint.path).is_file)
    assert kept, "the checkpoint the cancel wrote is kept"
    trajectory = await asyncio.to_thread((job_dir / "trajectory.dcd").stat)
    assert trajectory.st_size > 0, "and the trajectory"

    db = await asyncpg.connect(database_url)
    try:
        await wait_for_state(db, job_id, "CANCELLED", timeout=30, what="CANCELLED in PostgreSQL")
        row = await db.fetchrow(
            "SELECT final_reason, final_message, latest_checkpoint_step FROM jobs "
            "WHERE job_id = $1",
            job_id,
        )
        attempt = await db.fetchrow(
            "SELECT failure_reason, ended_at FROM attempts WHERE job_id = $1", job_id
        )
    finally:
        await db.close()
    assert row is not None and attempt is not None
    assert dict(row) == {
        "final_reason": "CANCELLED",
        "final_message": "cancelled by ann: wrong temperature",
        "latest_checkpoint_step": checkpoint.step,
    }
    assert attempt["failure_reason"] == "FAILURE_STOPPED" and attempt["ended_at"] is not None


async def test_a_held_running_job_resumes_from_its_checkpoint_once_released(
    stack: Stack,
) -> None:
    async with await operator_client(stack) as client:
        [job_id] = await client.submit_when_ready(
            submit_request(long_job("paused", steps=400_000), key="ctl-hold")
        )
        pid = await running_pid(client, stack, job_id)
        held = await client.hold([job_id])
        assert held.outcomes[0].result == pb.CONTROL_STOPPING
        views = await client.wait_control("hold", held, timeout=60)
        assert views[job_id].state.value == "HELD"
        await gone(pid)
        assert views[job_id].attempt == 2
        stopped_at = views[job_id].resume_from
        assert stopped_at is not None and stopped_at.step > 0
        # held: nothing runs it, however long it waits (the next decision is the release)
        assert runner_pid(job_id, stack.namespace) is None
        released = await client.release([job_id])
        assert released.outcomes[0].result == pb.CONTROL_DONE
        pid = await running_pid_of_attempt(client, stack, job_id, 2)
        cancelled = await client.cancel([job_id])
        await client.wait_control("cancel", cancelled, timeout=60)
        await gone(pid)
        progress = await read_all(client.nc.jetstream(), client.subjects.progress(job_id))
    second = [p.progress.step for p in progress if p.attempt == 2]
    assert second and second[0] > stopped_at.step, "went on from the hold's checkpoint"
    assert second[0] - stopped_at.step <= 100


async def running_pid_of_attempt(client: MdqClient, stack: Stack, job_id: str, attempt: int) -> int:
    async def reported() -> bool:
        progress = await read_all(client.nc.jetstream(), client.subjects.progress(job_id))
        return any(p.attempt == attempt for p in progress)

    await wait_for(reported, timeout=180, what=f"{job_id} attempt {attempt} running")
    pid = runner_pid(job_id, stack.namespace)
    assert pid is not None
    return pid


async def test_a_succeeded_job_extended_runs_on_from_its_final_checkpoint(
    tmp_path: Path, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a closed bus (the stack's own NATS, which authenticates every runner): the extended
    attempt gets runner credentials although the job succeeded once."""
    stack = own_stack(
        tmp_path, database_url, monkeypatch, extra_env={"MDQ_RECOVERY_BACKOFF_BASE_S": "1"}
    )
    async with stack:
        await extend_and_check(stack, database_url)


async def extend_and_check(stack: Stack, database_url: str) -> None:
    """Run a job to its end, extend it, and check it ran on from its final checkpoint: in the
    log, in its energy table and in PostgreSQL."""
    async with await operator_client(stack) as client:
        job = md_job("short", steps=600)
        job["checkpoint_interval_steps"] = 250  # the last before the end: step 500
        [job_id] = await client.submit_when_ready(submit_request(job, key="ctl-extend"))
        first = await client.wait([job_id], timeout=300)
        assert first[job_id].value == "SUCCEEDED"
        reply = await client.extend([job_id], steps=400, reason="not equilibrated")
        [outcome] = reply.outcomes
        assert (outcome.result, outcome.state, outcome.attempt) == (pb.CONTROL_DONE, "PENDING", 2)
        views = await client.wait_control("extend", reply, timeout=300)
        assert (views[job_id].state.value, views[job_id].attempt) == ("SUCCEEDED", 2)
        # ``wait`` reads the whole history: the job ended twice, and it is ended now
        assert (await client.wait([job_id], timeout=30))[job_id].value == "SUCCEEDED"
        js = client.nc.jetstream()
        progress = await read_all(js, client.subjects.progress(job_id))
        checkpoints = await read_all(js, client.subjects.job(job_id, "checkpoint"))
    first_run = [c.checkpoint.step for c in checkpoints if c.attempt == 1]
    assert first_run[-1] == 600, "the first run checkpointed its final step"
    extended = [p.progress.step for p in progress if p.attempt == 2]
    assert extended[0] > 600 and extended[-1] == 1000
    table = stack.data_dir / "jobs" / job_id / "energies.csv"
    energies = (await asyncio.to_thread(table.read_text)).splitlines()[1:]
    steps = [int(row.split(",")[0]) for row in energies]
    assert steps == sorted(set(steps)) and steps[-1] == 1000, "one energy table, continued"

    db = await asyncpg.connect(database_url)
    try:

        async def projected() -> bool:
            row = await db.fetchrow("SELECT state, attempt FROM jobs WHERE job_id = $1", job_id)
            return row is not None and (row["state"], row["attempt"]) == ("SUCCEEDED", 2)

        await wait_for(projected, timeout=30, what="the extension in PostgreSQL")
        row = await db.fetchrow(
            "SELECT target_steps, last_step FROM jobs WHERE job_id = $1", job_id
        )
        attempts = await db.fetch(
            "SELECT attempt, resumed_from_step FROM attempts WHERE job_id = $1 ORDER BY attempt",
            job_id,
        )
    finally:
        await db.close()
    assert row is not None and dict(row) == {"target_steps": 1000, "last_step": 1000}
    assert [(a["attempt"], a["resumed_from_step"]) for a in attempts] == [(1, 0), (2, 600)]
