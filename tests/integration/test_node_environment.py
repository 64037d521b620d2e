"""A node whose data disk fails takes no pods, says why, and comes back when the disk does.

A real node agent (subprocess, real NATS) serves two nodes on a data folder that is a real ext4
filesystem of its own (``mdq.testing.disks.SmallDisk``), failed for real: full (ENOSPC),
read-only (EROFS), dying (EIO), unmounted, frozen; or a btrfs subvolume under a qgroup limit
(``QuotaDisk``) that goes over its quota (EDQUOT). Within a heartbeat the nodes' records carry the
problem in words (what ``mdq nodes``, placement and the console read); a pod bound there fails
to start with that reason (StartError: FAILURE_ENVIRONMENT, never charged to its job) and, on a
lost mount, leaves no job folder on the disk beneath; once the disk is healed the problem clears
and a pod runs to the end.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
from nats.aio.client import Client

from mdq.backends.local.api import LocalBackend
from mdq.bus.subjects import Subjects
from mdq.contracts import pb
from mdq.core.nodes import NodeSample
from mdq.core.recovery import classify
from mdq.datadisk import VOLUME_MARKER
from mdq.testing.disks import SmallDisk
from tests.disks import Disk, made_disk, on_ext4
from tests.helpers import agent_running, eventually
from tests.integration.test_local_backend import FAST, NODES, pod, until_terminal


@pytest.fixture
def disk(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Disk]:
    yield from made_disk(request, tmp_path, "data")


@pytest.fixture
def agent(nats_url: str, namespace: str, disk: Disk, tmp_path: Path) -> Iterator[None]:
    settings = {**FAST, "start_error_hold_s": "1", "probe_stall_s": "2"}
    log_file = tmp_path / "agent.log"  # off the disk that is failed
    with agent_running(nats_url, namespace, disk.mount_point, NODES, settings, log_file=log_file):
        yield


@pytest.fixture
async def backend(nc: Client, subjects: Subjects) -> AsyncIterator[LocalBackend]:
    local = LocalBackend(nc=nc, subjects=subjects, heartbeat_timeout_s=1.5)
    yield local
    await local.close()


async def problems(backend: LocalBackend, wanted: Callable[[str], bool]) -> list[NodeSample]:
    """Every node's sample once each node is ready and its problem satisfies ``wanted``."""
    seen: list[NodeSample] = []

    async def probe() -> list[NodeSample] | None:
        seen[:] = await backend.sample_nodes()
        ready = [s for s in seen if s.ready]
        if sorted(s.name for s in ready) == sorted(NODES) and all(wanted(s.problem) for s in ready):
            return ready
        return None

    try:
        return await eventually(probe, within=20, what="the nodes' problem")
    except AssertionError:
        raise AssertionError(f"the nodes never said so; last seen {seen}") from None


CASES: list[tuple[str, str, Callable[[Disk], None], Callable[[Disk], None], str]] = [
    ("full", "ext4", lambda d: d.fill_up(), lambda d: d.free(), "data disk full (ENOSPC)"),
    (
        "over quota",
        "quota",
        lambda d: d.fill_up(),
        lambda d: d.free(),
        "data disk quota exceeded (EDQUOT)",
    ),
    (
        "read-only",
        "ext4",
        on_ext4(SmallDisk.make_read_only),
        on_ext4(SmallDisk.remount),
        "data disk read-only (EROFS)",
    ),
    (
        "dying",
        "ext4",
        on_ext4(SmallDisk.shut_down),
        on_ext4(SmallDisk.remount),
        "data disk I/O error (EIO)",
    ),
    (
        "unmounted",
        "ext4",
        on_ext4(SmallDisk.unmount),
        on_ext4(SmallDisk.mount),
        "data volume missing",
    ),
    (
        "not answering",
        "ext4",
        on_ext4(SmallDisk.freeze),
        on_ext4(SmallDisk.thaw),
        "data disk not answering",
    ),
]


@pytest.mark.parametrize(
    ("name", "disk", "fail", "heal", "problem"),
    CASES,
    ids=[c[0] for c in CASES],
    indirect=["disk"],
)
async def test_a_node_whose_data_disk_fails_takes_no_pods_says_why_and_comes_back(
    disk: Disk,
    agent: None,
    backend: LocalBackend,
    name: str,
    fail: Callable[[Disk], None],
    heal: Callable[[Disk], None],
    problem: str,
) -> None:
    await problems(backend, lambda text: text == "")
    assert (disk.mount_point / VOLUME_MARKER).is_file(), "the agent marked its volume"

    fail(disk)
    sick = await problems(backend, lambda text: problem in text)
    assert all(s.ready for s in sick), "a sick node is still there (its pods keep running)"

    await backend.create_pod(pod("mdq-sick-1", "print('never runs')"))
    failed = await until_terminal(backend, "mdq-sick-1")
    assert (failed.phase, failed.reason) == (pb.POD_FAILED, "StartError")
    assert problem in failed.message and "n1" in failed.message, failed.message
    assert classify(pod_reason=failed.reason, exit_code=failed.exit_code) == (
        pb.FAILURE_ENVIRONMENT
    )
    if name == "unmounted":
        assert not (disk.mount_point / "jobs").exists(), "no job folder on the disk beneath"

    heal(disk)
    await problems(backend, lambda text: text == "")
    await backend.create_pod(pod("mdq-healed-1", "print('ran')"))
    done = await until_terminal(backend, "mdq-healed-1", within=30)
    assert (done.phase, done.reason) == (pb.POD_SUCCEEDED, "Completed"), done
