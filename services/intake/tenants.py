"""What intake checks of a tenant's submit beyond its spec: the tenant's policy.

A tenant's submit is refused, naming what it exceeds, for its rate (a token bucket per tenant
in this replica), the ``high`` class without ``allow_high``, a job larger than its running
quota, or ``max_queued_jobs``; the operator's submits are never limited here. Design:
docs/security.md, "Tenants" (its "Limits").
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace

from mdq.bus.tenants import TenantDirectory
from mdq.contracts import pb
from mdq.core.spec import SpecError
from mdq.core.tenants import (
    RateRefusal,
    SubmitRateLimiter,
    TenantUsage,
    check_submit,
    policy_applies,
    rate_limit_message,
)

log = logging.getLogger(__name__)

USAGE_TTL_S = 1.0
"""How long a tenant's usage read from the waiting bucket is reused."""
RECENT_S = 120.0
"""How long this replica remembers what it accepted (longer than placement takes to count)."""

UsageReader = Callable[[str], Awaitable[TenantUsage | None]]
"""The usage placement last wrote for a tenant (None: none written, nothing queued)."""


@dataclass(slots=True)
class _Seen:
    usage: TenantUsage | None
    read_at: float


@dataclass(slots=True)
class TenantGate:
    """The policy checks of tenants' submits, for one intake replica."""

    directory: TenantDirectory
    read_usage: UsageReader
    clock: Callable[[], float] = time.time
    limiter: SubmitRateLimiter = field(default_factory=SubmitRateLimiter)
    _usage: dict[str, _Seen] = field(default_factory=dict)
    _accepted: dict[str, deque[tuple[float, int]]] = field(default_factory=dict)
    """tenant -> (when, jobs) this replica accepted, oldest first, for RECENT_S."""

    def rate_refusal(self, tenant: str) -> RateRefusal | None:
        """Why ``tenant`` may not submit now for its rate (None: it may, and its token is
        taken). Asked of a request-reply submit as it arrives, before it is read, and of a
        fire-and-forget one before it is validated; an invalid submit takes a token as a valid
        one does."""
        if not policy_applies(tenant):
            return None
        policy = self.directory.policy(tenant)
        wait = self.limiter.acquire(tenant, policy, self.clock())
        if wait > 0:
            return RateRefusal("", rate_limit_message(tenant, policy, wait), wait_s=wait)
        return None

    def take_token(self, tenant: str) -> float:
        """Take one of ``tenant``'s rate tokens for a submit of its stream (read no faster than
        its rate, never refused for it): 0.0 when taken, else the seconds until one is there
        (nothing taken then). The bucket is the one its request-reply submits take from."""
        if not policy_applies(tenant):
            return 0.0
        return self.limiter.acquire(tenant, self.directory.policy(tenant), self.clock())

    async def refusal(self, tenant: str, specs: Sequence[pb.JobSpec]) -> SpecError | None:
        """Why ``tenant`` may not submit ``specs`` now for its quotas (None: it may, and they
        are counted); its rate is ``rate_refusal``'s."""
        if not policy_applies(tenant):
            return None
        policy = self.directory.policy(tenant)
        now = self.clock()
        usage = await self._current_usage(tenant, now)
        error = check_submit(tenant, policy, specs, usage)
        if error is None:
            self._accepted.setdefault(tenant, deque()).append((now, len(specs)))
        return error

    async def _current_usage(self, tenant: str, now: float) -> TenantUsage:
        """Placement's last count, plus what this replica accepted after it."""
        seen = self._usage.get(tenant)
        if seen is None or now - seen.read_at > USAGE_TTL_S:
            seen = _Seen(await self.read_usage(tenant), now)
            self._usage[tenant] = seen
            self._forget_idle(now)
        counted = seen.usage or TenantUsage()
        since = counted.as_of.timestamp()
        accepted = self._accepted.get(tenant, deque())
        while accepted and accepted[0][0] < now - RECENT_S:
            accepted.popleft()
        later = sum(jobs for at, jobs in accepted if at > since)
        return replace(counted, queued_jobs=counted.queued_jobs + later)

    def _forget_idle(self, now: float) -> None:
        for tenant in [t for t, seen in self._usage.items() if now - seen.read_at > RECENT_S]:
            del self._usage[tenant]
            self._accepted.pop(tenant, None)
