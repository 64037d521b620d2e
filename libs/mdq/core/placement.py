"""Load-aware, priority-aware placement over an in-memory snapshot (pure).

The service hands ``plan`` what it knows — every node's capacity, readiness, cordon and live
load, what is already reserved on it and what was bound there since its last load report, and
the queue of pending jobs — and gets back one decision per job it could place, with the score
of every node it scored and why the others were filtered out. ``plan_preemptions`` says which
lower-priority running jobs to stop for a high-priority job that fits nowhere.

The rules (queue order, filters, the herd guard, the score, clusters, tenant quotas, fair share,
scaling) are docs/placement.md's, "The algorithm (``plan``)" and the sections after it.
"""

from __future__ import annotations

import functools
import heapq
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import NamedTuple

from mdq.core.clusters import NO_SELECTOR, Selector, cluster_of, locality
from mdq.core.fairshare import Fairness, FairQueue
from mdq.core.nodes import NodeSample

NOT_READY = "not ready"
CORDONED = "cordoned"
LOAD_STALE = "load report too old"
OVERLOADED = "load above hard threshold"
AVOIDED = "avoided after a failure there"
NO_CPU = "insufficient cpu"
NO_MEMORY = "insufficient memory"
CLUSTER_MISMATCH = "cluster labels do not match"

EXPLAIN_FILTERED_LIMIT = 16
"""Filtered nodes listed by name in a decision on a large cluster (the rest are counted)."""


@dataclass(frozen=True, slots=True)
class PlacementConfig:
    """Tunables of filtering, scoring and scaling."""

    overload_threshold: float = 0.8
    """Live CPU or memory load above which a node lowers a job's score there."""
    overload_penalty: float = 50.0
    """Score points an overloaded node loses."""
    hard_load_threshold: float = 0.95
    """Live CPU or memory load (with in-flight bindings) above which a node is not chosen."""
    target_load: float = 0.0
    """TargetLoadPacking target utilisation, 0..1; 0 spreads (least loaded first)."""
    balance_weight: float = 10.0
    """Score points lost per unit of |cpu share - memory share| after placement."""
    load_timeout_s: float = 15.0
    """A node whose load was last reported longer ago than this is not chosen."""
    aging_per_minute: float = 10.0
    """Priority points a pending job gains per minute of waiting."""
    full_scan_nodes: int = 32
    """Up to this many eligible nodes, every node is scored for every job."""
    sample_size: int = 4
    """On larger clusters: how many fitting best-ranked nodes are scored per job."""
    max_examined: int = 64
    """On larger clusters: at most this many ranked nodes are looked at before a full scan."""
    cluster_preference_weight: float = 20.0
    """Points for a node whose cluster has every label the job prefers (pro rata)."""
    locality_weight: float = 15.0
    """Points for a node whose cluster holds every dependency's outputs (pro rata)."""
    cluster_load_weight: float = 10.0
    """Points a node loses per unit of its cluster's reserved CPU share (several clusters)."""


NEVER_REPORTED = datetime.min.replace(tzinfo=UTC)
"""``reported_at`` of a node with no load report: older than any load timeout, never chosen."""


# Every field placement adds has a default, so that ``PlacementState.node_states`` can build
# one from positional arguments alone, NodeSample's fields first: a class call with keyword
# arguments builds a dict of them, every node of every pass.
@dataclass(slots=True)
class NodeState(NodeSample):
    """What placement knows of one node: its latest report, and what was bound there since."""

    reported_at: datetime = NEVER_REPORTED
    """When the report was made (a ``NodeLoad`` event's time)."""
    reserved_cpu: float = 0.0
    """Sum of CPU requests of the jobs bound to or running on this node."""
    reserved_memory_mb: int = 0
    """Sum of memory requests of the jobs bound to or running on this node."""
    inflight_cpu: float = 0.0
    """CPU requests bound here that the last load report cannot reflect yet (herd guard)."""
    inflight_memory_mb: int = 0
    """Memory requests bound here that the last load report cannot reflect yet."""

    def cpu_share(self) -> float:
        """Effective CPU utilisation: max(live + in-flight, reservations), 0..1+."""
        if self.cpu_capacity <= 0:
            return 1.0
        return max(
            self.cpu_load + self.inflight_cpu / self.cpu_capacity,
            self.reserved_cpu / self.cpu_capacity,
        )

    def memory_share(self) -> float:
        """Effective memory utilisation: max(live + in-flight, reservations), 0..1+."""
        if self.memory_capacity_mb <= 0:
            return 1.0
        return max(
            self.memory_load + self.inflight_memory_mb / self.memory_capacity_mb,
            self.reserved_memory_mb / self.memory_capacity_mb,
        )

    def expected_loads(self) -> tuple[float, float]:
        """Live CPU and memory load plus what was bound since the report."""
        cpu = self.cpu_load + (self.inflight_cpu / self.cpu_capacity if self.cpu_capacity else 1)
        memory = self.memory_load + (
            self.inflight_memory_mb / self.memory_capacity_mb if self.memory_capacity_mb else 1
        )
        return cpu, memory

    def expected_load(self) -> float:
        """Live load plus what was bound since the report: the larger of CPU and memory (what
        the hard threshold is compared with)."""
        return max(self.expected_loads())


@dataclass(frozen=True, slots=True)
class QueuedJob:
    """A pending job, as placement sees it."""

    job_id: str
    cpu: float
    memory_mb: int
    priority: int
    submitted_at: datetime
    avoid_nodes: frozenset[str] = frozenset()
    nominated_node: str = ""
    """Set after this job preempted work there: its requests are held on that node."""
    tenant: str = ""
    """Whose job it is (``mdq.core.ids.tenant_of``); "" for the operator's."""
    clusters: Selector = NO_SELECTOR
    """The clusters it requires and prefers (its spec's ``clusters``)."""
    data_clusters: tuple[str, ...] = ()
    """The cluster holding each dependency's outputs ("" where not known): data locality."""


@dataclass(frozen=True, slots=True)
class RunningJob:
    """A bound or running job that a higher-priority job might preempt."""

    job_id: str
    node: str
    cpu: float
    memory_mb: int
    priority: int
    started_at: datetime | None = None
    tenant: str = ""
    """Whose job it is ("" the operator's)."""
    checkpoint_at: datetime | None = None
    """When its latest checkpoint was reported (None: none yet this run)."""


class NodeScore(NamedTuple):
    """One node's score for one job, or why it was filtered out (a tuple: made per node).

    ``cpu_load`` and ``memory_load`` are the figures the decision used, 0..1 and above
    (docs/placement.md, "What mdq explain shows"): for a scored node its utilisation with the
    job placed (what the load term of the score used); for a node filtered as overloaded its
    live load plus what was bound there since its report (what the hard threshold was
    compared with); for one filtered for room, its reservations plus the job's requests over
    its capacity; for any other filter, its utilisation before the job."""

    node: str
    score: float = 0.0
    filtered: str = ""
    cpu_load: float = 0.0
    memory_load: float = 0.0


@dataclass(frozen=True, slots=True)
class ClusterSummary:
    """How one cluster fared for one job: its best scored node, or why it had none."""

    cluster: str
    best_score: float = 0.0
    best_node: str = ""
    candidates: int = 0
    filtered_counts: dict[str, int] = field(default_factory=dict)
    cpu_reserved: float = 0.0
    """Its reserved CPU share when the pass began (the cluster load term)."""


@dataclass(slots=True)
class Decision:
    """A job bound to ``node``, with the scores that explain the choice (read only, by
    convention: ``plan`` makes one per job bound, and a frozen dataclass's ``__init__`` would
    cost a tenth of a decision)."""

    job_id: str
    node: str
    scores: tuple[NodeScore, ...] = field(default=())
    filtered_counts: dict[str, int] = field(default_factory=dict)
    """Nodes filtered out, per reason (all of them, named in ``scores`` or not)."""
    nodes_total: int = 0
    not_examined: int = 0
    """Eligible nodes that were not scored (the heap ranked them lower)."""
    clusters: tuple[ClusterSummary, ...] = ()
    """Every cluster's best node or filters (empty with one unnamed cluster)."""


@dataclass(frozen=True, slots=True)
class Preemption:
    """Stop ``victims`` on ``node`` so that ``job_id`` fits there."""

    job_id: str
    node: str
    victims: tuple[str, ...]
    reason: str


# -- queue order -------------------------------------------------------------------------------
def effective_priority(job: QueuedJob, now: datetime, config: PlacementConfig) -> float:
    """Priority class plus aging."""
    waited_min = max(0.0, (now - job.submitted_at).total_seconds() / 60.0)
    return job.priority + config.aging_per_minute * waited_min


def queue_key(job: QueuedJob, config: PlacementConfig) -> tuple[float, float, str]:
    """Sort key of the queue: independent of "now" because every job ages at the same rate."""
    submitted = job.submitted_at.timestamp()
    if config.aging_per_minute > 0:
        return (submitted - 60.0 * job.priority / config.aging_per_minute, submitted, job.job_id)
    return (-float(job.priority), submitted, job.job_id)


def order_queue(
    queue: Iterable[QueuedJob], now: datetime, config: PlacementConfig
) -> list[QueuedJob]:
    """Highest effective priority first, then oldest first (``now`` kept for the API)."""
    del now
    return sorted(queue, key=lambda job: queue_key(job, config))


# -- filtering and scoring ---------------------------------------------------------------------
def node_filter(
    node: NodeState, now: datetime, config: PlacementConfig, *, check_load: bool = True
) -> str:
    """Why no job may go to ``node`` now, or "" (the job-independent filters)."""
    if not node.ready:
        return NOT_READY
    if node.cordoned:
        return f"{CORDONED}: {node.problem}" if node.problem else CORDONED
    if (now - node.reported_at).total_seconds() > config.load_timeout_s:
        return LOAD_STALE
    if check_load and node.expected_load() > config.hard_load_threshold:
        return OVERLOADED
    return ""


def job_filter(node: NodeState, job: QueuedJob, *, honour_avoid: bool = True) -> str:
    """Why ``job`` may not go to ``node``, or "" (cluster labels, avoid-list, fit)."""
    if job.clusters.require and not job.clusters.admits(node.cluster_labels):
        return CLUSTER_MISMATCH
    if honour_avoid and node.name in job.avoid_nodes:
        return AVOIDED
    if node.reserved_cpu + job.cpu > node.cpu_capacity + 1e-9:
        return NO_CPU
    if node.reserved_memory_mb + job.memory_mb > node.memory_capacity_mb:
        return NO_MEMORY
    return ""


def load_score(utilisation: float, target: float) -> float:
    """0..100 for a utilisation: least loaded best (target 0), or peaking at the target."""
    u = 0.0 if utilisation < 0.0 else 1.0 if utilisation > 1.0 else utilisation
    if target <= 0.0:
        return 100.0 * (1.0 - u)
    if u <= target:
        return 100.0 * (target + (1.0 - target) * u / target)
    return 100.0 * target * (1.0 - u) / (1.0 - target) if target < 1.0 else 100.0


def _rank(node: NodeState, config: PlacementConfig, penalty: float = 0.0) -> float:
    """Job-independent rank of an eligible node (its load score before any job lands, less
    its cluster's load ``penalty``)."""
    return load_score(max(node.cpu_share(), node.memory_share()), config.target_load) - penalty


def _rank_of(node: NodeState, target: float) -> float:
    """``_rank`` without a cluster penalty, its shares inlined (computed the same way: the
    heap of a large cluster is built from it, a node at a time)."""
    cpu_cap, mem_cap = node.cpu_capacity, node.memory_capacity_mb
    if cpu_cap <= 0:
        cpu = 1.0
    else:
        cpu = node.cpu_load + node.inflight_cpu / cpu_cap
        reserved = node.reserved_cpu / cpu_cap
        cpu = reserved if reserved > cpu else cpu
    if mem_cap <= 0:
        mem = 1.0
    else:
        mem = node.memory_load + node.inflight_memory_mb / mem_cap
        reserved = node.reserved_memory_mb / mem_cap
        mem = reserved if reserved > mem else mem
    return load_score(mem if mem > cpu else cpu, target)


def cluster_terms(node: NodeState, job: QueuedJob, config: PlacementConfig) -> float:
    """The job-dependent cluster points of ``node`` for ``job``: preferred labels, locality."""
    points = 0.0
    if job.clusters.prefer:
        points += config.cluster_preference_weight * job.clusters.preference(node.cluster_labels)
    if job.data_clusters:
        points += config.locality_weight * locality(job.data_clusters, node.cluster)
    return points


def cluster_load_penalties(
    nodes: Iterable[NodeState], config: PlacementConfig
) -> dict[str, tuple[float, float]]:
    """cluster -> (its reserved CPU share, the points its nodes lose for it), over ``nodes``
    (the eligible ones); empty with fewer than two clusters, where the term would only shift
    every score alike."""
    totals: dict[str, list[float]] = {}
    for node in nodes:
        entry = totals.setdefault(node.cluster, [0.0, 0.0])
        entry[0] += node.reserved_cpu
        entry[1] += node.cpu_capacity
    if len(totals) < 2:
        return {}
    penalties: dict[str, tuple[float, float]] = {}
    for cluster, (reserved, capacity) in totals.items():
        share = min(1.0, reserved / capacity) if capacity > 0 else 1.0
        penalties[cluster] = (share, config.cluster_load_weight * share)
    return penalties


def _score_fitting(
    node: NodeState, job: QueuedJob, config: PlacementConfig, penalty: float = 0.0
) -> NodeScore:
    # the hot path of plan: NodeState.cpu_share/memory_share/expected_load, inlined
    cpu_cap, mem_cap = node.cpu_capacity, node.memory_capacity_mb
    cpu_live = node.cpu_load + node.inflight_cpu / cpu_cap
    mem_live = node.memory_load + node.inflight_memory_mb / mem_cap
    reserved_cpu, reserved_mem = node.reserved_cpu / cpu_cap, node.reserved_memory_mb / mem_cap
    cpu_after = (cpu_live if cpu_live > reserved_cpu else reserved_cpu) + job.cpu / cpu_cap
    mem_after = (mem_live if mem_live > reserved_mem else reserved_mem) + job.memory_mb / mem_cap
    cpu_after = 1.0 if cpu_after > 1.0 else cpu_after
    mem_after = 1.0 if mem_after > 1.0 else mem_after
    u = cpu_after if cpu_after > mem_after else mem_after
    if config.target_load <= 0.0:  # load_score's spreading case, inlined
        score = 100.0 * (1.0 - (0.0 if u < 0.0 else u))
    else:
        score = load_score(u, config.target_load)
    score -= config.balance_weight * abs(cpu_after - mem_after)
    if cpu_live > config.overload_threshold or mem_live > config.overload_threshold:
        score -= config.overload_penalty
    if job.clusters.prefer or job.data_clusters:
        score += cluster_terms(node, job, config)
    score -= penalty
    return NodeScore(node.name, round(score, 3), "", cpu_after, mem_after)


def _filtered(node: NodeState, reason: str, job: QueuedJob | None = None) -> NodeScore:
    """A node filtered out, with the figures its filter looked at."""
    if reason == OVERLOADED:
        cpu, memory = node.expected_loads()
    elif job is not None and reason in (NO_CPU, NO_MEMORY):
        cpu = _ratio(node.reserved_cpu + job.cpu, node.cpu_capacity)
        memory = _ratio(node.reserved_memory_mb + job.memory_mb, node.memory_capacity_mb)
    else:
        cpu, memory = node.cpu_share(), node.memory_share()
    return NodeScore(node.name, 0.0, reason, cpu, memory)


def _ratio(amount: float, capacity: float) -> float:
    return amount / capacity if capacity > 0 else 1.0


def score_node(
    node: NodeState,
    job: QueuedJob,
    now: datetime,
    config: PlacementConfig,
    *,
    honour_avoid: bool = True,
) -> NodeScore:
    """Filter and score one node for one job."""
    reason = node_filter(node, now, config) or job_filter(node, job, honour_avoid=honour_avoid)
    if reason:
        return _filtered(node, reason, job)
    return _score_fitting(node, job, config)


def summarise_clusters(
    scores: Iterable[NodeScore],
    penalties: Mapping[str, tuple[float, float]],
    filtered_before: Mapping[str, Mapping[str, int]] | None = None,
) -> tuple[ClusterSummary, ...]:
    """Per cluster (every one in ``filtered_before`` — the nodes already filtered out per
    cluster and reason — and every one a score names): its best candidate and score, its
    candidates and its filtered nodes per reason; best first."""
    best: dict[str, NodeScore] = {}
    candidates: dict[str, int] = {}
    filtered: dict[str, dict[str, int]] = {
        cluster: dict(counts) for cluster, counts in (filtered_before or {}).items()
    }
    for score in scores:
        cluster = cluster_of(score.node)
        counts = filtered.setdefault(cluster, {})
        if score.filtered:
            counts[score.filtered] = counts.get(score.filtered, 0) + 1
            continue
        candidates[cluster] = candidates.get(cluster, 0) + 1
        known = best.get(cluster)
        if known is None or (score.score, known.node) > (known.score, score.node):
            best[cluster] = score
    summaries = [
        ClusterSummary(
            cluster=cluster,
            best_score=best[cluster].score if cluster in best else 0.0,
            best_node=best[cluster].node if cluster in best else "",
            candidates=candidates.get(cluster, 0),
            filtered_counts=counts,
            cpu_reserved=round(penalties[cluster][0], 4) if cluster in penalties else 0.0,
        )
        for cluster, counts in filtered.items()
    ]
    summaries.sort(key=lambda s: (not s.best_node, -s.best_score, s.cluster))
    return tuple(summaries)


# -- planning ----------------------------------------------------------------------------------
def _best(candidates: Sequence[NodeScore], order: dict[str, int]) -> NodeScore:
    """The highest score; among equal scores the node that comes first in ``order``."""
    best = candidates[0]
    for score in candidates[1:]:
        if score.score > best.score or (
            score.score == best.score and order[score.node] < order[best.node]
        ):
            best = score
    return best


class _SortedOut(NamedTuple):
    """Some of a plan's nodes, sorted into the eligible and the filtered out."""

    eligible: list[NodeState]
    """The eligible ones, in the nodes' order."""
    ranked: list[tuple[float, int, int, str]]
    """(-rank, index, version 0, name) of each eligible node (the heap's entries), in order."""
    filtered: list[tuple[int, str]]
    """(index, reason) of each node filtered out before any job, in order."""
    clustered: bool
    """Whether any of them belongs to a named cluster."""


def _sort_out(
    nodes: Sequence[NodeState], indices: Iterable[int], now: datetime, config: PlacementConfig
) -> _SortedOut:
    """Sort the nodes at ``indices`` (in increasing order) into eligible and filtered out at
    ``now``, with each eligible node's job-independent rank."""
    timeout, hard, target = config.load_timeout_s, config.hard_load_threshold, config.target_load
    # a report is too old when (now - reported_at).total_seconds() > timeout; with a
    # timeout in whole microseconds that is reported_at < now - timeout, exactly
    limit = timedelta(seconds=timeout)
    inline = limit.total_seconds() == timeout  # else node_filter decides for every node
    cutoff = now - limit if inline else now
    spreading = target <= 0.0
    eligible: list[NodeState] = []
    ranked: list[tuple[float, int, int, str]] = []
    filtered: list[tuple[int, str]] = []
    clustered = False
    for index in indices:
        node = nodes[index]
        if node.cluster:
            clustered = True
        # node_filter and _rank_of, inlined (a plan's cost grows with the cluster)
        cpu_cap, mem_cap = node.cpu_capacity, node.memory_capacity_mb
        if (
            inline
            and node.ready
            and not node.cordoned
            and not node.reported_at < cutoff
            and cpu_cap > 0
            and mem_cap > 0
        ):
            cpu = node.cpu_load + node.inflight_cpu / cpu_cap
            mem = node.memory_load + node.inflight_memory_mb / mem_cap
            if not (mem if mem > cpu else cpu) > hard:
                eligible.append(node)
                reserved = node.reserved_cpu / cpu_cap
                cpu = reserved if reserved > cpu else cpu
                reserved = node.reserved_memory_mb / mem_cap
                mem = reserved if reserved > mem else mem
                used = mem if mem > cpu else cpu
                if spreading:  # load_score's spreading case, inlined
                    rank = 100.0 * (1.0 - (0.0 if used < 0.0 else 1.0 if used > 1.0 else used))
                else:
                    rank = load_score(used, target)
                ranked.append((-rank, index, 0, node.name))
                continue
        reason = node_filter(node, now, config)
        if not reason:
            eligible.append(node)
            ranked.append((-_rank_of(node, target), index, 0, node.name))
        else:
            filtered.append((index, reason))
    return _SortedOut(eligible, ranked, filtered, clustered)


class NodeRanking:
    """Which of a pass's nodes are eligible, and their job-independent ranks, kept from one
    pass to the next over the same list of nodes (``PlacementState.pass_nodes``): a plan then
    sorts out only the nodes made again since the last pass, rather than the whole cluster
    every pass (docs/placement.md, "Scaling").

    The owner hands each pass's list over with ``lend``, saying which of its nodes are new
    since the last; ``plan`` (given the ranking) uses it for that list once. Every node is
    sorted out again when the list changed shape, the configuration changed, the oldest
    load report of an eligible node may have gone stale since, or the clock went back."""

    def __init__(self) -> None:
        self._lent: Sequence[NodeState] | None = None
        """The list of the pass under way, until a plan took it."""
        self._changed: set[int] | None = None
        """Indices of the nodes made again since the ranking was brought up to date (None:
        every node is to be sorted out again)."""
        self._config: PlacementConfig | None = None
        self._entries: list[tuple[float, int, int, str] | None] = []
        """Index -> the node's heap entry (None: filtered out)."""
        self._reasons: dict[int, str] = {}
        """Index -> why the node is filtered out."""
        self._clustered: set[int] = set()
        """Indices of the nodes of a named cluster."""
        self._fresh_until = NEVER_REPORTED
        """Until when no eligible node's load report can have gone stale."""
        self._sorted_at = NEVER_REPORTED
        """The time of the last sorting out (a clock set back sorts every node out again: a
        report stale then may not be now)."""

    def lend(self, nodes: Sequence[NodeState], changed: Iterable[int] | None) -> None:
        """``nodes`` are the next pass's; those at the indices ``changed`` were made again
        since the last list lent (None: all of them are new)."""
        if changed is None or self._changed is None or len(nodes) != len(self._entries):
            self._changed = None
        else:
            self._changed.update(changed)
        self._lent = nodes

    def take(
        self, nodes: Sequence[NodeState], now: datetime, config: PlacementConfig
    ) -> _SortedOut | None:
        """The nodes sorted out at ``now`` for a plan over ``nodes``; None unless ``nodes`` is
        the list lent last and not taken yet (a plan changes the nodes it binds on)."""
        if nodes is not self._lent:
            return None
        self._lent = None
        limit = timedelta(seconds=config.load_timeout_s)
        if limit.total_seconds() != config.load_timeout_s:  # node_filter's own arithmetic
            self._changed = None
            return None
        changed = self._changed
        if (
            changed is None
            or config != self._config
            or now > self._fresh_until
            or now < self._sorted_at
        ):
            self._sort_all(nodes, now, config, limit)
        elif changed:
            self._sort_again(nodes, sorted(changed), now, config, limit)
        self._changed = set()
        self._sorted_at = now
        ranked = [entry for entry in self._entries if entry is not None]
        return _SortedOut(
            [nodes[entry[1]] for entry in ranked],
            ranked,
            sorted(self._reasons.items()),
            bool(self._clustered),
        )

    def _sort_all(
        self, nodes: Sequence[NodeState], now: datetime, config: PlacementConfig, limit: timedelta
    ) -> None:
        sorted_out = _sort_out(nodes, range(len(nodes)), now, config)
        self._config = config
        entries: list[tuple[float, int, int, str] | None] = [None] * len(nodes)
        for entry in sorted_out.ranked:
            entries[entry[1]] = entry
        self._entries = entries
        self._reasons = dict(sorted_out.filtered)
        self._clustered = {index for index, node in enumerate(nodes) if node.cluster}
        self._fresh_until = datetime.max.replace(tzinfo=UTC)
        self._note_freshness(nodes, sorted_out, limit)

    def _sort_again(
        self,
        nodes: Sequence[NodeState],
        indices: list[int],
        now: datetime,
        config: PlacementConfig,
        limit: timedelta,
    ) -> None:
        sorted_out = _sort_out(nodes, indices, now, config)
        entries, reasons, clustered = self._entries, self._reasons, self._clustered
        for index in indices:
            entries[index] = None
            reasons.pop(index, None)
            if nodes[index].cluster:
                clustered.add(index)
            else:
                clustered.discard(index)
        for entry in sorted_out.ranked:
            entries[entry[1]] = entry
        reasons.update(sorted_out.filtered)
        self._note_freshness(nodes, sorted_out, limit)

    def _note_freshness(
        self, nodes: Sequence[NodeState], sorted_out: _SortedOut, limit: timedelta
    ) -> None:
        """Bring ``_fresh_until`` down to when the oldest report among the nodes just sorted
        out goes stale, of those that staleness would change: the eligible, and those filtered
        for their load (``node_filter`` names staleness first). A newer report of that node
        leaves it early: the next sorting out of every node puts it right."""
        fresh_until = self._fresh_until
        for node in sorted_out.eligible:
            if node.reported_at + limit < fresh_until:
                fresh_until = node.reported_at + limit
        for index, reason in sorted_out.filtered:
            reported_at = nodes[index].reported_at
            if reason == OVERLOADED and reported_at + limit < fresh_until:
                fresh_until = reported_at + limit
        self._fresh_until = fresh_until


class _Planner:
    """One ``plan`` call: the eligible nodes, their heap, and what fit nowhere."""

    def __init__(
        self,
        nodes: Sequence[NodeState],
        now: datetime,
        config: PlacementConfig,
        ranking: NodeRanking | None = None,
    ) -> None:
        self.config = config
        self.nodes = nodes
        self.nodes_total = len(nodes)
        self.static: list[NodeScore] = []
        self.static_counts: dict[str, int] = {}
        sorted_out = ranking.take(nodes, now, config) if ranking is not None else None
        if sorted_out is None:
            sorted_out = _sort_out(nodes, range(len(nodes)), now, config)
        self.eligible = sorted_out.eligible
        ranked = sorted_out.ranked
        """(-rank, index, version 0, name) of every eligible node (the heap's entries)."""
        clustered = sorted_out.clustered
        for index, reason in sorted_out.filtered:
            self.static.append(_filtered(nodes[index], reason))
            self.static_counts[reason] = self.static_counts.get(reason, 0) + 1
        self.clustered = clustered
        self.small = len(self.eligible) <= config.full_scan_nodes
        self.static_listed = tuple(
            self.static if self.small else self.static[:EXPLAIN_FILTERED_LIMIT]
        )
        """The nodes filtered out before any job that each decision lists."""
        self.penalties = cluster_load_penalties(self.eligible, config) if self.clustered else {}
        """cluster -> (reserved CPU share, points lost), with several clusters only."""
        self.static_by_cluster: dict[str, dict[str, int]] = {}
        """cluster -> its nodes filtered out before any job, per reason (every cluster)."""
        if self.clustered:
            for node in nodes:
                self.static_by_cluster.setdefault(node.cluster, {})
            for score in self.static:
                counts = self.static_by_cluster[cluster_of(score.node)]
                counts[score.filtered] = counts.get(score.filtered, 0) + 1
        self.position: dict[str, int] = {}
        """name -> index in ``eligible`` (made by the first full scan that needs it)."""
        self.version: dict[str, int] = {}
        """name -> how many times its room changed in this plan (absent: never)."""
        self.sampled_scores: dict[tuple[float, int], dict[str, tuple[int, NodeScore, bool]]] = {}
        """(cpu, memory) -> node -> (the node's version, its score or filter for a job of that
        shape without cluster labels or an avoid-list, whether it fits): a node the heap
        offers again to a job of the same shape is scored again only when its room changed."""
        self.touched: list[str] = []
        """Nodes whose room changed in this plan, in order (a cached scan redoes these)."""
        self.scans: dict[
            tuple[float, int, Selector, tuple[str, ...]], tuple[int, list[NodeScore]]
        ] = {}
        """The last full scan of each job shape (cpu, memory, cluster terms) without an
        avoid-list to honour: ``len(touched)`` when it was made, and its scores in
        ``eligible`` order."""
        self.heap: list[tuple[float, int, int, str]] = []
        self.spare: list[tuple[float, int, int, str]] = []
        """Heap entries the last decision examined and did not bind, best last: they were the
        heap's top, so the next decision looks at them again first (``sampled`` takes the
        better of their last and the heap's top each time) instead of pushing them back."""
        if not self.small:
            if self.penalties:  # several clusters: each node's rank less its cluster's penalty
                penalty = self.penalty
                self.heap = [
                    (-_rank(nodes[index], config, penalty(nodes[index])), index, 0, name)
                    for _, index, _, name in ranked
                ]
            else:
                self.heap = ranked
            heapq.heapify(self.heap)
        self.holds = False
        self.nowhere: list[tuple[float, int]] = []
        """(cpu, memory) of jobs without avoid-lists that fit on no node in this plan."""

    @functools.cached_property
    def order(self) -> dict[str, int]:
        """name -> index in the plan's nodes (made when a full scan or a hold needs it: the
        heap's entries carry their node's index)."""
        return {node.name: index for index, node in enumerate(self.nodes)}

    @functools.cached_property
    def by_name(self) -> dict[str, NodeState]:
        """name -> eligible node (made when a full scan or a hold needs it)."""
        return {node.name: node for node in self.eligible}

    def penalty(self, node: NodeState) -> float:
        if not self.penalties:
            return 0.0
        entry = self.penalties.get(node.cluster)
        return entry[1] if entry is not None else 0.0

    # requests only shrink the room left, so a job at least as big as one that fit nowhere
    # fits nowhere either (a job that requires clusters may fit where the other could not)
    def dominated(self, job: QueuedJob) -> bool:
        if not self.nowhere or self.holds or job.clusters.require:
            return False  # a nominee's held room may come back: no shortcut then
        return any(job.cpu >= cpu and job.memory_mb >= mem for cpu, mem in self.nowhere)

    def remember_nowhere(self, job: QueuedJob) -> None:
        if job.avoid_nodes or job.clusters.require or self.dominated(job):
            return
        self.nowhere = [
            (cpu, mem) for cpu, mem in self.nowhere if not (cpu >= job.cpu and mem >= job.memory_mb)
        ]
        self.nowhere.append((job.cpu, job.memory_mb))

    def hold(self, job: QueuedJob, sign: int) -> None:
        if not job.nominated_node:
            return
        node = self.by_name.get(job.nominated_node)
        if node is not None:
            node.reserved_cpu += sign * job.cpu
            node.reserved_memory_mb += sign * job.memory_mb
            self._touch(node, self.order[node.name])

    def bind(self, node: NodeState, job: QueuedJob, index: int) -> None:
        """Count ``job`` on ``node`` (``index`` in the plan's nodes) and re-rank it."""
        node.reserved_cpu += job.cpu
        node.reserved_memory_mb += job.memory_mb
        node.inflight_cpu += job.cpu
        node.inflight_memory_mb += job.memory_mb
        self._touch(node, index)

    def _touch(self, node: NodeState, index: int) -> None:
        self.touched.append(node.name)
        if self.small:
            return
        version = self.version.get(node.name, 0) + 1
        self.version[node.name] = version
        rank = (
            _rank(node, self.config, self.penalty(node))
            if self.penalties
            else _rank_of(node, self.config.target_load)
        )
        heapq.heappush(self.heap, (-rank, index, version, node.name))

    def _score(self, node: NodeState, job: QueuedJob, honour_avoid: bool) -> NodeScore:
        reason = job_filter(node, job, honour_avoid=honour_avoid)
        if reason:
            return _filtered(node, reason, job)
        return _score_fitting(node, job, self.config, self.penalty(node))

    def full_scan(self, job: QueuedJob, honour_avoid: bool) -> list[NodeScore]:
        """Every eligible node's score for ``job``. A job's scores depend only on its shape
        and the nodes' state, and a binding changes one node: a job shaped like an earlier one
        (a campaign of replicas, say) rescores only the nodes touched since."""
        if honour_avoid and job.avoid_nodes:
            return [self._score(node, job, True) for node in self.eligible]
        shape = (job.cpu, job.memory_mb, job.clusters, job.data_clusters)
        cached = self.scans.get(shape)
        changed = len(self.touched) - cached[0] if cached is not None else 0
        if cached is None or changed >= len(self.eligible):
            scores = [self._score(node, job, False) for node in self.eligible]
        else:
            scores = list(cached[1])
            if not self.position:
                self.position = {node.name: index for index, node in enumerate(self.eligible)}
            for name in set(self.touched[cached[0] :]):
                index = self.position[name]
                scores[index] = self._score(self.eligible[index], job, False)
        self.scans[shape] = (len(self.touched), scores)
        return scores

    def sampled(
        self, job: QueuedJob
    ) -> tuple[list[NodeScore], int, list[tuple[float, int, int, str]], NodeScore | None, int]:
        """Score the best-ranked fitting nodes; returns the scores, the nodes examined, their
        heap entries, taken (the caller keeps them in ``spare``: all but the node it binds,
        which ``bind`` re-ranks), the best fitting score (``_best``'s choice among them, made
        as they are scored; None when none fits) and its node's index in the plan's nodes."""
        popped: list[tuple[float, int, int, str]] = []
        scores: list[NodeScore] = []
        fitting = 0
        best: NodeScore | None = None
        best_score, best_order = 0.0, 0
        heap, version, nodes, config = self.heap, self.version, self.nodes, self.config
        sample_size, max_examined = config.sample_size, config.max_examined
        cpu, memory, avoid = job.cpu, job.memory_mb, job.avoid_nodes
        plain = not (job.clusters.require or avoid)
        cache: dict[str, tuple[int, NodeScore, bool]] | None = None
        if plain:
            cache = self.sampled_scores.get((cpu, memory))
            if cache is None:
                cache = self.sampled_scores[cpu, memory] = {}
        penalised = bool(self.penalties)
        pop = heapq.heappop
        spare = self.spare
        while (heap or spare) and fitting < sample_size and len(popped) < max_examined:
            # the next best entry of the heap and the spare ones together (``spare``)
            entry = spare.pop() if spare and (not heap or spare[-1] < heap[0]) else pop(heap)
            name = entry[3]
            if entry[2] != version.get(name, 0):
                continue  # stale: the node was re-ranked since
            popped.append(entry)
            known = cache.get(name) if cache is not None else None
            if known is not None and known[0] == entry[2]:
                score = known[1]
                fits = known[2]
            else:
                node = nodes[entry[1]]
                # job_filter, inlined when the job has no cluster labels or avoid-list to check
                if plain:
                    if node.reserved_cpu + cpu > node.cpu_capacity + 1e-9:
                        reason = NO_CPU
                    elif node.reserved_memory_mb + memory > node.memory_capacity_mb:
                        reason = NO_MEMORY
                    else:
                        reason = ""
                else:
                    reason = job_filter(node, job)
                fits = not reason
                if fits:
                    penalty = self.penalty(node) if penalised else 0.0
                    score = _score_fitting(node, job, config, penalty)
                else:
                    score = _filtered(node, reason, job)
                if cache is not None:
                    cache[name] = (entry[2], score, fits)
            scores.append(score)
            if fits:
                fitting += 1
                # _best: the highest score, among equals the node first in the nodes' order
                # (a heap entry's index is that order)
                value, rank = score.score, entry[1]
                if (
                    best is None
                    or value > best_score
                    or (value == best_score and rank < best_order)
                ):
                    best, best_score, best_order = score, value, rank
        return scores, len(popped), popped, best, best_order

    def decide(self, job: QueuedJob) -> Decision | None:
        if self.nowhere and self.dominated(job):
            return None
        if job.nominated_node:
            self.hold(job, -1)
        examined = len(self.eligible)
        # preferred labels and locality are not in the heap's job-independent rank: such a job
        # scores every node (replicas of it cost a node per decision, as any shape does)
        if self.small or job.clusters.prefer or job.data_clusters:
            scores = self.full_scan(job, True)
        else:
            scores, examined, popped, chosen, index = self.sampled(job)
            # What is left of ``spare`` ranks after every entry taken, which were taken best
            # first: put back in reverse, they keep it ordered best last.
            if chosen is not None:
                name = chosen.node
                spare = self.spare
                for entry in reversed(popped):
                    if entry[3] != name:
                        spare.append(entry)
                self.bind(self.nodes[index], job, index)  # pushes its new rank
                return self._explain(job, name, scores, examined)
            self.spare.extend(reversed(popped))
            scores, examined = self.full_scan(job, True), len(self.eligible)
        candidates = [s for s in scores if not s.filtered]
        if not candidates and job.avoid_nodes:
            # The avoid-list is a preference: rather the same node than no node at all.
            scores, examined = self.full_scan(job, False), len(self.eligible)
            candidates = [s for s in scores if not s.filtered]
        if not candidates:
            self.hold(job, +1)
            self.remember_nowhere(job)
            return None
        best = _best(candidates, self.order)
        self.bind(self.by_name[best.node], job, self.order[best.node])
        return self._explain(job, best.node, scores, examined)

    def _explain(
        self, job: QueuedJob, node: str, scores: list[NodeScore], examined: int
    ) -> Decision:
        counts = dict(self.static_counts)
        for score in scores:
            if score.filtered:
                counts[score.filtered] = counts.get(score.filtered, 0) + 1
        return Decision(  # positionally, in the fields' order (keywords cost a third more)
            job.job_id,
            node,
            (*scores, *self.static_listed),
            counts,
            self.nodes_total,
            len(self.eligible) - examined,
            summarise_clusters(scores, self.penalties, self.static_by_cluster)
            if self.clustered
            else (),
        )


def plan(
    nodes: Sequence[NodeState],
    queue: Iterable[QueuedJob],
    now: datetime,
    config: PlacementConfig = PlacementConfig(),
    *,
    ordered: bool = False,
    tenant_room: dict[str, float] | None = None,
    fairness: Fairness | None = None,
    capacity: tuple[float, float] | None = None,
    ranking: NodeRanking | None = None,
) -> list[Decision]:
    """Bind as many queued jobs as fit, best job first; each bound job counts on its node at
    once (reservations and in-flight load: the herd guard).

    ``nodes`` are updated in place (their reservations grow by what was bound). Pass
    ``ordered=True`` when ``queue`` is already in ``queue_key`` order. ``tenant_room`` is the
    CPU each tenant listed there may still bind (its quota less what it holds,
    ``mdq.core.tenants.cpu_room``): a job of such a tenant bigger than what is left is not
    bound (it waits; the jobs after it still may be, work-conserving), and the room shrinks in
    place by what is bound. With ``fairness`` and jobs of more than one tenant in the queue,
    the jobs are taken in weighted dominant-resource-fair order instead (``FairQueue``,
    ``mdq.core.fairshare``): the next job of the tenant whose weighted share of the eligible
    nodes' capacity is the smallest, each binding counting at once. ``capacity`` (CPU, memory
    MiB) is what those shares are shares of when ``nodes`` are not every schedulable node (the
    simulator hands over only nodes with room; docs/simulate.md); None: the eligible nodes'.
    ``ranking``: the nodes' ranking kept between passes, when ``nodes`` is the list it lent
    (``NodeRanking``).
    """
    planner = _Planner(nodes, now, config, ranking)
    jobs = list(queue) if ordered else order_queue(queue, now, config)
    for job in jobs:
        if job.nominated_node:
            planner.hold(job, +1)
            planner.holds = True
    decisions: list[Decision] = []
    if not planner.eligible:
        return decisions
    limited = tenant_room or None  # one test per job only when some tenant is limited
    fair: FairQueue[QueuedJob] | None = None
    tenants = {job.tenant for job in jobs} if fairness is not None else set()
    capped = fairness is not None and any(fairness.maximum(t) is not None for t in tenants)
    if fairness is not None and (len(tenants) > 1 or capped):
        total_cpu, total_memory_mb = capacity or (
            sum(node.cpu_capacity for node in planner.eligible),
            float(sum(node.memory_capacity_mb for node in planner.eligible)),
        )
        fair = FairQueue(jobs, fairness, total_cpu=total_cpu, total_memory_mb=total_memory_mb)
    for job in fair if fair is not None else jobs:
        room = limited.get(job.tenant) if limited is not None else None
        if room is not None and job.cpu > room + 1e-9:
            continue  # its tenant's CPU quota: it waits without taking a node's room
        if fair is not None and fair.over_maximum(job):
            continue  # its tenant's maximum share: it waits, the others' jobs still bind
        decision = planner.decide(job)
        if decision is not None:
            decisions.append(decision)
            if fair is not None:
                fair.charge(job)
            if room is not None and limited is not None:
                limited[job.tenant] = room - job.cpu
    return decisions


# -- waiting jobs ------------------------------------------------------------------------------
EXPLAIN_WAITING_LIMIT = 64
"""Nodes listed by name in a waiting job's explanation; the rest are counted per reason."""


@dataclass(frozen=True, slots=True)
class Waiting:
    """Why a queued job was bound nowhere in a pass: each node's filter or score."""

    job_id: str
    scores: tuple[NodeScore, ...]
    """Up to ``EXPLAIN_WAITING_LIMIT`` nodes: the candidates by score, then filtered ones."""
    filtered_counts: dict[str, int]
    """Every filtered node, per reason (named in ``scores`` or not)."""
    nodes_total: int
    summary: str
    """"0/2 nodes are available: 2 cordoned" (the Kubernetes scheduler's words for it)."""
    clusters: tuple[ClusterSummary, ...] = ()
    """Every cluster's best node or filters (empty with one unnamed cluster)."""


def explain_waiting(
    nodes: Sequence[NodeState],
    job: QueuedJob,
    now: datetime,
    config: PlacementConfig = PlacementConfig(),
) -> Waiting:
    """Why ``job`` fits on none of ``nodes`` (as ``plan`` left them: what higher-ranked jobs
    took in the same pass is already reserved). The avoid-list is not applied, since ``plan``
    drops it when nothing else fits; a node that passes every filter is listed with its score
    (the job then waits behind room held for a preemptor, or behind a job ranked before it)."""
    penalties = cluster_load_penalties(
        [node for node in nodes if not node_filter(node, now, config)], config
    )

    def scored(node: NodeState) -> NodeScore:
        reason = node_filter(node, now, config) or job_filter(node, job, honour_avoid=False)
        if reason:
            return _filtered(node, reason, job)
        entry = penalties.get(node.cluster)
        return _score_fitting(node, job, config, entry[1] if entry is not None else 0.0)

    scores = [scored(node) for node in nodes]
    counts: dict[str, int] = {}
    for score in scores:
        if score.filtered:
            counts[score.filtered] = counts.get(score.filtered, 0) + 1
    candidates = sorted((s for s in scores if not s.filtered), key=lambda s: (-s.score, s.node))
    filtered = sorted((s for s in scores if s.filtered), key=lambda s: (s.filtered, s.node))
    if not nodes:
        summary = "no node has reported its load yet"
    else:
        summary = f"{len(candidates)}/{len(nodes)} nodes are available"
        if counts:
            reasons = ", ".join(f"{count} {reason}" for reason, count in sorted(counts.items()))
            summary += f": {reasons}"
        if candidates:
            summary += "; the job waits behind jobs ranked before it or room held for another"
    clustered = any(node.cluster for node in nodes)
    return Waiting(
        job_id=job.job_id,
        scores=tuple((candidates + filtered)[:EXPLAIN_WAITING_LIMIT]),
        filtered_counts=counts,
        nodes_total=len(nodes),
        summary=summary,
        clusters=summarise_clusters(scores, penalties, {node.cluster: {} for node in nodes})
        if clustered
        else (),
    )


# -- preemption --------------------------------------------------------------------------------
def _may_host(node: NodeState, job: QueuedJob) -> bool:
    """Whether ``job`` could run on ``node`` at all (its cluster admitted, not avoided, not
    bigger than it)."""
    if node.name in job.avoid_nodes:
        return False
    if job.clusters.require and not job.clusters.admits(node.cluster_labels):
        return False
    return job.cpu <= node.cpu_capacity + 1e-9 and job.memory_mb <= node.memory_capacity_mb


def _victims_for(
    node: NodeState,
    job: QueuedJob,
    victims: Iterable[RunningJob],
    admit: Callable[[RunningJob], bool] | None = None,
) -> list[RunningJob]:
    """The first of ``victims`` (in order; those ``admit`` refuses are passed over) whose
    stopping makes room for ``job`` on ``node``; [] when they cannot, or none is needed."""
    free_cpu = node.cpu_capacity - node.reserved_cpu
    free_mem = node.memory_capacity_mb - node.reserved_memory_mb
    chosen: list[RunningJob] = []
    for victim in victims:
        if job.cpu <= free_cpu + 1e-9 and job.memory_mb <= free_mem:
            break
        if admit is not None and not admit(victim):
            continue
        chosen.append(victim)
        free_cpu += victim.cpu
        free_mem += victim.memory_mb
    fits = job.cpu <= free_cpu + 1e-9 and job.memory_mb <= free_mem
    return chosen if fits else []


def _make_room(node: NodeState, job: QueuedJob, victims: list[RunningJob], taken: set[str]) -> None:
    """Release ``victims`` on ``node`` and reserve ``job`` there (nobody counts them twice)."""
    for victim in victims:
        taken.add(victim.job_id)
        node.reserved_cpu -= victim.cpu
        node.reserved_memory_mb -= victim.memory_mb
    node.reserved_cpu += job.cpu
    node.reserved_memory_mb += job.memory_mb


def plan_preemptions(
    nodes: Sequence[NodeState],
    unplaced: Iterable[QueuedJob],
    running: Iterable[RunningJob],
    now: datetime,
    config: PlacementConfig = PlacementConfig(),
    *,
    limit: int = 16,
) -> list[Preemption]:
    """For high-priority jobs that fit nowhere: which lower-priority work to stop, and where.

    Only work of a strictly lower priority *class* is a victim (aging orders the queue but
    never preempts). On each eligible node (not on the job's avoid-list) victims are taken
    lowest class first, most recently started first (least work since its checkpoint is lost,
    and it is told to checkpoint anyway), until the job fits (the hard load threshold is not
    applied: the victims' own load is what leaves); the node needing the fewest,
    lowest victims wins. A node chosen for one preemptor has the preemptor's requests held on
    it, so two preemptors in one pass never count the same freed room. ``nodes`` are updated
    in place (victims released, the preemptor's requests reserved).
    """
    by_node: dict[str, list[RunningJob]] = {}
    for work in running:
        by_node.setdefault(work.node, []).append(work)
    # a node busy with the very work to preempt may be above the hard load threshold
    eligible = [node for node in nodes if not node_filter(node, now, config, check_load=False)]
    taken: set[str] = set()
    preemptions: list[Preemption] = []
    for job in order_queue(unplaced, now, config):
        if len(preemptions) >= limit:
            break
        best: tuple[tuple[int, int, float], NodeState, list[RunningJob]] | None = None
        for node in eligible:
            if not _may_host(node, job):
                continue
            victims = sorted(
                (
                    v
                    for v in by_node.get(node.name, ())
                    if v.priority < job.priority and v.job_id not in taken
                ),
                key=lambda v: (v.priority, -(v.started_at.timestamp() if v.started_at else 0.0)),
            )
            chosen = _victims_for(node, job, victims)
            if not chosen:
                continue
            cost = (max(v.priority for v in chosen), len(chosen), sum(v.cpu for v in chosen))
            if best is None or cost < best[0]:
                best = (cost, node, chosen)
        if best is None:
            continue
        _, node, chosen = best
        _make_room(node, job, chosen, taken)
        names = ", ".join(v.job_id for v in chosen)
        preemptions.append(
            Preemption(
                job_id=job.job_id,
                node=node.name,
                victims=tuple(v.job_id for v in chosen),
                reason=f"priority {job.priority} job fits nowhere; preempting {names} on "
                f"{node.name} (priority {max(v.priority for v in chosen)} or lower)",
            )
        )
    return preemptions


# -- fair-share reclaim ------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Standing:
    """A tenant's fair-share figures for ``plan_fair_reclaims``: its dominant share now and
    the share it is due (``mdq.core.fairshare``)."""

    share: float
    fair_share: float


def plan_fair_reclaims(
    nodes: Sequence[NodeState],
    unplaced: Iterable[QueuedJob],
    running: Iterable[RunningJob],
    standing: dict[str, Standing],
    total_cpu: float,
    total_memory_mb: float,
    now: datetime,
    config: PlacementConfig = PlacementConfig(),
    *,
    min_run_s: float = 120.0,
    limit: int = 16,
) -> list[Preemption]:
    """Give a tenant below its fair share room back from tenants above theirs.

    For each waiting job (queue order) whose tenant would still be at or below its fair
    share with it bound, look for running work of tenants above their fair share to stop on
    one node where the job would then fit: never work that started less than ``min_run_s``
    ago, never so much of one tenant's work that it would fall below its own fair share, the
    most over-share tenant's first and, within it, the work that loses least (reported a
    checkpoint most recently; the runner checkpoints on SIGTERM anyway); the node needing the
    fewest victims wins. Stopped work is requeued at once by recovery from its checkpoint.
    Shares change as reclaims are planned, so two waiting jobs never count the same victim and
    a tenant is never pushed past its fair share in one pass. ``nodes`` are updated in place,
    as ``plan_preemptions`` does.
    """
    shares = {tenant: figures.share for tenant, figures in standing.items()}
    fair = {tenant: figures.fair_share for tenant, figures in standing.items()}

    def dominant(cpu: float, memory_mb: float) -> float:
        return max(
            cpu / total_cpu if total_cpu > 0 else 0.0,
            memory_mb / total_memory_mb if total_memory_mb > 0 else 0.0,
        )

    def loss(work: RunningJob) -> float:
        since = work.checkpoint_at or work.started_at or now
        return (now - since).total_seconds()

    by_node: dict[str, list[RunningJob]] = {}
    for work in running:
        if work.started_at is None or (now - work.started_at).total_seconds() < min_run_s:
            continue  # in its first minutes: never a victim
        by_node.setdefault(work.node, []).append(work)
    eligible = [node for node in nodes if not node_filter(node, now, config, check_load=False)]
    taken: set[str] = set()
    reclaims: list[Preemption] = []
    for job in unplaced:
        if len(reclaims) >= limit:
            break
        if job.nominated_node or job.tenant not in fair:
            continue
        gain = dominant(job.cpu, job.memory_mb)
        if shares[job.tenant] + gain > fair[job.tenant] + 1e-9:
            continue  # it would take its tenant above its fair share
        best: tuple[tuple[int, float], NodeState, list[RunningJob]] | None = None
        for node in eligible:
            if not _may_host(node, job):
                continue
            victims = sorted(
                (
                    v
                    for v in by_node.get(node.name, ())
                    if v.job_id not in taken
                    and v.tenant != job.tenant
                    and v.tenant in fair
                    and shares[v.tenant] > fair[v.tenant] + 1e-9
                ),
                key=lambda v: (fair[v.tenant] - shares[v.tenant], loss(v)),
            )
            left = dict(shares)

            def keeps_its_due(victim: RunningJob, left: dict[str, float] = left) -> bool:
                # never a victim whose loss takes its tenant below its own fair share
                after = left[victim.tenant] - dominant(victim.cpu, victim.memory_mb)
                if after < fair[victim.tenant] - 1e-9:
                    return False
                left[victim.tenant] = after
                return True

            chosen = _victims_for(node, job, victims, keeps_its_due)
            if not chosen:
                continue
            cost = (len(chosen), sum(loss(v) for v in chosen))
            if best is None or cost < best[0]:
                best = (cost, node, chosen)
        if best is None:
            continue
        _, node, chosen = best
        for victim in chosen:
            shares[victim.tenant] -= dominant(victim.cpu, victim.memory_mb)
        shares[job.tenant] += gain
        _make_room(node, job, chosen, taken)
        owners = sorted({v.tenant or "the operator" for v in chosen})
        reclaims.append(
            Preemption(
                job_id=job.job_id,
                node=node.name,
                victims=tuple(v.job_id for v in chosen),
                reason=f"fair share: tenant {job.tenant or 'the operator'} is below its fair "
                f"share; reclaiming {', '.join(v.job_id for v in chosen)} on {node.name} from "
                f"{', '.join(owners)} (above theirs)",
            )
        )
    return reclaims
