"""The cluster backend port: what mdq needs from wherever pods run.

Placement creates pods already bound to the node it chose; the watcher follows pod updates;
the metrics service reads node capacity and live load. The local adapter (runner subprocesses
on virtual nodes) and the Kubernetes adapter implement the same protocol and report the same
updates, so nothing above this port knows which one runs.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Protocol

from mdq.contracts import pb
from mdq.core.nodes import NodeSample
from mdq.errors import Conflict


@dataclass(frozen=True, slots=True)
class PodSpec:
    """One attempt of a job, to run on ``node``."""

    name: str
    """Pod name, "mdq-<job>-<attempt>" (ids.pod_name)."""
    job_id: str
    attempt: int
    node: str
    """The node placement chose; the pod is bound there."""
    cpu: float
    """CPU cores requested and enforced."""
    memory_mb: int
    """Memory limit in MiB; exceeding it ends the attempt as OOMKilled."""
    priority_class: str
    spec: pb.JobSpec = field(default_factory=pb.JobSpec)
    """The job's spec, as logged by intake (the runner validates it again)."""
    resume_from: pb.Checkpoint | None = None
    """The checkpoint to resume from (recovery's choice), or None for a fresh start."""
    depends_on: tuple[str, ...] = ()
    """Job ids of the dependencies, in depends_on order: their folders are the job's inputs."""
    threads: int = 1
    """OpenMM CPU threads."""


# A pod is described, never commanded: there is no command and no environment here. Whoever
# runs it (the local agent, a kubelet through the manifest mdq builds) starts the runner with
# its own argv and builds the runner's environment from these fields and an allowlist
# (mdq.backends.launch), so writing a pod record cannot run anything else.


@dataclass(frozen=True, slots=True)
class PodUpdate:
    """The observed state of a pod."""

    pod_name: str
    job_id: str
    attempt: int
    node: str
    phase: pb.PodPhase
    exit_code: int = 0
    reason: str = ""
    """Kubernetes-style: "Completed", "Error", "OOMKilled", "Evicted", "NodeLost"."""
    message: str = ""


class PodExists(Conflict):
    """create_pod found a pod of that name already (idempotent callers may ignore it)."""


class ClusterBackend(Protocol):
    """Where pods run."""

    async def create_pod(self, pod: PodSpec) -> None:
        """Create the pod bound to ``pod.node``; raise PodExists if it already exists."""
        ...

    async def delete_pod(self, name: str) -> None:
        """Stop and remove a pod (SIGTERM, then SIGKILL after a grace period); no-op if gone."""
        ...

    def watch_pods(self) -> AsyncIterator[PodUpdate]:
        """The current state of every pod, then every change, forever."""
        ...

    async def sample_nodes(self) -> list[NodeSample]:
        """Every node with its capacity, readiness and live load."""
        ...

    async def close(self) -> None:
        """Release connections."""
        ...
