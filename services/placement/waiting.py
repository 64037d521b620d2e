"""Why each unplaced job waits, written into the waiting bucket (``NS_waiting``) for
``mdq explain`` (docs/placement.md, "Explain"). The bucket also holds each tenant's usage
(``services.placement.accounting``)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime

from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig
from nats.js.kv import KeyValue

from mdq.bus.outage import warn_try_failed
from mdq.bus.streams import open_bucket
from mdq.contracts import pb
from mdq.core.fairshare import fairness_reason, max_share_reason
from mdq.core.node_health import Suspicion
from mdq.core.placement import NodeState, PlacementConfig, QueuedJob, Waiting, explain_waiting
from mdq.core.placement_state import PlacementState, TenantShare
from mdq.core.state import JobState, JobView
from mdq.core.timestamps import set_timestamp
from services.placement.scores import cluster_score_messages, node_score_message
from services.placement.settings import PlacementSettings

log = logging.getLogger("mdq.placement")

WAITING_JOBS_PER_PASS = 32
"""Unplaced jobs (in queue order) whose explanation is refreshed per explaining pass."""
WAITING_TTL_S = 3600.0
"""A waiting job's explanation expires this long after placement last wrote it."""
WAITING_REFRESH_S = 600.0
"""An unchanged explanation (or tenant usage) is written again this often (so it does not
expire)."""


def waiting_bucket_config(bucket: str, *, replicas: int = 1) -> KeyValueConfig:
    """The waiting bucket's configuration. Direct gets are on: a tenant reads why its own jobs
    wait by a direct get of their keys' subjects, the only ones its permissions name
    (``mdq.bus.security.permissions.tenant_permissions``)."""
    return KeyValueConfig(
        bucket=bucket, ttl=WAITING_TTL_S, history=1, replicas=replicas, direct=True
    )


class WaitingBucket:
    """The waiting bucket, opened (or made) on its first write."""

    def __init__(self, js: JetStreamContext, *, bucket: str, replicas: int) -> None:
        self._js = js
        self._bucket = bucket
        self._replicas = replicas
        self._kv: KeyValue | None = None

    async def put(self, key: str, value: bytes) -> None:
        if self._kv is None:
            self._kv = await open_bucket(
                self._js, waiting_bucket_config(self._bucket, replicas=self._replicas)
            )
        await self._kv.put(key, value)


class WaitingExplainer:
    """Writes why the first unplaced jobs fit nowhere, where the answer changed."""

    def __init__(
        self,
        *,
        state: Callable[[], PlacementState],
        config: PlacementConfig,
        settings: PlacementSettings,
        bucket: WaitingBucket,
        cordons: Callable[[datetime], dict[str, Suspicion]],
        shares: Callable[[datetime], dict[str, TenantShare]],
        maximum: Callable[[str], float | None],
    ) -> None:
        """``state``: placement's state now (a restore replaces it). ``cordons``, ``shares``,
        ``maximum``: the failure cordons, each tenant's fair-share standing and its maximum
        share now."""
        self._state = state
        self._config = config
        self._settings = settings
        self._bucket = bucket
        self._cordons = cordons
        self._shares = shares
        self._maximum = maximum
        self._written: dict[str, tuple[tuple[object, ...], datetime]] = {}
        """job -> (what its explanation said, when it was written), while it waits."""
        self._explained_at: datetime | None = None

    def changed(self, view: JobView) -> None:
        """A job's view changed: an explanation of why it waits is kept only while PENDING."""
        if view.state is not JobState.PENDING:
            self._written.pop(view.job_id, None)

    async def explain(
        self,
        nodes: list[NodeState],
        unplaced: list[QueuedJob],
        now: datetime,
        held: dict[str, str] | None = None,
    ) -> None:
        """Write why the first unplaced jobs fit nowhere (``mdq explain``), at most every
        ``explain_waiting_interval_s`` and only where the answer changed. Best effort: an
        explanation that cannot be written never holds placement up."""
        interval = self._settings.explain_waiting_interval_s
        last = self._explained_at
        if interval <= 0 or (last is not None and (now - last).total_seconds() < interval):
            return
        self._explained_at = now
        cordons = self._cordons(now)
        shares = self._shares(now)
        for job in unplaced[:WAITING_JOBS_PER_PASS]:
            reason = held.get(job.job_id) if held else None
            if reason:
                waiting = Waiting(job.job_id, (), {}, len(nodes), reason)
            else:
                waiting = explain_waiting(nodes, job, now, self._config)
                standing = shares.get(job.tenant)
                note = ""
                if standing is not None:
                    note = max_share_reason(
                        job.tenant,
                        standing.share,
                        self._maximum(job.tenant),
                        standing.job_share(job),
                    )
                    if not note and len(shares) > 1:  # others compete for the room
                        note = fairness_reason(job.tenant, standing.share, standing.fair_share)
                if note:
                    waiting = replace(waiting, summary=f"{waiting.summary}; {note}")
            signature = (waiting.summary, tuple((s.node, s.filtered) for s in waiting.scores))
            written = self._written.get(job.job_id)
            if (
                written is not None
                and written[0] == signature
                and (now - written[1]).total_seconds() < WAITING_REFRESH_S
            ):
                continue
            message = self.message(waiting, now, cordons)
            try:
                await self._bucket.put(job.job_id, message.SerializeToString())
            except Exception as error:
                warn_try_failed(log, f"could not write why {job.job_id} waits", error)
                return
            self._written[job.job_id] = (signature, now)

    def message(
        self, waiting: Waiting, now: datetime, cordons: dict[str, Suspicion]
    ) -> pb.JobWaiting:
        """A waiting job's explanation as the contract's message."""
        message = pb.JobWaiting(
            attempt=self._state().book.jobs[waiting.job_id].attempt,
            candidates=[node_score_message(score) for score in waiting.scores],
            nodes_total=waiting.nodes_total,
            filtered_counts=waiting.filtered_counts,
            summary=waiting.summary,
            clusters=cluster_score_messages(waiting.clusters),
        )
        set_timestamp(message.at, now)
        for name, suspicion in sorted(cordons.items()):
            if not suspicion.failures:
                continue  # a failing environment: the node's filter reason names it
            cordon = message.cordons.add(node=name, failures=suspicion.failures)
            set_timestamp(cordon.until, suspicion.until)
        return message
