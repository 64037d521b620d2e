"""End to end on the embedded stack with two local execution clusters (``mdq up --clusters
2``; issue 18, items 1, 2 and 5): NATS authenticates every connection, each cluster's node agent
may use its own cluster's buckets, and real OpenMM jobs run where their ``clusters`` selector
sends them, a chain's analysis where its run left its outputs; events and PostgreSQL name the
node within its cluster."""

from __future__ import annotations

from pathlib import Path

import asyncpg
import pytest

from mdq.sdk.client import MdqClient
from mdq.stack import Stack
from tests.e2e.test_stack import md_job, request, submit_when_ready
from tests.helpers import events_of

pytestmark = pytest.mark.e2e


async def test_jobs_run_on_the_clusters_they_ask_for(
    tmp_path: Path, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("NATS_URL", raising=False)
    monkeypatch.delenv("MDQ_NATS_CREDS", raising=False)
    stack = Stack(
        state_dir=tmp_path / "state",
        database_url=database_url,
        local_nodes=1,
        clusters=2,
        metrics_port=0,
        grace_s=5.0,
    )
    info = await stack.start()
    try:
        campaign = request(
            md_job("on-lab2", steps=500, clusters={"require": {"site": "lab2"}}),
            md_job("on-lab1", steps=500, clusters={"require": {"site": "lab1"}}),
            {
                "name": "analyze",
                "task": "TASK_ANALYZE",
                "depends_on": ["on-lab2"],
                "resources": {"cpu": 0.5},
            },
            key="clusters-1",
        )
        async with await MdqClient.connect(
            info.nats_url, stack.namespace, creds=info.nats_creds
        ) as client:
            job_ids = await submit_when_ready(client, campaign)
            states = await client.wait(job_ids, timeout=300)
            assert {str(state) for state in states.values()} == {"SUCCEEDED"}, states
            on_lab2, on_lab1, analyze = job_ids
            js = client.nc.jetstream()
            bound = {
                event.job_id: event.bound for event in await events_of(js, client.subjects, "bound")
            }
        assert bound[on_lab2].node == "lab2/local-1" and bound[on_lab2].cluster == "lab2"
        assert bound[on_lab1].node == "lab1/local-1"
        # the analysis may run anywhere: it goes where its run's outputs are
        assert bound[analyze].cluster == "lab2"
        assert {c.cluster for c in bound[analyze].clusters} == {"lab1", "lab2"}
    finally:
        await stack.stop()

    db = await asyncpg.connect(database_url)
    try:
        nodes = dict(
            await db.fetch(
                "SELECT job_id, node FROM attempts WHERE job_id = ANY($1::text[])", job_ids
            )
        )
    finally:
        await db.close()
    assert nodes == {on_lab2: "lab2/local-1", on_lab1: "lab1/local-1", analyze: "lab2/local-1"}
