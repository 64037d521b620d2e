"""Binding: each pass plans the PENDING jobs onto nodes (``mdq.core.placement.plan``),
publishes a fenced ``bound`` per decision and creates its pod; what fits nowhere is explained
and may preempt or reclaim. The fence (``Nats-Expected-Last-Subject-Sequence``) keeps a job
from being bound twice, whatever the replicas (docs/placement.md, "Replicas and restarts")."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Callable
from datetime import datetime

from nats.js.api import PubAck

from mdq.backends.port import ClusterBackend, PodExists, PodSpec
from mdq.bus.publisher import EventPublisher
from mdq.bus.requests import EXPECTED_LAST_SUBJECT_SEQUENCE, is_wrong_last_sequence
from mdq.contracts import pb
from mdq.core import ids
from mdq.core.clusters import cluster_of
from mdq.core.placement import Decision, PlacementConfig, plan
from mdq.core.placement_state import PlacementState
from mdq.core.state import JobState, JobView, Stop, event_time
from services.placement.accounting import TenantAccounting
from services.placement.cordons import Cordons
from services.placement.emitter import Emitter
from services.placement.preemption import Preemptor
from services.placement.scores import ExplainedScores, candidate_entry, cluster_score_messages
from services.placement.settings import PlacementSettings
from services.placement.waiting import WaitingExplainer

log = logging.getLogger("mdq.placement")


class Binder:
    """Places the queue on each pass and makes sure bound jobs have their pods."""

    def __init__(
        self,
        *,
        state: Callable[[], PlacementState],
        publisher: EventPublisher,
        backend: ClusterBackend,
        settings: PlacementSettings,
        config: PlacementConfig,
        emitter: Emitter,
        cordons: Cordons,
        accounting: TenantAccounting,
        explainer: WaitingExplainer,
        preemptor: Preemptor,
    ) -> None:
        """``state``: placement's state now (a restore replaces it)."""
        self._state = state
        self._publisher = publisher
        self._backend = backend
        self._settings = settings
        self._config = config
        self._emitter = emitter
        self._cordons = cordons
        self._accounting = accounting
        self._explainer = explainer
        self._preemptor = preemptor
        self._adopt: set[str] = set()
        """Jobs bound by someone else (an old leader) whose pod this leader makes sure of."""
        self._binding: set[str] = set()
        """Jobs whose bound event this replica is publishing right now."""
        self._own_echoes: set[int] = set()
        """Stream sequences of bound events this replica published and applied: their echo
        from the log changes nothing, so it is not decoded."""
        self.bound_total = 0
        self.fenced_total = 0
        """Bindings refused because another replica bound the job first."""

    # -- what the log's intake asks ----------------------------------------------------------
    def is_binding(self, job_id: str) -> bool:
        """Whether this replica is publishing the job's ``bound`` right now."""
        return job_id in self._binding

    def forget_echo(self, sequence: int) -> bool:
        """Whether ``sequence`` is a ``bound`` this replica published and applied (its echo
        is expected no more)."""
        if sequence in self._own_echoes:
            self._own_echoes.discard(sequence)
            return True
        return False

    def adopt(self, job_id: str) -> None:
        """A job bound by someone else: the next pass makes sure of its pod."""
        self._adopt.add(job_id)

    def drop_adopted(self) -> None:
        """Not leading: the pods of adopted jobs are the leader's to make sure of."""
        self._adopt.clear()

    async def ensure_adopted(self) -> None:
        """Make sure of the pod of each job adopted since the last pass."""
        if self._adopt:
            # a job that ended (and was pruned) since it was adopted needs no pod
            jobs = self._state().book.jobs
            adopted = [view for job in self._adopt if (view := jobs.get(job))]
            self._adopt.clear()
            await asyncio.gather(
                *(self.ensure_pod(v) for v in adopted if v.state is JobState.BOUND)
            )

    async def repair(self) -> None:
        """On taking over: make sure every BOUND job's pod exists (create is idempotent)."""
        await asyncio.gather(*(self.ensure_pod(v) for v in self._state().views(JobState.BOUND)))

    # -- a pass --------------------------------------------------------------------------------
    async def place(self, now: datetime) -> int:
        """Bind what fits of the queue; explain, preempt and reclaim for what does not.
        Returns the number of jobs bound."""
        queue = self._state().queue(now)
        if not queue:
            self._cordons.failure_cordons(now)  # noted each pass, with work to place or not
            return 0
        nodes = self._cordons.pass_nodes(now)  # lent to this pass: only for one with work
        room = self._accounting.tenant_room()
        fairness = self._accounting.fairness()
        decisions = plan(
            nodes,
            queue,
            now,
            self._config,
            ordered=True,
            tenant_room=room,
            fairness=fairness,
            ranking=self._state().ranking,
        )
        await self._bind_all(decisions)
        if len(decisions) < len(queue):
            placed = {decision.job_id for decision in decisions}
            unplaced = [job for job in queue if job.job_id not in placed]
            held = self._accounting.quota_reasons(unplaced) if room else {}
            await self._explainer.explain(nodes, unplaced, now, held)
            # a job its tenant's quota holds back may not take another's room either
            candidates = [job for job in unplaced if job.job_id not in held]
            if self._settings.preemption:
                await self._preemptor.preempt(nodes, candidates, now)
            if self._settings.fair_share and self._settings.fair_share_reclaim:
                await self._preemptor.reclaim(nodes, candidates, now)
        return len(decisions)

    async def _bind_all(self, decisions: list[Decision]) -> None:
        """Publish the decisions' ``bound`` events, fenced, ``bind_concurrency`` at a time,
        then create their pods. A publish that failed for another reason than the fence is
        raised once the others are applied."""
        size = self._settings.bind_concurrency
        failure: Exception | None = None
        explained: ExplainedScores = {}
        for start in range(0, len(decisions), size):
            try:
                await self._bind_batch(decisions[start : start + size], explained)
            except Exception as error:  # the other batches still go
                failure = failure or error
        if failure is not None:
            raise failure

    async def _bind_batch(self, decisions: list[Decision], explained: ExplainedScores) -> None:
        batch: list[tuple[JobView, pb.Event]] = []
        for decision in decisions:
            view = self._state().book.jobs[decision.job_id]
            if view.state is JobState.PENDING:
                batch.append((view, self.bound_event(view, decision, explained)))
        if not batch:
            return
        job_ids = [view.job_id for view, _ in batch]
        self._binding.update(job_ids)
        bound: list[JobView] = []
        failure: Exception | None = None
        try:
            results = await self._publisher.publish_each(
                [(event, self._fence(event.job_id)) for _, event in batch]
            )
            for (view, event), result in zip(batch, results, strict=True):
                try:
                    if not self._accepted(event, result):
                        continue
                except Exception as error:
                    failure = failure or error
                    continue
                self._emitter.apply(view, event)
                self._state().note_binding(view, event_time(event))
                bound.append(view)
        finally:
            self._binding.difference_update(job_ids)
        await asyncio.gather(*(self.ensure_pod(view) for view in bound))
        self.bound_total += len(bound)
        if failure is not None:
            raise failure

    def bound_event(
        self, view: JobView, decision: Decision, explained: ExplainedScores
    ) -> pb.Event:
        """The ``bound`` event of a decision, with its explanation.

        The decisions of one plan share most of their score objects (the core rescores only
        the nodes a binding changed), so ``explained`` keeps each one's encoded candidate entry
        by object for the plan: a decision's candidates are then one concatenation and one
        parse instead of a message built per node."""
        # The body is filled in place in the envelope: building it apart and copying it in
        # (make_event) would double the cost of the per-binding explanation.
        event = self._publisher.event(
            "bound", pb.JobBound(), job_id=view.job_id, attempt=view.attempt
        )
        body = event.bound
        body.node = decision.node
        body.pod_name = ids.pod_name(view.job_id, view.attempt)
        entries = []
        for score in decision.scores:
            known = explained.get(id(score))
            if known is None:  # the score object is kept with it, so its id stays its own
                known = explained[id(score)] = (score, candidate_entry(score))
            entries.append(known[1])
        body.MergeFromString(b"".join(entries))
        body.nodes_total = decision.nodes_total
        body.filtered_counts.update(decision.filtered_counts)
        body.not_examined = decision.not_examined
        body.cluster = cluster_of(decision.node)
        if decision.clusters:
            body.clusters.extend(cluster_score_messages(decision.clusters))
        body.resources.CopyFrom(view.resources)
        if view.resume_from is not None:
            body.resume_from.CopyFrom(view.resume_from)
        return event

    def _fence(self, job_id: str) -> dict[str, str]:
        """The header that makes JetStream refuse a ``bound`` if anyone bound the job since
        this replica last looked."""
        return {EXPECTED_LAST_SUBJECT_SEQUENCE: str(self._state().fence_sequence(job_id))}

    def _accepted(self, event: pb.Event, result: PubAck | Exception) -> bool:
        """Whether a fenced ``bound`` was stored as ours; raises the error of a publish that
        failed for another reason than the fence."""
        if is_wrong_last_sequence(result):
            log.info("%s was bound by another replica; not binding it", event.job_id)
            self.fenced_total += 1
            # read the last binding again: one of this attempt settles it when its echo comes;
            # one of an earlier attempt only means the fence was stale (an extended job)
            self._state().ask_fence_again(event.job_id)
            return False
        if isinstance(result, Exception):
            raise result
        if result.duplicate:
            self.fenced_total += 1
            return False
        self._state().note_bound_sequence(event.job_id, result.seq)
        if result.seq > self._state().book.last_sequence:  # its echo is still to come
            self._own_echoes.add(result.seq)
        return True

    def pod_for(self, view: JobView) -> PodSpec:
        """The pod of the job's current attempt on its bound node: a description of the
        attempt, never a command (the backend starts the runner; mdq.backends.launch)."""
        return PodSpec(
            name=ids.pod_name(view.job_id, view.attempt),
            job_id=view.job_id,
            attempt=view.attempt,
            node=view.node,
            cpu=view.resources.cpu,
            memory_mb=int(view.resources.memory_mb),
            priority_class=view.spec.priority_class,
            spec=view.spec,
            resume_from=view.resume_from,
            depends_on=tuple(view.depends_on_ids),
            threads=max(1, math.ceil(view.resources.cpu)),
        )

    async def ensure_pod(self, view: JobView) -> None:
        if view.state is not JobState.BOUND or view.stop is not Stop.NONE:
            return  # ended or being stopped meanwhile: no pod (one made is deleted by a pass)
        with contextlib.suppress(PodExists):
            await self._backend.create_pod(self.pod_for(view))
