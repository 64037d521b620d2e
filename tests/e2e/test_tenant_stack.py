"""End to end on the embedded stack, whose NATS authenticates every connection: a tenant added
with ``mdq tenant add`` runs a real OpenMM job through every service (its runner with
credentials minted for that job), follows it from its own stream to SUCCEEDED, and the history
says whose it is; another tenant cannot follow it."""

from __future__ import annotations

import stat
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import asyncpg
import nats.errors
import pytest

from mdq.bus.security.auth import nats_secrets_dir
from mdq.contracts import pb
from mdq.sdk.client import JobNotInLog, MdqClient
from mdq.stack import Stack, StackInfo
from mdq.tenancy import AddedTenant, add_tenant
from tests.e2e.stacks import operator_client, own_stack
from tests.e2e.test_stack import md_job
from tests.helpers import wait_for
from tools.submitting import submit_request

pytestmark = pytest.mark.e2e


@asynccontextmanager
async def stack_with_tenants(
    tmp_path: Path, database_url: str, monkeypatch: pytest.MonkeyPatch, *, grace_s: float
) -> AsyncIterator[tuple[Stack, StackInfo, dict[str, AddedTenant]]]:
    """An embedded stack of one local node (its NATS authenticating every connection, none of
    the caller's NATS settings in the environment) with the tenants alice and bob added: the
    stack, what it started, and each tenant's credentials. Stopped when the block ends."""
    stack = own_stack(tmp_path, database_url, monkeypatch, grace_s=grace_s)
    info = await stack.start()
    try:
        added = {
            tenant: await add_tenant(
                tenant,
                secrets=nats_secrets_dir(stack.state_dir),
                nats_url=info.nats_url,
                namespace=stack.namespace,
                admin_creds=info.nats_admin_creds,
            )
            for tenant in ("alice", "bob")
        }
        yield stack, info, added
    finally:
        await stack.stop()


async def test_a_tenant_runs_a_job_and_another_cannot_follow_it(
    tmp_path: Path, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with stack_with_tenants(tmp_path, database_url, monkeypatch, grace_s=15.0) as (
        stack,
        info,
        added,
    ):
        job = submit_request(md_job("water", steps=500), key="alice-1")
        job.submitted_by = "mallory"  # ignored: the tenant is whoever the server let submit
        async with await MdqClient.connect(
            info.nats_url, stack.namespace, creds=added["alice"].creds
        ) as alice:
            [job_id] = await alice.submit_when_ready(job)
            states = await alice.wait([job_id], timeout=300)
        assert job_id.startswith("alice.")
        assert {str(state) for state in states.values()} == {"SUCCEEDED"}, states
        # what the job wrote (trajectory, checkpoints, its pod's log) is for the stack's
        # owner and group alone: folders 0750, files 0640 at most (docs/security.md "Files")
        written = [*(stack.data_dir / "jobs").rglob("*"), *(stack.data_dir / "pods").rglob("*")]
        assert any(path.is_file() for path in written), written
        for path in [stack.data_dir, *written]:
            loose = stat.S_IMODE(path.stat().st_mode) & (0o027 if path.is_dir() else 0o137)
            assert not loose, (path, oct(path.stat().st_mode))

        async with await MdqClient.connect(
            info.nats_url, stack.namespace, creds=added["bob"].creds
        ) as bob:
            with pytest.raises(JobNotInLog) as waited:  # not even seen: said at once
                await bob.wait([job_id], timeout=30)
            assert waited.value.job_ids == [job_id]
            # nor submit as her: the server drops what he publishes on her subject
            as_alice = pb.SubmitRequest(jobs=[pb.JobSpec(name="x")], idempotency_key="b")
            with pytest.raises(nats.errors.TimeoutError):
                await bob.nc.request(
                    bob.subjects.api_submit_for("alice"), as_alice.SerializeToString(), timeout=2
                )

    db = await asyncpg.connect(database_url)
    try:

        async def projected() -> bool:
            return bool(
                await db.fetchval("SELECT count(*) FROM progress WHERE job_id = $1", job_id)
            )

        await wait_for(projected, timeout=5, what="the tenant's progress in PostgreSQL")
        row = await db.fetchrow(
            "SELECT state, submitted_by, last_step FROM jobs WHERE job_id = $1", job_id
        )
    finally:
        await db.close()
    assert row is not None and dict(row) == {
        "state": "SUCCEEDED",
        "submitted_by": "alice",
        "last_step": 500,
    }


RENEWAL_TTL_S = 8


async def test_a_runner_outlives_its_first_credentials(
    tmp_path: Path, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With runner credentials that live 8 s, a job that runs longer still reports to the end:
    its runner renewed them from placement (its pod log says so) and reconnected on the
    fresh ones; without the renewal the server ends its connection and the job cannot
    succeed."""
    stack = own_stack(
        tmp_path,
        database_url,
        monkeypatch,
        extra_env={"MDQ_NATS_RUNNER_CREDS_TTL_S": str(RENEWAL_TTL_S)},
    )
    await stack.start()
    try:
        async with await operator_client(stack) as client:
            long_job = md_job("outlives", steps=12_000)
            long_job["report_interval_steps"] = 500
            long_job["checkpoint_interval_steps"] = 4000
            [job_id] = await client.submit_when_ready(submit_request(long_job, key="renew-1"))
            states = await client.wait([job_id], timeout=300)
        assert {str(state) for state in states.values()} == {"SUCCEEDED"}, states
        [log] = (stack.data_dir / "pods").glob(f"*{job_id}*.log")
        text = log.read_text()
        assert "NATS credentials renewed" in text, text[-2000:]
        assert "could not be published" not in text, text[-2000:]
    finally:
        await stack.stop()
