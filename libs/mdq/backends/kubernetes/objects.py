"""Kubernetes objects as mdq sees them (pure): the pod manifest, and pods and nodes read back.

The backend speaks raw JSON (dicts in the API's camelCase) with the API server; this module
turns a ``PodSpec`` into a pod manifest and its runner's credentials into the pod's own
Secret (owned by the pod, so Kubernetes deletes it with the pod), a pod into the ``PodUpdate``
mdq reports (with the
termination mapped to the reasons ``mdq.core.recovery.classify`` knows), a node into its
readiness, and metrics.k8s.io quantities into numbers. ``PodTracker`` keeps the last update of
every pod so a re-list (after a 410) or a redelivered event never reports a transition twice,
and a terminal update is final.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from mdq.backends.kubernetes.settings import KubernetesSettings
from mdq.backends.launch import RUNNER_MODULE, bus_environment, runner_task
from mdq.backends.port import PodSpec, PodUpdate
from mdq.contracts import pb

Json = dict[str, Any]

CONTAINER = "runner"
RUNNER_CREDS_DIR = "/var/run/secrets/mdq-nats"
"""Where a runner pod finds its NATS credentials: its own Secret's (``runner_secret``), or the
shared one of ``KubernetesSettings.runner_creds_secret`` when placement has no runner issuer."""
RUNNER_CREDS_KEY = "nats.creds"
"""The key of the credentials in a runner's Secret, and the file's name in the pod."""
RUNNER_CREDS_VOLUME = "nats-creds"
SECRET_SUFFIX = "-nats-"
"""A pod's own Secret is ``<pod>-nats-<nonce>`` (``runner_secret_name``)."""
_NAME_LIMIT = 253
MANAGED_BY = "app.kubernetes.io/managed-by"
NAMESPACE_LABEL = "mdq.io/namespace"
JOB_LABEL = "mdq.io/job"
ATTEMPT_LABEL = "mdq.io/attempt"
JOB_ANNOTATION = "mdq.io/job-id"
ATTEMPT_ANNOTATION = "mdq.io/attempt"
NODE_ANNOTATION = "mdq.io/node"
PRIORITY_ANNOTATION = "mdq.io/priority-class"

RUNNER_COMMAND = ("python", "-m", RUNNER_MODULE)
"""The container command of every runner pod: the image's Python runs the runner."""

TERMINAL = frozenset({pb.POD_SUCCEEDED, pb.POD_FAILED})
_PHASES: dict[str, pb.PodPhase] = {
    "Pending": pb.POD_PENDING,
    "Running": pb.POD_RUNNING,
    "Succeeded": pb.POD_SUCCEEDED,
    "Failed": pb.POD_FAILED,
}
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_START_ERRORS = frozenset(
    {
        "InvalidImageName",
        "CreateContainerConfigError",
        "CreateContainerError",
        "ErrImageNeverPull",
        "ErrImagePull",
        "ImagePullBackOff",
        "RunContainerError",
    }
)
"""Waiting reasons of a pod that did not start: the container never recovers from some, and
an image the node cannot pull is retried by the kubelet for as long as the pod lives. Either
is the node's failure, never the job's (StartError: FAILURE_ENVIRONMENT), and the attempt is
retried after a backoff, elsewhere when another node fits."""
SANDBOX_CONDITIONS = ("PodReadyToStartContainers", "PodHasNetwork")
"""The pod condition that turns True once the kubelet has made the pod's sandbox (network
namespace, CNI): ``PodReadyToStartContainers`` since Kubernetes 1.29, ``PodHasNetwork``
before. While it stays False the container waits in ContainerCreating and the kubelet retries
without ever failing the pod (a broken CNI or runtime on that node): ``sandbox_stalled_since``."""
_POD_REASONS = {
    "Evicted": "Evicted",
    "Preempting": "Preempted",
    "Shutdown": "Evicted",
    "Terminated": "Evicted",
    "NodeShutdown": "Evicted",
    "NodeLost": "NodeLost",
    "UnexpectedAdmissionError": "Evicted",
    "OutOfcpu": "Evicted",
    "OutOfmemory": "Evicted",
    "NodeAffinity": "Evicted",
}
"""Pod-level status reasons (kubelet evictions, node shutdown, admission) -> mdq's reason."""
_DISRUPTIONS = {
    "PreemptionByScheduler": "Preempted",
    "PreemptionByKubeScheduler": "Preempted",
    "DeletionByTaintManager": "NodeLost",
    "DeletionByPodGC": "NodeLost",
    "EvictionByEvictionAPI": "Evicted",
    "TerminationByKubelet": "Evicted",
}
"""Reasons of the DisruptionTarget condition -> mdq's reason (unknown ones: "Evicted")."""


def selector(mdq_namespace: str) -> str:
    """The label selector of this mdq namespace's pods."""
    return f"{MANAGED_BY}=mdq,{NAMESPACE_LABEL}={mdq_namespace}"


def _cpu(cores: float) -> str:
    return f"{max(1, round(cores * 1000))}m"


def runner_secret_name(pod_name: str, nonce: str) -> str:
    """The name of the Secret with the credentials of pod ``pod_name``'s runner:
    ``<pod>-nats-<nonce>`` (the backend draws the nonce for each pod it makes).

    Derived from the pod's name, and new for each pod object made: a Secret of an earlier pod
    of the same name that the garbage collector has not deleted yet (it goes with its owner,
    in the background) never stands in for the new pod's, so placement needs no right to read
    or delete Secrets to tell them apart (``create`` alone)."""
    suffix = SECRET_SUFFIX + nonce
    return pod_name[: _NAME_LIMIT - len(suffix)] + suffix


def _labels(pod: PodSpec, mdq_namespace: str, name: str) -> dict[str, str]:
    labels = {
        "app.kubernetes.io/name": name,
        MANAGED_BY: "mdq",
        NAMESPACE_LABEL: mdq_namespace,
        ATTEMPT_LABEL: str(pod.attempt),
    }
    if _LABEL_VALUE.match(pod.job_id) and len(pod.job_id) <= 63:
        labels[JOB_LABEL] = pod.job_id
    return labels


def pod_manifest(
    pod: PodSpec,
    *,
    settings: KubernetesSettings,
    mdq_namespace: str,
    nats_url: str,
    data_dir: Path,
    creds_secret: str | None = None,
) -> Json:
    """The pod of one attempt: unscheduled (mdq binds it), never restarted, with limits.

    Its command is the runner's (``settings.runner_command`` or ``python -m services.runner``)
    and its environment only the task derived from ``pod``, the bus (``nats_url``, the
    namespace), the data folder as mounted in the pod (``data_dir``) and the pod's own name
    and node (``mdq.backends.launch``): nothing of the creating service's environment.

    ``creds_secret``: the Secret whose ``nats.creds`` the runner authenticates with, mounted
    read-only as a file (never an environment variable): the pod's own (``runner_secret``);
    None: the shared ``settings.runner_creds_secret`` (none when that is empty too)."""
    labels = _labels(pod, mdq_namespace, "mdq-runner")
    variables = runner_task(pod, data_dir=data_dir).to_env() | bus_environment(
        nats_url=nats_url, namespace=mdq_namespace, data_dir=data_dir
    )
    env: list[Json] = [{"name": key, "value": value} for key, value in sorted(variables.items())]
    for name, path in (("MDQ_POD_NAME", "metadata.name"), ("MDQ_NODE_NAME", "spec.nodeName")):
        env.append({"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}})
    resources: Json = {
        "requests": {"cpu": _cpu(pod.cpu), "memory": f"{pod.memory_mb}Mi"},
        "limits": {"memory": f"{pod.memory_mb}Mi"},
    }
    if settings.cpu_limit:
        resources["limits"]["cpu"] = _cpu(pod.cpu)
    container: Json = {
        "name": CONTAINER,
        "image": settings.runner_image,
        "imagePullPolicy": settings.image_pull_policy,
        "command": list(settings.runner_command or RUNNER_COMMAND),
        "env": env,
        "resources": resources,
        # Pod Security "restricted": the namespaces of deploy/ enforce it.
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
        },
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
    }
    spec: Json = {
        "schedulerName": settings.scheduler_name,
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": settings.termination_grace_s,
        "automountServiceAccountToken": False,
        "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [container],
        "volumes": [{"name": "tmp", "emptyDir": {}}],
    }
    if priority_class := settings.priority_classes.get(pod.priority_class, ""):
        spec["priorityClassName"] = priority_class
    if settings.service_account:
        spec["serviceAccountName"] = settings.service_account
    secret_name = settings.runner_creds_secret if creds_secret is None else creds_secret
    if secret_name:
        # A file, never an environment variable: the runner reads it by its path.
        spec["volumes"].append(
            {
                "name": RUNNER_CREDS_VOLUME,
                "secret": {
                    "secretName": secret_name,
                    "defaultMode": 0o440,
                    "items": [{"key": RUNNER_CREDS_KEY, "path": RUNNER_CREDS_KEY}],
                },
            }
        )
        container["volumeMounts"].append(
            {"name": RUNNER_CREDS_VOLUME, "mountPath": RUNNER_CREDS_DIR, "readOnly": True}
        )
        env.append({"name": "MDQ_NATS_CREDS", "value": f"{RUNNER_CREDS_DIR}/{RUNNER_CREDS_KEY}"})
    mount_path = settings.data_mount_path or str(data_dir)
    if settings.checkpoint_pvc and mount_path:
        spec["volumes"].append(
            {"name": "data", "persistentVolumeClaim": {"claimName": settings.checkpoint_pvc}}
        )
        container["volumeMounts"].append({"name": "data", "mountPath": mount_path})
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod.name,
            "labels": labels,
            "annotations": {
                JOB_ANNOTATION: pod.job_id,
                ATTEMPT_ANNOTATION: str(pod.attempt),
                NODE_ANNOTATION: pod.node,
                PRIORITY_ANNOTATION: pod.priority_class,
            },
        },
        "spec": spec,
    }


def mounted_creds_secret(pod: Mapping[str, Any]) -> str:
    """The Secret a pod object mounts its runner's credentials from; "" for none."""
    for volume in (pod.get("spec") or {}).get("volumes") or []:
        if volume.get("name") == RUNNER_CREDS_VOLUME:
            return str((volume.get("secret") or {}).get("secretName", ""))
    return ""


def runner_secret(
    pod: PodSpec, *, name: str, mdq_namespace: str, creds: str, owner_uid: str
) -> Json:
    """The Secret ``name`` with the credentials of ``pod``'s runner (``creds``, the text of a
    ``.creds`` file), owned by the pod object whose uid is ``owner_uid``: the garbage collector
    deletes it with the pod. Immutable: nobody changes what a runner authenticates with."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "immutable": True,
        "metadata": {
            "name": name,
            "labels": _labels(pod, mdq_namespace, "mdq-runner-creds"),
            "annotations": {JOB_ANNOTATION: pod.job_id, ATTEMPT_ANNOTATION: str(pod.attempt)},
            # No blockOwnerDeletion: setting it would need the pods/finalizers right.
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "Pod", "name": pod.name, "uid": owner_uid}
            ],
        },
        "data": {RUNNER_CREDS_KEY: base64.b64encode(creds.encode()).decode()},
    }


def binding(name: str, node: str) -> Json:
    """The Binding that assigns pod ``name`` to ``node``."""
    return {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": name},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    }


# -- reading pods back ---------------------------------------------------------------------
def _container_status(pod: Mapping[str, Any]) -> Json:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    for status in statuses:
        if status.get("name") == CONTAINER:
            return dict(status)
    return dict(statuses[0]) if statuses else {}


def _condition(conditions: Iterable[Mapping[str, Any]], kind: str) -> Mapping[str, Any] | None:
    for condition in conditions:
        if condition.get("type") == kind:
            return condition
    return None


def disruption_reason(pod: Mapping[str, Any]) -> str:
    """mdq's reason for a pod with a True DisruptionTarget condition, else ""."""
    condition = _condition((pod.get("status") or {}).get("conditions") or [], "DisruptionTarget")
    if condition is None or condition.get("status") != "True":
        return ""
    return _DISRUPTIONS.get(str(condition.get("reason", "")), "Evicted")


def _failure(pod: Mapping[str, Any]) -> tuple[int, str, str]:
    """(exit code, reason, message) of a Failed pod."""
    status = pod.get("status") or {}
    terminated = (_container_status(pod).get("state") or {}).get("terminated") or {}
    code = int(terminated.get("exitCode", 0) or 0)
    container_reason = str(terminated.get("reason", "") or "")
    message = str(terminated.get("message", "") or status.get("message", "") or "")
    if container_reason == "OOMKilled":
        return code or 137, "OOMKilled", message or "container exceeded its memory limit"
    if (pod_reason := str(status.get("reason", "") or "")) in _POD_REASONS:
        return code, _POD_REASONS[pod_reason], str(status.get("message", "") or message)
    if disrupted := disruption_reason(pod):
        return code, disrupted, message or f"pod disrupted ({disrupted})"
    if not container_reason or container_reason == "Completed":
        container_reason = "Error"
    return code, container_reason, message or f"exited with {code}"


UNDATED = datetime.min.replace(tzinfo=UTC)
"""``sandbox_stalled_since`` of a stalled pod whose condition has no lastTransitionTime: the
tracker dates the stall from its first check instead."""


def sandbox_stalled_since(pod: Mapping[str, Any]) -> datetime | None:
    """Since when a Pending pod, bound to a node, has waited for its sandbox
    (``SANDBOX_CONDITIONS`` False: the condition's lastTransitionTime, ``UNDATED`` without
    one), else None."""
    status = pod.get("status") or {}
    if str(status.get("phase", "Pending") or "Pending") != "Pending":
        return None
    if not (pod.get("spec") or {}).get("nodeName"):
        return None  # not bound yet: the scheduler's wait, not the node's
    conditions = status.get("conditions") or []
    for kind in SANDBOX_CONDITIONS:
        condition = _condition(conditions, kind)
        if condition is not None:
            if condition.get("status") == "True":
                return None
            return parse_time(condition.get("lastTransitionTime")) or UNDATED
    return None


def sandbox_start_error(update: PodUpdate, since: datetime, now: datetime) -> PodUpdate:
    """The terminal update of a pod whose sandbox was not made in time (StartError)."""
    waited = (now - since).total_seconds()
    return replace(
        update,
        phase=pb.POD_FAILED,
        exit_code=128,
        reason="StartError",
        message=f"pod sandbox not created on {update.node or 'its node'} in {waited:.0f} s "
        f"({SANDBOX_CONDITIONS[0]} False since {since.isoformat(timespec='seconds')})",
    )


def start_problems(
    pods: Iterable[Mapping[str, Any]], *, now: datetime, stalled_after_s: float
) -> dict[str, str]:
    """node -> why pods cannot start there, from its pods as listed: a container waiting
    with a start error (``_START_ERRORS``), or a sandbox stalled for ``stalled_after_s``."""
    problems: dict[str, str] = {}
    for pod in pods:
        node = str((pod.get("spec") or {}).get("nodeName") or "")
        if not node or node in problems:
            continue
        waiting = (_container_status(pod).get("state") or {}).get("waiting") or {}
        if (reason := str(waiting.get("reason", ""))) in _START_ERRORS:
            problems[node] = f"pods could not start: {reason}"
            continue
        since = sandbox_stalled_since(pod)
        if since not in (None, UNDATED) and (now - since).total_seconds() >= stalled_after_s:
            problems[node] = (
                f"pods could not start: no pod sandbox for {(now - since).total_seconds():.0f} s"
            )
    return problems


def pod_update(pod: Mapping[str, Any]) -> PodUpdate | None:
    """What mdq reports for this pod now; None for a pod that is not mdq's or in no known
    phase (Unknown: the node is not reporting; the node watch deals with that)."""
    metadata = pod.get("metadata") or {}
    annotations = metadata.get("annotations") or {}
    job_id = annotations.get(JOB_ANNOTATION)
    try:
        attempt = int(annotations.get(ATTEMPT_ANNOTATION, ""))
    except ValueError:
        return None
    if not job_id:
        return None
    status = pod.get("status") or {}
    phase = _PHASES.get(str(status.get("phase", "Pending") or "Pending"))
    if phase is None:
        return None
    node = str(annotations.get(NODE_ANNOTATION) or (pod.get("spec") or {}).get("nodeName") or "")
    update = PodUpdate(
        pod_name=str(metadata.get("name", "")),
        job_id=str(job_id),
        attempt=attempt,
        node=node,
        phase=phase,
    )
    if phase == pb.POD_PENDING:
        waiting = (_container_status(pod).get("state") or {}).get("waiting") or {}
        if (reason := str(waiting.get("reason", ""))) in _START_ERRORS:
            message = f"{reason}: {waiting.get('message', '')}".rstrip(": ")
            return replace(update, phase=pb.POD_FAILED, exit_code=128, reason="StartError",
                           message=message)  # fmt: skip
        return update
    if phase == pb.POD_RUNNING:
        return replace(update, message=f"running on {node}")
    if phase == pb.POD_SUCCEEDED:
        return replace(update, reason="Completed", message="exited with 0")
    code, reason, message = _failure(pod)
    return replace(update, exit_code=code, reason=reason, message=message)


def removed_update(pod: Mapping[str, Any], last: PodUpdate) -> PodUpdate:
    """The terminal update of a pod deleted before it ended (by someone, or a controller)."""
    reason = disruption_reason(pod) or "Deleted"
    return replace(
        last,
        phase=pb.POD_FAILED,
        exit_code=last.exit_code,
        reason=reason,
        message=f"pod deleted before it ended ({reason})",
    )


class PodTracker:
    """The last reported update of every pod: reports each change once, a terminal one last."""

    def __init__(self) -> None:
        self.last: dict[str, PodUpdate] = {}
        self.stalled: dict[str, datetime] = {}
        """Pods waiting for their sandbox (``sandbox_stalled_since``): name -> since when."""

    def _offer(self, update: PodUpdate) -> PodUpdate | None:
        previous = self.last.get(update.pod_name)
        if previous is not None and (previous.phase in TERMINAL or previous == update):
            return None
        if (
            previous is not None
            and previous.phase == pb.POD_RUNNING
            and (update.phase == pb.POD_PENDING)
        ):
            return None  # never backwards
        self.last[update.pod_name] = update
        return update

    def observe(self, kind: str, pod: Mapping[str, Any]) -> PodUpdate | None:
        """A watch event (ADDED / MODIFIED / DELETED) of a pod; the update to report, if any."""
        name = str((pod.get("metadata") or {}).get("name", ""))
        since = None if kind == "DELETED" else sandbox_stalled_since(pod)
        if since is None:
            self.stalled.pop(name, None)
        elif since is not UNDATED or name not in self.stalled:
            self.stalled[name] = since
        if kind == "DELETED":
            previous = self.last.pop(name, None)
            if previous is None or previous.phase in TERMINAL:
                return None
            current = pod_update(pod)
            if current is not None and current.phase in TERMINAL:
                return current  # its final status came with the deletion
            return removed_update(pod, previous)
        update = pod_update(pod)
        return None if update is None else self._offer(update)

    def resync(self, pods: Sequence[Mapping[str, Any]]) -> list[PodUpdate]:
        """A fresh list of every pod (after a 410): report only what changed meanwhile,
        including pods that disappeared while nobody watched."""
        updates: list[PodUpdate] = []
        seen: set[str] = set()
        for pod in pods:
            seen.add(str((pod.get("metadata") or {}).get("name", "")))
            if (update := self.observe("MODIFIED", pod)) is not None:
                updates.append(update)
        for name in [name for name in self.last if name not in seen]:
            gone = {"metadata": {"name": name}}
            if (update := self.observe("DELETED", gone)) is not None:
                updates.append(update)
        return updates

    def start_timeouts(self, now: datetime, limit_s: float) -> list[PodUpdate]:
        """Every pod whose sandbox has been stalled for ``limit_s`` ends StartError (once)."""
        ended: list[PodUpdate] = []
        for name, since in list(self.stalled.items()):
            if since is UNDATED:
                self.stalled[name] = now  # first seen stalled now: dated from here
                continue
            if (now - since).total_seconds() < limit_s:
                continue
            del self.stalled[name]
            update = self.last.get(name)
            if update is None or update.phase != pb.POD_PENDING:
                continue
            self.last[name] = failed = sandbox_start_error(update, since, now)
            ended.append(failed)
        return ended

    def lose_node(self, node: str, message: str) -> list[PodUpdate]:
        """Every unfinished pod on ``node`` failed: the node is lost."""
        lost = [
            replace(update, phase=pb.POD_FAILED, exit_code=0, reason="NodeLost", message=message)
            for update in self.last.values()
            if update.node == node and update.phase not in TERMINAL
        ]
        for update in lost:
            self.last[update.pod_name] = update
        return lost


# -- nodes and metrics ---------------------------------------------------------------------
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"n": 1e-9, "u": 1e-6, "m": 1e-3, "": 1.0, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12,
            "P": 1e15, "E": 1e18}  # fmt: skip
_QUANTITY = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)([a-zA-Z]*)$")


def parse_quantity(text: str | int | float) -> float:
    """A Kubernetes quantity ("250m", "1.5", "123456n", "512Mi", "1G") as a number."""
    if isinstance(text, int | float):
        return float(text)
    match = _QUANTITY.match(text.strip())
    if match is None:
        raise ValueError(f"not a quantity: {text!r}")
    number, suffix = float(match.group(1)), match.group(2)
    if suffix in _BINARY:
        return number * _BINARY[suffix]
    if suffix in _DECIMAL:
        return number * _DECIMAL[suffix]
    raise ValueError(f"unknown quantity suffix in {text!r}")


def parse_time(text: str | None) -> datetime | None:
    """An RFC 3339 time of the API ("2026-11-29T10:00:00Z"), or None."""
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC)
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class NodeView:
    """What mdq needs of a node object."""

    name: str
    cpu_capacity: float
    memory_capacity_mb: int
    ready: bool
    """The Ready condition is True."""
    schedulable: bool
    """Not cordoned and without a NoSchedule / NoExecute taint mdq does not tolerate."""
    ready_since: datetime | None
    """When the Ready condition last changed."""
    problem: str = ""
    """The node's pressure conditions that are True ("DiskPressure: kubelet has disk
    pressure"), "; "-joined: why its environment cannot run pods now."""


def node_view(node: Mapping[str, Any], *, tolerated_taints: Iterable[str] = ()) -> NodeView:
    """Capacity (allocatable), readiness and schedulability of a node object."""
    status = node.get("status") or {}
    spec = node.get("spec") or {}
    allocatable = status.get("allocatable") or status.get("capacity") or {}
    ready_condition = _condition(status.get("conditions") or [], "Ready") or {}
    tolerated = set(tolerated_taints)
    taints = [
        taint
        for taint in spec.get("taints") or []
        if taint.get("effect") in ("NoSchedule", "NoExecute") and taint.get("key") not in tolerated
    ]
    return NodeView(
        name=str((node.get("metadata") or {}).get("name", "")),
        cpu_capacity=parse_quantity(allocatable.get("cpu", "0")),
        memory_capacity_mb=int(parse_quantity(allocatable.get("memory", "0")) // 2**20),
        ready=ready_condition.get("status") == "True",
        schedulable=not spec.get("unschedulable", False) and not taints,
        ready_since=parse_time(ready_condition.get("lastTransitionTime")),
        problem=node_problem(status.get("conditions") or []),
    )


PROBLEM_CONDITIONS = ("DiskPressure", "PIDPressure", "MemoryPressure", "NetworkUnavailable")
"""Node conditions that, when True, say the node's environment cannot take pods (the kubelet
taints such a node too; mdq shows why)."""


def node_problem(conditions: Iterable[Mapping[str, Any]]) -> str:
    """The True pressure conditions of a node, in words ("" when none is)."""
    found = []
    conditions = list(conditions)
    for kind in PROBLEM_CONDITIONS:
        condition = _condition(conditions, kind)
        if condition is not None and condition.get("status") == "True":
            message = str(condition.get("message") or condition.get("reason") or "")
            found.append(f"{kind}: {message}".rstrip(": "))
    return "; ".join(found)


def node_usage(metrics: Mapping[str, Any]) -> dict[str, tuple[float, float]]:
    """metrics.k8s.io NodeMetricsList -> {node: (cpu cores in use, memory bytes in use)}."""
    usage: dict[str, tuple[float, float]] = {}
    for item in metrics.get("items") or []:
        name = str((item.get("metadata") or {}).get("name", ""))
        used = item.get("usage") or {}
        try:
            usage[name] = (
                parse_quantity(used.get("cpu", "0")),
                parse_quantity(used.get("memory", "0")),
            )
        except ValueError:
            continue
    return usage
