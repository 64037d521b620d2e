"""End to end: the whole stack (every service, the local backend, real OpenMM) on real NATS and
PostgreSQL — a campaign with a chain lands in the history, and a runner killed with SIGKILL
resumes from its checkpoint."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from typing import Any

import asyncpg
import pytest

from mdq.stack import Stack
from tests.e2e.stacks import operator_client
from tests.helpers import read_all, wait_for
from tools.processes import runner_pid
from tools.submitting import submit_request, water_job

pytestmark = pytest.mark.e2e


def md_job(
    name: str, *, temperature: float = 300.0, steps: int = 1500, **extra: Any
) -> dict[str, object]:
    fields = {"report_interval_steps": 250, "checkpoint_interval_steps": 500, **extra}
    return water_job(name, steps=steps, task="TASK_MD", temperature_k=temperature, **fields)


async def test_campaign_with_chain_runs_to_the_history(stack: Stack, database_url: str) -> None:
    # Seeded (initial velocities and the thermostat's noise) and reported every 50 steps: the
    # mean temperature of a small box over its last 1.5 ps is then a steady figure, not one
    # sample's chance, and the order of the boxes' means below holds run after run.
    temperature = {"report_interval_steps": 50}
    campaign = submit_request(
        md_job("water-280k", temperature=280, seed=280, **temperature),
        md_job("water-300k", temperature=300, seed=300, **temperature),
        md_job("water-320k", temperature=320, seed=320, **temperature),
        {
            "name": "init",
            "task": "TASK_MINIMIZE",
            "system": {"water_box": {"box_nm": 1.6}},
            "steps": 100,
        },
        md_job("run", steps=1000, depends_on=["init"]),
        {
            "name": "analyze",
            "task": "TASK_ANALYZE",
            "depends_on": ["run"],
            "resources": {"cpu": 0.5},
        },
        key="e2e-campaign",
    )
    async with await operator_client(stack) as client:
        job_ids = await client.submit_when_ready(campaign)
        assert await client.submit(campaign) == job_ids  # same key, same jobs
        states = await client.wait(job_ids, timeout=400)
    assert {str(state) for state in states.values()} == {"SUCCEEDED"}, states
    ids = dict(zip(["w280", "w300", "w320", "init", "run", "analyze"], job_ids, strict=True))

    db = await asyncpg.connect(database_url)
    try:

        async def projected() -> bool:
            count = await db.fetchval(
                "SELECT count(*) FROM jobs WHERE state = 'SUCCEEDED' AND job_id = ANY($1::text[])",
                job_ids,
            )
            return bool(count == len(job_ids))

        await wait_for(projected, timeout=30, what="every job SUCCEEDED in PostgreSQL")
        rows = {
            r["job_id"]: r
            for r in await db.fetch("SELECT * FROM jobs WHERE job_id = ANY($1::text[])", job_ids)
        }
        for key in ("w280", "w300", "w320"):
            assert rows[ids[key]]["last_step"] == 1500
            samples = await db.fetch(
                "SELECT step, temperature_k FROM progress WHERE job_id = $1 ORDER BY step", ids[key]
            )
            assert [s["step"] for s in samples][-1] == 1500 and len(samples) >= 6
        # The thermostat shows: the hot box ends up hotter than the cold one on average.
        mean = {}
        for key in ("w280", "w320"):
            mean[key] = await db.fetchval(
                "SELECT avg(temperature_k) FROM progress WHERE job_id = $1 AND step >= 750",
                ids[key],
            )
        assert mean["w320"] > mean["w280"], mean
        # The chain ran in order: run started after init ended, analyze after run.
        attempts = {
            r["job_id"]: r
            for r in await db.fetch(
                "SELECT * FROM attempts WHERE job_id = ANY($1::text[])", job_ids
            )
        }
        assert attempts[ids["run"]]["started_at"] >= attempts[ids["init"]]["ended_at"]
        assert attempts[ids["analyze"]]["started_at"] >= attempts[ids["run"]]["ended_at"]
        assert all(a["node"].startswith("local-") for a in attempts.values())
        placements = await db.fetchval(
            "SELECT count(*) FROM placements WHERE job_id = ANY($1::text[])", job_ids
        )
        assert placements == len(job_ids)
    finally:
        await db.close()
    analysis = json.loads((stack.data_dir / "jobs" / ids["analyze"] / "analysis.json").read_text())
    assert json.dumps(analysis).count(ids["run"]) >= 1


async def test_runner_killed_mid_job_resumes_from_its_checkpoint(
    stack: Stack, database_url: str
) -> None:
    job = md_job("long", steps=8000)
    job["checkpoint_interval_steps"] = 1000
    job["report_interval_steps"] = 200
    async with await operator_client(stack) as client:
        [job_id] = await client.submit_when_ready(submit_request(job, key="e2e-kill"))
        js = client.nc.jetstream()

        async def checkpointed() -> bool:
            return len(await read_all(js, client.subjects.job(job_id, "checkpoint"))) >= 1

        await wait_for(checkpointed, timeout=120, what="a first checkpoint")
        pid = runner_pid(job_id, stack.namespace)
        assert pid is not None, "the runner process of the job"
        os.kill(pid, signal.SIGKILL)
        states = await client.wait([job_id], timeout=300)
        assert str(states[job_id]) == "SUCCEEDED"
        checkpoints = await read_all(js, client.subjects.job(job_id, "checkpoint"))
        progress = await read_all(js, client.subjects.progress(job_id))
    first_attempt_checkpoints = [c.checkpoint.step for c in checkpoints if c.attempt == 1]
    resumed = [p.progress.step for p in progress if p.attempt == 2]
    assert first_attempt_checkpoints, "attempt 1 checkpointed before the kill"
    assert resumed and resumed[0] > max(first_attempt_checkpoints) >= 1000  # continues, not from 0
    assert resumed[-1] == 8000

    db = await asyncpg.connect(database_url)
    try:

        async def projected() -> bool:
            state: str | None = await db.fetchval(
                "SELECT state FROM jobs WHERE job_id = $1", job_id
            )
            return state == "SUCCEEDED"

        await wait_for(projected, timeout=30, what="the job SUCCEEDED in PostgreSQL")
        rows = await db.fetch("SELECT * FROM attempts WHERE job_id = $1 ORDER BY attempt", job_id)
        assert [r["attempt"] for r in rows] == [1, 2]
        assert rows[0]["failure_reason"] == "FAILURE_CRASHED"
        assert rows[1]["resumed_from_step"] == max(first_attempt_checkpoints)
        assert await db.fetchval("SELECT last_step FROM jobs WHERE job_id = $1", job_id) == 8000
    finally:
        await db.close()
    await asyncio.sleep(0)
