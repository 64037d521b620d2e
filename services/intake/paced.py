"""Each tenant's fire-and-forget submits, read from the tenant's own submit stream no faster
than the tenant's rate.

A tenant's submits are captured by its own stream (``NS_SUBMIT_<tenant>``, a work queue of the
submits waiting: one acked here leaves it; full, ``MDQ_STORAGE_TENANT_SUBMIT_MSGS``, it refuses
that tenant's publishes and nobody else's). Intake finds those streams
(``mdq.bus.streams.tenant_submit_streams``: every ``scan_s``, and at once when the tenants'
policies change), makes a durable pull consumer of each under its own name and identity
(``ensure_tenant_submit_consumer``: its replicas share it) and follows each with a loop of its
own: take a token of the tenant's rate (the same bucket as its request-reply submits), wait for
one if there is none, then pull one submit, handle it and ack it. A flood within the stream's
cap is not refused and not read: it waits in the tenant's stream and is handled at the
tenant's rate, in order, behind what it published before. A removed tenant's stream is deleted
with the consumer; its loop ends.
Design: docs/intake.md ("The service and its entrances"), docs/security.md ("Limits").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import nats.js.errors
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from mdq.bus.log import raise_if_cancelling
from mdq.bus.outage import warn_try_failed
from mdq.bus.streams import (
    STREAM_NOT_FOUND,
    ensure_tenant_submit_consumer,
    tenant_submit_streams,
)
from mdq.bus.subjects import Subjects

log = logging.getLogger(__name__)

MAX_NAP_S = 1.0
"""The longest a loop sleeps waiting for its tenant's next token before asking again (a policy
changed meanwhile takes effect within it)."""

Consume = Callable[[Msg, str], Coroutine[Any, Any, None]]
"""Handle one submit of a tenant and ack it (or nak it on a NATS error)."""
TakeToken = Callable[[str], float]
"""Take one of a tenant's rate tokens: 0.0 when taken, else the seconds until there is one."""
Changed = Callable[[float], Awaitable[object]]
"""Wait up to a number of seconds for the tenants' policies to change."""


class TenantSubmits:
    """Intake's readers of every tenant's submit stream (``run`` until cancelled)."""

    def __init__(
        self,
        js: JetStreamContext,
        subjects: Subjects,
        *,
        consume: Consume,
        take_token: TakeToken,
        changed: Changed | None = None,
        name: str,
        ack_wait_s: float,
        max_ack_pending: int,
        scan_s: float = 2.0,
        fetch_s: float = 10.0,
        recheck_s: float = 60.0,
        retry_s: float = 1.0,
    ) -> None:
        self._js = js
        self._subjects = subjects
        self._consume = consume
        self._take_token = take_token
        self._changed = changed
        self._name = name
        self._ack_wait_s = ack_wait_s
        self._max_ack_pending = max_ack_pending
        self._scan_s = scan_s
        self._fetch_s = fetch_s
        self._recheck_s = recheck_s
        """An idle loop checks its consumer again (made anew if it was deleted) this often."""
        self._retry_s = retry_s
        self._followed: dict[str, asyncio.Task[None]] = {}
        self._in_hand: set[asyncio.Task[None]] = set()
        """Submits being handled: a stop lets them finish (and be acked)."""
        self._scanned = asyncio.Event()

    @property
    def tenants(self) -> list[str]:
        """The tenants whose submit stream is followed now."""
        return sorted(tenant for tenant, task in self._followed.items() if not task.done())

    async def wait_scanned(self, timeout_s: float) -> bool:
        """Wait until the tenants' streams were looked for once."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await self._scanned.wait()
        return self._scanned.is_set()

    async def run(self) -> None:
        """Follow every tenant's submit stream until cancelled."""
        try:
            while True:
                try:
                    await self.scan()
                except Exception as error:
                    warn_try_failed(log, "could not list the tenants' submit streams", error)
                self._scanned.set()
                if self._changed is None:
                    await asyncio.sleep(self._scan_s)
                else:
                    await self._changed(self._scan_s)
        finally:
            await self.stop()

    async def scan(self) -> None:
        """Start following the submit streams made since the last scan, stop following those
        removed."""
        found = set(await tenant_submit_streams(self._js, self._subjects))
        for tenant in sorted(found):
            task = self._followed.get(tenant)
            if task is None or task.done():
                self._followed[tenant] = asyncio.create_task(
                    self._follow(tenant), name=f"intake-submits-{tenant}"
                )
                log.info("following tenant %s's submit stream", tenant)
        for tenant in sorted(set(self._followed) - found):
            task = self._followed.pop(tenant)
            task.cancel()
            log.info("tenant %s's submit stream is gone: no longer followed", tenant)

    async def stop(self) -> None:
        """Stop pulling; the submits in hand are handled (and acked) first."""
        tasks, self._followed = list(self._followed.values()), {}
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._in_hand:
            await asyncio.wait(set(self._in_hand), timeout=10)

    async def _follow(self, tenant: str) -> None:
        """Bind (or make) intake's consumer of ``tenant``'s stream and pull from it at the
        tenant's rate; again after an error; until the stream is gone."""
        stream = self._subjects.tenant_submit_stream(tenant)
        while True:
            raise_if_cancelling()  # a stop whose cancel a NATS request dropped ends here
            try:
                await ensure_tenant_submit_consumer(
                    self._js,
                    self._subjects,
                    tenant,
                    name=self._name,
                    ack_wait_s=self._ack_wait_s,
                    max_ack_pending=self._max_ack_pending,
                )
                await self._align(stream)
                subscription = await self._js.pull_subscribe_bind(self._name, stream)
            except nats.js.errors.NotFoundError as error:
                if error.err_code == STREAM_NOT_FOUND:
                    return  # removed: the next scan forgets it
                warn_try_failed(log, f"tenant {tenant}: could not bind its consumer", error)
                await asyncio.sleep(self._retry_s)
                continue
            except Exception as error:
                warn_try_failed(log, f"tenant {tenant}: could not bind its consumer", error)
                await asyncio.sleep(self._retry_s)
                continue
            try:
                await self._pace(tenant, subscription)
            except Exception as error:
                warn_try_failed(log, f"tenant {tenant}: pulling its submits failed", error)
                await asyncio.sleep(self._retry_s)
            finally:
                with contextlib.suppress(Exception):
                    await subscription.unsubscribe()

    async def _align(self, stream: str) -> None:
        """Bring the consumer's ack wait and most in flight in line with intake's settings, in
        place (a change of the settings takes effect at the next bind)."""
        info = await self._js.consumer_info(stream, self._name)
        config = info.config
        if (config.ack_wait, config.max_ack_pending) == (self._ack_wait_s, self._max_ack_pending):
            return
        config.ack_wait, config.max_ack_pending = self._ack_wait_s, self._max_ack_pending
        await self._js.add_consumer(stream, config=config)
        log.info("intake's consumer of %s follows the settings again", stream)

    async def _pace(self, tenant: str, subscription: JetStreamContext.PullSubscription) -> None:
        """Pull ``tenant``'s submits one at a time, each after a token of its rate (taken before
        the pull, so a submit is handled as soon as it arrives within the rate); return after
        ``recheck_s`` idle (the caller checks the consumer again)."""
        token = False
        idle_since = time.monotonic()
        while True:
            raise_if_cancelling()
            if not token:
                wait = self._take_token(tenant)
                if wait > 0:
                    await asyncio.sleep(min(wait, MAX_NAP_S))
                    continue
                token = True
            asked = time.monotonic()
            try:
                [message] = await subscription.fetch(1, timeout=self._fetch_s)
            except TimeoutError:
                now = time.monotonic()
                if now - idle_since >= self._recheck_s:
                    return
                if now - asked < self._fetch_s / 2:  # answered at once (a 409): not in a spin
                    await asyncio.sleep(self._retry_s)
                continue
            token = False
            idle_since = time.monotonic()
            # Handled to its end (and acked) even when the loop is stopped meanwhile.
            handling: asyncio.Task[None] = asyncio.create_task(self._consume(message, tenant))
            self._in_hand.add(handling)
            handling.add_done_callback(self._in_hand.discard)
            await asyncio.shield(handling)
