"""Fair share between tenants: weighted dominant-resource fairness over the queue (pure).

``FairQueue`` hands ``plan`` the queued jobs one at a time, always the next job of the tenant
whose weighted dominant share is the smallest now, charging a tenant as soon as one of its jobs
binds; it is work-conserving. Design: docs/placement.md, "Fair share".
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

OPERATOR_WEIGHT = 1.0
"""Weight of the operator's own untenanted jobs (tenant "")."""


class Request(Protocol):
    """What fairness needs of a queued job (``mdq.core.placement.QueuedJob`` has it)."""

    @property
    def tenant(self) -> str: ...

    @property
    def cpu(self) -> float: ...

    @property
    def memory_mb(self) -> int: ...


Job = TypeVar("Job", bound=Request)


def no_guarantee(_tenant: str) -> float:
    """The guaranteed share of a tenant whose policy sets none."""
    return 0.0


def no_maximum(_tenant: str) -> float | None:
    """The maximum share of a tenant whose policy sets none (unlimited)."""
    return None


@dataclass(frozen=True, slots=True)
class Fairness:
    """What ``plan`` needs to order the queue fairly: each tenant's held requests now, its
    weight, and its guaranteed and maximum dominant shares (policy ``guaranteed_share``,
    ``max_share``)."""

    held: Mapping[str, Held]
    weight: Callable[[str], float]
    guaranteed: Callable[[str], float] = no_guarantee
    maximum: Callable[[str], float | None] = no_maximum


@dataclass(slots=True)
class Held:
    """What one tenant's BOUND and RUNNING jobs request in total."""

    cpu: float = 0.0
    memory_mb: float = 0.0


def dominant_share(held: Held, total_cpu: float, total_memory_mb: float) -> float:
    """The larger of ``held``'s CPU and memory shares of the capacity (0 with no capacity)."""
    cpu = held.cpu / total_cpu if total_cpu > 0 else 0.0
    memory = held.memory_mb / total_memory_mb if total_memory_mb > 0 else 0.0
    return max(cpu, memory)


class FairQueue(Generic[Job]):
    """The queue in weighted-DRF order, decided job by job as ``plan`` binds them.

    Iterate it for the jobs; call ``charge(job)`` for each one bound before asking for the
    next. ``queue`` must be in queue order (``queue_key``); ``held`` is each tenant's current
    requests (tenants absent hold nothing) and is not changed; ``weight`` gives a tenant's
    weight (> 0).
    """

    def __init__(
        self,
        queue: Sequence[Job],
        fairness: Fairness,
        total_cpu: float,
        total_memory_mb: float,
    ) -> None:
        held, weight = fairness.held, fairness.weight
        self._total_cpu = total_cpu
        self._total_memory_mb = total_memory_mb
        self._by_tenant: dict[str, list[tuple[int, Job]]] = {}
        for position, job in enumerate(queue):
            self._by_tenant.setdefault(job.tenant, []).append((position, job))
        self._held = {
            tenant: Held(held[tenant].cpu, held[tenant].memory_mb) if tenant in held else Held()
            for tenant in self._by_tenant
        }
        self._weight = {tenant: weight(tenant) for tenant in self._by_tenant}
        self._guaranteed = {tenant: fairness.guaranteed(tenant) for tenant in self._by_tenant}
        self._maximum = {tenant: fairness.maximum(tenant) for tenant in self._by_tenant}
        self._next = dict.fromkeys(self._by_tenant, 0)
        self._heap = [
            (*self._rank(tenant), jobs[0][0], tenant) for tenant, jobs in self._by_tenant.items()
        ]
        heapq.heapify(self._heap)

    def _share(self, tenant: str) -> float:
        return dominant_share(self._held[tenant], self._total_cpu, self._total_memory_mb)

    def _rank(self, tenant: str) -> tuple[int, float]:
        """Tenants below their guaranteed share first, then by weighted share."""
        below = self._share(tenant) < self._guaranteed[tenant] - 1e-12
        return (0 if below else 1, self.weighted_share(tenant))

    def over_maximum(self, job: Job) -> bool:
        """Whether binding ``job`` would take its tenant above its maximum share."""
        maximum = self._maximum[job.tenant]
        if maximum is None:
            return False
        held = self._held[job.tenant]
        after = Held(held.cpu + job.cpu, held.memory_mb + job.memory_mb)
        return dominant_share(after, self._total_cpu, self._total_memory_mb) > maximum + 1e-9

    def weighted_share(self, tenant: str) -> float:
        """``tenant``'s dominant share now (with what was charged) over its weight."""
        return self._share(tenant) / self._weight[tenant]

    def charge(self, job: Job) -> None:
        """``job`` was bound: its requests count in its tenant's share from now on."""
        held = self._held[job.tenant]
        held.cpu += job.cpu
        held.memory_mb += job.memory_mb

    def __iter__(self) -> Iterator[Job]:
        heap = self._heap
        while heap:
            *_, tenant = heapq.heappop(heap)
            jobs = self._by_tenant[tenant]
            index = self._next[tenant]
            yield jobs[index][1]
            index += 1
            self._next[tenant] = index
            if index < len(jobs):  # its share as it is now: after the caller's charge, if any
                heapq.heappush(heap, (*self._rank(tenant), jobs[index][0], tenant))


def fair_shares(
    demands: Mapping[str, float],
    weight: Callable[[str], float],
    guaranteed: Callable[[str], float] = no_guarantee,
    maximum: Callable[[str], float | None] = no_maximum,
) -> dict[str, float]:
    """Each tenant's fair dominant share of the whole capacity (1.0) when ``demands`` (the
    dominant share each tenant would hold with all its queued jobs bound) compete for it.

    Weighted water-filling (max-min fairness): a tenant demanding less than its weighted part
    gets its demand, and what it leaves is split among the others by weight, until every tenant
    is either satisfied or at its part of what is left. A tenant's ``maximum`` caps its demand;
    its ``guaranteed`` share is a floor (as far as it demands it): a tenant the water-filling
    would leave below it is given it, and the others share what remains. Tenants demanding
    nothing get 0.
    """
    wanted = {}
    for tenant, demand in demands.items():
        cap = maximum(tenant)
        wanted[tenant] = min(demand, cap) if cap is not None else demand
    pinned: dict[str, float] = {}
    while True:
        free = {tenant: demand for tenant, demand in wanted.items() if tenant not in pinned}
        shares = _water_fill(free, weight, 1.0 - sum(pinned.values()))
        low = {
            tenant
            for tenant in free
            if shares[tenant] < min(free[tenant], guaranteed(tenant)) - 1e-12
        }
        if not low:
            return {**shares, **pinned}
        for tenant in low:
            pinned[tenant] = min(free[tenant], guaranteed(tenant))


def _water_fill(
    demands: Mapping[str, float], weight: Callable[[str], float], capacity: float
) -> dict[str, float]:
    """Weighted max-min fair split of ``capacity`` among ``demands``."""
    shares = dict.fromkeys(demands, 0.0)
    active = {tenant for tenant, demand in demands.items() if demand > 0}
    left = max(0.0, capacity)
    while active and left > 1e-12:
        total_weight = sum(weight(tenant) for tenant in active)
        parts = {tenant: left * weight(tenant) / total_weight for tenant in active}
        satisfied = {tenant for tenant in active if demands[tenant] <= parts[tenant] + 1e-12}
        if not satisfied:
            shares.update(parts)
            break
        for tenant in satisfied:
            shares[tenant] = demands[tenant]
            left -= demands[tenant]
        active -= satisfied
    return shares


ABOVE_FAIR_SHARE = 0.005
"""How far above its fair share a tenant must be for ``fairness_reason`` to speak (rounding)."""


def fairness_reason(tenant: str, share: float, fair_share: float) -> str:
    """Why fair share puts ``tenant``'s jobs after other tenants', for ``mdq explain``; "" when
    it is not above its fair share."""
    if share <= fair_share + ABOVE_FAIR_SHARE:
        return ""
    who = f"tenant {tenant}" if tenant else "the operator"
    return (
        f"fair share: {who} holds {share:.0%} of the cluster, above its fair share of "
        f"{fair_share:.0%}, so its jobs go after those of tenants below theirs"
    )


def max_share_reason(tenant: str, share: float, maximum: float | None, job_share: float) -> str:
    """Why ``tenant``'s maximum share keeps a job of ``job_share`` (its dominant share of the
    cluster) waiting while the tenant holds ``share``, for ``mdq explain``; "" when it does not.
    """
    if maximum is None or share + job_share <= maximum + 1e-9:
        return ""
    who = f"tenant {tenant}" if tenant else "the operator"
    return (
        f"{who} is at its maximum share: it holds {share:.0%} of the cluster, at most {maximum:.0%}"
    )
