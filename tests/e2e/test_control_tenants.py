"""End to end on the embedded stack, whose NATS authenticates every connection (docs/control.md,
"Authority"): a tenant cancels its own running job with its own credentials through placement;
another tenant's cancel of it is refused by placement (FORBIDDEN) on its own subject, and by
the server on hers (nobody answers); the job ends CANCELLED with no runner left."""

from __future__ import annotations

import asyncio
from pathlib import Path

import nats.errors
import pytest

from mdq.contracts import pb
from mdq.sdk.client import MdqClient
from mdq.stack import Stack
from tests.e2e.test_control_stack import gone, long_job
from tests.e2e.test_tenant_stack import stack_with_tenants
from tests.helpers import wait_for
from tools.processes import runner_pid
from tools.submitting import submit_request

pytestmark = pytest.mark.e2e


async def stepping(stack: Stack, job_id: str) -> int:
    """Once the job's runner runs and has written a report row: its pid (from outside: the
    process table and the runner's own energy table)."""
    table = stack.data_dir / "jobs" / job_id / "energies.csv"

    async def stepped() -> bool:
        if runner_pid(job_id, stack.namespace) is None:
            return False
        rows = await asyncio.to_thread(lambda: table.read_text() if table.is_file() else "")
        return len(rows.splitlines()) > 1

    await wait_for(stepped, timeout=180, what=f"{job_id} stepping")
    pid = runner_pid(job_id, stack.namespace)
    assert pid is not None
    return pid


async def test_a_tenant_cancels_its_own_job_and_no_one_elses(
    tmp_path: Path, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with (
        stack_with_tenants(tmp_path, database_url, monkeypatch, grace_s=5.0) as (
            stack,
            info,
            added,
        ),
        await MdqClient.connect(
            info.nats_url, stack.namespace, creds=added["alice"].creds
        ) as alice,
        await MdqClient.connect(info.nats_url, stack.namespace, creds=added["bob"].creds) as bob,
    ):
        job = long_job("mine", steps=10_000_000)
        job["labels"] = {"team": "x"}
        [job_id] = await alice.submit_when_ready(submit_request(job, key="alice-ctl"))
        pid = await stepping(stack, job_id)  # a tenant reads its own stream only: outside
        # bob on his own subject: placement refuses, naming why
        theirs = await bob.cancel([job_id])
        assert [(o.result, o.state) for o in theirs.outcomes] == [(pb.CONTROL_FORBIDDEN, "")]
        assert (await bob.hold(labels={"team": "x"})).matched == 0  # his own jobs only
        # bob on alice's subject: the server drops it, nobody answers
        forged = pb.ControlRequest(control_key="b", verb=pb.CONTROL_CANCEL, job_ids=[job_id])
        with pytest.raises(nats.errors.Error):
            await bob.nc.request(
                bob.subjects.api_control_for("alice"), forged.SerializeToString(), timeout=2
            )
        assert runner_pid(job_id, stack.namespace) == pid  # still running
        mine = await alice.cancel([job_id], reason="wrong input")
        assert [o.result for o in mine.outcomes] == [pb.CONTROL_STOPPING]
        views = await alice.wait_control("cancel", mine, timeout=120)
        assert views[job_id].state.value == "CANCELLED"
        assert views[job_id].final_message == "cancelled by tenant alice: wrong input"
        await gone(pid)
