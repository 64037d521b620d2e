"""Node health: a node whose environment is failing, or on which many different jobs crash, is
cordoned, within a budget that never lets mdq's own cordons take out the cluster (pure).

A node reports its environment's problem with its load (``NodeLoad.problem``: its data folder
full, read-only, failing or not mounted, pods that could not start; on Kubernetes a pressure
condition): such a node is cordoned while it reports one, worst first in the budget below
(a direct observation, where a crash is a guess), and takes work again with its first report
without one. The failures its jobs met there (FAILURE_ENVIRONMENT) charge neither them nor it.

One job crashing says little about its node; several different jobs crashing on the same node
within a short window points at the node (a bad disk, a flaky GPU, a broken library). Placement
folds every ``attempt_failed`` event into ``NodeHealth`` — with the event's own time, so a
restarted placement reaches the same verdict from the log — and a node with
``failures_to_cordon`` distinct failed jobs within ``window_s`` becomes *suspect* for
``cordon_s``. A suspect node is cordoned (no new work; running work stays) only as far as the
budget allows (``cordons``).

Which failures count (only those that implicate the node as a place to run jobs):
- FAILURE_CRASHED — counts. The runner itself ended with an unexpected error or signal; on one
  node, across distinct jobs, that is the node's signature.
- FAILURE_NODE_LOST — does not count. The node or its agent went away (no heartbeat, Kubernetes
  NodeLost, or a restarted agent finding the pods its predecessor ran): infrastructure, not
  evidence that the node is bad for jobs. kill -9 of the local node agent produces exactly
  this: its runners die with it (PR_SET_PDEATHSIG), nobody is left to report their exit, and
  their pods end "NodeLost" — from the restarted agent, or from the backend's heartbeat check
  if the agent stays away — which recovery classifies as FAILURE_NODE_LOST. Counting it is how
  one agent kill on the two-node stack cordoned both nodes.
- FAILURE_LOST — does not count. Silence is the control plane's own observation, and its usual
  causes are not the node: the node or agent died before it was declared lost (on Kubernetes
  the 60 s silence rule fires before a NotReady node's pods end NodeLost), the bus was away (every
  runner on every node falls silent at once), the watcher stalled. A node that is really
  unreachable is already kept out by readiness; a job lost on a node avoids it on its retry.
- FAILURE_ENVIRONMENT (the data disk full, read-only, failing or unmounted; a pod that could not
  start) — does not count: the node says so itself with its ``problem``, which cordons it
  directly, and a shared volume fails every node at once.
- FAILURE_EVICTED (preemption, drain, agent shut down), FAILURE_OOM_KILLED (the job's request),
  FAILURE_UNSTABLE and FAILURE_INVALID_INPUT (the job's physics or input): the job's or the
  operator's doing — do not count.

The budget (``within_budget``), in CPU capacity of the *ready* nodes (unready nodes are out
already and take no part): cordons are chosen worst first — a reported problem, then most
distinct failures, then most recent failure — and one is applied only if, counting operator
cordons, the cordoned capacity stays within ``max_cordoned_fraction`` of the ready capacity.
One exception keeps a small cluster able to fence off its one bad node: when no other ready
node is cordoned, a single node holding at most half of the ready capacity may be cordoned (two
equal nodes: one of them). Never is the last schedulable (ready, uncordoned) node cordoned. A
suspect node the budget leaves open is reported ``held_back``: it keeps taking work. Like
Kubernetes' node lifecycle controller, which stops evicting when most of a zone looks
unhealthy, the reasoning is that when much of the cluster looks bad at once the fault is more
likely the scheduler's own view (the bus, the control plane, an agent) than the nodes.
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
