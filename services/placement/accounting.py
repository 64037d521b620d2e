"""Each tenant's standing as placement sees it: the CPU its quota leaves it, its fair share
(weight, guaranteed and maximum share from its policy), and its usage written into the waiting
bucket for intake's queued-jobs quota (docs/placement.md, "Tenant quotas", "Fair share")."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime
from typing import Any

from mdq.bus.outage import warn_try_failed
from mdq.bus.tenants import TenantDirectory
from mdq.core.fairshare import OPERATOR_WEIGHT, Fairness
from mdq.core.placement import QueuedJob
from mdq.core.placement_state import PlacementState, TenantShare
from mdq.core.tenants import TenantUsage, usage_key
from services.placement.settings import PlacementSettings
from services.placement.waiting import WAITING_REFRESH_S, WaitingBucket

log = logging.getLogger("mdq.placement")


def _refresh(written: tuple[tuple[Any, ...], datetime], now: datetime) -> bool:
    """Whether a tenant's unchanged usage is written again: while it is not nothing (jobs
    queued or CPU running), every ``WAITING_REFRESH_S`` (nothing is written once and left to
    expire)."""
    counted, at = written
    return counted[:2] != (0, 0.0) and (now - at).total_seconds() >= WAITING_REFRESH_S


class TenantAccounting:
    """Tenants' quotas and fair shares for a pass, from their policies (read live)."""

    def __init__(
        self,
        *,
        state: Callable[[], PlacementState],
        tenants: TenantDirectory,
        settings: PlacementSettings,
        clock: Callable[[], datetime],
        bucket: WaitingBucket,
    ) -> None:
        """``state``: placement's state now (a restore replaces it)."""
        self._state = state
        self._tenants = tenants
        self._settings = settings
        self._clock = clock
        self._bucket = bucket
        self._written: dict[str, tuple[tuple[Any, ...], datetime]] = {}
        """tenant -> (queued jobs, running CPU) last written as its usage, and when."""
        self._written_at: datetime | None = None

    def shares(self, now: datetime) -> dict[str, TenantShare]:
        """Each tenant's fair-share standing now ({} with fair share off)."""
        if not self._settings.fair_share:
            return {}
        return self._state().shares(now, self.weight, self.guaranteed, self.maximum)

    def fairness(self) -> Fairness | None:
        """What ``plan`` weighs tenants by (None with fair share off)."""
        if not self._settings.fair_share:
            return None
        return Fairness(
            held=self._state().held(),
            weight=self.weight,
            guaranteed=self.guaranteed,
            maximum=self.maximum,
        )

    def guaranteed(self, tenant: str) -> float:
        """A tenant's guaranteed share (its policy's; none for the operator)."""
        return (self._tenants.policy(tenant).guaranteed_share or 0.0) if tenant else 0.0

    def maximum(self, tenant: str) -> float | None:
        """A tenant's maximum share (its policy's; none for the operator)."""
        return self._tenants.policy(tenant).max_share if tenant else None

    def weight(self, tenant: str) -> float:
        """A tenant's fair-share weight: its policy's (read at each pass, so a change to the
        tenants bucket counts from the next), the operator's ``OPERATOR_WEIGHT``."""
        return self._tenants.policy(tenant).weight if tenant else OPERATOR_WEIGHT

    def tenant_room(self) -> dict[str, float]:
        """The CPU each tenant with queued jobs and a CPU quota may still bind."""
        return self._state().tenant_room(self._tenants.policy)

    def quota_reasons(self, jobs: list[QueuedJob]) -> dict[str, str]:
        """job -> why its tenant's CPU quota keeps it from being bound now, for those it does."""
        return self._state().quota_reasons(jobs, self._tenants.policy)

    async def write_usage(self) -> None:
        """Write each tenant's usage (``TenantUsage``) into the waiting bucket under
        ``tenant.<name>``, at most every ``tenant_usage_interval_s``, when it changed since
        it was last written (and every ``WAITING_REFRESH_S`` while it is not nothing, so it
        does not expire; an absent key means nothing queued or running). Best effort."""
        interval = self._settings.tenant_usage_interval_s
        now = self._clock()
        last = self._written_at
        if interval <= 0 or (last is not None and (now - last).total_seconds() < interval):
            return
        self._written_at = now
        shares = self.shares(now)
        for tenant in self._state().tenants():
            queued, cpu = self._state().tenant_usage(tenant)
            standing = shares.get(tenant)
            counted: tuple[Any, ...] = (queued, round(cpu, 6), self.weight(tenant))
            if standing is not None:
                counted += (
                    standing.running_jobs,
                    round(standing.running.memory_mb, 3),
                    round(standing.share, 4),
                    round(standing.fair_share, 4),
                )
            written = self._written.get(tenant)
            if written is not None and written[0] == counted and not _refresh(written, now):
                continue
            usage = TenantUsage(
                queued_jobs=queued, running_cpu=counted[1], as_of=now, weight=counted[2]
            )
            if standing is not None:
                usage = replace(
                    usage,
                    running_jobs=counted[3],
                    running_memory_mb=counted[4],
                    share=counted[5],
                    fair_share=counted[6],
                )
            try:
                await self._bucket.put(usage_key(tenant), usage.to_json())
            except Exception as error:
                warn_try_failed(log, f"could not write the usage of tenant {tenant}", error)
                return
            self._written[tenant] = (counted, now)
