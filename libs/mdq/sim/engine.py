"""A discrete-event simulator in virtual time that drives mdq's own scheduling core.

Events (arrivals, placement passes, runner starts and ends, OOM kills, crashes, node losses and
returns, preemption stops, retries coming due) sit in one heap ordered by virtual time. Every
decision is the production core's: ``mdq.core.placement.plan`` (scores, the 80 % rule, the
herd guard, priority and aging, fair share), ``plan_preemptions`` and ``plan_fair_reclaims``,
``mdq.core.recommend.recommend`` for learned requests, and ``mdq.core.recovery.decide`` over a
``JobView`` folded from the same events the services would have logged. The simulator only
moves time, tracks what runs where, and measures. docs/simulate.md describes the model and
what it leaves out.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

from mdq.contracts import pb
from mdq.core.events import make_event
from mdq.core.exit_codes import RunnerExit
from mdq.core.fairshare import Fairness, Held, dominant_share, fair_shares
from mdq.core.placement import (
    NodeState,
    Preemption,
    QueuedJob,
    RunningJob,
    Standing,
    plan,
    plan_fair_reclaims,
    plan_preemptions,
    queue_key,
)
from mdq.core.recommend import (
    CostFingerprint,
    Recommendation,
    UsageSample,
    bucket_of,
    recommend,
)
from mdq.core.recovery import GiveUp, Requeue, Wait, decide, requeued_body
from mdq.core.spec import PRIORITY_CLASSES
from mdq.core.state import JobView
from mdq.sim.config import SimConfig
from mdq.sim.model import SimJob, SimNode, Workload

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)
"""Virtual time 0 as the core's datetimes see it."""

# event kinds, in the order simultaneous events are handled
_ARRIVE, _DUE, _END, _OOM, _CRASH, _STOP, _NODE_DOWN, _NODE_UP, _PASS = range(9)

WAITING, PENDING, BOUND, SUCCEEDED, FAILED, CANCELLED = range(6)


@dataclass(slots=True)
class _Node:
    spec: SimNode
    state: NodeState
    up: bool = True
    reserved_cpu: float = 0.0
    reserved_memory_mb: int = 0
    used_cpu: float = 0.0
    """Cores the jobs running here keep busy (their live CPU load)."""
    used_memory_mb: float = 0.0
    running: set[int] = field(default_factory=set)


@dataclass(slots=True)
class _Job:
    spec: SimJob
    index: int
    tenant: str
    priority: int
    cpu: float
    memory_mb: int
    state: int = WAITING
    attempt: int = 1
    token: int = 0
    """Bumped at each binding and end: an event of an older token is stale."""
    ready_s: float = 0.0
    not_before_s: float = 0.0
    resume_step: int = 0
    avoid: frozenset[str] = frozenset()
    node: _Node | None = None
    bound_s: float = 0.0
    start_s: float = 0.0
    rate: float = 0.0
    cpu_used: float = 0.0
    first_start_s: float = -1.0
    end_s: float = -1.0
    deps_left: int = 0
    dependants: list[int] = field(default_factory=list)
    crashes: list[int] = field(default_factory=list)
    crash_step: int = 0
    """The crash the bound attempt meets, when its event is a crash."""
    view: JobView | None = None
    queued: QueuedJob | None = None
    nominated: tuple[str, float] | None = None
    stopping: bool = False
    running: RunningJob | None = None


_Entry = tuple[tuple[float, float, str], int, int]
"""A queued job: its queue key, its index, and its token when queued (stale once it moved)."""


class _TenantQueue:
    """One tenant's queue: the ``size`` first entries in a sorted list (what a pass sees), the
    rest in a heap; every entry of the list sorts before every entry of the heap."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.front: list[_Entry] = []
        self.rest: list[_Entry] = []

    def add(self, entry: _Entry) -> None:
        if self.front and entry < self.front[-1]:
            bisect.insort(self.front, entry)
            if len(self.front) > self.size:
                heapq.heappush(self.rest, self.front.pop())
        else:
            heapq.heappush(self.rest, entry)

    def head(self, live: Callable[[_Entry], bool]) -> list[_Entry]:
        """The first ``size`` live entries, in order (stale ones dropped on the way)."""
        front = [entry for entry in self.front if live(entry)]
        rest = self.rest
        while len(front) < self.size and rest:
            entry = heapq.heappop(rest)
            if live(entry):
                front.append(entry)
        self.front = front
        return front


@dataclass(slots=True)
class Metrics:
    """What one configuration did with the workload (docs/simulate.md, "Metrics")."""

    config: str
    jobs: int = 0
    succeeded: int = 0
    failed: int = 0
    cancelled: int = 0
    makespan_s: float = 0.0
    mean_wait_s: float = 0.0
    p95_wait_s: float = 0.0
    utilisation: float = 0.0
    """CPU-seconds reserved by attempts over the cluster's CPU-seconds during the makespan."""
    cpu_slack: float = 0.0
    """1 - CPU-seconds used / CPU-seconds reserved, over every attempt."""
    memory_slack: float = 0.0
    """Mean over attempts that were not OOM-killed of 1 - peak memory / memory requested."""
    oom_kills: int = 0
    crashes: int = 0
    node_losses: int = 0
    """Attempts that failed because their node was lost."""
    preemptions: int = 0
    """Attempts stopped for a higher priority class or a fair-share reclaim."""
    steps_lost: int = 0
    """MD steps done past the checkpoint a retry resumed from, summed."""
    share_error: dict[str, float] = field(default_factory=dict)
    """Per tenant: time-weighted mean of |dominant share - fair share| while tenants compete."""
    share_error_max: float = 0.0
    passes: int = 0
    events: int = 0
    virtual_s: float = 0.0
    """Virtual time simulated (the last event's)."""
    starts: list[tuple[float, str]] = field(default_factory=list)
    """(first start, job id) of every job that started, in start order."""

    def summary(self) -> dict[str, object]:
        """The figures of the JSON line (starts left out)."""
        return {
            "config": self.config,
            "jobs": self.jobs,
            "succeeded": self.succeeded,
            "failed": self.failed,
            "cancelled": self.cancelled,
            "makespan_s": round(self.makespan_s, 1),
            "mean_wait_s": round(self.mean_wait_s, 1),
            "p95_wait_s": round(self.p95_wait_s, 1),
            "utilisation": round(self.utilisation, 4),
            "cpu_slack": round(self.cpu_slack, 4),
            "memory_slack": round(self.memory_slack, 4),
            "oom_kills": self.oom_kills,
            "crashes": self.crashes,
            "node_losses": self.node_losses,
            "preemptions": self.preemptions,
            "steps_lost": self.steps_lost,
            "share_error_max": round(self.share_error_max, 4),
            "share_error": {t or "operator": round(e, 4) for t, e in self.share_error.items()},
            "passes": self.passes,
        }


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank ``q`` percentile (0..1) of ``values``; 0 for none."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[rank - 1]


def fingerprint_of_kind(job: SimJob) -> CostFingerprint:
    """The cost fingerprint learned requests group a simulated job by: its ``kind`` (or its own
    id), its atom bucket and its threads."""
    return CostFingerprint(
        system_kind=job.kind or job.job_id,
        atom_bucket=bucket_of(job.atoms),
        nonbonded_method=pb.NONBONDED_PME,
        cutoff_nm=1.0,
        barostat=False,
        integrator=pb.INTEGRATOR_UNSPECIFIED,
        platform="CPU",
        threads=max(1, math.ceil(job.cpu)),
        trajectory_interval_steps=0,
        checkpoint_interval_steps=job.checkpoint_every_steps,
    )


def _at(t: float) -> datetime:
    return EPOCH + timedelta(seconds=t)


class Simulator:
    """One configuration over one workload; ``run`` returns its ``Metrics``."""

    def __init__(self, workload: Workload, config: SimConfig) -> None:
        self.config = config
        self.workload = workload
        self.now = 0.0
        self.heap: list[tuple[float, int, int, int, int]] = []
        self.seq = 0
        self.nodes: list[_Node] = []
        self.node_by_name: dict[str, _Node] = {}
        for spec in workload.nodes:
            state = NodeState(
                name=spec.name,
                cpu_capacity=spec.cpu,
                memory_capacity_mb=spec.memory_mb,
                ready=True,
                cpu_load=0.0,
                memory_load=0.0,
                reported_at=EPOCH,
            )
            node = _Node(spec, state)
            self.nodes.append(node)
            self.node_by_name[spec.name] = node
        self.total_cpu = sum(node.spec.cpu for node in self.nodes)
        self.total_memory_mb = float(sum(node.spec.memory_mb for node in self.nodes))
        by_id = {job.job_id: i for i, job in enumerate(workload.jobs)}
        self.jobs: list[_Job] = []
        for index, job_spec in enumerate(workload.jobs):
            priority = PRIORITY_CLASSES.get(job_spec.priority_class, PRIORITY_CLASSES["normal"])
            job = _Job(
                spec=job_spec,
                index=index,
                tenant=job_spec.tenant,
                priority=priority if config.priorities else 0,
                cpu=job_spec.cpu,
                memory_mb=job_spec.memory_mb,
                crashes=sorted(job_spec.crash_at_steps),
            )
            self.jobs.append(job)
        for job in self.jobs:
            for dep in job.spec.depends_on:
                if dep not in by_id:
                    raise ValueError(f"job {job.spec.job_id}: depends_on names unknown {dep!r}")
                job.deps_left += 1
                self.jobs[by_id[dep]].dependants.append(job.index)
        self.queues: dict[str, _TenantQueue] = {}
        """Per tenant: its queued jobs in queue order."""
        self.held: dict[str, Held] = {}
        self.pending_demand: dict[str, Held] = {}
        self.pass_at: float | None = None
        self.history: dict[CostFingerprint, list[UsageSample]] = {}
        self.recommended: dict[CostFingerprint, Recommendation] = {}
        self.running_by_priority: dict[int, int] = {}
        self.metrics = Metrics(config=config.name, jobs=len(self.jobs))
        self.waits: list[float] = []
        self.cpu_reserved_s = 0.0
        self.cpu_used_s = 0.0
        self.memory_slacks: list[float] = []
        self.share_error_sum: dict[str, float] = {}
        self.share_time = 0.0
        self.share_sample: tuple[float, dict[str, float]] | None = None

    # -- events ------------------------------------------------------------------------------
    def push(self, t: float, kind: int, index: int = -1, token: int = 0) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, kind, self.seq, index, token))

    def wake(self) -> None:
        """Something changed: a pass at the next point of the pass grid (unless one is due)."""
        if self.pass_at is not None:
            return
        interval = self.config.pass_interval_s
        t = math.ceil(self.now / interval - 1e-9) * interval if interval > 0 else self.now
        self.pass_at = t
        self.push(t, _PASS)

    def run(self) -> Metrics:
        for job in self.jobs:
            self.push(job.spec.arrival_s, _ARRIVE, job.index)
        for outage in self.workload.outages:
            if outage.node not in self.node_by_name:
                raise ValueError(f"outage: unknown node {outage.node!r}")
            index = self.nodes.index(self.node_by_name[outage.node])
            self.push(outage.at_s, _NODE_DOWN, index)
            self.push(outage.at_s + outage.down_s, _NODE_UP, index)
        events = 0
        while self.heap:
            t, kind, _, index, token = heapq.heappop(self.heap)
            self.now = t
            events += 1
            if kind == _PASS:
                self.pass_at = None
                self.placement_pass()
                continue
            if kind in (_NODE_DOWN, _NODE_UP):
                self.node_event(self.nodes[index], kind == _NODE_UP)
                continue
            job = self.jobs[index]
            if kind == _ARRIVE:
                self.arrive(job)
            elif kind == _DUE:
                if job.state == PENDING and job.token == token:
                    self.enqueue(job)
            elif job.state == BOUND and job.token == token:
                if kind == _END:
                    self.succeed(job)
                elif kind == _OOM:
                    self.fail(job, pb.FAILURE_OOM_KILLED, RunnerExit.OUT_OF_MEMORY, "OOM-killed")
                elif kind == _CRASH:
                    self.fail(job, pb.FAILURE_CRASHED, 1, "crashed")
                elif kind == _STOP:
                    self.fail(job, pb.FAILURE_EVICTED, RunnerExit.PREEMPTED, "preempted")
        self.metrics.events = events
        self.metrics.virtual_s = self.now
        return self.finish()

    # -- arrivals and the queue --------------------------------------------------------------
    def arrive(self, job: _Job) -> None:
        if job.state != WAITING:
            return  # cancelled already: a dependency failed for good
        if self.config.learned_requests:
            self.learn(job)
        if job.deps_left == 0:
            self.release(job)

    def learn(self, job: _Job) -> None:
        """Intake's step for an ``auto`` job: its requests recommended from history."""
        fingerprint = fingerprint_of_kind(job.spec)
        recommendation = self.recommended.get(fingerprint)
        if recommendation is None:
            recommendation = recommend(
                fingerprint,
                atoms=job.spec.atoms,
                history=self.history.get(fingerprint, ()),
                cpu_asked=job.spec.cpu,
            )
            self.recommended[fingerprint] = recommendation
        job.cpu = recommendation.cpu
        job.memory_mb = recommendation.memory_mb

    def release(self, job: _Job, *, first: bool = True) -> None:
        """The job is PENDING: ready since now (``first``) or, for a retry, since it first was
        (the queue orders it by that, as placement orders by the job's submit)."""
        job.state = PENDING
        if first:
            job.ready_s = self.now
        demand = self.pending_demand.setdefault(job.tenant, Held())
        demand.cpu += job.cpu
        demand.memory_mb += job.memory_mb
        self.enqueue(job)

    def enqueue(self, job: _Job) -> None:
        if job.not_before_s > self.now:
            self.push(job.not_before_s, _DUE, job.index, job.token)
            return
        queued = job.queued
        if queued is None:
            queued = job.queued = QueuedJob(
                job_id=job.spec.job_id,
                cpu=job.cpu,
                memory_mb=job.memory_mb,
                priority=job.priority,
                submitted_at=_at(job.ready_s),
                avoid_nodes=job.avoid,
                tenant=job.tenant,
            )
        key = queue_key(queued, self.config.placement)
        queue = self.queues.get(job.tenant)
        if queue is None:
            queue = self.queues[job.tenant] = _TenantQueue(self.config.queue_window)
        queue.add((key, job.index, job.token))
        self.wake()

    def window(self) -> list[_Job]:
        """The head of every tenant's queue (``queue_window`` each), in queue order."""
        jobs = self.jobs

        def live(entry: _Entry) -> bool:
            job = jobs[entry[1]]
            return job.state == PENDING and job.token == entry[2]

        heads = [queue.head(live) for queue in self.queues.values()]
        merged = heads[0] if len(heads) == 1 else sorted(e for head in heads for e in head)
        return [jobs[entry[1]] for entry in merged]

    # -- placement ---------------------------------------------------------------------------
    def refresh_nodes(self, now: datetime, nodes: Iterable[_Node] | None = None) -> None:
        """Each node's load report as of now (the metrics service's), no binding in flight
        (``nodes``: those, else every node)."""
        live = self.config.sees_live_load
        for node in self.nodes if nodes is None else nodes:
            state = node.state
            state.ready = node.up
            state.reported_at = now
            state.reserved_cpu = node.reserved_cpu
            state.reserved_memory_mb = node.reserved_memory_mb
            state.inflight_cpu = 0.0
            state.inflight_memory_mb = 0
            if live:
                state.cpu_load = (node.used_cpu + node.spec.background_cpu) / node.spec.cpu
                state.memory_load = node.used_memory_mb / node.spec.memory_mb
            else:
                state.cpu_load = state.memory_load = 0.0

    def placement_pass(self) -> None:
        try:
            self.place()
        finally:
            self.sample_shares()  # the shares as this pass left them, until the next

    def place(self) -> None:
        jobs = self.window()
        if not jobs:
            return
        self.metrics.passes += 1
        now = _at(self.now)
        queue: list[QueuedJob] = []
        min_cpu, min_memory = math.inf, math.inf
        nominated: set[str] = set()
        for job in jobs:
            queued = job.queued
            assert queued is not None
            if job.nominated is not None:
                node_name, until = job.nominated
                if until < self.now:
                    job.nominated = None
                else:
                    queued = replace(queued, nominated_node=node_name)
                    nominated.add(node_name)
            queue.append(queued)
            min_cpu = min(min_cpu, queued.cpu)
            min_memory = min(min_memory, queued.memory_mb)
        # a node without room for the smallest queued job can take none of them: left out
        # left out as well: a node its live load already filters out (above the hard
        # threshold: what the pass binds only adds to it); the decisions are the same
        hard = self.config.placement.hard_load_threshold if self.config.sees_live_load else 1e9
        roomy = [
            node
            for node in self.nodes
            if node.up
            and (
                (
                    node.reserved_cpu + min_cpu <= node.spec.cpu + 1e-9
                    and node.reserved_memory_mb + min_memory <= node.spec.memory_mb
                    and (node.used_cpu + node.spec.background_cpu) <= hard * node.spec.cpu
                    and node.used_memory_mb <= hard * node.spec.memory_mb
                )
                or node.spec.name in nominated
            )
        ]
        self.refresh_nodes(now, roomy)
        nodes = [node.state for node in roomy]
        fairness = (
            Fairness(
                held={t: Held(h.cpu, h.memory_mb) for t, h in self.held.items()},
                weight=self.weight,
            )
            if self.config.fair_share
            else None
        )
        decisions = plan(
            nodes,
            queue,
            now,
            self.config.placement,
            ordered=True,
            fairness=fairness,
            capacity=(self.up_cpu(), self.up_memory()),
        )
        placed: set[str] = set()
        by_id = {job.spec.job_id: job for job in jobs}
        for decision in decisions:
            placed.add(decision.job_id)
            self.bind(by_id[decision.job_id], self.node_by_name[decision.node])
        if len(decisions) == len(queue):
            return
        unplaced = [q for q in queue if q.job_id not in placed and not q.nominated_node]
        if not unplaced:
            return
        if self.config.preemption and self.running_by_priority:
            lowest = min(self.running_by_priority)
            candidates = [q for q in unplaced if q.priority > lowest][:64]
            if candidates:
                self.refresh_nodes(now)
                self.stop_for(
                    plan_preemptions(
                        [n.state for n in self.nodes],
                        candidates,
                        self.running_work(),
                        now,
                        self.config.placement,
                    ),
                    by_id,
                )
        if self.config.fair_share and self.config.fair_share_reclaim:
            self.reclaim(unplaced[:64], by_id, now)

    def weight(self, tenant: str) -> float:
        return self.config.weights.get(tenant, 1.0)

    def up_cpu(self) -> float:
        return sum(node.spec.cpu for node in self.nodes if node.up)

    def up_memory(self) -> float:
        return float(sum(node.spec.memory_mb for node in self.nodes if node.up))

    def running_work(self) -> list[RunningJob]:
        work: list[RunningJob] = []
        for node in self.nodes:
            for index in node.running:
                job = self.jobs[index]
                if job.stopping:
                    continue
                if job.running is None:
                    job.running = RunningJob(
                        job_id=job.spec.job_id,
                        node=node.spec.name,
                        cpu=job.cpu,
                        memory_mb=job.memory_mb,
                        priority=job.priority,
                        started_at=_at(job.start_s),
                        tenant=job.tenant,
                    )
                running = job.running
                every = job.spec.checkpoint_every_steps
                if every and self.step_of(job) >= every:
                    # when its latest checkpoint was written, for the reclaim's loss
                    step = self.step_of(job) // every * every
                    at = job.start_s + max(0.0, (step - job.resume_step) / job.rate)
                    running = replace(running, checkpoint_at=_at(at))
                work.append(running)
        return work

    def stop_for(self, preemptions: Iterable[Preemption], by_id: dict[str, _Job]) -> None:
        """Hold each preemptor's room on its node; its victims exit after the stop grace."""
        for preemption in preemptions:
            node = preemption.node
            by_id[preemption.job_id].nominated = (
                node,
                self.now + self.config.preemption_timeout_s,
            )
            for victim_id in preemption.victims:
                victim = next(
                    self.jobs[i]
                    for i in self.node_by_name[node].running
                    if self.jobs[i].spec.job_id == victim_id
                )
                victim.stopping = True
                self.metrics.preemptions += 1
                self.push(self.now + self.config.stop_grace_s, _STOP, victim.index, victim.token)

    def reclaim(self, unplaced: list[QueuedJob], by_id: dict[str, _Job], now: datetime) -> None:
        if len({q.tenant for q in unplaced} | set(self.held)) < 2:
            return
        total_cpu, total_memory = self.up_cpu(), self.up_memory()
        shares, fair = self.standings(total_cpu, total_memory)
        if not any(shares[t] > fair[t] + 1e-9 for t in shares):
            return
        standing = {t: Standing(shares[t], fair[t]) for t in shares}
        self.refresh_nodes(now)
        self.stop_for(
            plan_fair_reclaims(
                [n.state for n in self.nodes],
                [q for q in unplaced if by_id[q.job_id].nominated is None],
                self.running_work(),
                standing,
                total_cpu,
                total_memory,
                now,
                self.config.placement,
                min_run_s=self.config.fair_share_min_run_s,
            ),
            by_id,
        )

    def standings(
        self, total_cpu: float, total_memory: float
    ) -> tuple[dict[str, float], dict[str, float]]:
        """Each competing tenant's dominant share now and its fair share (``fair_shares``)."""
        tenants = {t for t, h in self.held.items() if h.cpu > 1e-9} | {
            t for t, d in self.pending_demand.items() if d.cpu > 1e-9
        }
        shares: dict[str, float] = {}
        demands: dict[str, float] = {}
        for tenant in tenants:
            held = self.held.get(tenant, Held())
            pending = self.pending_demand.get(tenant, Held())
            shares[tenant] = dominant_share(held, total_cpu, total_memory)
            demands[tenant] = dominant_share(
                Held(held.cpu + pending.cpu, held.memory_mb + pending.memory_mb),
                total_cpu,
                total_memory,
            )
        return shares, fair_shares(demands, self.weight)

    def sample_shares(self) -> None:
        """Close the previous share sample (time-weighted) and open one if tenants compete."""
        if self.share_sample is not None:
            since, errors = self.share_sample
            span = self.now - since
            self.share_time += span
            for tenant, error in errors.items():
                self.share_error_sum[tenant] = self.share_error_sum.get(tenant, 0.0) + error * span
            self.share_sample = None
        if not any(demand.cpu > 1e-9 for demand in self.pending_demand.values()):
            return  # nothing waits: no competition to be fair about
        shares, fair = self.standings(self.up_cpu(), self.up_memory())
        if len(shares) < 2:
            return
        self.share_sample = (
            self.now,
            {tenant: abs(shares[tenant] - fair[tenant]) for tenant in shares},
        )

    # -- attempts ----------------------------------------------------------------------------
    def bind(self, job: _Job, node: _Node) -> None:
        job.state = BOUND
        job.token += 1
        job.node = node
        job.nominated = None
        job.stopping = False
        job.running = None
        job.bound_s = self.now
        node.reserved_cpu += job.cpu
        node.reserved_memory_mb += job.memory_mb
        node.running.add(job.index)
        held = self.held.setdefault(job.tenant, Held())
        held.cpu += job.cpu
        held.memory_mb += job.memory_mb
        demand = self.pending_demand[job.tenant]
        demand.cpu -= job.cpu
        demand.memory_mb -= job.memory_mb
        self.running_by_priority[job.priority] = self.running_by_priority.get(job.priority, 0) + 1
        spec = job.spec
        job.cpu_used = min(spec.cores_used, job.cpu) if spec.cores_used > 0 else job.cpu
        demand_cores = node.used_cpu + node.spec.background_cpu + job.cpu_used
        speed = min(1.0, node.spec.cpu / demand_cores) if demand_cores > 0 else 1.0
        throttle = min(1.0, job.cpu / spec.cores_used) if spec.cores_used > 0 else 1.0
        job.rate = spec.steps_per_s * speed * throttle
        node.used_cpu += job.cpu_used
        node.used_memory_mb += min(spec.peak_memory_mb, job.memory_mb)
        job.start_s = self.now + self.config.start_delay_s
        if job.first_start_s < 0:
            job.first_start_s = job.start_s
            self.waits.append(job.start_s - job.ready_s)
            self.metrics.starts.append((job.start_s, spec.job_id))
        remaining = max(0, spec.steps - job.resume_step)
        end = job.start_s + remaining / job.rate
        kind = _END
        if spec.peak_memory_mb > job.memory_mb:
            # memory rises from half the peak to the peak over the ramp; killed at the limit
            fraction = max(0.0, job.memory_mb / spec.peak_memory_mb - 0.5) / 0.5
            oom = job.start_s + spec.memory_ramp_s * fraction
            if oom < end:
                end, kind = oom, _OOM
        for step in job.crashes:
            if step > job.resume_step:
                crash = job.start_s + (step - job.resume_step) / job.rate
                if crash < end:
                    end, kind = crash, _CRASH
                    job.crash_step = step
                break
        self.push(end, kind, job.index, job.token)

    def step_of(self, job: _Job) -> int:
        """The MD step a bound attempt has reached now."""
        done = max(0.0, self.now - job.start_s) * job.rate
        return min(job.spec.steps, job.resume_step + int(done))

    def leave_node(self, job: _Job) -> None:
        node = job.node
        assert node is not None
        node.reserved_cpu -= job.cpu
        node.reserved_memory_mb -= job.memory_mb
        node.used_cpu -= job.cpu_used
        node.used_memory_mb -= min(job.spec.peak_memory_mb, job.memory_mb)
        node.running.discard(job.index)
        held = self.held[job.tenant]
        held.cpu -= job.cpu
        held.memory_mb -= job.memory_mb
        count = self.running_by_priority[job.priority] - 1
        if count:
            self.running_by_priority[job.priority] = count
        else:
            del self.running_by_priority[job.priority]
        ran = max(0.0, self.now - job.bound_s)
        self.cpu_reserved_s += job.cpu * ran
        self.cpu_used_s += job.cpu_used * max(0.0, self.now - job.start_s)
        job.token += 1
        self.wake()

    def record_usage(self, job: _Job, *, oom: bool) -> None:
        spec = job.spec
        if not oom:
            self.memory_slacks.append(max(0.0, 1.0 - spec.peak_memory_mb / job.memory_mb))
        if not self.config.learned_requests:
            return
        fingerprint = fingerprint_of_kind(spec)
        samples = self.history.setdefault(fingerprint, [])
        samples.append(
            UsageSample(
                fingerprint=fingerprint,
                peak_memory_mb=0.0 if oom else spec.peak_memory_mb,
                mean_cores=0.0 if oom else job.cpu_used,
                memory_limit_mb=float(job.memory_mb),
                cpu_limit=job.cpu,
                oom_killed=oom,
            )
        )
        if len(samples) > self.config.history_limit:
            del samples[0]
        self.recommended.pop(fingerprint, None)

    def succeed(self, job: _Job) -> None:
        self.leave_node(job)
        self.record_usage(job, oom=False)
        job.state = SUCCEEDED
        job.end_s = self.now
        job.node = None
        for index in job.dependants:
            dependant = self.jobs[index]
            dependant.deps_left -= 1
            arrived = dependant.spec.arrival_s <= self.now
            if dependant.deps_left == 0 and dependant.state == WAITING and arrived:
                self.release(dependant)

    def fail(self, job: _Job, reason: pb.FailureReason, exit_code: int, why: str) -> None:
        """The attempt failed: fold it into the job's view and let recovery decide."""
        node = job.node
        assert node is not None
        step = self.step_of(job)
        stopped = reason == pb.FAILURE_EVICTED
        self.leave_node(job)
        if reason == pb.FAILURE_OOM_KILLED:
            self.metrics.oom_kills += 1
            self.record_usage(job, oom=True)
        elif reason == pb.FAILURE_CRASHED:
            self.metrics.crashes += 1
            step = job.crash_step
            job.crashes.remove(step)  # a crash happens once
        elif reason == pb.FAILURE_NODE_LOST:
            self.metrics.node_losses += 1
        every = job.spec.checkpoint_every_steps
        checkpoint = step if stopped else (step // every * every if every else 0)
        view = self.fold_failure(job, node.spec.name, reason, exit_code, why, step, checkpoint)
        decision = decide(view, self.config.recovery, _at(self.now))
        job.node = None
        if isinstance(decision, Requeue):
            self.apply(view, "requeued", requeued_body(decision, view, _at(self.now)), job)
            self.metrics.steps_lost += decision.steps_lost
            job.attempt = decision.attempt
            job.resume_step = decision.resume_from.step if decision.resume_from else 0
            if decision.memory_mb is not None:
                job.memory_mb = decision.memory_mb
            job.avoid = frozenset(decision.avoid_nodes)
            job.not_before_s = self.now + decision.delay_s
            job.queued = None
            self.release(job, first=False)
        elif isinstance(decision, GiveUp):
            self.end_for_good(job, FAILED)
        elif isinstance(decision, Wait):  # pragma: no cover - only lost attempts wait
            raise AssertionError("the simulator loses no attempt silently")
        else:
            self.end_for_good(job, CANCELLED)

    def fold_failure(
        self,
        job: _Job,
        node: str,
        reason: pb.FailureReason,
        exit_code: int,
        why: str,
        step: int,
        checkpoint: int,
    ) -> JobView:
        """The job's view with this attempt's binding, start, checkpoint and failure folded in,
        as the watcher and the runner would have logged them."""
        spec = job.spec
        view = job.view
        if view is None:
            body = pb.JobSubmitted(
                spec=pb.JobSpec(
                    name=spec.job_id,
                    steps=spec.steps,
                    checkpoint_interval_steps=spec.checkpoint_every_steps,
                    priority_class=spec.priority_class,
                    max_retries=spec.max_retries,
                    resources=pb.Resources(cpu=job.cpu, memory_mb=job.memory_mb),
                ),
                request_id=spec.job_id,
            )
            view = job.view = JobView.from_submitted(self.event("submitted", body, job, 0, 0.0))
        pod = f"mdq-{spec.job_id}-{job.attempt}"
        self.apply(view, "bound", pb.JobBound(node=node, pod_name=pod), job, job.bound_s)
        self.apply(view, "started", pb.JobStarted(), job, job.start_s)
        if checkpoint > job.resume_step:
            self.apply(view, "checkpoint", pb.Checkpoint(step=checkpoint), job)
        failed = pb.AttemptFailed(
            reason=reason, exit_code=exit_code, message=why, node=node, last_step=step
        )
        self.apply(view, "attempt_failed", failed, job)
        view.current.pod_phase = pb.POD_FAILED
        return view

    def event(self, kind: str, body: object, job: _Job, attempt: int, at: float) -> pb.Event:
        return make_event(
            kind,
            body,  # type: ignore[arg-type]
            job_id=job.spec.job_id,
            attempt=attempt,
            producer="simulator",
            at=_at(at),
        )

    def apply(
        self, view: JobView, kind: str, body: object, job: _Job, at: float | None = None
    ) -> None:
        attempt = job.attempt + 1 if kind == "requeued" else job.attempt
        view.apply(self.event(kind, body, job, attempt, self.now if at is None else at))

    def end_for_good(self, job: _Job, state: int) -> None:
        job.state = state
        job.end_s = self.now
        for index in job.dependants:
            dependant = self.jobs[index]
            if dependant.state in (WAITING, PENDING):
                if dependant.state == PENDING:
                    demand = self.pending_demand[dependant.tenant]
                    demand.cpu -= dependant.cpu
                    demand.memory_mb -= dependant.memory_mb
                self.end_for_good(dependant, CANCELLED)

    def node_event(self, node: _Node, up: bool) -> None:
        if up:
            node.up = True
            self.wake()
            return
        node.up = False
        for index in sorted(node.running):
            job = self.jobs[index]
            self.fail(job, pb.FAILURE_NODE_LOST, 0, "node lost")

    # -- the report --------------------------------------------------------------------------
    def finish(self) -> Metrics:
        metrics = self.metrics
        if self.share_sample is not None:
            self.sample_shares()
        for job in self.jobs:
            if job.state == SUCCEEDED:
                metrics.succeeded += 1
            elif job.state == FAILED:
                metrics.failed += 1
            elif job.state == CANCELLED:
                metrics.cancelled += 1
        ends = [job.end_s for job in self.jobs if job.end_s >= 0]
        start = min((job.spec.arrival_s for job in self.jobs), default=0.0)
        metrics.makespan_s = max(ends, default=start) - start
        metrics.mean_wait_s = sum(self.waits) / len(self.waits) if self.waits else 0.0
        metrics.p95_wait_s = percentile(self.waits, 0.95)
        capacity = self.total_cpu * metrics.makespan_s
        metrics.utilisation = self.cpu_reserved_s / capacity if capacity > 0 else 0.0
        reserved = self.cpu_reserved_s
        metrics.cpu_slack = 1.0 - self.cpu_used_s / reserved if reserved else 0.0
        metrics.memory_slack = (
            sum(self.memory_slacks) / len(self.memory_slacks) if self.memory_slacks else 0.0
        )
        if self.share_time > 0:
            metrics.share_error = {
                tenant: total / self.share_time for tenant, total in self.share_error_sum.items()
            }
            metrics.share_error_max = max(metrics.share_error.values(), default=0.0)
        metrics.starts.sort()
        return metrics


def simulate(workload: Workload, config: SimConfig) -> Metrics:
    """Run ``workload`` under ``config``."""
    return Simulator(workload, config).run()


def compare(workload: Workload, configs: Iterable[SimConfig]) -> list[Metrics]:
    """Each configuration over the same workload, in order."""
    return [simulate(workload, config) for config in configs]
