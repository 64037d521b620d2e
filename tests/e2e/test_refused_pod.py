"""End to end, on a closed bus: a pod whose attempt placement says does not live (the runner
credential desk refuses it) fails to start without keeping its node from taking pods. Its
refusal is about the attempt (cancelled, ended or replaced meanwhile), not the node; were it
counted against the node, anyone who can end attempts could cordon nodes."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from mdq.backends.local.api import LocalBackend
from mdq.backends.local.records import NodeRecord
from mdq.backends.port import PodSpec
from mdq.bus.connect import connect
from mdq.bus.subjects import Subjects
from mdq.contracts import pb
from mdq.core import ids
from mdq.stack import LOCAL_AGENT
from tests.e2e.stacks import own_stack
from tests.helpers import eventually, wait_for
from tests.integration.test_local_backend import until_terminal

pytestmark = pytest.mark.e2e

JOB = "0123456789ab-never-bound"


async def test_a_refused_credential_does_not_cordon_the_node(
    tmp_path: Path, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    stack = own_stack(
        tmp_path,
        database_url,
        monkeypatch,
        services=("placement",),
        extra_env={"MDQ_LOCAL_HEARTBEAT_S": "0.5"},
    )
    async with stack:
        creds = stack.state_dir / "secrets" / "nats" / "placement.creds"
        nc = await connect(stack.info.nats_url, name="refused-pod-test", creds=creds)
        backend = LocalBackend(nc=nc, subjects=Subjects(stack.namespace), heartbeat_timeout_s=5)
        try:

            async def node_ready() -> str | None:
                samples = await backend.sample_nodes()
                return samples[0].name if samples and samples[0].ready else None

            node = await eventually(node_ready, within=60, what="the node ready")
            name = ids.pod_name(JOB, 1)
            await backend.create_pod(
                PodSpec(
                    name=name,
                    job_id=JOB,
                    attempt=1,
                    node=node,
                    cpu=1.0,
                    memory_mb=256,
                    priority_class="normal",
                    spec=pb.JobSpec(name="never-bound"),
                )
            )

            ended = await until_terminal(backend, name, within=60)
            failed_at = time.time()
            assert ended.phase == pb.POD_FAILED and "is not running" in ended.message, ended
            # the node's own next heartbeats (a start failure is published at once, and kept
            # for MDQ_LOCAL_START_ERROR_HOLD_S): ready, with no problem
            nodes = (await backend.buckets()).nodes
            reports: dict[float, NodeRecord] = {}

            async def three_heartbeats_later() -> bool:
                entry = await nodes.get(node)
                record = NodeRecord.from_json(node, entry.value or b"")
                reports[record.heartbeat_unix] = record
                return sum(beat > failed_at for beat in reports) >= 3

            await wait_for(three_heartbeats_later, timeout=30, interval=0.1, what="heartbeats")
            for record in reports.values():
                assert record.node.ready and record.node.problem == "", record
        finally:
            await backend.close()
            await nc.close()
        log = (stack.logs_dir / f"{LOCAL_AGENT}.log").read_text()
        assert "take no new pods" not in log
