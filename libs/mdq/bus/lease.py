"""The leader lease of a service's replicas: one JetStream KV key with a TTL, taken with
``create`` and kept with ``update`` on the revision last written, so two replicas never both
believe a renewal succeeded. A holder that stops renewing loses it after the TTL; one that stops
cleanly deletes it. An efficiency measure, not the safety net: placement fences every binding
per job (docs/placement.md, "Replicas and restarts").
"""

from __future__ import annotations

import contextlib
import logging

from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig
from nats.js.errors import APIError, KeyNotFoundError
from nats.js.kv import KeyValue

from mdq.bus.streams import open_bucket

log = logging.getLogger("mdq.lease")

LEASE_KEY = "leader"


class LeaderLease:
    """One replica's hold on its service's lease."""

    def __init__(
        self, *, js: JetStreamContext, bucket: str, holder: str, ttl_s: float, replicas: int = 1
    ) -> None:
        self._js = js
        self._replicas = replicas
        self._bucket = bucket
        self.holder = holder
        self._ttl_s = ttl_s
        self._kv: KeyValue | None = None
        self._revision: int | None = None

    @property
    def held(self) -> bool:
        return self._revision is not None

    async def _bucket_kv(self) -> KeyValue:
        if self._kv is None:
            self._kv = await open_bucket(
                self._js,
                KeyValueConfig(
                    bucket=self._bucket, ttl=self._ttl_s, history=1, replicas=self._replicas
                ),
            )
        return self._kv

    async def holder_now(self) -> str:
        """Who holds the lease now ("" if nobody)."""
        kv = await self._bucket_kv()
        try:
            entry = await kv.get(LEASE_KEY)
        except KeyNotFoundError:
            return ""
        return (entry.value or b"").decode()

    async def try_acquire(self) -> bool:
        """Take the lease if nobody holds it; True if this replica holds it now."""
        if self.held:
            return await self.renew()
        kv = await self._bucket_kv()
        try:
            self._revision = await kv.create(LEASE_KEY, self.holder.encode())
        except APIError:
            return False
        log.info("%s took the lease of %s", self.holder, self._bucket)
        return True

    async def renew(self) -> bool:
        """Extend the lease; False (and no longer held) if someone else has it now."""
        if self._revision is None:
            return False
        kv = await self._bucket_kv()
        try:
            self._revision = await kv.update(LEASE_KEY, self.holder.encode(), last=self._revision)
        except APIError:
            log.warning("%s lost the lease of %s", self.holder, self._bucket)
            self._revision = None
            return False
        return True

    async def release(self) -> None:
        """Give the lease up now (clean shutdown), so a follower need not wait for the TTL."""
        if self._revision is None or self._kv is None:
            return
        revision, self._revision = self._revision, None
        with contextlib.suppress(APIError):
            await self._kv.delete(LEASE_KEY, last=revision)
