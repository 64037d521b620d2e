"""Placement's process loop: restore, follow the jobs and nodes logs, keep the leader lease, and
while leading serve job control and run a pass whenever something changed (at least every
``reconcile_interval_s``), forever (docs/placement.md, "Replicas and restarts")."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING

from nats.js import JetStreamContext
from nats.js.api import DeliverPolicy

from mdq.bus.lease import LeaderLease
from mdq.bus.log import follow_log, raise_if_cancelling
from mdq.bus.outage import warn_try_failed
from mdq.bus.runtime import every, run_parts
from mdq.bus.subjects import Subjects
from services.placement.settings import PlacementSettings

if TYPE_CHECKING:
    from services.placement.app import Placement

log = logging.getLogger("mdq.placement")

TENANT_POLICIES_WAIT_S = 10.0
"""At start, how long placement waits for the tenants' policies before it places anyway."""


class ServiceLoop:
    """Runs one placement replica: whether it leads, when it has caught up, when it passes."""

    def __init__(
        self,
        *,
        js: JetStreamContext,
        subjects: Subjects,
        settings: PlacementSettings,
        lease: LeaderLease | None,
    ) -> None:
        """``lease``: the leader lease (None: this replica always leads)."""
        self._js = js
        self._subjects = subjects
        self._settings = settings
        self._lease = lease
        self.dirty = asyncio.Event()
        """Set when a pass has work (an event changed the state, a request came)."""
        self.jobs_ready = asyncio.Event()
        """Set once the jobs log is folded up to its end."""
        self.nodes_ready = asyncio.Event()
        self.leader = lease is None

    async def _caught_up_jobs(self) -> None:
        self.jobs_ready.set()

    async def _caught_up_nodes(self) -> None:
        self.nodes_ready.set()

    async def _keep_lease(self, service: Placement, lease: LeaderLease) -> None:
        """Take or renew the lease every third of its TTL; flip ``leader`` accordingly."""

        async def check() -> None:
            try:
                held = await lease.try_acquire()
            except Exception as error:
                warn_try_failed(log, "lease check failed; not leading until one succeeds", error)
                held = False
            raise_if_cancelling()  # else a stopped replica would go on renewing its lease
            if held and not self.leader:
                await service.repair()
                self.dirty.set()
            self.leader = held

        await every(self._settings.lease_ttl_s / 3, check, what="placement's lease")

    async def run(self, service: Placement) -> None:
        """Follow the logs and reconcile (while leader), forever."""
        after = await service.restore()
        try:
            await run_parts(
                {
                    "placement-jobs": follow_log(
                        self._js,
                        self._subjects.job_all("*"),
                        on_event=service.on_job_event,
                        on_caught_up=self._caught_up_jobs,
                        skip=service.is_own_echo,
                        start_sequence=after + 1 if after else 0,
                    ),
                    "placement-nodes": follow_log(
                        self._js,
                        self._subjects.node_load("*"),
                        on_event=service.on_node_event,
                        on_caught_up=self._caught_up_nodes,
                        deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
                    ),
                    "placement-passes": self._lead_once_caught_up(service),
                }
            )
        finally:
            await service.job_control.close()
            await service.tenants.close()
            if self._lease is not None:
                with contextlib.suppress(Exception):
                    await asyncio.shield(self._lease.release())

    async def _lead_once_caught_up(self, service: Placement) -> None:
        """Once both logs are folded to their end: the lease (or lead at once, without one)
        and the passes, forever."""
        if not await service.tenants.wait_synced(TENANT_POLICIES_WAIT_S):
            log.warning(
                "tenant policies not read after %.0f s; placing with what is known",
                TENANT_POLICIES_WAIT_S,
            )
        await self.jobs_ready.wait()
        await self.nodes_ready.wait()
        log.info("caught up: %d jobs, %d nodes", len(service.book.jobs), len(service.nodes))
        if self._lease is None:
            await service.repair()
            await self._passes(service)
        else:
            await run_parts(
                {
                    "placement-lease": self._keep_lease(service, self._lease),
                    "placement-pass-loop": self._passes(service),
                }
            )

    async def _passes(self, service: Placement) -> None:
        """A pass whenever something changed, at least every ``reconcile_interval_s``: while
        leading, serve job control and bind; while following, drop what was adopted."""
        while True:
            self.dirty.clear()
            service.state.prune()  # between passes: no view of an ended job is in use
            await service.job_control.serve(self.leader)
            if self.leader:
                try:
                    started = time.perf_counter()
                    bound = await service.reconcile()
                    if bound:
                        log.info(
                            "bound %d jobs in %.1f ms",
                            bound,
                            1000 * (time.perf_counter() - started),
                        )
                except Exception as error:
                    warn_try_failed(log, "reconcile failed; retrying", error)
                    await asyncio.sleep(0.5)
                await service.snapshots.write(service.state)
            else:
                service.binder.drop_adopted()
            raise_if_cancelling()  # a cancel that a pass's NATS requests dropped
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._settings.reconcile_interval_s):
                    await self.dirty.wait()
