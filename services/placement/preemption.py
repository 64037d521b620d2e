"""Room made for waiting jobs by stopping running ones: a high-priority job preempts
lower-priority work (``plan_preemptions``), a tenant below its fair share reclaims room from
those above theirs (``plan_fair_reclaims``). The preemptor is nominated on the node, the
victims' pods are deleted (docs/placement.md, "Preemption", "Fair share")."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta

from mdq.backends.port import ClusterBackend
from mdq.core import ids
from mdq.core.placement import (
    NodeState,
    PlacementConfig,
    Preemption,
    QueuedJob,
    Standing,
    plan_fair_reclaims,
    plan_preemptions,
)
from mdq.core.placement_state import PlacementState, TenantShare
from services.placement.settings import PlacementSettings

log = logging.getLogger("mdq.placement")

PREEMPTION_SCAN = 64
"""Unplaced jobs (in queue order) considered for preemption per pass."""


class Preemptor:
    """Stops running work for the unplaced jobs of a pass."""

    def __init__(
        self,
        *,
        state: Callable[[], PlacementState],
        backend: ClusterBackend,
        settings: PlacementSettings,
        config: PlacementConfig,
        shares: Callable[[datetime], dict[str, TenantShare]],
    ) -> None:
        """``state``: placement's state now (a restore replaces it). ``shares``: each
        tenant's fair-share standing now."""
        self._state = state
        self._backend = backend
        self._settings = settings
        self._config = config
        self._shares = shares
        self.preempted_total = 0
        self.reclaimed_total = 0
        """Running jobs stopped to give a tenant its fair share back (in ``preempted_total``
        too)."""

    async def preempt(
        self, nodes: list[NodeState], unplaced: list[QueuedJob], now: datetime
    ) -> list[Preemption]:
        candidates = [job for job in unplaced if not self._state().nominated(job.job_id)]
        if not candidates:
            return []
        running = self._state().running_work()
        if not running:
            return []
        lowest = min(work.priority for work in running)
        # the head of the queue only: a pass never costs more than a bounded search
        candidates = [job for job in candidates if job.priority > lowest][:PREEMPTION_SCAN]
        if not candidates:
            return []
        preemptions = plan_preemptions(nodes, candidates, running, now, self._config)
        await self._stop_for(preemptions, now)
        return preemptions

    async def _stop_for(self, preemptions: list[Preemption], now: datetime) -> None:
        """Hold each preemptor's room on its node and delete its victims' pods."""
        until = now + timedelta(seconds=self._settings.preemption_timeout_s)
        # the victims' views are taken before the first await: nothing is pruned meanwhile
        # (pruning happens between passes), this just keeps that true if that ever changes
        victims = [[self._state().book.jobs[v] for v in p.victims] for p in preemptions]
        for preemption, views in zip(preemptions, victims, strict=True):
            log.info("preemption for %s: %s", preemption.job_id, preemption.reason)
            self._state().nominate(preemption, until)
            for view in views:
                await self._backend.delete_pod(ids.pod_name(view.job_id, view.attempt))
                self.preempted_total += 1

    async def reclaim(
        self, nodes: list[NodeState], unplaced: list[QueuedJob], now: datetime
    ) -> list[Preemption]:
        """Give tenants below their fair share room back from those above theirs
        (``plan_fair_reclaims``), by the preemption path: the waiting job is nominated on the
        node, the victims' pods are deleted (SIGTERM: they checkpoint, and recovery requeues
        them at once)."""
        candidates = [job for job in unplaced if not self._state().nominated(job.job_id)]
        if not candidates:
            return []
        shares = self._shares(now)
        if len(shares) < 2:
            return []  # one tenant: nobody to take from
        standing = {t: Standing(s.share, s.fair_share) for t, s in shares.items()}
        if not any(figures.share > figures.fair_share for figures in standing.values()):
            return []
        total_cpu, total_memory_mb = self._state().schedulable_capacity(now)
        reclaims = plan_fair_reclaims(
            nodes,
            candidates[:PREEMPTION_SCAN],
            self._state().running_work(),
            standing,
            total_cpu,
            total_memory_mb,
            now,
            self._config,
            min_run_s=self._settings.fair_share_min_run_s,
        )
        await self._stop_for(reclaims, now)
        self.reclaimed_total += sum(len(reclaim.victims) for reclaim in reclaims)
        return reclaims
