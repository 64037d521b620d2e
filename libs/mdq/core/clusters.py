"""Execution clusters: their names, how a node is named within one, and a job's selector (pure).

mdq may run jobs on several execution clusters at once: the department's Kubernetes
cluster, a national centre's allocation, a cloud account, or local clusters of virtual nodes.
Each has a name (a DNS label) and labels (``site=hpc-centre``, ``gpu=true``). A node is named
*within its cluster* everywhere in mdq — events, PostgreSQL, metrics, ``mdq nodes``, the
console — as ``<cluster>/<node>``; with the one unnamed cluster of a single-cluster deployment
(cluster ""), names stay bare, as they always were. ``/`` is in no Kubernetes node name and
no cluster name, so a qualified name splits one way only.

A job's ``clusters`` selector (``pb.ClusterSelector``) requires or prefers cluster labels;
placement (``mdq.core.placement``) filters on ``require`` and scores ``prefer``, besides the
clusters' load and where a chain's dependencies left their outputs.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from mdq.contracts import pb

SEPARATOR = "/"
CLUSTER_NAME_PATTERN = re.compile(r"^[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?$")
"""A DNS label of at most 32 characters (it is part of node names, metric labels, pod labels)."""
LABEL_PATTERN = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?$")
"""A cluster label's key or value: Kubernetes' label-value syntax (1 to 63 characters)."""
MAX_SELECTOR_LABELS = 16


def qualified(cluster: str, node: str) -> str:
    """The node's name in mdq: ``<cluster>/<node>``, or ``node`` in the unnamed cluster."""
    return f"{cluster}{SEPARATOR}{node}" if cluster else node


def cluster_of(node: str) -> str:
    """The cluster of a node named by ``qualified`` ("" for a bare name)."""
    cluster, separator, _ = node.partition(SEPARATOR)
    return cluster if separator else ""


def local_name(node: str) -> str:
    """The node's name inside its cluster (what its Kubernetes API or agent calls it)."""
    _, separator, rest = node.partition(SEPARATOR)
    return rest if separator else node


def valid_cluster_name(name: str) -> bool:
    return bool(CLUSTER_NAME_PATTERN.fullmatch(name))


@dataclass(frozen=True, slots=True)
class Selector:
    """A job's cluster terms, hashable (placement caches scans by them)."""

    require: frozenset[tuple[str, str]] = frozenset()
    """Labels the cluster must have, with these values."""
    prefer: frozenset[tuple[str, str]] = frozenset()
    """Labels the cluster should have."""

    @classmethod
    def of(cls, selector: pb.ClusterSelector) -> Selector:
        return cls(frozenset(selector.require.items()), frozenset(selector.prefer.items()))

    def __bool__(self) -> bool:
        return bool(self.require or self.prefer)

    def admits(self, labels: Mapping[str, str]) -> bool:
        """Whether a cluster with ``labels`` may run the job."""
        return all(labels.get(key) == value for key, value in self.require)

    def preference(self, labels: Mapping[str, str]) -> float:
        """The fraction of the preferred labels a cluster with ``labels`` has (0 when none
        is preferred)."""
        if not self.prefer:
            return 0.0
        return sum(labels.get(key) == value for key, value in self.prefer) / len(self.prefer)


NO_SELECTOR = Selector()


def selector_error(selector: pb.ClusterSelector) -> tuple[str, str] | None:
    """(field below ``clusters``, message) of the first malformed entry, or None."""
    for part, labels in (("require", selector.require), ("prefer", selector.prefer)):
        if len(labels) > MAX_SELECTOR_LABELS:
            return part, f"at most {MAX_SELECTOR_LABELS} labels"
        for key, value in labels.items():
            if not LABEL_PATTERN.fullmatch(key) or not LABEL_PATTERN.fullmatch(value):
                return (
                    f"{part}[{key!r}]",
                    "keys and values are 1 to 63 letters, digits, '-', '_' or '.', beginning "
                    "and ending with a letter or digit",
                )
    return None


def locality(data_clusters: tuple[str, ...], cluster: str) -> float:
    """The fraction of a job's dependencies whose outputs are on ``cluster`` (0 without
    dependencies; a dependency whose cluster is not known counts as elsewhere)."""
    if not data_clusters:
        return 0.0
    return sum(where == cluster for where in data_clusters) / len(data_clusters)


@dataclass(slots=True)
class Reachability:
    """When each cluster last answered, and whether it counts as lost (pure: the caller gives
    the clock). A cluster is lost once it has not answered for ``lost_after_s``: its running
    jobs are then given up there and requeued on other clusters, and it must be *fenced* —
    its stale pods deleted — when it answers again, before anything runs there."""

    lost_after_s: float
    answered_at: dict[str, float] = field(default_factory=dict)
    lost: set[str] = field(default_factory=set)

    def answered(self, cluster: str, now: float) -> bool:
        """``cluster`` answered at ``now``; True when it was lost (it needs fencing now)."""
        self.answered_at[cluster] = now
        return cluster in self.lost

    def silent(self, cluster: str, now: float) -> bool:
        """``cluster`` did not answer at ``now``; True the moment it becomes lost (once)."""
        since = self.answered_at.setdefault(cluster, now)  # first seen silent: count from now
        if cluster in self.lost or now - since < self.lost_after_s:
            return False
        self.lost.add(cluster)
        return True

    def fenced(self, cluster: str) -> None:
        """Its stale pods are deleted: it is a cluster like the others again."""
        self.lost.discard(cluster)

    def forget(self, cluster: str) -> None:
        """It left the clusters file."""
        self.answered_at.pop(cluster, None)
        self.lost.discard(cluster)
