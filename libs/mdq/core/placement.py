"""Load-aware, priority-aware placement over an in-memory snapshot (pure).

The service hands ``plan`` what it knows — every node's capacity, readiness and live load,
what is already reserved on it, and the queue of pending jobs — and gets back one decision
per job it could place, with the score of every node and why the others were filtered out.

Rules, in order:
- The queue is ordered by priority class (plus an aging bonus, so a low-priority job never
  starves), then by submit time.
- A node is a candidate if it is ready, its load report is fresh, it is not on the job's
  avoid-list (set by recovery; a preference, dropped when no other node fits), and the job's
  requests fit its capacity minus what is reserved.
- Score (higher is better): free capacity after the job lands, where a node's load is the
  larger of its live load and its reservations (the herd guard: what was just bound counts
  before the node's reported load reflects it), minus a penalty for CPU/memory imbalance.
- The brief's rule: a node whose live CPU or memory load is above ``overload_threshold``
  (80%) lowers the job's priority there, by ``overload_penalty`` points.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime


@dataclass(frozen=True, slots=True)
class PlacementConfig:
    """Tunables of the scoring."""

    overload_threshold: float = 0.8
    """Live CPU or memory load above which a node is overloaded."""
    overload_penalty: float = 50.0
    """Score points an overloaded node loses."""
    balance_weight: float = 10.0
    """Score points lost per unit of |cpu share - memory share| after placement."""
    load_timeout_s: float = 15.0
    """A node whose load was last reported longer ago than this is not chosen."""
    aging_per_minute: float = 10.0
    """Priority points a pending job gains per minute of waiting."""


@dataclass(slots=True)
class NodeState:
    """What placement knows of one node."""

    name: str
    cpu_capacity: float
    memory_capacity_mb: int
    ready: bool
    cpu_load: float
    """Live CPU load, 0..1, as last reported."""
    memory_load: float
    """Live memory load, 0..1, as last reported."""
    reported_at: datetime
    reserved_cpu: float = 0.0
    """Sum of CPU requests of the jobs bound to or running on this node."""
    reserved_memory_mb: int = 0
    """Sum of memory requests of the jobs bound to or running on this node."""


@dataclass(frozen=True, slots=True)
class QueuedJob:
    """A pending job, as placement sees it."""

    job_id: str
    cpu: float
    memory_mb: int
    priority: int
    submitted_at: datetime
    avoid_nodes: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class NodeScore:
    """One node's score for one job, or why it was filtered out."""

    node: str
    score: float = 0.0
    filtered: str = ""
    cpu_load: float = 0.0
    memory_load: float = 0.0


@dataclass(frozen=True, slots=True)
class Decision:
    """A job bound to ``node``, with the scores that explain the choice."""

    job_id: str
    node: str
    scores: tuple[NodeScore, ...] = field(default=())


def effective_priority(job: QueuedJob, now: datetime, config: PlacementConfig) -> float:
    """Priority class plus aging."""
    waited_min = max(0.0, (now - job.submitted_at).total_seconds() / 60.0)
    return job.priority + config.aging_per_minute * waited_min


def score_node(
    node: NodeState,
    job: QueuedJob,
    now: datetime,
    config: PlacementConfig,
    *,
    honour_avoid: bool = True,
) -> NodeScore:
    """Filter and score one node for one job."""
    cpu_share = (
        max(node.cpu_load, node.reserved_cpu / node.cpu_capacity) if node.cpu_capacity else 1.0
    )
    mem_share = (
        max(node.memory_load, node.reserved_memory_mb / node.memory_capacity_mb)
        if node.memory_capacity_mb
        else 1.0
    )
    base = NodeScore(node=node.name, cpu_load=node.cpu_load, memory_load=node.memory_load)
    if not node.ready:
        return replace(base, filtered="not ready")
    if (now - node.reported_at).total_seconds() > config.load_timeout_s:
        return replace(base, filtered="load report too old")
    if honour_avoid and node.name in job.avoid_nodes:
        return replace(base, filtered="avoided after a failure there")
    if node.reserved_cpu + job.cpu > node.cpu_capacity + 1e-9:
        return replace(base, filtered="insufficient cpu")
    if node.reserved_memory_mb + job.memory_mb > node.memory_capacity_mb:
        return replace(base, filtered="insufficient memory")
    cpu_after = min(1.0, cpu_share + job.cpu / node.cpu_capacity)
    mem_after = min(1.0, mem_share + job.memory_mb / node.memory_capacity_mb)
    score = 100.0 * (1.0 - max(cpu_after, mem_after))
    score -= config.balance_weight * abs(cpu_after - mem_after)
    if max(node.cpu_load, node.memory_load) > config.overload_threshold:
        score -= config.overload_penalty
    return replace(base, score=round(score, 3))


def order_queue(
    queue: Iterable[QueuedJob], now: datetime, config: PlacementConfig
) -> list[QueuedJob]:
    """Highest effective priority first, then oldest first."""
    return sorted(
        queue,
        key=lambda job: (-effective_priority(job, now, config), job.submitted_at, job.job_id),
    )


def plan(
    nodes: Sequence[NodeState],
    queue: Iterable[QueuedJob],
    now: datetime,
    config: PlacementConfig = PlacementConfig(),
) -> list[Decision]:
    """Bind as many queued jobs as fit; reserve each on its node as it goes (herd guard).

    ``nodes`` are updated in place (their reservations grow by what was bound).
    """
    decisions: list[Decision] = []
    for job in order_queue(queue, now, config):
        scores = tuple(score_node(node, job, now, config) for node in nodes)
        candidates = [s for s in scores if not s.filtered]
        if not candidates and job.avoid_nodes:
            # The avoid-list is a preference: rather the same node than no node at all.
            scores = tuple(score_node(node, job, now, config, honour_avoid=False) for node in nodes)
            candidates = [s for s in scores if not s.filtered]
        if not candidates:
            continue
        best = max(candidates, key=lambda s: (s.score, -_index(nodes, s.node)))
        chosen = next(node for node in nodes if node.name == best.node)
        chosen.reserved_cpu += job.cpu
        chosen.reserved_memory_mb += job.memory_mb
        decisions.append(Decision(job_id=job.job_id, node=best.node, scores=scores))
    return decisions


def _index(nodes: Sequence[NodeState], name: str) -> int:
    for index, node in enumerate(nodes):
        if node.name == name:
            return index
    return len(nodes)
