"""Node health: a node whose environment is failing, or on which many different jobs crash, is
cordoned, within a budget that never lets mdq's own cordons take out the cluster (pure).

Placement folds every node's reported problem and every ``attempt_failed`` event (with the
event's own time, so a restarted placement reaches the same verdict from the log) into
``NodeHealth``; ``cordons`` says which nodes to cordon within the budget (``within_budget``)
and which suspects it holds back. Which failures count against a node, and why the budget is
what it is: docs/placement.md, "Cordons".
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from mdq.contracts import pb

NODE_SUSPECT_FAILURES = frozenset({pb.FAILURE_CRASHED})
"""Failure classes that may be the node's fault (see the module docstring for the others)."""

FLOOR_MAX_SHARE = 0.5
"""The largest share of ready CPU capacity the one-node exception may cordon."""

_EPSILON = 1e-9


@dataclass(frozen=True, slots=True)
class NodeHealthPolicy:
    """When a node becomes suspect, for how long, and how much of the cluster may be cordoned."""

    failures_to_cordon: int = 3
    """Distinct jobs failing on one node within the window that make it suspect (0 disables)."""
    window_s: float = 600.0
    """The window in which those failures count."""
    cordon_s: float = 300.0
    """How long the cordon lasts after the failure that triggered (or renewed) it."""
    max_cordoned_fraction: float = 1 / 3
    """The largest share of ready CPU capacity cordoned at once, operator cordons included."""


@dataclass(frozen=True, slots=True)
class Suspicion:
    """A node that qualified for a cordon."""

    node: str
    failures: int
    """Distinct failed jobs that made (and since renewed) the verdict: its severity."""
    last_failure: datetime
    since: datetime
    """When this episode began (a renewal keeps it)."""
    until: datetime
    """When the verdict lapses (a node's problem: when it was last seen; it lasts as long as
    the node reports it)."""
    problem: str = ""
    """The problem the node reports ("" for a verdict on crashes alone)."""


@dataclass(frozen=True, slots=True)
class NodeCapacity:
    """What the budget needs to know of a node."""

    name: str
    cpu: float
    ready: bool
    """Ready and reporting: placement could bind work there."""
    cordoned: bool = False
    """Cordoned by an operator (or the cluster): out, and counted against the budget."""
    problem: str = ""
    """Why its environment cannot run pods now ("" when it can): makes it a suspect."""


@dataclass(frozen=True, slots=True)
class Cordons:
    """The failure cordons in force, and the suspects the budget left open."""

    cordoned: dict[str, Suspicion] = field(default_factory=dict)
    held_back: tuple[Suspicion, ...] = ()


NO_CORDONS = Cordons()


def severity_order(suspicion: Suspicion) -> tuple[int, int, float, str]:
    """Worst first: a reported problem, then most distinct failures, then most recent
    failure, then by name."""
    return (
        0 if suspicion.problem else 1,
        -suspicion.failures,
        -suspicion.last_failure.timestamp(),
        suspicion.node,
    )


def with_problems(
    suspects: Iterable[Suspicion], nodes: Iterable[NodeCapacity], now: datetime
) -> list[Suspicion]:
    """``suspects`` and every ready node that reports a problem, one suspicion per node (a
    suspect on crashes that also reports a problem carries both)."""
    by_node = {suspicion.node: suspicion for suspicion in suspects}
    for node in nodes:
        if not node.ready or not node.problem:
            continue
        known = by_node.get(node.name)
        by_node[node.name] = (
            replace(known, problem=node.problem)
            if known is not None
            else Suspicion(
                node=node.name,
                failures=0,
                last_failure=now,
                since=now,
                until=now,
                problem=node.problem,
            )
        )
    return list(by_node.values())


def within_budget(
    suspects: Iterable[Suspicion], nodes: Iterable[NodeCapacity], max_fraction: float
) -> Cordons:
    """Which suspects to cordon, worst first, without passing the budget (module docstring).

    Suspects on nodes that are unknown, not ready or already cordoned by an operator are
    neither cordoned nor held back: they take no work anyway.
    """
    ready = [node for node in nodes if node.ready]
    total = sum(max(0.0, node.cpu) for node in ready)
    out_cpu = sum(max(0.0, node.cpu) for node in ready if node.cordoned)
    out_nodes = sum(1 for node in ready if node.cordoned)
    open_nodes = {node.name: node for node in ready if not node.cordoned}
    allowance = max_fraction * total
    cordoned: dict[str, Suspicion] = {}
    held_back: list[Suspicion] = []
    for suspicion in sorted(suspects, key=severity_order):
        node = open_nodes.get(suspicion.node)
        if node is None:
            continue
        cpu = max(0.0, node.cpu)
        fits = out_cpu + cpu <= allowance + _EPSILON or (
            out_nodes == 0 and cpu <= FLOOR_MAX_SHARE * total + _EPSILON
        )
        if len(open_nodes) <= 1 or not fits:
            held_back.append(suspicion)
            continue
        del open_nodes[suspicion.node]
        out_cpu += cpu
        out_nodes += 1
        cordoned[suspicion.node] = suspicion
    return Cordons(cordoned=cordoned, held_back=tuple(held_back))


@dataclass(slots=True)
class NodeHealth:
    """Recent crashes per node, and the suspicions they caused."""

    policy: NodeHealthPolicy = field(default_factory=NodeHealthPolicy)
    _failures: dict[str, deque[tuple[datetime, str]]] = field(
        default_factory=lambda: defaultdict(deque)
    )
    _suspects: dict[str, Suspicion] = field(default_factory=dict)

    def record(self, *, node: str, job_id: str, reason: pb.FailureReason, at: datetime) -> bool:
        """Fold in one failed attempt; return True if it (newly) makes the node suspect.

        Reaching the threshold clears the node's window: a renewal of an active verdict takes
        ``failures_to_cordon`` fresh failures, adds them to its severity and extends it.
        """
        if not node or reason not in NODE_SUSPECT_FAILURES or self.policy.failures_to_cordon <= 0:
            return False
        recent = self._failures[node]
        recent.append((at, job_id))
        while recent and recent[0][0] < at - timedelta(seconds=self.policy.window_s):
            recent.popleft()
        distinct = len({job for _, job in recent})
        if distinct < self.policy.failures_to_cordon:
            return False
        recent.clear()
        current = self._suspects.get(node)
        active = current is not None and current.until > at
        self._suspects[node] = Suspicion(
            node=node,
            failures=distinct + (current.failures if current is not None and active else 0),
            last_failure=at,
            since=current.since if current is not None and active else at,
            until=at + timedelta(seconds=self.policy.cordon_s),
        )
        return not active

    def to_dict(self) -> dict[str, Any]:
        """The recent failures and the verdicts as JSON-able values (the policy is
        configuration, not state: ``from_dict`` takes it)."""
        return {
            "failures": {
                node: [[at.isoformat(), job] for at, job in recent]
                for node, recent in sorted(self._failures.items())
                if recent
            },
            "suspects": [
                {
                    "node": s.node,
                    "failures": s.failures,
                    "last_failure": s.last_failure.isoformat(),
                    "since": s.since.isoformat(),
                    "until": s.until.isoformat(),
                }
                for _, s in sorted(self._suspects.items())
            ],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any], policy: NodeHealthPolicy) -> NodeHealth:
        """The state ``to_dict`` wrote, under ``policy``."""
        health = cls(policy=policy)
        for node, recent in data["failures"].items():
            health._failures[node] = deque((datetime.fromisoformat(at), job) for at, job in recent)
        for s in data["suspects"]:
            health._suspects[s["node"]] = Suspicion(
                node=s["node"],
                failures=int(s["failures"]),
                last_failure=datetime.fromisoformat(s["last_failure"]),
                since=datetime.fromisoformat(s["since"]),
                until=datetime.fromisoformat(s["until"]),
            )
        return health

    def suspects(self, now: datetime) -> list[Suspicion]:
        """Every node whose verdict is in force at ``now`` (before the budget)."""
        return [s for s in self._suspects.values() if now < s.until]

    def cordons(self, now: datetime, nodes: Iterable[NodeCapacity]) -> Cordons:
        """The cordons in force at ``now`` on these nodes — failing environments and crash
        verdicts — within the budget."""
        known = list(nodes)
        suspects = with_problems(self.suspects(now), known, now)
        if not suspects:
            return NO_CORDONS
        return within_budget(suspects, known, self.policy.max_cordoned_fraction)
