"""Per-job runner credentials on Kubernetes, enforced by a real nats-server.

A nats-server with mdq's trust chain (``mdq.bus.security.auth.Trust``, as ``mdq up`` and deploy/
configure it), the Kubernetes API emulator and simulated kubelets: the backend, given the runner
issuer (``MDQ_NATS_RUNNER_ISSUER``), makes each runner pod a Secret of its own with credentials
minted for its job, owned by the pod and mounted into it alone. The pods' own programs then
try the bus with what they were given: their job's progress is acknowledged, another job's
refused by the server. Deleting the pod deletes the Secret (the garbage collector); a pod
whose Secret is missing (a placement that died between the two) waits in ContainerCreating
and runs once placement creates it again.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from kubernetes_asyncio import client as k8s

from mdq.backends.factory import make_backend
from mdq.backends.kubernetes.backend import KubernetesBackend, call_json
from mdq.backends.kubernetes.objects import (
    RUNNER_CREDS_DIR,
    binding,
    pod_manifest,
    runner_secret_name,
)
from mdq.backends.kubernetes.settings import KubernetesSettings
from mdq.backends.port import PodExists, PodSpec
from mdq.bus.connect import connect
from mdq.bus.security.auth import (
    RUNNER_ISSUER_ENV,
    RunnerIssuer,
    Trust,
    issue,
    nats_secrets_dir,
    runner_issuer,
)
from mdq.bus.security.claims import decode_claims
from mdq.bus.security.permissions import service_permissions
from mdq.bus.streams import ensure_streams
from mdq.bus.subjects import Subjects
from mdq.embedded import EmbeddedNats
from mdq.stack import Stack
from mdq.testing.cluster import SimulatedCluster
from mdq.testing.scripted_runner import scripted_spec
from tests.helpers import closed_nats, wait_for
from tests.integration.test_kubernetes_backend import simulated_cluster

K8S_NAMESPACE = "mdq"
MDQ_NAMESPACE = "mdq"
"""The trust chain's namespace: the runner template's subjects are ``mdq.…``."""
SUBJECTS = Subjects(MDQ_NAMESPACE)
SCRIPTED = ("python", "-m", "mdq.testing.scripted_runner")
ALPHA, BETA = "0123456789ab-alpha", "0123456789ab-beta"


@dataclass
class Bus:
    nats: EmbeddedNats
    trust: Trust
    admin: Path
    folder: Path

    @property
    def issuer(self) -> RunnerIssuer:
        return runner_issuer(self.trust)


@pytest.fixture(scope="module")
def bus() -> Iterator[Bus]:
    with closed_nats("mdq-k8s-creds-") as (embedded, trust, folder):
        admin = issue(trust, service_permissions("admin", SUBJECTS), folder / "admin.creds")
        yield Bus(embedded, trust, admin, folder)


@pytest.fixture(scope="module")
async def streams(bus: Bus) -> AsyncIterator[Bus]:
    """The streams, made by admin as ``mdq up`` and the bus-setup Job do."""
    admin = await connect(bus.nats.url, name="admin", creds=bus.admin)
    await ensure_streams(admin.jetstream(), SUBJECTS)
    await admin.close()
    yield bus


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[SimulatedCluster]:
    async with simulated_cluster(tmp_path) as the_cluster:
        yield the_cluster


def settings_for(cluster: SimulatedCluster, **extra: object) -> KubernetesSettings:
    return KubernetesSettings(
        kubeconfig=str(cluster.kubeconfig),
        namespace=K8S_NAMESPACE,
        termination_grace_s=2,
        watch_timeout_s=30,
        retry_backoff_s=0.2,
        runner_command=SCRIPTED,
        checkpoint_pvc="",
        **extra,  # type: ignore[arg-type]
    )


@pytest.fixture
async def backend(cluster: SimulatedCluster, streams: Bus) -> AsyncIterator[KubernetesBackend]:
    the_backend = await KubernetesBackend.connect(
        settings=settings_for(cluster),
        mdq_namespace=MDQ_NAMESPACE,
        runner_nats_url=streams.nats.url,
        data_dir=Path("/data"),
        runner_issuer=streams.issuer,
    )
    yield the_backend
    await the_backend.close()


def pod(job: str, script: str, *, node: str = "node-1") -> PodSpec:
    return PodSpec(
        name=f"mdq-{job}-1",
        job_id=job,
        attempt=1,
        node=node,
        cpu=0.5,
        memory_mb=256,
        priority_class="normal",
        spec=scripted_spec(script),
    )


def reporter(out: Path, other_job: str) -> str:
    """A pod's program: with the credentials its pod was given (the file MDQ_NATS_CREDS
    names), publish its own job's progress through JetStream and another job's, and write what
    happened to ``out``."""
    return f"""
import asyncio, hashlib, json, os, stat
import nats
from mdq.bus.connect import auth_options
from mdq.bus.subjects import Subjects

async def main():
    errors = []
    async def on_error(error):
        errors.append(str(error))
    creds = os.environ["MDQ_NATS_CREDS"]
    subjects = Subjects(os.environ["MDQ_NAMESPACE"])
    nc = await nats.connect(os.environ["NATS_URL"], error_cb=on_error, allow_reconnect=False,
                            **auth_options(creds))
    ack = await nc.jetstream().publish(subjects.progress(os.environ["MDQ_JOB_ID"]), b"mine")
    other = subjects.progress({other_job!r})
    await nc.publish(other, b"forged")
    await nc.flush()
    # the server's refusal comes to the error callback; wait for it, not for a fixed time
    deadline = asyncio.get_running_loop().time() + 20
    while not errors and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.02)
    await nc.close()
    text = open(creds).read()
    secret_lines = [line for line in text.splitlines() if line.startswith(("eyJ", "SU"))]
    json.dump({{
        "creds": creds,
        "sha256": hashlib.sha256(text.encode()).hexdigest(),
        "secret_lines": len(secret_lines),
        "mode": stat.S_IMODE(os.stat(creds).st_mode),
        "acked_by": ack.stream,
        "other": other,
        "errors": errors,
        "creds_in_env": [k for k, v in os.environ.items()
                         if "NKEY" in v or any(line in v for line in secret_lines)],
    }}, open({str(out)!r}, "w"))

asyncio.run(main())
"""


async def phase_of(cluster: SimulatedCluster, name: str) -> str:
    return str(((cluster.api.pod(name, K8S_NAMESPACE) or {}).get("status") or {}).get("phase"))


async def until_phase(cluster: SimulatedCluster, name: str, *phases: str) -> None:
    async def reached() -> bool:
        return await phase_of(cluster, name) in phases

    await wait_for(reached, timeout=30, what=f"{name} {'/'.join(phases)}")


def own_secrets(cluster: SimulatedCluster, pod_name: str) -> list[dict[str, object]]:
    return [
        s
        for s in cluster.api.secrets(K8S_NAMESPACE)
        if str(s["metadata"]["name"]).startswith(f"{pod_name}-nats-")
    ]


def creds_of(secret: dict[str, object]) -> str:
    data = secret["data"]
    assert isinstance(data, dict) and set(data) == {"nats.creds"}
    return base64.b64decode(data["nats.creds"]).decode()


async def test_each_runner_pod_gets_its_own_secret_and_reports_for_its_own_job_only(
    backend: KubernetesBackend,
    cluster: SimulatedCluster,
    streams: Bus,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    specs = {
        ALPHA: pod(ALPHA, reporter(tmp_path / "alpha.json", BETA)),
        BETA: pod(BETA, reporter(tmp_path / "beta.json", ALPHA), node="node-2"),
    }
    for spec in specs.values():
        await backend.create_pod(spec)
    for spec in specs.values():
        await until_phase(cluster, spec.name, "Succeeded", "Failed")
        assert await phase_of(cluster, spec.name) == "Succeeded", spec.name

    minted: list[str] = []
    assert len(cluster.api.secrets(K8S_NAMESPACE)) == 2  # one per pod, nothing shared
    for job, spec in specs.items():
        stored = cluster.api.pod(spec.name, K8S_NAMESPACE) or {}
        [secret] = own_secrets(cluster, spec.name)
        name = str(secret["metadata"]["name"])  # type: ignore[index]
        # Owned by its pod (this very object, by uid): the garbage collector deletes it with it.
        assert secret["metadata"]["ownerReferences"] == [  # type: ignore[index]
            {"apiVersion": "v1", "kind": "Pod", "name": spec.name,
             "uid": stored["metadata"]["uid"]}
        ]  # fmt: skip
        assert secret["immutable"] is True
        # Credentials for this job alone, signed with the runner-scoped key, not the account's.
        creds = creds_of(secret)
        minted.append(creds)
        claims = decode_claims(creds.split("\n")[1])
        assert claims["name"] == job
        assert claims["iss"] != streams.trust.users_public
        assert claims["nats"]["issuer_account"] == streams.trust.users_public
        # Mounted into this pod alone, read-only, as a file the environment names.
        [volume] = [v for v in stored["spec"]["volumes"] if "secret" in v]
        assert volume["secret"]["secretName"] == name
        assert volume["secret"]["defaultMode"] == 0o440
        [container] = stored["spec"]["containers"]
        [mount] = [m for m in container["volumeMounts"] if m["name"] == volume["name"]]
        assert mount == {"name": volume["name"], "mountPath": RUNNER_CREDS_DIR, "readOnly": True}
        env = {e["name"]: e.get("value", "") for e in container["env"]}
        assert env["MDQ_NATS_CREDS"] == f"{RUNNER_CREDS_DIR}/nats.creds"
        assert not [k for k, v in env.items() if "NKEY" in v or "eyJ" in v]

        # What the pod's program saw: its file (0440, mapped by the kubelet), and the server's
        # answers: its own job's progress acknowledged, another job's refused.
        result = json.loads((tmp_path / f"{job.split('-')[1]}.json").read_text())
        assert result["creds"] != env["MDQ_NATS_CREDS"]  # the kubelet's folder behind it
        assert result["sha256"] == hashlib.sha256(creds.encode()).hexdigest()
        assert result["mode"] == 0o440 and result["secret_lines"] == 2
        assert result["creds_in_env"] == []
        assert result["acked_by"] == SUBJECTS.progress_stream
        assert result["other"] != SUBJECTS.progress(job)
        assert any(f'"{result["other"]}"' in error for error in result["errors"]), result
    # Neither pod mounts the other's Secret.
    mounted = {
        job: {
            v["secret"]["secretName"]
            for v in (cluster.api.pod(spec.name, K8S_NAMESPACE) or {})["spec"]["volumes"]
            if "secret" in v
        }
        for job, spec in specs.items()
    }
    assert len(mounted[ALPHA] | mounted[BETA]) == 2
    # The server stored each job's own report, and no forged one.
    admin = await connect(streams.nats.url, name="admin", creds=streams.admin)
    try:
        js = admin.jetstream()
        # each runner's refusal came back before it exited: the server had handled both
        # publishes, so the stream's count of each subject is final
        info = await js.stream_info(SUBJECTS.progress_stream, subjects_filter=">")
        assert {job: (info.state.subjects or {}).get(SUBJECTS.progress(job)) for job in specs} == {
            job: 1 for job in specs
        }
        for job in specs:
            message = await js.get_last_msg(SUBJECTS.progress_stream, SUBJECTS.progress(job))
            assert message.data == b"mine"
    finally:
        await admin.close()
    # Never logged: no record holds a credential or its seed.
    seeds = [line for text in minted for line in text.splitlines() if line.startswith("SU")]
    assert len(seeds) == 2
    for record in caplog.records:
        text = record.getMessage()
        assert "NKEY" not in text and not [seed for seed in seeds if seed in text]


async def test_deleting_the_pod_deletes_its_secret(
    backend: KubernetesBackend, cluster: SimulatedCluster
) -> None:
    spec = pod("0123456789ab-sleeper", "import time; time.sleep(30)")
    await backend.create_pod(spec)
    await until_phase(cluster, spec.name, "Running")
    [secret] = own_secrets(cluster, spec.name)
    await backend.delete_pod(spec.name)

    async def gone() -> bool:
        return cluster.api.pod(spec.name, K8S_NAMESPACE) is None and not own_secrets(
            cluster, spec.name
        )

    await wait_for(gone, timeout=15, what="the pod and its Secret deleted")
    # By the garbage collector, with its owner: placement only ever created it (it may not
    # read or delete a Secret), and nobody deleted it through the API.
    assert secret["metadata"]["ownerReferences"]  # type: ignore[index]
    mine = cluster.api.requests_where(path_suffix="", user_agent="mdq-kubernetes-backend")
    assert [(r.method, r.status) for r in mine if "/secrets" in r.path] == [("POST", 201)]
    assert not [r for r in cluster.api.requests if "/secrets" in r.path and r.method == "DELETE"]


async def test_a_pod_left_without_its_secret_waits_and_runs_once_created_again(
    backend: KubernetesBackend, cluster: SimulatedCluster, streams: Bus
) -> None:
    """A placement that died after creating the pod and before its Secret: the pod (here
    even bound, which mdq does only after the Secret) waits in ContainerCreating and runs
    nothing; the placement that takes over creates the pod again: the pod exists, so its
    Secret is made (named as the pod mounts it, owned by it) and it runs."""
    bound = pod("0123456789ab-bound", "pass", node="node-2")
    unbound = pod("0123456789ab-unbound", "pass")
    async with k8s.ApiClient(k8s.Configuration(host=cluster.api.url)) as api:
        core = k8s.CoreV1Api(api)
        for spec in (bound, unbound):
            manifest = pod_manifest(
                spec,
                settings=backend._settings,
                mdq_namespace=MDQ_NAMESPACE,
                nats_url=streams.nats.url,
                data_dir=Path("/data"),
                creds_secret=runner_secret_name(spec.name, "deadbeef"),
            )
            await call_json(core.create_namespaced_pod, K8S_NAMESPACE, manifest)
        await call_json(
            core.create_namespaced_pod_binding,
            bound.name,
            K8S_NAMESPACE,
            binding(bound.name, "node-2"),
        )

    def waiting_reason() -> str:
        status = (cluster.api.pod(bound.name, K8S_NAMESPACE) or {}).get("status") or {}
        [container] = status.get("containerStatuses") or [{}]
        return str(((container.get("state") or {}).get("waiting") or {}).get("reason", ""))

    async def creating() -> bool:
        return waiting_reason() == "ContainerCreating"

    await wait_for(creating, timeout=10, what="the bound pod in ContainerCreating")
    kubelet = cluster.kubelets["node-2"]

    async def looked_five_times() -> bool:
        return kubelet.mount_tries[(K8S_NAMESPACE, bound.name)] >= 5

    # and it stays there: the kubelet looked for its credentials five times, in vain
    await wait_for(looked_five_times, timeout=20, what="five tries at the pod's volumes")
    assert await phase_of(cluster, bound.name) == "Pending" and waiting_reason()
    assert cluster.kubelets["node-2"].pid_of(bound.name, K8S_NAMESPACE) is None
    assert await phase_of(cluster, unbound.name) == "Pending"
    assert cluster.api.secrets(K8S_NAMESPACE) == []

    for spec in (bound, unbound):
        with pytest.raises(PodExists):
            await backend.create_pod(spec)
        [secret] = own_secrets(cluster, spec.name)
        assert secret["metadata"]["name"] == f"{spec.name}-nats-deadbeef"  # type: ignore[index]
        stored = cluster.api.pod(spec.name, K8S_NAMESPACE) or {}
        owners = secret["metadata"]["ownerReferences"]  # type: ignore[index]
        assert [o["uid"] for o in owners] == [stored["metadata"]["uid"]]
        assert decode_claims(creds_of(secret).split("\n")[1])["name"] == spec.job_id
    for spec in (bound, unbound):
        await until_phase(cluster, spec.name, "Succeeded", "Failed")
        assert await phase_of(cluster, spec.name) == "Succeeded", spec.name
    assert cluster.node_of(unbound.name) == "node-1"


async def test_creating_a_pod_again_keeps_its_one_secret(
    backend: KubernetesBackend, cluster: SimulatedCluster
) -> None:
    spec = pod("0123456789ab-twice", "import time; time.sleep(0.5)")
    await backend.create_pod(spec)
    with pytest.raises(PodExists):
        await backend.create_pod(spec)
    [secret] = own_secrets(cluster, spec.name)
    name = str(secret["metadata"]["name"])  # type: ignore[index]
    posts = cluster.api.requests_where(method="POST", path_suffix="/secrets")
    assert [r.status for r in posts] == [201, 409]  # the second time: the same name, there
    await until_phase(cluster, spec.name, "Succeeded", "Failed")
    assert await phase_of(cluster, spec.name) == "Succeeded"
    assert [str(s["metadata"]["name"]) for s in own_secrets(cluster, spec.name)] == [name]  # type: ignore[index]


async def test_without_an_issuer_pods_mount_the_shared_secret_with_one_warning(
    cluster: SimulatedCluster, streams: Bus, caplog: pytest.LogCaptureFixture
) -> None:
    shared = await KubernetesBackend.connect(
        settings=settings_for(cluster, runner_creds_secret="mdq-nats-runners"),
        mdq_namespace=MDQ_NAMESPACE,
        runner_nats_url=streams.nats.url,
    )
    caplog.set_level(logging.WARNING, logger="mdq.backends.kubernetes.backend")
    try:
        for job in ("0123456789ab-one", "0123456789ab-two"):
            await shared.create_pod(pod(job, "pass"))
            stored = cluster.api.pod(f"mdq-{job}-1", K8S_NAMESPACE) or {}
            [volume] = [v for v in stored["spec"]["volumes"] if "secret" in v]
            assert volume["secret"]["secretName"] == "mdq-nats-runners"
    finally:
        await shared.close()
    assert cluster.api.requests_where(path_suffix="/secrets") == []
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and RUNNER_ISSUER_ENV in warnings[0], warnings
    assert "mdq-nats-runners" in warnings[0]


async def test_the_factory_gives_the_backend_the_issuer_it_is_told(
    cluster: SimulatedCluster, streams: Bus, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("MDQ_K8S_KUBECONFIG", str(cluster.kubeconfig))
    monkeypatch.setenv("MDQ_K8S_RUNNER_COMMAND", json.dumps(SCRIPTED))
    issuer_file = streams.issuer.save(tmp_path / "runner-issuer.json")
    made = await make_backend(
        kind="kubernetes",
        nc=None,  # type: ignore[arg-type]
        subjects=SUBJECTS,
        runner_nats_url=streams.nats.url,
        runner_issuer=issuer_file,
        runner_creds_ttl_s=600,
    )
    try:
        spec = pod("0123456789ab-factory", "pass")
        await made.create_pod(spec)
        [secret] = own_secrets(cluster, spec.name)
        claims = decode_claims(creds_of(secret).split("\n")[1])
        assert claims["name"] == spec.job_id
        # short-lived: the runner renews them from placement while its attempt is the live one
        assert 0 < claims["exp"] - claims["iat"] <= 600
    finally:
        await made.close()


@pytest.mark.parametrize(
    ("backend_kind", "child", "gets_issuer"),
    [
        ("local", "local-backend", False),  # it asks placement, holding no key
        ("local", "placement", True),
        ("kubernetes", "placement", True),
        ("kubernetes", "watcher", False),
        ("kubernetes", "metrics", False),
        ("kubernetes", "intake", False),
    ],
)
def test_the_stack_gives_the_runner_issuer_to_placement_alone(
    tmp_path: Path, backend_kind: str, child: str, gets_issuer: bool
) -> None:
    stack = Stack(state_dir=tmp_path / "state", backend=backend_kind, nats_url="", metrics_port=0)
    stack._secure_bus()
    env = stack._identity_env(child)
    expected = str(nats_secrets_dir(stack.state_dir) / "runner-issuer.json")
    assert (env.get(RUNNER_ISSUER_ENV) == expected) is gets_issuer
    assert (RUNNER_ISSUER_ENV in env) is gets_issuer


@pytest.mark.parametrize(
    ("pod_name", "nonce", "expected"),
    [
        ("mdq-0123456789ab-j-1", "0a1b2c3d", "mdq-0123456789ab-j-1-nats-0a1b2c3d"),
        ("p" * 260, "0a1b2c3d", "p" * (253 - 14) + "-nats-0a1b2c3d"),
    ],
)
def test_a_runner_secret_is_named_after_its_pod(pod_name: str, nonce: str, expected: str) -> None:
    name = runner_secret_name(pod_name, nonce)
    assert name == expected and len(name) <= 253
