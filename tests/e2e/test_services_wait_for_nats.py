"""End to end: every process of the stack started before NATS exists waits for it (one log line
per try, no exit, no restart by the supervisor) and works once a server starts on its URL: a job
submitted then runs to SUCCEEDED through intake, placement, the node agent, the runner, the
watcher and recovery, and lands in PostgreSQL."""

from __future__ import annotations

import asyncio
from pathlib import Path

import asyncpg
import pytest

from mdq.embedded import EmbeddedNats, free_port, start_nats
from mdq.sdk.client import MdqClient
from tests.e2e.stacks import session_stack, wait_for_state
from tests.e2e.test_stack import md_job
from tests.helpers import wait_for
from tools.submitting import submit_request

pytestmark = pytest.mark.e2e


async def test_every_service_waits_for_nats_and_works_once_it_starts(
    tmp_path: Path, database_url: str, namespace: str
) -> None:
    url = f"nats://127.0.0.1:{free_port()}"
    stack = session_stack(url, database_url, namespace, tmp_path, local_nodes=1)
    server: EmbeddedNats | None = None
    await stack.start()
    try:
        children = stack.status()
        assert {child.name for child in children} == {
            "intake",
            "placement",
            "watcher",
            "recovery",
            "metrics",
            "console",
            "local-backend",
        }

        async def all_waiting() -> bool:
            return all(
                child.log_path.read_text().count(f"NATS at {url} not reachable") >= 2
                for child in stack.status()
            )

        await wait_for(all_waiting, timeout=90, what="every service to say it waits for NATS")
        assert [(c.name, c.running, c.restarts) for c in stack.status()] == [
            (c.name, True, 0) for c in children
        ], "a service exited instead of waiting"

        port = int(url.rsplit(":", 1)[1])
        server = await asyncio.to_thread(start_nats, tmp_path / "nats", port=port)
        async with await MdqClient.connect(url, namespace) as client:
            submit = submit_request(md_job("late-nats", steps=300), key="late-nats")
            [job_id] = await client.submit_when_ready(submit)
            states = await client.wait([job_id], timeout=240)
        assert str(states[job_id]) == "SUCCEEDED"
        assert [(c.name, c.restarts) for c in stack.status()] == [(c.name, 0) for c in children]

        db = await asyncpg.connect(database_url)
        try:
            await wait_for_state(
                db, job_id, "SUCCEEDED", timeout=60, what="the job SUCCEEDED in PostgreSQL"
            )
        finally:
            await db.close()
    finally:
        await stack.stop()
        if server is not None:
            await asyncio.to_thread(server.stop)
