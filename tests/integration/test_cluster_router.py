"""Several execution clusters behind one backend: two simulated Kubernetes
clusters (API emulators over real HTTP, kubelets running the pods as processes) and a local
cluster (a node agent of its own), routed by ``mdq.backends.clusters.ClusterRouter`` as the
services make it from a clusters file that changes while it runs."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from nats.aio.client import Client

from mdq.backends.clusters import (
    BadClustersFile,
    ClusterEntry,
    ClusterLost,
    ClusterRouter,
    KvLostClusters,
    UnknownCluster,
    parse_clusters,
)
from mdq.backends.factory import CLUSTERS_RELOAD_ENV, make_backend
from mdq.backends.kubernetes.backend import KubernetesBackend
from mdq.backends.kubernetes.settings import KubernetesSettings
from mdq.backends.local.agent import NodeAgent, NodeConfig
from mdq.backends.port import ClusterBackend, PodUpdate
from mdq.bus.subjects import Subjects
from mdq.contracts import pb
from mdq.core.recovery import classify
from mdq.testing.cluster import SimulatedCluster
from tests.helpers import wait_for
from tests.integration.test_kubernetes_runner_creds import pod

SCRIPTED = ["python", "-m", "mdq.testing.scripted_runner"]


def kubernetes_entry(
    name: str, cluster: SimulatedCluster, labels: dict[str, str]
) -> dict[str, object]:
    return {
        "name": name,
        "kind": "kubernetes",
        "labels": labels,
        "kubernetes": {
            "kubeconfig": str(cluster.kubeconfig),
            "namespace": "mdq",
            "runner_command": SCRIPTED,
            "termination_grace_s": 2,
            "retry_backoff_s": 0.2,
            "watch_timeout_s": 30,
        },
    }


@contextlib.asynccontextmanager
async def collecting(router: ClusterRouter) -> AsyncIterator[list[PodUpdate]]:
    seen: list[PodUpdate] = []

    async def collect() -> None:
        async for update in router.watch_pods():
            seen.append(update)

    task = asyncio.create_task(collect())
    try:
        yield seen
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        if task.done() and not task.cancelled() and task.exception():
            raise task.exception()  # type: ignore[misc]


async def test_pods_nodes_and_clusters_that_come_and_go(
    nc: Client, subjects: Subjects, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CLUSTERS_RELOAD_ENV, "0.2")
    east = SimulatedCluster(work_dir=tmp_path / "east", namespace="mdq", heartbeat_s=0.3)
    west = SimulatedCluster(work_dir=tmp_path / "west", namespace="mdq", heartbeat_s=0.3)
    stop_agent = asyncio.Event()
    agent = NodeAgent(
        js=nc.jetstream(),
        subjects=subjects.for_local_cluster("lab"),
        nodes=[NodeConfig(name="local-1", cpu_capacity=2, memory_capacity_mb=2048)],
        data_dir=tmp_path / "lab-data",
        heartbeat_s=0.3,
        nats_url="nats://unused:4222",
        runner_module="mdq.testing.scripted_runner",
    )
    async with east, west:
        agent_task = asyncio.create_task(agent.run(stop_agent))
        clusters_file = tmp_path / "clusters.json"
        entries: list[dict[str, object]] = [
            kubernetes_entry("east", east, {"site": "campus"}),
            kubernetes_entry("west", west, {"site": "centre", "fabric": "infiniband"}),
            {"name": "lab", "kind": "local", "labels": {"site": "lab"}},
        ]
        clusters_file.write_text(json.dumps({"clusters": entries}))
        router = await make_backend(
            kind="clusters",
            nc=nc,
            subjects=subjects,
            runner_nats_url="nats://nats.example:4222",
            data_dir=Path("/data"),
            clusters_file=clusters_file,
        )
        assert isinstance(router, ClusterRouter)
        try:

            async def every_node() -> bool:
                names = {s.name for s in await router.sample_nodes() if s.ready}
                return names == {
                    "east/node-1",
                    "east/node-2",
                    "west/node-1",
                    "west/node-2",
                    "lab/local-1",
                }

            await wait_for(every_node, what="the nodes of all three clusters, qualified")
            samples = {s.name: s for s in await router.sample_nodes()}
            assert samples["west/node-2"].cluster == "west"
            assert samples["west/node-2"].cluster_labels == {
                "site": "centre",
                "fabric": "infiniband",
            }
            assert samples["lab/local-1"].cluster_labels == {"site": "lab"}

            async with collecting(router) as seen:
                # a pod goes to the cluster its node names, under the node's own name there
                await router.create_pod(pod("w1", "print('ok')", node="west/node-2"))
                await router.create_pod(
                    pod("e1", "import time; time.sleep(60)", node="east/node-1")
                )

                def final(name: str) -> PodUpdate | None:
                    ends = [
                        u
                        for u in seen
                        if u.pod_name == name and u.phase in (pb.POD_SUCCEEDED, pb.POD_FAILED)
                    ]
                    return ends[-1] if ends else None

                async def w1_done() -> bool:
                    return final("mdq-w1-1") is not None

                await wait_for(w1_done, what="west's pod to succeed", timeout=30)
                done = final("mdq-w1-1")
                assert done is not None and done.phase == pb.POD_SUCCEEDED
                assert done.node == "west/node-2"
                assert west.api.pod("mdq-w1-1", "mdq") is not None
                assert east.api.pod("mdq-w1-1", "mdq") is None

                async def e1_running() -> bool:
                    return any(u.pod_name == "mdq-e1-1" and u.phase == pb.POD_RUNNING for u in seen)

                await wait_for(e1_running, what="east's pod running", timeout=30)
                # deleting needs no map of pods to clusters: it is asked everywhere
                await router.delete_pod("mdq-e1-1")

                async def e1_gone() -> bool:
                    return final("mdq-e1-1") is not None

                await wait_for(e1_gone, what="east's pod stopped", timeout=30)
                stopped = final("mdq-e1-1")
                assert stopped is not None and stopped.node == "east/node-1"
                assert stopped.phase == pb.POD_FAILED

                with pytest.raises(UnknownCluster):
                    await router.create_pod(pod("x1", "print('no')", node="north/node-1"))

                # west leaves the file: its nodes leave the samples, without a restart
                clusters_file.write_text(json.dumps({"clusters": [entries[0], entries[2]]}))

                async def west_gone() -> bool:
                    names = {s.name for s in await router.sample_nodes()}
                    return not any(name.startswith("west/") for name in names)

                await wait_for(west_gone, what="west removed")
                # a broken file changes nothing
                refused = router.file_errors
                clusters_file.write_text("{clusters: [{name: 'Bad Name', kind: local}]}")

                async def read_and_refused() -> bool:
                    return router.file_errors > refused

                await wait_for(read_and_refused, what="the broken file read and refused")
                assert set(router.clusters) == {"east", "lab"}
                # west comes back relabelled, and a pod there is watched again
                entries[1]["labels"] = {"site": "centre", "gpu": "true"}
                clusters_file.write_text(json.dumps({"clusters": entries}))

                async def west_back() -> bool:
                    found = {s.name: s for s in await router.sample_nodes()}
                    node = found.get("west/node-1")
                    return node is not None and node.cluster_labels.get("gpu") == "true"

                await wait_for(west_back, what="west back with its new labels")
                await router.create_pod(pod("w2", "print('again')", node="west/node-1"))

                async def w2_done() -> bool:
                    return final("mdq-w2-1") is not None

                await wait_for(w2_done, what="a pod on the returned cluster", timeout=30)
                # east relabelled in place: the same connection, the new labels
                east_backend = router._members["east"].backend
                entries[0] = {**entries[0], "labels": {"site": "campus", "spot": "true"}}
                clusters_file.write_text(json.dumps({"clusters": entries}))

                async def east_relabelled() -> bool:
                    found = {s.name: s for s in await router.sample_nodes()}
                    return found["east/node-1"].cluster_labels.get("spot") == "true"

                await wait_for(east_relabelled, what="east's new labels")
                assert router._members["east"].backend is east_backend
        finally:
            await router.close()
            stop_agent.set()
            await asyncio.wait_for(agent_task, 30)


CLUSTERS_FILE_ERRORS = [
    ("not yaml", "clusters: [", "not YAML"),
    (
        "unknown field",
        '{"clusters": [{"name": "a", "kind": "local", "zone": 1}]}',
        "clusters.0.zone",
    ),
    ("bad name", '{"clusters": [{"name": "A/B", "kind": "local"}]}', "clusters.0.name"),
    ("unknown kind", '{"clusters": [{"name": "a", "kind": "slurm"}]}', "clusters.0.kind"),
    (
        "duplicate",
        '{"clusters": [{"name": "a", "kind": "local"}, {"name": "a", "kind": "local"}]}',
        "clusters: Value error, cluster names must be unique",
    ),
    (
        "bad label",
        '{"clusters": [{"name": "a", "kind": "local", "labels": {"x y": "1"}}]}',
        "clusters.0.labels",
    ),
]


@pytest.mark.parametrize(("name", "text", "message"), CLUSTERS_FILE_ERRORS)
def test_a_bad_clusters_file_is_refused_naming_the_field(
    name: str, text: str, message: str
) -> None:
    with pytest.raises(BadClustersFile, match=message.replace(".", r"\.")):
        parse_clusters(text)


async def test_a_cluster_that_stops_answering_is_lost_then_fenced_when_it_is_back(
    nc: Client, subjects: Subjects, tmp_path: Path
) -> None:
    """East's API goes away (its kubelets and their pods go on, as in a network partition):
    after ``lost_after_s`` its running pod is reported FAILED NodeLost and the loss recorded
    for every process; no pod is created there and another process's router (metrics') shows
    its nodes not ready until the watcher's router has deleted the stale pod when east answers
    again."""
    east = SimulatedCluster(work_dir=tmp_path / "east", namespace="mdq", heartbeat_s=0.3)
    west = SimulatedCluster(work_dir=tmp_path / "west", namespace="mdq", heartbeat_s=0.3)
    async with east, west:
        entries = [
            ClusterEntry.model_validate(kubernetes_entry("east", east, {"site": "campus"})),
            ClusterEntry.model_validate(kubernetes_entry("west", west, {"site": "centre"})),
        ]

        async def connect(entry: ClusterEntry) -> ClusterBackend:
            settings = KubernetesSettings(**entry.kubernetes)
            return await KubernetesBackend.connect(
                settings=settings, mdq_namespace=subjects.namespace, runner_nats_url="nats://x:1"
            )

        js = nc.jetstream()
        watcher_side = ClusterRouter(
            connect=connect,
            lost=KvLostClusters(js, subjects).start(),
            # well above a loaded machine's slowest answer, so west is never lost by mistake
            lost_after_s=4.0,
            probe_interval_s=0.3,
            sample_timeout_s=2.0,
        )
        metrics_side = ClusterRouter(connect=connect, lost=KvLostClusters(js, subjects).start())
        await watcher_side.sync(entries)
        await metrics_side.sync(entries)
        try:
            async with collecting(watcher_side) as seen:
                await watcher_side.create_pod(
                    pod("e2", "import time; time.sleep(120)", node="east/node-1")
                )

                def of(name: str) -> list[PodUpdate]:
                    return [u for u in seen if u.pod_name == name]

                async def running_on_east() -> bool:
                    return any(u.phase == pb.POD_RUNNING for u in of("mdq-e2-1"))

                await wait_for(running_on_east, what="the pod running on east", timeout=30)
                port = int(east.api.url.rsplit(":", 1)[1])
                await east.api.stop()  # a partition: the kubelets and the pod go on

                async def reported_lost() -> bool:
                    return any(u.phase == pb.POD_FAILED for u in of("mdq-e2-1"))

                await wait_for(reported_lost, what="east's pod reported lost", timeout=30)
                [lost] = [u for u in of("mdq-e2-1") if u.phase == pb.POD_FAILED]
                assert lost.reason == "ClusterLost" and "cluster east lost" in lost.message
                assert lost.node == "east/node-1"
                assert classify(pod_reason=lost.reason, exit_code=0) == pb.FAILURE_CLUSTER_LOST

                async def recorded() -> bool:
                    return "east" in metrics_side.lost_now()

                await wait_for(recorded, what="the loss recorded for the other processes")
                with pytest.raises(ClusterLost):
                    await metrics_side.create_pod(pod("e3", "print('no')", node="east/node-2"))

                # The watcher's router fences east once it answers again; the fence is held
                # at its start, so the other router's view before it is checked every time.
                fence_reached, fence_may_go = asyncio.Event(), asyncio.Event()
                fence = watcher_side._fence

                async def held_fence(member: Any) -> None:
                    fence_reached.set()
                    await fence_may_go.wait()
                    await fence(member)

                watcher_side._fence = held_fence  # type: ignore[method-assign]
                await east.api.start(port=port)  # back, pods and all
                await asyncio.wait_for(fence_reached.wait(), timeout=30)
                # until it is fenced, the other router keeps its nodes out
                assert metrics_side.lost_now() == {"east"}
                east_nodes = [s for s in await metrics_side.sample_nodes() if s.cluster == "east"]
                assert east_nodes and not any(s.ready for s in east_nodes)
                fence_may_go.set()

                async def fenced() -> bool:
                    stored = east.api.pod("mdq-e2-1", "mdq")
                    gone = stored is None or bool(stored["metadata"].get("deletionTimestamp"))
                    return gone and not metrics_side.lost_now() and not watcher_side.lost_now()

                await wait_for(fenced, what="east fenced: its stale pod deleted", timeout=30)

                async def east_ready() -> bool:
                    samples = await metrics_side.sample_nodes()
                    return any(s.cluster == "east" and s.ready for s in samples)

                await wait_for(east_ready, what="east's nodes ready again", timeout=30)
                # the stale pod's later updates (deleted) are not passed on as news
                assert [u.phase for u in of("mdq-e2-1")].count(pb.POD_FAILED) == 1
        finally:
            await watcher_side.close()
            await metrics_side.close()
