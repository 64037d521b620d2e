"""Node health: a node on which many different jobs fail is cordoned for a while (pure).

One job crashing says little about its node; several different jobs crashing or going silent
on the same node within a short window points at the node (a bad disk, a flaky NIC, a noisy
neighbour). Placement folds every ``attempt_failed`` event into ``NodeHealth`` — with the
event's own time, so a restarted placement reaches the same verdict from the log — and treats
a cordoned node as it treats one cordoned by an operator: no new work until the cordon lapses.
"""

from __future__ import annotations

from collections import defaultdict, deque
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from mdq.contracts import pb

NODE_SUSPECT_FAILURES = frozenset({pb.FAILURE_CRASHED, pb.FAILURE_LOST, pb.FAILURE_NODE_LOST})
"""Failure classes that may be the node's fault (OOM, NaN energy or bad input are the job's)."""


@dataclass(frozen=True, slots=True)
class NodeHealthPolicy:
    """When a node is cordoned, and for how long."""

    failures_to_cordon: int = 3
    """Distinct jobs failing on one node within the window that cordon it (0 disables)."""
    window_s: float = 600.0
    """The window in which those failures count."""
    cordon_s: float = 300.0
    """How long the cordon lasts after the failure that triggered it."""


@dataclass(slots=True)
class NodeHealth:
    """Recent suspect failures per node, and the cordons they caused."""

    policy: NodeHealthPolicy = field(default_factory=NodeHealthPolicy)
    _failures: dict[str, deque[tuple[datetime, str]]] = field(
        default_factory=lambda: defaultdict(deque)
    )
    _cordoned_until: dict[str, datetime] = field(default_factory=dict)

    def record(self, *, node: str, job_id: str, reason: pb.FailureReason, at: datetime) -> bool:
        """Fold in one failed attempt; return True if it (newly) cordons the node."""
        if not node or reason not in NODE_SUSPECT_FAILURES or self.policy.failures_to_cordon <= 0:
            return False
        recent = self._failures[node]
        recent.append((at, job_id))
        while recent and recent[0][0] < at - timedelta(seconds=self.policy.window_s):
            recent.popleft()
        if len({job for _, job in recent}) < self.policy.failures_to_cordon:
            return False
        was_cordoned = node in self._cordoned_until and self._cordoned_until[node] > at
        self._cordoned_until[node] = at + timedelta(seconds=self.policy.cordon_s)
        recent.clear()
        return not was_cordoned

    def cordoned(self, node: str, now: datetime) -> bool:
        """Whether ``node`` is cordoned at ``now``."""
        until = self._cordoned_until.get(node)
        return until is not None and now < until

    def cordons(self, now: datetime) -> dict[str, datetime]:
        """Every node cordoned at ``now``, with the end of its cordon."""
        return {node: until for node, until in self._cordoned_until.items() if now < until}
