"""A node as it reports itself: capacity, readiness, live load, cordon, cluster, problem (pure).

One type carries a node's report everywhere: a backend's ``sample_nodes`` returns it, the
metrics service publishes it as a ``NodeLoad`` event, placement's ``NodeState`` is it plus
what placement adds (when it was reported, what is reserved and in flight there), and the local
backend's nodes bucket stores it with its agent's heartbeat.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


# Not frozen: placement's NodeState extends it, and ``plan`` changes its copies of those.
@dataclass(slots=True)
class NodeSample:
    """A node's capacity, readiness and live usage at one moment."""

    name: str
    cpu_capacity: float
    memory_capacity_mb: int
    ready: bool
    cpu_load: float
    """CPU in use / capacity, 0..1."""
    memory_load: float
    """Memory in use / capacity, 0..1."""
    cordoned: bool = False
    """Ready, but taking no new pods (Kubernetes: unschedulable, or a NoSchedule/NoExecute taint
    mdq does not tolerate); its running pods keep running."""
    cluster: str = ""
    """Its execution cluster, "" for the one unnamed cluster (the router over several clusters,
    ``mdq.backends.clusters``, sets it and qualifies ``name`` as "<cluster>/<node>")."""
    cluster_labels: Mapping[str, str] = field(default_factory=dict)
    """Its cluster's labels, which jobs' ``clusters`` selectors match."""
    problem: str = ""
    """Why its environment cannot run pods now, in words ("" when it can): the local agent's
    probe of its data folder, pods that could not start; Kubernetes' DiskPressure and kin."""
