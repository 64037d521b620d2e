"""Job control on the Kubernetes backend, over real HTTP against the API emulator and its
kubelets (``mdq.testing.cluster``): a running job cancelled through placement has its pod
deleted, the watcher fails the attempt FAILURE_STOPPED, recovery ends the job CANCELLED, and
neither the pod nor its process is left (docs/control.md)."""

from __future__ import annotations

from pathlib import Path

import psutil
from nats.aio.client import Client

from mdq.backends.kubernetes.backend import KubernetesBackend
from mdq.bus.publisher import EventPublisher
from mdq.bus.subjects import Subjects
from mdq.contracts import pb
from mdq.core.ids import pod_name
from mdq.core.recovery import RecoveryPolicy
from mdq.core.runner_task import ENV_JOB_ID
from mdq.core.spec import normalize_job
from mdq.sdk.client import MdqClient
from mdq.testing.scripted_runner import scripted_spec
from services.placement.app import Placement
from services.placement.settings import PlacementSettings
from services.recovery.app import Recovery
from services.watcher.lifecycle import Lifecycle
from tests.helpers import event, events_of, node_load, publisher, running, wait_for
from tests.integration.test_kubernetes_backend import (
    K8S_NAMESPACE,
    RUNNER_NATS,
    settings_for,
    simulated_cluster,
)

JOB = "abcabcabcabc-sleeper"


def pod_processes(job_id: str) -> list[psutil.Process]:
    """Live processes of ``job_id``'s pod on this machine (the kubelets run them here)."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        try:
            if "scripted_runner" not in " ".join(process.info["cmdline"] or ()):
                continue
            if process.status() != psutil.STATUS_ZOMBIE and (
                process.environ().get(ENV_JOB_ID) == job_id
            ):
                found.append(process)
        except psutil.Error:
            continue
    return found


async def test_a_cancelled_running_job_leaves_no_pod(
    nc: Client, subjects: Subjects, namespace: str, tmp_path: Path
) -> None:
    js = nc.jetstream()
    bus = publisher(js, subjects)
    spec = normalize_job(scripted_spec("import time; time.sleep(600)"), "jobs[0]")
    spec.resources.cpu, spec.resources.memory_mb = 0.5, 256
    body = pb.JobSubmitted(spec=spec, request_id="abcabcabcabc")
    async with simulated_cluster(tmp_path) as cluster:
        backend = await KubernetesBackend.connect(
            settings=settings_for(cluster),
            mdq_namespace=namespace,
            runner_nats_url=RUNNER_NATS,
            data_dir=Path("/data"),
        )
        try:
            for node in ("node-1", "node-2"):
                await bus.publish(node_load(node, cpu_capacity=2, memory_mb=4096))
            await bus.publish(event("submitted", body, job=JOB, attempt=0))

            def own(producer: str) -> EventPublisher:
                return EventPublisher(js=js, subjects=subjects, producer=producer)

            placement = Placement(
                js=js,
                subjects=subjects,
                publisher=own("placement"),
                backend=backend,
                settings=PlacementSettings(reconcile_interval_s=0.2),
                namespace=subjects.namespace,
                nc=nc,
            )
            lifecycle = Lifecycle(
                js=js,
                subjects=subjects,
                publisher=own("watcher"),
                backend=backend,
                check_interval_s=0.2,
            )
            recovery = Recovery(
                js=js, subjects=subjects, publisher=own("recovery"), policy=RecoveryPolicy()
            )
            async with running(placement.run()), running(lifecycle.run()), running(recovery.run()):

                async def pod_running() -> bool:
                    started = await events_of(js, subjects, "started", JOB)
                    return bool(started) and bool(pod_processes(JOB))

                await wait_for(pod_running, timeout=60, what="the job's pod running")
                client = MdqClient(nc=nc, subjects=subjects)
                reply = await client.cancel([JOB], reason="wrong input")
                assert [o.result for o in reply.outcomes] == [pb.CONTROL_STOPPING]
                views = await client.wait_control("cancel", reply, timeout=60)
                assert views[JOB].state.value == "CANCELLED"

                async def nothing_left() -> bool:
                    gone = cluster.api.pod(pod_name(JOB, 1), K8S_NAMESPACE) is None
                    return gone and not pod_processes(JOB)

                await wait_for(nothing_left, timeout=30, what="the pod and its process gone")
        finally:
            await backend.close()
    [failed] = await events_of(js, subjects, "attempt_failed", JOB)
    assert failed.attempt_failed.reason == pb.FAILURE_STOPPED
    [cancelled] = await events_of(js, subjects, "cancelled", JOB)
    assert cancelled.producer == "recovery"
    assert cancelled.cancelled.message == "cancelled by the operator: wrong input"
    assert await events_of(js, subjects, "succeeded", JOB) == []
