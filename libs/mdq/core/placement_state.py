"""Placement's state: the job log and the nodes' loads folded into what binding needs (pure).

The placement service owns one ``PlacementState``, feeds it every job event (``apply``) and
node load (``apply_load``), and asks it what to decide on: the queue (``queue``), the nodes with
their reservations and in-flight bindings (``node_states``; ``pass_nodes`` and ``ranking`` for a
pass, kept from one pass to the next), the WAITING jobs whose dependencies
ended (``dependency_verdict``), the running work a preemptor may stop (``running_work``) and
each tenant's usage (``tenant_usage``, ``tenant_room``). Time is never read here: every method
that depends on it takes ``now``. What is kept, and how memory stays bounded by
``ended_memory`` rather than the history: docs/placement.md, "Where the state lives".
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Collection, Container, Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from mdq.contracts import pb
from mdq.core import ids
from mdq.core.clusters import NO_SELECTOR, Selector, cluster_of
from mdq.core.fairshare import Held, dominant_share, fair_shares, no_guarantee, no_maximum
from mdq.core.node_health import NodeCapacity, NodeHealth, NodeHealthPolicy
from mdq.core.placement import (
    NodeRanking,
    NodeState,
    PlacementConfig,
    Preemption,
    QueuedJob,
    RunningJob,
    queue_key,
)
from mdq.core.state import JobBook, JobState, JobView, Stop, event_time
from mdq.core.tenants import QUEUED_STATES, TenantPolicy, cpu_quota_reason, cpu_room, policy_applies

HOLDING = (JobState.BOUND, JobState.RUNNING)
SNAPSHOT_VERSION = 1
"""Bumped when ``snapshot``'s layout changes; ``from_snapshot`` refuses any other."""
ENDED_MEMORY = 10_000
"""How many ended jobs' final states are kept by default (``ended_memory``)."""


@dataclass(slots=True)
class Nomination:
    """Room held on ``node`` for a job that preempted ``victims`` there."""

    node: str
    victims: tuple[str, ...]
    until: datetime


@dataclass(frozen=True, slots=True)
class TenantShare:
    """One tenant's fair-share standing (``PlacementState.shares``)."""

    running_jobs: int
    running: Held
    weight: float
    share: float
    """Dominant share of the schedulable capacity now."""
    fair_share: float
    """The dominant share it is due (``mdq.core.fairshare.fair_shares``)."""
    total_cpu: float = 0.0
    """The schedulable capacity the shares are of."""
    total_memory_mb: float = 0.0

    def job_share(self, job: QueuedJob) -> float:
        """The dominant share of the capacity ``job`` requests."""
        return dominant_share(Held(job.cpu, job.memory_mb), self.total_cpu, self.total_memory_mb)


class Folded(NamedTuple):
    """What one folded job event changed."""

    view: JobView
    suspect: bool = False
    """The event (an attempt that crashed) newly made its node suspect (``NodeHealth``)."""


class PlacementState:
    """Everything placement knows, folded from the log; no I/O, no clock."""

    def __init__(
        self,
        config: PlacementConfig = PlacementConfig(),
        *,
        load_settle_s: float = 10.0,
        health_policy: NodeHealthPolicy | None = None,
        fail_on_dependency_failure: bool = True,
        ended_memory: int = ENDED_MEMORY,
    ) -> None:
        self.config = config
        self.ended_memory = ended_memory
        """The most ended jobs whose final state is kept (the newest; older ones are read from
        the log when a job depends on them)."""
        self.load_settle_s = load_settle_s
        """A binding counts as in-flight on its node until a load report this long after it."""
        self.fail_on_dependency_failure = fail_on_dependency_failure
        self.book = JobBook()
        self.nodes: dict[str, NodeState] = {}
        """node -> its latest load report (without reservations: ``node_states`` adds them)."""
        self._problem_nodes: set[str] = set()
        """Nodes whose latest load report names a problem (kept with ``nodes``)."""
        self.health = NodeHealth(policy=health_policy or NodeHealthPolicy())
        self._by_state: dict[JobState, set[str]] = {state: set() for state in JobState}
        self._indexed_state: dict[str, JobState] = {}
        """job -> the state it is filed under in ``_by_state``."""
        self._holding: dict[str, tuple[str, float, int]] = {}
        """job -> (node, cpu, memory) of every BOUND or RUNNING job."""
        self._reserved: dict[str, list[float]] = {}
        """node -> [cpu, memory] reserved by BOUND and RUNNING jobs (kept incrementally)."""
        self._inflight: dict[str, dict[str, tuple[datetime, float, int]]] = {}
        """node -> job -> (bound at, cpu, memory) of holding jobs bound there that the node's
        last load report may not reflect yet (dropped when a report comes ``load_settle_s``
        after the binding, or when the job stops holding)."""
        self._inflight_totals: dict[str, list[float]] = {}
        """node -> [cpu, memory] summed over ``_inflight[node]`` (kept incrementally)."""
        self._tenant_cpu: dict[str, float] = {}
        """tenant -> CPU of its BOUND and RUNNING jobs (kept incrementally; no zero entries)."""
        self._held: dict[str, Held] = {}
        """tenant ("" the operator) -> requests of its BOUND and RUNNING jobs (fair share; kept
        incrementally; no empty entries)."""
        self._tenant_queued: dict[str, int] = {}
        """tenant -> its jobs in ``QUEUED_STATES`` (kept incrementally; no zero entries)."""
        self._tenants_seen: set[str] = set()
        """Every tenant with a job in the log (each gets its usage written once at least)."""
        self._queued: dict[tuple[str, int], QueuedJob] = {}
        """(job, attempt) -> its ``QueuedJob``, while PENDING (made once per attempt)."""
        self._last_bound_seq: dict[str, int] = {}
        """job -> stream sequence of its last ``bound`` event (the publish fence)."""
        self._node_lost_at: dict[str, datetime] = {}
        """node -> time of the latest job lost with it (FAILURE_NODE_LOST), until the node's
        next load report (``_lost_since_report``)."""
        self._nominations: dict[str, Nomination] = {}
        self._terminating: set[str] = set()
        """Victims of a preemption whose pods were deleted, while they still hold their room."""
        self._ended: OrderedDict[str, JobState] = OrderedDict()
        """job -> final state (SUCCEEDED or FAILED) of the ``ended_memory`` ended jobs that
        ``prune`` forgot (or the service looked up) last, oldest first."""
        self._ended_cluster: dict[str, str] = {}
        """job -> the cluster its last attempt ran on (its outputs are there), for the jobs of
        ``_ended`` that ran on a named cluster (data locality of their dependents)."""
        self._cluster_labels: dict[str, dict[str, str]] = {}
        """cluster -> its labels as last reported (one dict shared by its nodes)."""
        self._unknown: set[str] = set()
        """Dependencies of waiting jobs that are neither live nor remembered, not yet handed to
        the service to look up (``take_unknown_dependencies``)."""
        self._asked: set[str] = set()
        """Dependencies handed to the service and not answered yet."""
        self._missing: set[str] = set()
        """Dependencies the log holds no terminal event of (``learn_missing``)."""
        self._learned: dict[str, JobState] = {}
        """Final states the service read from the log (``learn_final``), kept while a WAITING
        job depends on them (``prune`` drops the others)."""
        self._ended_since: list[str] = []
        """Jobs that ended since the last ``prune``."""
        self._stopping: set[str] = set()
        """Live jobs whose attempt is being stopped on request (``JobView.stop`` set)."""
        self._unknown_fences: set[str] = set()
        """Jobs extended after ``prune`` forgot them: the sequence of their last ``bound`` (the
        publish fence) is to be read from the log before they are bound again."""
        self._orphan_pods: set[tuple[str, int]] = set()
        """(job, attempt) of jobs that ended CANCELLED while they held a node: their pod may
        still run (a cancel that raced a binding) and is to be deleted."""
        self._pass_copies: list[NodeState] = []
        """The copies ``pass_nodes`` handed out last, in name order."""
        self._pass_rooms: list[tuple[float, int, float, int]] = []
        """Each of those copies' reservation and in-flight fields as handed out."""
        self._pass_position: dict[str, int] = {}
        """node -> its index in ``_pass_copies``."""
        self._pass_cordons: frozenset[str] = frozenset()
        """The failure cordons those copies were made with."""
        self._pass_changed: set[str] = set()
        """Nodes whose report, reservations, in-flight bindings or loss changed since those
        copies were made."""
        self.ranking = NodeRanking()
        """The ranking of the nodes lent to the pass under way (``plan``'s ``ranking``)."""

    # -- folding the log -------------------------------------------------------------------
    def apply(self, sequence: int, event: pb.Event) -> Folded | None:
        """Fold one job event from the log (at stream ``sequence``); None if it changed no
        job. Events of a job ``prune`` forgot change nothing (an ended job accepts none)."""
        kind = event.WhichOneof("body")
        if kind == "submitted" or kind == "bound":
            job_id = event.job_id
            if job_id in self._ended:
                if sequence > self.book.last_sequence:
                    self.book.last_sequence = sequence
                return None
            if kind == "bound":
                self._last_bound_seq[job_id] = max(sequence, self._last_bound_seq.get(job_id, 0))
        view = self.book.apply(sequence, event)
        if view is None:
            return None
        if kind == "extended":  # an ended job lives again: no longer one to remember
            self._ended.pop(view.job_id, None)
            self._ended_cluster.pop(view.job_id, None)
            if view.job_id not in self._last_bound_seq:
                self._unknown_fences.add(view.job_id)
        elif kind == "reprioritized":  # its queue entry holds the old priority
            self._queued.pop((view.job_id, view.attempt), None)
        self._index(view)
        if kind != "attempt_failed":
            return Folded(view)
        failure = event.attempt_failed
        at = event_time(event)
        if failure.reason == pb.FAILURE_NODE_LOST and failure.node:
            previous = self._node_lost_at.get(failure.node)
            if previous is None or at > previous:
                self._node_lost_at[failure.node] = at
                self._pass_changed.add(failure.node)
        suspect = self.health.record(
            node=failure.node, job_id=event.job_id, reason=failure.reason, at=at
        )
        return Folded(view, suspect)

    def apply_to(self, view: JobView, event: pb.Event) -> bool:
        """Fold an event this replica published into ``view`` at once (its echo from the log
        is a no-op later); False if it changed nothing."""
        if not view.apply(event):
            return False
        if event.WhichOneof("body") == "reprioritized":
            self._queued.pop((view.job_id, view.attempt), None)
        self._index(view)
        return True

    def apply_load(self, load: pb.NodeLoad, reported_at: datetime) -> bool:
        """Take a node's load report; False if an older one than what is known. Bindings
        ``load_settle_s`` or more before the report are in its live load now: they settle."""
        known = self.nodes.get(load.node)
        if known is not None and reported_at < known.reported_at:
            return False
        self.nodes[load.node] = NodeState(
            name=load.node,
            cpu_capacity=load.cpu_capacity,
            memory_capacity_mb=load.memory_capacity_mb,
            ready=load.ready,
            cordoned=load.cordoned,
            cpu_load=load.cpu_load,
            memory_load=load.memory_load,
            reported_at=reported_at,
            cluster=load.cluster,
            cluster_labels=self._labels_of(load.cluster, load.cluster_labels),
            problem=load.problem,
        )
        self._pass_changed.add(load.node)
        if load.problem:
            self._problem_nodes.add(load.node)
        else:
            self._problem_nodes.discard(load.node)
        horizon = reported_at - timedelta(seconds=self.load_settle_s)
        if recent := self._inflight.get(load.node):
            for job_id in [job for job, entry in recent.items() if entry[0] <= horizon]:
                self._forget_inflight(load.node, job_id)
        return True

    def has_node_problems(self) -> bool:
        """Whether a node's latest load report names a problem (what the failure cordons
        weigh besides crash verdicts), without a look at every node."""
        return bool(self._problem_nodes)

    def _labels_of(self, cluster: str, labels: Mapping[str, str]) -> dict[str, str]:
        """``labels`` of ``cluster``, as one dict its nodes share (a cluster's thousand nodes
        report the same labels)."""
        known = self._cluster_labels.get(cluster)
        if known is None or known != labels:
            known = self._cluster_labels[cluster] = dict(labels)
        return known

    def output_cluster(self, job_id: str) -> str:
        """The cluster holding ``job_id``'s outputs: where its last attempt ran ("" when
        not known, or in a single-cluster deployment)."""
        view = self.book.jobs.get(job_id)
        if view is not None:
            return cluster_of(view.node)
        return self._ended_cluster.get(job_id, "")

    def _index(self, view: JobView) -> None:
        filed = self._indexed_state.get(view.job_id)
        if filed is not view.state:
            if filed is not None:
                self._by_state[filed].discard(view.job_id)
                if filed is JobState.PENDING:  # its QueuedJob is never asked for again
                    self._queued.pop((view.job_id, view.attempt), None)
            self._by_state[view.state].add(view.job_id)
            self._indexed_state[view.job_id] = view.state
            if tenant := ids.tenant_of(view.job_id):
                self._count_queued(tenant, filed, view.state)
            if view.state.terminal:
                self._ended_since.append(view.job_id)  # forgotten at the next prune
        before = self._holding.get(view.job_id)
        now_holding = (
            (view.node, view.resources.cpu, int(view.resources.memory_mb))
            if view.state in HOLDING and view.node
            else None
        )
        if before != now_holding:
            if before is not None:
                self._reserve(view.job_id, before, -1)
                del self._holding[view.job_id]
                self._forget_inflight(before[0], view.job_id)
                if view.state is JobState.CANCELLED:
                    self._orphan_pods.add((view.job_id, view.attempt))
            if now_holding is not None:
                self._reserve(view.job_id, now_holding, +1)
                self._holding[view.job_id] = now_holding
        if view.state not in HOLDING:
            self._terminating.discard(view.job_id)
        if view.state is not JobState.PENDING:
            self._nominations.pop(view.job_id, None)
        if view.stop is not Stop.NONE and not view.state.terminal:
            self._stopping.add(view.job_id)
        else:
            self._stopping.discard(view.job_id)

    def _reserve(self, job_id: str, holding: tuple[str, float, int], sign: int) -> None:
        node, cpu, memory = holding
        totals = self._reserved.setdefault(node, [0.0, 0.0])
        totals[0] += sign * cpu
        totals[1] += sign * memory
        self._pass_changed.add(node)
        tenant = ids.tenant_of(job_id)
        held = self._held.setdefault(tenant, Held())
        held.cpu += sign * cpu
        held.memory_mb += sign * memory
        if held.cpu < 1e-6 and held.memory_mb < 0.5:
            del self._held[tenant]
        if tenant:
            running = self._tenant_cpu.get(tenant, 0.0) + sign * cpu
            if running > 1e-6:
                self._tenant_cpu[tenant] = running
            else:
                self._tenant_cpu.pop(tenant, None)

    def _count_queued(self, tenant: str, before: JobState | None, after: JobState) -> None:
        """A job of ``tenant`` moved from ``before`` (None: new) to ``after``."""
        if before is None:
            self._tenants_seen.add(tenant)
        change = (after in QUEUED_STATES) - (before in QUEUED_STATES)
        if change:
            queued = self._tenant_queued.get(tenant, 0) + change
            if queued > 0:
                self._tenant_queued[tenant] = queued
            else:
                self._tenant_queued.pop(tenant, None)

    # -- bindings ---------------------------------------------------------------------------
    def note_binding(self, view: JobView, at: datetime) -> None:
        """Count a binding (made ``at``) on its node until the node's load report reflects it
        (herd guard); nothing if the job holds no room (it ended or was never bound)."""
        if not view.node or view.job_id not in self._holding:
            return
        self._forget_inflight(view.node, view.job_id)
        cpu, memory = view.resources.cpu, int(view.resources.memory_mb)
        self._inflight.setdefault(view.node, {})[view.job_id] = (at, cpu, memory)
        totals = self._inflight_totals.setdefault(view.node, [0.0, 0.0])
        totals[0] += cpu
        totals[1] += memory
        self._pass_changed.add(view.node)

    def _forget_inflight(self, node: str, job_id: str) -> None:
        entry = self._inflight.get(node, {}).pop(job_id, None)
        if entry is not None:
            totals = self._inflight_totals[node]
            totals[0] -= entry[1]
            totals[1] -= entry[2]
            self._pass_changed.add(node)

    def inflight(self, node: str) -> dict[str, tuple[datetime, float, int]]:
        """job -> (bound at, cpu, memory) of the bindings on ``node`` not settled yet."""
        return dict(self._inflight.get(node, {}))

    def fence_sequence(self, job_id: str) -> int:
        """Stream sequence of the last ``bound`` of ``job_id`` seen (0: none): a bound this
        replica publishes expects it as the subject's last."""
        return self._last_bound_seq.get(job_id, 0)

    def note_bound_sequence(self, job_id: str, sequence: int) -> None:
        """This replica's ``bound`` of ``job_id`` was stored at ``sequence``."""
        self._last_bound_seq[job_id] = sequence

    # -- preemption -------------------------------------------------------------------------
    def nominate(self, preemption: Preemption, until: datetime) -> None:
        """Hold room on the preemption's node for its job until ``until`` (or until the job is
        bound), and count its victims as terminating (they are no victims again)."""
        self._nominations[preemption.job_id] = Nomination(
            node=preemption.node, victims=preemption.victims, until=until
        )
        self._terminating.update(preemption.victims)

    def nominated(self, job_id: str) -> bool:
        """Whether room is held for ``job_id`` (a lapsed nomination counts until ``queue``)."""
        return job_id in self._nominations

    def running_work(self) -> list[RunningJob]:
        """RUNNING jobs a preemptor may stop (not those being stopped already)."""
        work: list[RunningJob] = []
        for view in self.views(JobState.RUNNING):
            if view.job_id in self._terminating or not view.node:
                continue
            work.append(
                RunningJob(
                    job_id=view.job_id,
                    node=view.node,
                    cpu=view.resources.cpu,
                    memory_mb=int(view.resources.memory_mb),
                    priority=view.priority,
                    started_at=view.current.started_at,
                    tenant=ids.tenant_of(view.job_id),
                    checkpoint_at=view.checkpoint_at,
                )
            )
        return work

    # -- job control --------------------------------------------------------------------------
    def stopping(self) -> list[JobView]:
        """The live jobs whose attempt is being stopped on request (``JobView.stop``), by id."""
        return [self.book.jobs[job_id] for job_id in sorted(self._stopping)]

    def take_unknown_fences(self) -> list[str]:
        """Extended jobs whose last ``bound`` is to be read from the log (``fence_learned``
        tells it); each handed out once."""
        unknown = sorted(self._unknown_fences)
        self._unknown_fences.clear()
        return unknown

    def ask_fence_again(self, job_id: str) -> None:
        """The look-up of ``job_id``'s last ``bound`` failed: hand it out again."""
        self._unknown_fences.add(job_id)

    def fence_learned(self, job_id: str, sequence: int) -> None:
        """The service read ``job_id``'s last ``bound`` from the log: at ``sequence``."""
        if sequence > self._last_bound_seq.get(job_id, 0):
            self._last_bound_seq[job_id] = sequence

    def take_orphan_pods(self) -> list[tuple[str, int]]:
        """(job, attempt) of the pods to delete because their job was cancelled while it held
        a node; each handed out once."""
        orphans = sorted(self._orphan_pods)
        self._orphan_pods.clear()
        return orphans

    # -- what to decide on ------------------------------------------------------------------
    def views(self, state: JobState) -> list[JobView]:
        """The jobs in ``state`` (terminal states: only those ended since the last prune)."""
        return [self.book.jobs[job_id] for job_id in self._by_state[state]]

    def count(self, state: JobState) -> int:
        """How many jobs are in ``state``."""
        return len(self._by_state[state])

    def cancelled_dependencies(self, view: JobView) -> tuple[str, ...]:
        """The dependencies of a waiting (or held while waiting) job that were CANCELLED: the
        job is cancelled with them."""
        return tuple(
            dep for dep in view.depends_on_ids if self.final_state(dep) is JobState.CANCELLED
        )

    def dependency_verdict(self, view: JobView) -> tuple[str, ...] | None:
        """For a WAITING job: None while it must wait; its failed dependencies when it fails
        with them (``fail_on_dependency_failure``); () when it is released."""
        states = [self.final_state(dep) for dep in view.depends_on_ids]
        failed = tuple(
            dep
            for dep, state in zip(view.depends_on_ids, states, strict=True)
            if state is JobState.FAILED
        )
        if failed and self.fail_on_dependency_failure:
            return failed
        if all(state is not None and self._dependency_done(state) for state in states):
            return ()
        return None

    def final_state(self, job_id: str) -> JobState | None:
        """The state of ``job_id`` (its final one if ``prune`` forgot it); None if unknown
        (then it is filed for the service to look up, once)."""
        view = self.book.jobs.get(job_id)
        if view is not None:
            return view.state
        final = self._ended.get(job_id) or self._learned.get(job_id)
        if final is None and job_id not in self._asked and job_id not in self._missing:
            self._unknown.add(job_id)
        return final

    def take_unknown_dependencies(self) -> list[str]:
        """The dependencies to read from the log (each handed out once until answered)."""
        unknown = sorted(self._unknown)
        self._asked.update(unknown)
        self._unknown.clear()
        return unknown

    def learn_final(self, job_id: str, final: JobState) -> None:
        """The service read ``job_id``'s terminal event from the log: remember its state."""
        self._asked.discard(job_id)
        if job_id not in self.book.jobs:
            self._learned[job_id] = final

    def learn_missing(self, job_id: str) -> None:
        """The log holds no terminal event of ``job_id`` (aged out, or a bug): its dependents
        wait; ``is_missing`` says so to the explanation."""
        self._asked.discard(job_id)
        self._missing.add(job_id)

    def ask_again(self, job_id: str) -> None:
        """The look-up of ``job_id`` failed (the log could not be read): hand it out again."""
        self._asked.discard(job_id)
        self._unknown.add(job_id)

    def is_missing(self, job_id: str) -> bool:
        return job_id in self._missing

    def _remember_ended(self, job_id: str, final: JobState, cluster: str = "") -> None:
        self._ended[job_id] = final
        self._ended.move_to_end(job_id)
        if cluster:
            self._ended_cluster[job_id] = cluster
        while len(self._ended) > self.ended_memory:
            forgotten, _ = self._ended.popitem(last=False)
            self._ended_cluster.pop(forgotten, None)

    def _dependency_done(self, state: JobState) -> bool:
        if state is JobState.SUCCEEDED:
            return True
        # without fail-on-dependency-failure, a dependency that failed for good counts as done
        return state is JobState.FAILED and not self.fail_on_dependency_failure

    def _queued_job(self, view: JobView) -> QueuedJob:
        key = (view.job_id, view.attempt)
        job = self._queued.get(key)
        if job is None:
            job = QueuedJob(
                job_id=view.job_id,
                cpu=view.resources.cpu,
                memory_mb=int(view.resources.memory_mb),
                priority=view.priority,
                submitted_at=view.submitted_at,
                avoid_nodes=frozenset(view.avoid_nodes),
                tenant=ids.tenant_of(view.job_id),
                clusters=Selector.of(view.spec.clusters)
                if view.spec.HasField("clusters")
                else NO_SELECTOR,
                data_clusters=tuple(self.output_cluster(dep) for dep in view.depends_on_ids)
                if self._cluster_labels.keys() - {""}
                else (),
            )
            self._queued[key] = job
        return job

    def queue(self, now: datetime) -> list[QueuedJob]:
        """The PENDING jobs due at ``now``, in queue order, with their nominations (a lapsed
        nomination is dropped)."""
        jobs: list[QueuedJob] = []
        for view in self.views(JobState.PENDING):
            if view.not_before is not None and view.not_before > now:
                continue
            if view.stop is Stop.CANCEL:  # cancelled before it is bound (the service ends it)
                continue
            job = self._queued_job(view)
            nomination = self._nominations.get(view.job_id)
            if nomination is not None:
                if nomination.until < now:
                    del self._nominations[view.job_id]
                else:
                    job = replace(job, nominated_node=nomination.node)
            jobs.append(job)
        jobs.sort(key=lambda job: queue_key(job, self.config))
        return jobs

    def capacities(self, now: datetime) -> list[NodeCapacity]:
        """What the cordon budget weighs: each node's CPU, whether placement could bind there
        (ready, load fresh at ``now``) and whether an operator cordoned it."""
        timeout = self.config.load_timeout_s
        return [
            NodeCapacity(
                name=node.name,
                cpu=node.cpu_capacity,
                ready=node.ready and (now - node.reported_at).total_seconds() <= timeout,
                cordoned=node.cordoned,
                problem=node.problem,
            )
            for node in self.nodes.values()
        ]

    def node_states(self, cordons: Container[str] = ()) -> list[NodeState]:
        """Copies of the known nodes, by name, with their reservations, in-flight bindings and
        the failure ``cordons`` in force (``plan`` changes the copies, never the state)."""
        return [self._copy_of(name, cordons) for name in sorted(self.nodes)]

    def pass_nodes(self, cordons: Collection[str] = ()) -> list[NodeState]:
        """``node_states`` for a pass, made again only where something changed since the
        last call rather than node by node each time (a pass's cost would grow with the
        cluster). The copies are lent until the next call; the caller may change their
        reservation and in-flight fields (``plan``'s bindings, the preemption plans' room),
        which the next call sets back, and nothing else."""
        cordoned = frozenset(cordons)
        copies = self._pass_copies
        if len(copies) != len(self.nodes):  # a node reported for the first time
            copies = self._pass_copies = self.node_states(cordoned)
            self._pass_position = {node.name: index for index, node in enumerate(copies)}
            self._pass_rooms = [_room(node) for node in copies]
            self._pass_cordons = cordoned
            self._pass_changed.clear()
            lent = list(copies)
            self.ranking.lend(lent, None)
            return lent
        changed = self._pass_changed
        if cordoned != self._pass_cordons:
            changed |= cordoned ^ self._pass_cordons
            self._pass_cordons = cordoned
        rooms = self._pass_rooms
        for node, room in zip(copies, rooms, strict=True):
            if (
                node.reserved_cpu != room[0]
                or node.reserved_memory_mb != room[1]
                or node.inflight_cpu != room[2]
                or node.inflight_memory_mb != room[3]
            ):
                changed.add(node.name)  # the last pass's plan changed it
        position = self._pass_position
        made: list[int] = []
        for name in changed:
            index = position.get(name)
            if index is not None:  # else a node that never reported (a binding to it)
                copies[index] = node = self._copy_of(name, cordoned)
                rooms[index] = _room(node)
                made.append(index)
        changed.clear()
        lent = list(copies)
        self.ranking.lend(lent, made)
        return lent

    def _copy_of(self, name: str, cordons: Container[str]) -> NodeState:
        """The copy of node ``name`` that ``node_states`` hands out."""
        node = self.nodes[name]
        idle = (0.0, 0.0)
        cpu, memory = self._reserved.get(name, idle)
        inflight_cpu, inflight_memory = self._inflight_totals.get(name, idle)
        # built positionally, in NodeState's field order (NodeSample's, then placement's):
        # ``dataclasses.replace`` costs 3x as much per node, keywords a third more
        return NodeState(
            name,
            node.cpu_capacity,
            node.memory_capacity_mb,
            node.ready and not (name in self._node_lost_at and self._lost_since_report(node)),
            node.cpu_load,
            node.memory_load,
            node.cordoned or name in cordons,
            node.cluster,
            node.cluster_labels,
            node.problem,
            node.reported_at,
            cpu,
            int(memory),
            inflight_cpu if inflight_cpu > 0.0 else 0.0,
            int(inflight_memory) if inflight_memory > 0 else 0,
        )

    def _lost_since_report(self, node: NodeState) -> bool:
        """Whether a job was lost with ``node`` (FAILURE_NODE_LOST) after its latest load
        report: that report's "ready" is then older than the news that the node is gone, so the
        node counts as not ready until it reports again. Without this, a job requeued within a
        second of its node's loss is bound straight back to the dead node when its avoid-list
        cannot be honoured (every other node full)."""
        lost_at = self._node_lost_at.get(node.name)
        if lost_at is None:
            return False
        if node.reported_at > lost_at:
            del self._node_lost_at[node.name]  # a newer report speaks for the node again
            return False
        return True

    # -- tenants ----------------------------------------------------------------------------
    def tenant_usage(self, tenant: str) -> tuple[int, float]:
        """``tenant``'s jobs not running yet and the CPU of its BOUND and RUNNING jobs."""
        return self._tenant_queued.get(tenant, 0), self._tenant_cpu.get(tenant, 0.0)

    def held(self) -> dict[str, Held]:
        """Each tenant's ("" the operator's) BOUND and RUNNING requests, for fair share (copies:
        ``plan`` may count bindings on them)."""
        return {tenant: Held(held.cpu, held.memory_mb) for tenant, held in self._held.items()}

    def _held_as_planned(self) -> dict[str, Held]:
        """Each tenant's requests as preemptions already under way will leave them: victims
        being stopped no longer count for their tenants, and jobs with room held for them
        (nominated, still PENDING) count for theirs; otherwise the passes until the victims
        are gone would see the same shortfall again and stop more."""
        held = {tenant: Held(h.cpu, h.memory_mb) for tenant, h in self._held.items()}
        for victim in self._terminating:
            holding = self._holding.get(victim)
            if holding is not None:
                mine = held.setdefault(ids.tenant_of(victim), Held())
                mine.cpu -= holding[1]
                mine.memory_mb -= holding[2]
        for job_id in self._nominations:
            view = self.book.jobs.get(job_id)
            if view is not None and view.state is JobState.PENDING:
                mine = held.setdefault(ids.tenant_of(job_id), Held())
                mine.cpu += view.resources.cpu
                mine.memory_mb += view.resources.memory_mb
        return held

    def schedulable_capacity(self, now: datetime) -> tuple[float, float]:
        """CPU and memory (MiB) of the nodes placement may bind to at ``now`` (ready, not
        cordoned, load fresh): what fair shares are shares of."""
        timeout, cpu, memory = self.config.load_timeout_s, 0.0, 0
        for name in sorted(self.nodes):  # node_filter(check_load=False) of node_states()
            node = self.nodes[name]
            if (
                node.ready
                and not node.cordoned
                and (now - node.reported_at).total_seconds() <= timeout
                and not self._lost_since_report(node)
            ):
                cpu += node.cpu_capacity
                memory += node.memory_capacity_mb
        return cpu, float(memory)

    def shares(
        self,
        now: datetime,
        weight: Callable[[str], float],
        guaranteed: Callable[[str], float] = no_guarantee,
        maximum: Callable[[str], float | None] = no_maximum,
    ) -> dict[str, TenantShare]:
        """Each tenant's ("" the operator's) fair-share standing at ``now``: its running
        requests, its dominant share of the schedulable capacity (nodes ready, not cordoned,
        load fresh) and the fair share it is due while every tenant's PENDING jobs compete
        (``fair_shares``). Tenants with nothing running or pending are left out."""
        total_cpu, total_memory_mb = self.schedulable_capacity(now)
        holding = self._held_as_planned()
        wanted = {tenant: Held(held.cpu, held.memory_mb) for tenant, held in holding.items()}
        for view in self.views(JobState.PENDING):
            if view.job_id in self._nominations:
                continue  # counted as held already
            tenant = ids.tenant_of(view.job_id)
            held = wanted.setdefault(tenant, Held())
            held.cpu += view.resources.cpu
            held.memory_mb += view.resources.memory_mb
        running: dict[str, int] = {}
        for job_id in self._holding:
            tenant = ids.tenant_of(job_id)
            running[tenant] = running.get(tenant, 0) + 1
        demands = {
            tenant: dominant_share(held, total_cpu, total_memory_mb)
            for tenant, held in wanted.items()
        }
        fair = fair_shares(demands, weight, guaranteed, maximum)
        report: dict[str, TenantShare] = {}
        for tenant in wanted:
            held = holding.get(tenant, Held())
            report[tenant] = TenantShare(
                running_jobs=running.get(tenant, 0),
                running=Held(held.cpu, held.memory_mb),
                weight=weight(tenant),
                share=dominant_share(held, total_cpu, total_memory_mb),
                fair_share=fair[tenant],
                total_cpu=total_cpu,
                total_memory_mb=total_memory_mb,
            )
        return report

    def tenants(self) -> list[str]:
        """Every tenant with a job in the log, by name."""
        return sorted(self._tenants_seen)

    def tenant_room(self, policy: Callable[[str], TenantPolicy]) -> dict[str, float]:
        """The CPU each tenant with queued jobs and a CPU quota (its ``policy``) may still
        bind."""
        room: dict[str, float] = {}
        for tenant in self._tenant_queued:
            left = cpu_room(policy(tenant), self._tenant_cpu.get(tenant, 0.0))
            if left is not None:
                room[tenant] = left
        return room

    def quota_reasons(
        self, jobs: Iterable[QueuedJob], policy: Callable[[str], TenantPolicy]
    ) -> dict[str, str]:
        """job -> why its tenant's CPU quota keeps it from being bound now, for those it does."""
        reasons: dict[str, str] = {}
        for job in jobs:
            if not policy_applies(job.tenant):
                continue
            running = self._tenant_cpu.get(job.tenant, 0.0)
            reason = cpu_quota_reason(job.tenant, policy(job.tenant), running, job.cpu)
            if reason:
                reasons[job.job_id] = reason
        return reasons

    # -- memory -----------------------------------------------------------------------------
    @property
    def unpruned_ended(self) -> int:
        """Jobs that ended since the last ``prune`` (their views are still held)."""
        return len(self._ended_since)

    def prune(self) -> int:
        """Forget the jobs that ended since the last prune, keeping only their final state
        (``final_state``: all a chain asks of a dependency); returns how many. An ended job
        holds no room, counts in no tenant's usage and accepts no event, so nothing else
        changes. Call it between decisions, never while views taken from ``views`` are still
        being acted on (the service does it once per loop)."""
        forgotten = 0
        for job_id in self._ended_since:
            view = self.book.jobs.get(job_id)
            if view is None or not view.state.terminal:  # gone, or extended since it ended
                continue
            del self.book.jobs[job_id]
            self._remember_ended(job_id, view.state, cluster_of(view.node))
            self._by_state[view.state].discard(job_id)
            self._indexed_state.pop(job_id, None)
            self._last_bound_seq.pop(job_id, None)
            forgotten += 1
        self._ended_since.clear()
        if self._learned or self._missing:
            needed = {
                dep
                for job_id in self._by_state[JobState.WAITING]
                for dep in self.book.jobs[job_id].depends_on_ids
            }
            self._learned = {job: st for job, st in self._learned.items() if job in needed}
            self._missing &= needed
        return forgotten

    def sizes(self) -> dict[str, int]:
        """How many entries each index holds (what memory grows with)."""
        return {
            "jobs": len(self.book.jobs),
            "indexed": len(self._indexed_state),
            "holding": len(self._holding),
            "inflight": sum(len(jobs) for jobs in self._inflight.values()),
            "queued_jobs": len(self._queued),
            "fences": len(self._last_bound_seq),
            "nominations": len(self._nominations),
            "terminating": len(self._terminating),
            "ended": len(self._ended),
            "learned": len(self._learned),
            "missing": len(self._missing),
            "ended_since_prune": len(self._ended_since),
            "stopping": len(self._stopping),
            "orphan_pods": len(self._orphan_pods),
        }

    # -- snapshot ---------------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        """The state's content as JSON-able values; ``from_snapshot`` rebuilds it. The
        indexes derived from the jobs (states, reservations, tenant usage) are not in it."""
        return {
            "version": SNAPSHOT_VERSION,
            "last_sequence": self.book.last_sequence,
            "jobs": [view.to_dict() for view in self.book.jobs.values()],
            "ended": [  # oldest first; the cluster its outputs are on, where one is named
                [job, state.value, *([where] if (where := self._ended_cluster.get(job)) else [])]
                for job, state in self._ended.items()
            ],
            "ended_since_prune": list(self._ended_since),
            "fences": sorted([job, seq] for job, seq in self._last_bound_seq.items()),
            "inflight": sorted(
                [node, job, at.isoformat(), cpu, memory]
                for node, jobs in self._inflight.items()
                for job, (at, cpu, memory) in jobs.items()
            ),
            "nodes": [_node_to_dict(self.nodes[name]) for name in sorted(self.nodes)],
            "node_lost_at": sorted(
                [node, at.isoformat()] for node, at in self._node_lost_at.items()
            ),
            "health": self.health.to_dict(),
            "tenants_seen": sorted(self._tenants_seen),
        }

    @classmethod
    def from_snapshot(
        cls,
        data: dict[str, Any],
        config: PlacementConfig = PlacementConfig(),
        *,
        load_settle_s: float = 10.0,
        health_policy: NodeHealthPolicy | None = None,
        fail_on_dependency_failure: bool = True,
        ended_memory: int = ENDED_MEMORY,
    ) -> PlacementState:
        """The state ``snapshot`` wrote (under this configuration). Raises ``ValueError`` for
        a snapshot of another layout (the caller then replays the log)."""
        if data.get("version") != SNAPSHOT_VERSION:
            raise ValueError(f"placement snapshot version {data.get('version')!r} is not mine")
        state = cls(
            config,
            load_settle_s=load_settle_s,
            health_policy=health_policy,
            fail_on_dependency_failure=fail_on_dependency_failure,
            ended_memory=ended_memory,
        )
        state.book.last_sequence = int(data["last_sequence"])
        state._tenants_seen.update(data["tenants_seen"])
        for raw in data["jobs"]:
            view = JobView.from_dict(raw)
            state.book.jobs[view.job_id] = view
            state._index(view)
        state._ended_since = list(data["ended_since_prune"])
        for job, final, *where in data["ended"]:
            state._remember_ended(job, JobState(final), where[0] if where else "")
        state._last_bound_seq = {job: int(seq) for job, seq in data["fences"]}
        for node, job, at, cpu, memory in data["inflight"]:
            state._inflight.setdefault(node, {})[job] = (
                datetime.fromisoformat(at),
                float(cpu),
                int(memory),
            )
            totals = state._inflight_totals.setdefault(node, [0.0, 0.0])
            totals[0] += cpu
            totals[1] += memory
        state.nodes = {raw["name"]: _node_from_dict(raw, state._labels_of) for raw in data["nodes"]}
        state._problem_nodes = {name for name, node in state.nodes.items() if node.problem}
        state._node_lost_at = {
            node: datetime.fromisoformat(at) for node, at in data["node_lost_at"]
        }
        state.health = NodeHealth.from_dict(data["health"], state.health.policy)
        return state


def _room(node: NodeState) -> tuple[float, int, float, int]:
    """The fields of a node's copy that a pass may change."""
    return node.reserved_cpu, node.reserved_memory_mb, node.inflight_cpu, node.inflight_memory_mb


def _node_to_dict(node: NodeState) -> dict[str, Any]:
    return {
        "name": node.name,
        "cpu_capacity": node.cpu_capacity,
        "memory_capacity_mb": node.memory_capacity_mb,
        "ready": node.ready,
        "cordoned": node.cordoned,
        "cpu_load": node.cpu_load,
        "memory_load": node.memory_load,
        "reported_at": node.reported_at.isoformat(),
        "cluster": node.cluster,
        "cluster_labels": dict(node.cluster_labels),
        "problem": node.problem,
    }


def _node_from_dict(
    data: dict[str, Any], labels_of: Callable[[str, Mapping[str, str]], dict[str, str]]
) -> NodeState:
    cluster = str(data.get("cluster", ""))  # a snapshot from before clusters: the unnamed one
    return NodeState(
        name=data["name"],
        cpu_capacity=float(data["cpu_capacity"]),
        memory_capacity_mb=int(data["memory_capacity_mb"]),
        ready=bool(data["ready"]),
        cordoned=bool(data["cordoned"]),
        cpu_load=float(data["cpu_load"]),
        memory_load=float(data["memory_load"]),
        reported_at=datetime.fromisoformat(data["reported_at"]),
        cluster=cluster,
        cluster_labels=labels_of(cluster, data.get("cluster_labels", {})),
        problem=str(data.get("problem", "")),
    )
