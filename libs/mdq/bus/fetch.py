"""Batches from a durable pull consumer, for the projection's hot path.

``BatchFetcher`` sends the same pull requests as nats-py's ``fetch`` with reply subjects of
its own and collects what arrives in a callback, so a batch costs one wait instead of one per
message; no message is skipped, and errors are raised as nats-py raises them. Design:
docs/history.md, "Ingest speed".
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import json
import time

import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext

from mdq.bus.requests import NO_RESPONDERS, STATUS

CONFLICT = "409"
HEARTBEAT = "100"
NO_WAIT_GRACE_S = 2.0
"""A no_wait request with neither messages nor a status after this long is given up (lost in a
reconnect)."""


def connection_of(js: JetStreamContext) -> Client:
    """The client a JetStream context talks through (nats-py keeps it as ``_nc``)."""
    client: Client = js._nc
    return client


class BatchFetcher:
    """Fetches batches of a durable pull consumer (``start()`` before use, ``close()`` after)."""

    def __init__(self, js: JetStreamContext, *, stream: str, consumer: str) -> None:
        self._nc = connection_of(js)
        self._next_subject = f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{consumer}"
        self._prefix = f"{self._nc.new_inbox()}."  # under this identity's own inbox prefix
        self._tokens = itertools.count()
        self._buffer: collections.deque[Msg] = collections.deque()
        self._open: str | None = None
        """Reply token of the open request, None when none is open."""
        self._remaining = 0
        self._open_until = 0.0
        self._error: Exception | None = None
        self._wanted = 1
        """Buffered messages the waiting fetch needs: fewer wake nobody."""
        self._changed = asyncio.Event()
        self._subscription: Subscription | None = None

    async def start(self) -> BatchFetcher:
        self._subscription = await self._nc.subscribe(
            self._prefix + "*",
            cb=self._on_message,
            pending_msgs_limit=1_000_000,
            pending_bytes_limit=1 << 30,
        )
        return self

    async def close(self) -> None:
        subscription, self._subscription = self._subscription, None
        if subscription is not None and not self._nc.is_closed:
            await subscription.unsubscribe()

    async def _on_message(self, message: Msg) -> None:
        headers = message.headers
        status = headers.get(STATUS) if headers else None
        if status is None:
            self._buffer.append(message)
            if self._open is not None:
                self._remaining -= 1
                if self._remaining <= 0:
                    self._open = None
            if self._open is not None and len(self._buffer) < self._wanted:
                return  # the waiting fetch wants more: one wake-up per batch, not per message
        elif status == HEARTBEAT:
            return
        else:
            token = message.subject[len(self._prefix) :]
            if token == self._open:
                self._open = None
            if status == CONFLICT:
                self._error = nats.js.errors.APIError.from_msg(message)
            elif status == NO_RESPONDERS:  # the consumer is gone
                self._error = nats.errors.NoRespondersError()
        self._changed.set()

    async def _request(self, batch: int, *, expires_s: float | None) -> None:
        token = str(next(self._tokens))
        request: dict[str, object] = {"batch": batch}
        if expires_s is None:
            request["no_wait"] = True
            self._open_until = time.monotonic() + NO_WAIT_GRACE_S
        else:
            request["expires"] = int(expires_s * 1e9)
            self._open_until = time.monotonic() + expires_s + NO_WAIT_GRACE_S
        self._open, self._remaining = token, batch
        await self._nc.publish(
            self._next_subject, json.dumps(request).encode(), reply=self._prefix + token
        )

    def _check_open(self) -> None:
        if self._open is not None and time.monotonic() > self._open_until:
            self._open = None  # its answer was lost (a reconnect): ask again

    async def fetch(self, batch: int, timeout: float) -> list[Msg]:  # noqa: ASYNC109
        """Up to ``batch`` messages: what the consumer has now, or else what arrives within
        ``timeout`` seconds (maybe none)."""
        if self._subscription is None:
            raise RuntimeError("BatchFetcher.start() was not called")
        deadline = time.monotonic() + timeout
        self._wanted = batch
        self._check_open()
        if len(self._buffer) < batch and self._open is None:
            await self._request(batch - len(self._buffer), expires_s=None)
        lingering = False
        while len(self._buffer) < batch:
            # Cleared before anything here awaits: a delivery that lands while the request
            # below is being sent must still wake the wait that follows it.
            self._changed.clear()
            self._raise_error()
            self._check_open()
            left = deadline - time.monotonic()
            if self._open is None:
                if self._buffer or lingering or left <= 0.01:
                    break
                await self._request(batch, expires_s=left)
                lingering = True
            try:
                async with asyncio.timeout(max(left, 0.001)):
                    await self._changed.wait()
            except TimeoutError:
                break
        self._raise_error()
        count = min(batch, len(self._buffer))
        return [self._buffer.popleft() for _ in range(count)]

    def _raise_error(self) -> None:
        error, self._error = self._error, None
        if error is not None:
            raise error
