"""The Kubernetes backend over real HTTP (kubernetes-asyncio) against the API emulator, with
simulated kubelets running the pods as local processes.

Pods are tiny Python commands: they are created with mdq's schedulerName and bound through the
Binding subresource, their terminations map to the reasons recovery knows (Error, OOMKilled,
Evicted, DisruptionTarget, Deleted, NodeLost), a watch that expires (410) is re-listed with no
transition reported twice, and nodes (Ready, cordon, taints, metrics.k8s.io) become samples.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from kubernetes_asyncio import client as k8s

from mdq.backends.factory import make_backend
from mdq.backends.kubernetes.backend import KubernetesBackend, call_json
from mdq.backends.kubernetes.objects import (
    PodTracker,
    node_view,
    parse_quantity,
    pod_update,
    start_problems,
)
from mdq.backends.kubernetes.settings import KubernetesSettings
from mdq.backends.port import PodExists, PodSpec, PodUpdate
from mdq.bus.subjects import Subjects
from mdq.contracts import pb
from mdq.core.nodes import NodeSample
from mdq.core.recovery import classify
from mdq.testing.cluster import SimulatedCluster
from mdq.testing.scripted_runner import scripted_spec
from mdq.testing.tasks import Background, BackgroundFailed
from tests.helpers import wait_for
from tests.tables import named_cases

K8S_NAMESPACE = "mdq"
SCRIPTED = ("python", "-m", "mdq.testing.scripted_runner")
"""The runner image's stand-in program that runs the script in a pod's job spec."""
RUNNER_NATS = "nats://nats.example:4222"


def simulated_cluster(tmp_path: Path) -> SimulatedCluster:
    """The two-node simulated cluster of the Kubernetes backend's tests (used as ``async
    with``)."""
    return SimulatedCluster(
        work_dir=tmp_path / "cluster",
        namespace=K8S_NAMESPACE,
        heartbeat_s=0.3,
        # a node is lost after 5 s without heartbeat (every 0.3 s): at 1.5 s, a loaded 2-core
        # machine stalled the heartbeats long enough to lose healthy nodes
        node_monitor_grace_s=5.0,
        bookmark_interval_s=0.3,
    )


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[SimulatedCluster]:
    async with simulated_cluster(tmp_path) as the_cluster:
        yield the_cluster


def settings_for(cluster: SimulatedCluster) -> KubernetesSettings:
    return KubernetesSettings(
        kubeconfig=str(cluster.kubeconfig),
        namespace=K8S_NAMESPACE,
        node_lost_after_s=1.0,
        termination_grace_s=2,
        watch_timeout_s=30,
        retry_backoff_s=0.2,
        runner_command=SCRIPTED,
    )


@pytest.fixture
async def backend(cluster: SimulatedCluster, namespace: str) -> AsyncIterator[KubernetesBackend]:
    the_backend = await KubernetesBackend.connect(
        settings=settings_for(cluster),
        mdq_namespace=namespace,
        runner_nats_url=RUNNER_NATS,
        data_dir=Path("/data"),
    )
    yield the_backend
    await the_backend.close()


class Updates:
    """Every update ``watch_pods`` yields, collected in the background."""

    def __init__(self, backend: KubernetesBackend) -> None:
        self.seen: list[PodUpdate] = []
        self._background = Background("the updates collector")
        self._task = self._background.spawn(self._collect(backend), name="watch_pods")

    async def _collect(self, backend: KubernetesBackend) -> None:
        async for update in backend.watch_pods():
            self.seen.append(update)

    def of(self, pod: str) -> list[PodUpdate]:
        return [u for u in self.seen if u.pod_name == pod]

    def phases(self, pod: str) -> list[str]:
        return [pb.PodPhase.Name(u.phase) for u in self.of(pod)]

    async def until_running(self, *pods: PodSpec, timeout: float = 20) -> None:
        """Wait until every one of ``pods`` has been reported running."""

        async def running() -> bool:
            return all("POD_RUNNING" in self.phases(spec.name) for spec in pods)

        await wait_for(running, timeout=timeout, what="pods running")

    async def until_final(self, pod: str, timeout: float = 20) -> PodUpdate:
        async def final() -> bool:
            if self._task.done():
                self._task.result()
            return any(u.phase in (pb.POD_SUCCEEDED, pb.POD_FAILED) for u in self.of(pod))

        await wait_for(final, timeout=timeout, what=f"{pod} to end")
        return self.of(pod)[-1]

    async def close(self) -> None:
        """Stop collecting; raise what the watch failed with, if it did."""
        await self._background.close()


@pytest.fixture
async def updates(backend: KubernetesBackend) -> AsyncIterator[Updates]:
    collected = Updates(backend)
    await asyncio.sleep(0.2)
    yield collected
    await collected.close()


def pod(
    name: str,
    script: str,
    *,
    node: str = "node-1",
    memory_mb: int = 256,
    priority: str = "normal",
) -> PodSpec:
    return PodSpec(
        name=f"mdq-{name}-1",
        job_id=name,
        attempt=1,
        node=node,
        cpu=0.5,
        memory_mb=memory_mb,
        priority_class=priority,
        spec=scripted_spec(script),
    )


async def test_a_pod_is_created_unscheduled_bound_and_reported_until_it_succeeds(
    backend: KubernetesBackend,
    cluster: SimulatedCluster,
    updates: Updates,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Secrets of the process that hosts the kubelet (standing in for the image's environment)
    # never reach the pod: only the runner's allowlist does.
    monkeypatch.setenv("DATABASE_URL", "postgresql://mdq:hunter2@db/mdq")
    monkeypatch.setenv("MDQ_TEST_API_TOKEN", "s3cret")
    out = tmp_path / "env.json"
    script = (
        "import json, os; json.dump({k: os.environ.get(k) for k in "
        "('MDQ_POD_NAME', 'MDQ_NODE_NAME', 'MDQ_JOB_ID', 'MDQ_ATTEMPT', 'NATS_URL', "
        f"'MDQ_DATA_DIR', 'DATABASE_URL', 'MDQ_TEST_API_TOKEN')}}, open({str(out)!r}, 'w'))"
    )
    spec = pod("ok", script, node="node-2", priority="high")
    await backend.create_pod(spec)
    final = await updates.until_final(spec.name)

    assert final.phase == pb.POD_SUCCEEDED and final.reason == "Completed"
    assert updates.phases(spec.name) == ["POD_PENDING", "POD_RUNNING", "POD_SUCCEEDED"]
    assert (final.job_id, final.attempt, final.node) == ("ok", 1, "node-2")
    assert json.loads(out.read_text()) == {
        "MDQ_POD_NAME": spec.name,
        "MDQ_NODE_NAME": "node-2",
        "MDQ_JOB_ID": "ok",
        "MDQ_ATTEMPT": "1",
        "NATS_URL": RUNNER_NATS,
        "MDQ_DATA_DIR": "/data",
        "DATABASE_URL": None,
        "MDQ_TEST_API_TOKEN": None,
    }
    stored = cluster.api.pod(spec.name, K8S_NAMESPACE)
    assert stored is not None
    pod_spec = stored["spec"]
    assert pod_spec["schedulerName"] == "mdq-scheduler"
    assert pod_spec["nodeName"] == "node-2"
    assert pod_spec["restartPolicy"] == "Never"
    assert pod_spec["priorityClassName"] == "mdq-high"
    assert pod_spec["volumes"] == [
        {"name": "tmp", "emptyDir": {}},
        {"name": "data", "persistentVolumeClaim": {"claimName": "mdq-data"}},
    ]
    assert pod_spec["securityContext"] == {
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    container = pod_spec["containers"][0]
    assert container["image"] == "mdq-runner:latest"
    assert container["volumeMounts"] == [
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "data", "mountPath": "/data"},
    ]
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert container["resources"] == {
        "requests": {"cpu": "500m", "memory": "256Mi"},
        "limits": {"cpu": "500m", "memory": "256Mi"},
    }
    assert stored["metadata"]["labels"]["mdq.io/namespace"] == backend._mdq_namespace
    # Created without a node, then bound through the subresource, once.
    created = cluster.api.requests_where(method="POST", path_suffix="/pods")
    bindings = cluster.api.requests_where(method="POST", path_suffix=f"/{spec.name}/binding")
    assert [r.status for r in created] == [201] and [r.status for r in bindings] == [201]


async def test_create_is_idempotent_and_repairs_a_missing_binding(
    backend: KubernetesBackend, cluster: SimulatedCluster, updates: Updates
) -> None:
    spec = pod("twice", "import time; time.sleep(0.5)")
    await backend.create_pod(spec)
    with pytest.raises(PodExists):
        await backend.create_pod(spec)  # 409 AlreadyExists, then "already assigned": fine
    statuses = [r.status for r in cluster.api.requests_where(path_suffix=f"/{spec.name}/binding")]
    assert statuses == [201, 409]

    # A placement that died between create and bind: the pod exists, unbound.
    orphan = pod("orphan", "pass", node="node-2")
    manifest = json.loads(json.dumps(_manifest(orphan, backend)))
    async with k8s.ApiClient(k8s.Configuration(host=cluster.api.url)) as api:
        await call_json(k8s.CoreV1Api(api).create_namespaced_pod, K8S_NAMESPACE, manifest)
    assert cluster.node_of(orphan.name) == ""
    with pytest.raises(PodExists):
        await backend.create_pod(orphan)
    assert cluster.node_of(orphan.name) == "node-2"
    # Nobody else bound it, at any time: the only binding request is mdq's, and it succeeded.
    orphan_bindings = cluster.api.requests_where(path_suffix=f"/{orphan.name}/binding")
    assert [(r.status, r.user_agent) for r in orphan_bindings] == [(201, "mdq-kubernetes-backend")]
    assert (await updates.until_final(orphan.name)).phase == pb.POD_SUCCEEDED
    assert (await updates.until_final(spec.name)).phase == pb.POD_SUCCEEDED


def _manifest(spec: PodSpec, backend: KubernetesBackend) -> dict[str, object]:
    from mdq.backends.kubernetes.objects import pod_manifest

    return pod_manifest(
        spec,
        settings=backend._settings,
        mdq_namespace=backend._mdq_namespace,
        nats_url=RUNNER_NATS,
        data_dir=Path("/data"),
    )


async def test_terminations_map_to_the_reasons_recovery_knows(
    backend: KubernetesBackend, cluster: SimulatedCluster, updates: Updates
) -> None:
    crash = pod("crash", "import sys; sys.exit(1)")
    hog = pod("hog", "import time; b = bytearray(400 * 2**20); time.sleep(30)", memory_mb=150)
    evicted = pod("evicted", "import time; time.sleep(30)", node="node-2")
    disrupted = pod("disrupted", "import time; time.sleep(30)", node="node-2")
    deleted = pod("deleted", "import time; time.sleep(30)")
    for spec in (crash, hog, evicted, disrupted, deleted):
        await backend.create_pod(spec)
    await updates.until_running(evicted, disrupted, deleted)
    await cluster.kubelets["node-2"].evict(evicted.name, K8S_NAMESPACE)
    cluster.api.disrupt_pod(disrupted.name, K8S_NAMESPACE, reason="EvictionByEvictionAPI")
    await backend.delete_pod(disrupted.name)
    await backend.delete_pod(deleted.name)
    await backend.delete_pod("mdq-never-existed-1")  # no-op

    every = (crash, hog, evicted, disrupted, deleted)
    results = {s.job_id: await updates.until_final(s.name) for s in every}
    assert (results["crash"].reason, results["crash"].exit_code) == ("Error", 1)
    assert (results["hog"].reason, results["hog"].exit_code) == ("OOMKilled", 137)
    assert results["evicted"].reason == "Evicted"
    assert results["disrupted"].reason == "Evicted"
    assert results["deleted"].reason == "Error" and results["deleted"].exit_code in (143, 137)
    recovery = {
        job: classify(pod_reason=u.reason, exit_code=u.exit_code) for job, u in results.items()
    }
    assert recovery == {
        "crash": pb.FAILURE_CRASHED,
        "hog": pb.FAILURE_OOM_KILLED,
        "evicted": pb.FAILURE_EVICTED,
        "disrupted": pb.FAILURE_EVICTED,
        "deleted": pb.FAILURE_CRASHED,
    }
    for spec in (crash, hog, evicted, disrupted, deleted):  # one terminal update each
        assert sum(u.phase == pb.POD_FAILED for u in updates.of(spec.name)) == 1

    async def gone() -> bool:
        return cluster.api.pod(deleted.name, K8S_NAMESPACE) is None

    await wait_for(gone, timeout=10, what="the kubelet to remove the deleted pod")


async def test_an_expired_watch_is_relisted_without_reporting_anything_twice(
    backend: KubernetesBackend, cluster: SimulatedCluster, updates: Updates
) -> None:
    slow = pod("slow", "import time; time.sleep(2.5)")
    vanishing = pod("vanishing", "import time; time.sleep(30)", node="node-2")
    await backend.create_pod(slow)
    await backend.create_pod(vanishing)
    await updates.until_running(slow, vanishing)
    await wait_for(_true_after(lambda: backend.pod_stats.bookmarks > 0), what="a bookmark")
    # Compaction: the open watches end and resuming from any version seen answers 410. While
    # nobody watches, a pod is deleted for good (grace 0): only the re-list can tell.
    cluster.api.expire_watches()
    await backend._delete(vanishing.name, grace_s=0)
    assert (await updates.until_final(slow.name)).phase == pb.POD_SUCCEEDED
    lost = await updates.until_final(vanishing.name)

    assert backend.pod_stats.expired >= 1 and backend.pod_stats.lists >= 2
    assert "mdq-kubernetes-backend" in cluster.api.expired
    assert updates.phases(slow.name) == ["POD_PENDING", "POD_RUNNING", "POD_SUCCEEDED"]
    assert updates.phases(vanishing.name) == ["POD_PENDING", "POD_RUNNING", "POD_FAILED"]
    assert lost.reason == "Deleted"
    cluster.api.expire_watches()  # and once more, with nothing new: nothing is reported again
    count, watches = len(updates.seen), backend.pod_stats.watches
    await wait_for(
        _true_after(lambda: backend.pod_stats.expired >= 2 and backend.pod_stats.watches > watches),
        what="a second relist, and a watch from it",
    )
    # A pod created now is reported after anything the relist reported: once it shows, the
    # relist's reports (had there been any) are in too.
    marker = pod("marker", "pass")
    await backend.create_pod(marker)

    async def marker_seen() -> bool:
        return bool(updates.of(marker.name))

    await wait_for(marker_seen, what="the marker pod reported")
    assert len([u for u in updates.seen if u.pod_name != marker.name]) == count


def _true_after(check: Callable[[], bool]) -> Callable[[], Awaitable[bool]]:
    async def poll() -> bool:
        return check()

    return poll


async def test_a_node_that_goes_not_ready_loses_its_pods(
    backend: KubernetesBackend, cluster: SimulatedCluster, updates: Updates
) -> None:
    stays = pod("stays", "import time; time.sleep(30)", node="node-2")
    doomed = pod("doomed", "import time; time.sleep(30)", node="node-1")
    await backend.create_pod(stays)
    await backend.create_pod(doomed)
    await updates.until_running(stays, doomed)
    await cluster.fail_node("node-1")
    lost = await updates.until_final(doomed.name, timeout=15)

    assert lost.phase == pb.POD_FAILED and lost.reason == "NodeLost"
    assert "not ready" in lost.message
    assert classify(pod_reason=lost.reason, exit_code=lost.exit_code) == pb.FAILURE_NODE_LOST
    assert updates.phases(stays.name) == ["POD_PENDING", "POD_RUNNING"]
    samples = {s.name: s for s in await backend.sample_nodes()}
    assert not samples["node-1"].ready and samples["node-2"].ready
    node = cluster.api.node("node-1") or {}
    assert {t["key"] for t in node["spec"]["taints"]} == {"node.kubernetes.io/unreachable"}
    # The lost pod was deleted (it stays Terminating: no kubelet confirms it).
    doomed_now = cluster.api.pod(doomed.name, K8S_NAMESPACE) or {}
    assert doomed_now["metadata"].get("deletionTimestamp")
    # Proof that later node checks did not report it again: the other node fails too, and
    # its pod's loss is reported by a node check (and its deletion event) after that one.
    await cluster.fail_node("node-2")
    assert (await updates.until_final(stays.name, timeout=15)).reason == "NodeLost"
    assert sum(u.phase == pb.POD_FAILED for u in updates.of(doomed.name)) == 1


async def test_no_pod_is_lost_with_its_node_while_the_api_does_not_answer(
    cluster: SimulatedCluster, namespace: str
) -> None:
    """A node seen NotReady, then the whole API gone: what the node watch saw last is not
    taken as current, so no pod is reported NodeLost (the cluster's own loss is what applies,
    ``mdq.backends.clusters``)."""
    lost_after_s = 3.0
    backend = await KubernetesBackend.connect(
        settings=settings_for(cluster).model_copy(update={"node_lost_after_s": lost_after_s}),
        mdq_namespace=namespace,
        runner_nats_url=RUNNER_NATS,
        data_dir=Path("/data"),
    )
    try:
        updates = Updates(backend)
        kept = pod("kept", "import time; time.sleep(60)", node="node-1")
        await backend.create_pod(kept)
        await updates.until_running(kept)
        await cluster.fail_node("node-1")

        async def not_ready() -> bool:
            return not {s.name: s for s in await backend.sample_nodes()}["node-1"].ready

        await wait_for(not_ready, timeout=15, what="node-1 not ready")
        said = int((cluster.api.node("node-1") or {})["metadata"]["resourceVersion"])
        await wait_for(
            _true_after(lambda: int(backend.node_stats.resource_version or 0) >= said),
            what="the node watch to deliver node-1 not ready",
        )
        await cluster.api.stop()
        # an absence: the window is what would have been enough to judge the node lost
        await asyncio.sleep(lost_after_s + 2.0)
        assert "NodeLost" not in [u.reason for u in updates.of(kept.name)]
        assert backend.node_stats.errors > 0  # the watch saw the API go
    finally:
        await backend.close()


async def test_a_pod_without_a_sandbox_ends_start_error_and_its_node_takes_no_new_pods(
    cluster: SimulatedCluster, namespace: str
) -> None:
    # node-1's CNI is broken: its pods wait in ContainerCreating for ever, node-1 stays Ready
    cluster.kubelets["node-1"].sandbox_broken = True
    settings = settings_for(cluster).model_copy(update={"sandbox_timeout_s": 3.0})
    backend = await KubernetesBackend.connect(
        settings=settings, mdq_namespace=namespace, runner_nats_url=RUNNER_NATS
    )
    updates = Updates(backend)
    try:
        stuck = pod("stuck", "print('never runs')", node="node-1")
        fine = pod("fine", "print('runs')", node="node-2")
        await backend.create_pod(stuck)
        await backend.create_pod(fine)
        assert (await updates.until_final(fine.name)).reason == "Completed"

        # from half the timeout, the node says why it takes no new pods
        async def problem_shown() -> bool:
            samples = {s.name: s for s in await backend.sample_nodes()}
            return bool(samples["node-1"].problem)

        await wait_for(problem_shown, timeout=10, interval=0.2, what="node-1's problem")
        samples = {s.name: s for s in await backend.sample_nodes()}
        assert "no pod sandbox" in samples["node-1"].problem
        assert samples["node-1"].ready and not samples["node-2"].problem

        ended = await updates.until_final(stuck.name, timeout=15)
        assert (ended.phase, ended.reason, ended.exit_code) == (pb.POD_FAILED, "StartError", 128)
        assert "pod sandbox not created on node-1" in ended.message
        assert classify(pod_reason=ended.reason, exit_code=ended.exit_code) == (
            pb.FAILURE_ENVIRONMENT
        )
        assert updates.phases(stuck.name) == ["POD_PENDING", "POD_FAILED"]

        # the pod was deleted: the problem goes with it, and the node is healthy again
        async def healthy_again() -> bool:
            samples = {s.name: s for s in await backend.sample_nodes()}
            return not samples["node-1"].problem

        await wait_for(healthy_again, timeout=10, interval=0.2, what="node-1 healthy again")
        assert (cluster.api.pod(stuck.name, K8S_NAMESPACE) or {}).get("metadata", {}).get(
            "deletionTimestamp"
        ) or cluster.api.pod(stuck.name, K8S_NAMESPACE) is None
    finally:
        await updates.close()
        await backend.close()


async def test_nodes_are_sampled_with_readiness_cordons_taints_and_live_usage(
    backend: KubernetesBackend, cluster: SimulatedCluster, updates: Updates
) -> None:
    burner = pod(
        "burner", "import time\nb = bytearray(60 * 2**20)\nwhile True: pass", node="node-2"
    )
    await backend.create_pod(burner)
    await updates.until_running(burner)

    sampled: dict[str, NodeSample] = {}

    async def busy() -> bool:
        sampled.update({s.name: s for s in await backend.sample_nodes()})
        return sampled["node-2"].cpu_load > 0.005 and sampled["node-2"].memory_load > 0.01

    await backend.sample_nodes()  # the first sample primes the CPU counters
    await wait_for(busy, timeout=15, interval=0.5, what="node-2's live load")
    assert (sampled["node-1"].cpu_capacity, sampled["node-1"].memory_capacity_mb) == (2.0, 4096)
    assert sampled["node-1"].ready and sampled["node-1"].cpu_load < sampled["node-2"].cpu_load

    async with k8s.ApiClient(k8s.Configuration(host=cluster.api.url)) as api:
        core = k8s.CoreV1Api(api)
        await call_json(core.patch_node, "node-1", {"spec": {"unschedulable": True}})
        taint = {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}
        await call_json(core.patch_node, "node-2", {"spec": {"taints": [taint]}})
    samples = {s.name: s for s in await backend.sample_nodes()}
    assert samples["node-1"].ready and samples["node-2"].ready  # running pods keep running
    assert samples["node-1"].cordoned and samples["node-2"].cordoned  # nothing new lands
    tolerant = KubernetesBackend(
        api=backend._api,
        settings=settings_for(cluster).model_copy(update={"tolerated_taints": ("dedicated",)}),
        mdq_namespace="x",
    )
    assert {s.name: s.cordoned for s in await tolerant.sample_nodes()} == {
        "node-1": True,
        "node-2": False,
    }
    await backend.delete_pod(burner.name)


async def test_the_factory_makes_the_kubernetes_backend_from_the_environment(
    cluster: SimulatedCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MDQ_K8S_KUBECONFIG", str(cluster.kubeconfig))
    monkeypatch.setenv("MDQ_K8S_PRIORITY_CLASSES", '{"normal": ""}')
    monkeypatch.setenv("MDQ_K8S_RUNNER_COMMAND", json.dumps(SCRIPTED))
    made = await make_backend(
        kind="kubernetes",
        nc=None,  # type: ignore[arg-type]
        subjects=Subjects("fac"),
        runner_nats_url=RUNNER_NATS,
    )
    try:
        assert isinstance(made, KubernetesBackend)
        assert {s.name for s in await made.sample_nodes()} == {"node-1", "node-2"}
        await made.create_pod(pod("plain", "pass"))
        stored = cluster.api.pod("mdq-plain-1", K8S_NAMESPACE) or {}
        assert "priorityClassName" not in stored["spec"]
        assert stored["metadata"]["labels"]["mdq.io/namespace"] == "fac"
    finally:
        await made.close()


async def test_a_failure_inside_the_simulated_cluster_fails_its_stop(tmp_path: Path) -> None:
    """A kubelet's supervisor that raises (here, on reporting a pod's end), or an emulator
    handler that raises, is no silent log line: the cluster's ``check`` and ``stop`` raise it."""
    unstarted = simulated_cluster(tmp_path)

    async def metrics_bug(request: object) -> None:
        raise ValueError("handler bug")

    unstarted.api._node_metrics = metrics_bug  # type: ignore[method-assign,assignment]
    the_cluster = await unstarted.start()
    kubelet = the_cluster.kubelets["node-1"]
    broken = RuntimeError("the kubelet's report broke")

    async def report_breaks(*args: object, **kwargs: object) -> None:
        raise broken

    kubelet._report_terminated = report_breaks  # type: ignore[method-assign]
    backend = await KubernetesBackend.connect(
        settings=settings_for(the_cluster),
        mdq_namespace="broken",
        runner_nats_url=RUNNER_NATS,
        data_dir=Path("/data"),
    )
    try:
        await backend.create_pod(pod("quick", "pass"))

        async def supervisor_failed() -> bool:
            return bool(kubelet._background.failures)

        await wait_for(supervisor_failed, timeout=20, what="the broken report")
        with pytest.raises(BackgroundFailed) as raised:
            the_cluster.check()
        assert raised.value.exceptions == (broken,)
        # an emulator handler's own exception (node metrics): answered 500, raised by stop
        with contextlib.suppress(Exception):
            await backend.sample_nodes()
    finally:
        await backend.close()
    with pytest.raises(BackgroundFailed) as stopped:
        await the_cluster.stop()
    assert [str(e) for e in stopped.value.exceptions] == ["handler bug"]


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        ({"phase": "Pending"}, ("POD_PENDING", "", 0)),
        ({"phase": "Unknown"}, None),
        ({"phase": "Succeeded"}, ("POD_SUCCEEDED", "Completed", 0)),
        (
            {"phase": "Failed", "containerStatuses": [
                {"name": "runner",
                 "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}
            ]},
            ("POD_FAILED", "OOMKilled", 137),
        ),
        (
            {"phase": "Failed", "reason": "Evicted", "message": "low on memory"},
            ("POD_FAILED", "Evicted", 0),
        ),
        (
            {"phase": "Failed", "conditions": [
                {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}
            ], "containerStatuses": [
                {"name": "runner", "state": {"terminated": {"exitCode": 143, "reason": "Error"}}}
            ]},
            ("POD_FAILED", "Preempted", 143),
        ),
        (
            {"phase": "Failed", "conditions": [
                {"type": "DisruptionTarget", "status": "True", "reason": "DeletionByTaintManager"}
            ]},
            ("POD_FAILED", "NodeLost", 0),
        ),
        (
            {"phase": "Pending", "containerStatuses": [
                {"name": "runner", "state": {"waiting": {"reason": "InvalidImageName"}}}
            ]},
            ("POD_FAILED", "StartError", 128),
        ),
        (
            {"phase": "Pending", "containerStatuses": [
                {"name": "runner", "state": {"waiting": {"reason": "ImagePullBackOff"}}}
            ]},
            ("POD_FAILED", "StartError", 128),
        ),
    ],
)  # fmt: skip
def test_pod_statuses_map_to_updates(
    status: dict[str, object], expected: tuple[str, str, int] | None
) -> None:
    obj = {
        "metadata": {
            "name": "mdq-j-2",
            "annotations": {"mdq.io/job-id": "j", "mdq.io/attempt": "2"},
        },
        "spec": {"nodeName": "n"},
        "status": status,
    }
    update = pod_update(obj)
    if expected is None:
        assert update is None
        return
    assert update is not None
    assert (pb.PodPhase.Name(update.phase), update.reason, update.exit_code) == expected
    assert (update.job_id, update.attempt, update.node) == ("j", 2, "n")


NODE_PROBLEM_CASES = [
    ("healthy", [{"type": "DiskPressure", "status": "False"}], ""),
    (
        "disk pressure",
        [{"type": "DiskPressure", "status": "True", "message": "kubelet has disk pressure"}],
        "DiskPressure: kubelet has disk pressure",
    ),
    (
        "two at once",
        [
            {"type": "DiskPressure", "status": "True", "reason": "KubeletHasDiskPressure"},
            {"type": "PIDPressure", "status": "True", "message": "too many processes"},
        ],
        "DiskPressure: KubeletHasDiskPressure; PIDPressure: too many processes",
    ),
]


@named_cases(("conditions", "problem"), NODE_PROBLEM_CASES)
def test_a_nodes_pressure_conditions_are_its_problem(
    conditions: list[dict[str, str]], problem: str
) -> None:
    ready = {"type": "Ready", "status": "True"}
    node = {"metadata": {"name": "n"}, "status": {"conditions": [ready, *conditions]}}
    assert node_view(node).problem == problem


def test_the_tracker_reports_each_transition_once_and_nothing_after_the_end() -> None:
    def obj(phase: str) -> dict[str, object]:
        return {
            "metadata": {"name": "p", "annotations": {"mdq.io/job-id": "j", "mdq.io/attempt": "1"}},
            "status": {"phase": phase},
        }

    tracker = PodTracker()
    seen = [tracker.observe("ADDED", obj("Pending")), tracker.observe("MODIFIED", obj("Pending")),
            tracker.observe("MODIFIED", obj("Running"))]  # fmt: skip
    assert [u.phase if u else None for u in seen] == [pb.POD_PENDING, None, pb.POD_RUNNING]
    assert tracker.resync([obj("Running")]) == []
    assert [u.reason for u in tracker.lose_node("", "gone")] == ["NodeLost"]
    assert tracker.observe("MODIFIED", obj("Succeeded")) is None  # terminal is final
    assert tracker.observe("DELETED", obj("Succeeded")) is None
    assert parse_quantity("250m") == 0.25 and parse_quantity("1Gi") == 2**30


SANDBOX_CASES = [
    # (name, phase, node, sandbox condition status or None, seconds since, timed out)
    ("sandbox stalled past the timeout", "Pending", "n", "False", 130, True),
    ("sandbox stalled, not yet", "Pending", "n", "False", 100, False),
    ("sandbox made", "Pending", "n", "True", 500, False),
    ("no sandbox condition reported", "Pending", "n", None, 500, False),
    ("not bound to a node yet", "Pending", "", "False", 500, False),
    ("running", "Running", "n", "False", 500, False),
]


@named_cases(("phase", "node", "sandbox", "ago_s", "timed_out"), SANDBOX_CASES)
def test_a_pod_waiting_for_its_sandbox_times_out_once(
    phase: str, node: str, sandbox: str | None, ago_s: int, timed_out: bool
) -> None:
    now = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)
    since = now - timedelta(seconds=ago_s)
    conditions = [] if sandbox is None else [
        {"type": "PodReadyToStartContainers", "status": sandbox,
         "lastTransitionTime": since.isoformat().replace("+00:00", "Z")}
    ]  # fmt: skip
    obj = {
        "metadata": {"name": "p", "annotations": {"mdq.io/job-id": "j", "mdq.io/attempt": "1"}},
        "spec": {"nodeName": node},
        "status": {"phase": phase, "conditions": conditions},
    }
    tracker = PodTracker()
    tracker.observe("ADDED", obj)
    ended = tracker.start_timeouts(now, 120)
    assert [(u.reason, u.exit_code) for u in ended] == ([("StartError", 128)] if timed_out else [])
    stalled = phase == "Pending" and bool(node) and sandbox == "False"
    later = tracker.start_timeouts(now + timedelta(hours=1), 120)
    assert len(later) == (1 if stalled and not timed_out else 0)  # once, and only when stalled
    assert tracker.start_timeouts(now + timedelta(hours=2), 120) == []
    if timed_out:
        assert tracker.observe("MODIFIED", obj) is None  # terminal is final
        assert start_problems([obj], now=now, stalled_after_s=60) == {
            "n": "pods could not start: no pod sandbox for 130 s"
        }
    elif phase == "Pending":
        assert start_problems([obj], now=now, stalled_after_s=120) == {}


def test_a_stall_without_a_transition_time_is_dated_from_the_first_look() -> None:
    obj = {
        "metadata": {"name": "p", "annotations": {"mdq.io/job-id": "j", "mdq.io/attempt": "1"}},
        "spec": {"nodeName": "n"},
        "status": {"phase": "Pending", "conditions": [
            {"type": "PodReadyToStartContainers", "status": "False"}
        ]},
    }  # fmt: skip
    now = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)
    tracker = PodTracker()
    tracker.observe("ADDED", obj)
    assert tracker.start_timeouts(now, 120) == []  # not "stalled since the year 1"
    tracker.observe("MODIFIED", obj)  # a later event keeps the date of the first look
    assert tracker.start_timeouts(now + timedelta(seconds=119), 120) == []
    ended = tracker.start_timeouts(now + timedelta(seconds=121), 120)
    assert [(u.reason, u.exit_code) for u in ended] == [("StartError", 128)]
    assert start_problems([obj], now=now, stalled_after_s=0) == {}  # undated: not judged


def test_a_start_error_waiting_reason_is_its_nodes_problem() -> None:
    obj = {
        "spec": {"nodeName": "n"},
        "status": {"phase": "Pending", "containerStatuses": [
            {"name": "runner", "state": {"waiting": {"reason": "ErrImagePull"}}}
        ]},
    }  # fmt: skip
    now = datetime(2026, 12, 4, tzinfo=UTC)
    assert start_problems([obj], now=now, stalled_after_s=60) == {
        "n": "pods could not start: ErrImagePull"
    }
    assert parse_quantity("1500000n") == pytest.approx(0.0015)
