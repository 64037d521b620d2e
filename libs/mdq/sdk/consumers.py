"""The consumers the SDK and the ``mdq`` command make to read a stream, and their removal.

Each is an ordered push consumer (no acknowledgements) holding every subject a read needs on
one stream (several filter subjects on one consumer), made with an inactive threshold of
``CONSUMER_IDLE_S`` and deleted when the read is done with it, an error or a cancellation
included. A tenant's stream holds at most ``MDQ_STORAGE_TENANT_CONSUMERS`` consumers at once
(docs/security.md, "Tenants"): a process killed before it could delete its consumer leaves it
for ``CONSUMER_IDLE_S`` seconds, not for the stream's idle limit. A server that refuses to make
a consumer (that limit reached, among others) raises ``ConsumerRefused``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

import nats.errors
import nats.js.errors
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig, DeliverPolicy

from mdq.bus.log import IDLE_HEARTBEAT_S
from mdq.errors import Unavailable

CONSUMER_IDLE_S = 5.0
"""Seconds a consumer of the SDK's outlives the interest of its reader (a killed process, or
one whose ordered consumer was replaced by a fresh one): then the server deletes it."""

DELETE_WITHIN_S = 2.0
"""How long deleting a consumer is waited for; past that the server's idle limit removes it."""

MAX_CONSUMERS_CODE = 10026
"""JetStream's error code for "maximum consumers limit reached"."""


class ConsumerRefused(Unavailable):
    """The server would not make a consumer to read a stream (its limit on consumers reached,
    or JetStream unavailable); the same read may succeed a little later."""


def consumer_refusal(stream: str, error: Exception) -> ConsumerRefused:
    """What a person is told when ``stream`` refused a consumer with ``error``."""
    if isinstance(error, nats.js.errors.APIError):
        if error.err_code == MAX_CONSUMERS_CODE:
            return ConsumerRefused(
                f"{stream} refused a consumer: maximum consumers limit reached (other "
                "commands or clients of these credentials are reading it; a consumer left "
                "by a killed command goes within seconds): try again shortly"
            )
        return ConsumerRefused(
            f"{stream} refused a consumer: {error.description or error} "
            f"(code {error.err_code or error.code})"
        )
    return ConsumerRefused(f"{stream} did not make a consumer: {error!r}")


async def remove_consumer(
    js: JetStreamContext,
    stream: str,
    subscription: JetStreamContext.PushSubscription | JetStreamContext.PullSubscription,
) -> None:
    """Stop ``subscription`` and delete its consumer (the current one: an ordered consumer is
    replaced by a fresh one when it falls behind). Nothing raised: what cannot be deleted now
    goes after ``CONSUMER_IDLE_S``."""
    with contextlib.suppress(Exception):
        await subscription.unsubscribe()
    consumer = subscription._consumer  # nats-py keeps the current name there alone
    with contextlib.suppress(Exception):
        async with asyncio.timeout(DELETE_WITHIN_S):
            await js.delete_consumer(stream, consumer)


@contextlib.asynccontextmanager
async def ordered_consumer(
    js: JetStreamContext,
    stream: str,
    subjects: Sequence[str],
    *,
    cb: Callable[[Msg], Awaitable[None]] | None = None,
    deliver_policy: DeliverPolicy = DeliverPolicy.ALL,
) -> AsyncIterator[JetStreamContext.PushSubscription]:
    """One ordered consumer on ``stream`` filtering ``subjects`` (which must not overlap),
    delivering to ``cb`` (or to ``next_msg`` without one); deleted on the way out, however it
    is left. ``ConsumerRefused`` if the server will not make it."""
    if not subjects:
        raise ValueError("ordered_consumer: no subject to read")
    config = ConsumerConfig(
        filter_subjects=list(subjects) if len(subjects) > 1 else None,
        inactive_threshold=CONSUMER_IDLE_S,
    )
    try:
        subscription = await js.subscribe(
            subjects[0],
            stream=stream,
            cb=cb,
            config=config,
            ordered_consumer=True,
            idle_heartbeat=IDLE_HEARTBEAT_S,  # deaf for ~2 s at most
            deliver_policy=deliver_policy,
            inactive_threshold=CONSUMER_IDLE_S,
        )
    except (nats.js.errors.APIError, nats.errors.TimeoutError) as error:
        raise consumer_refusal(stream, error) from error
    try:
        yield subscription
    finally:
        await asyncio.shield(remove_consumer(js, stream, subscription))


async def read_stored(
    js: JetStreamContext, stream: str, subjects: Sequence[str], *, timeout_s: float = 5.0
) -> list[Msg]:
    """Every message ``stream`` holds now on ``subjects``, in stream order, through one
    ordered consumer (deleted before it returns)."""
    async with ordered_consumer(js, stream, subjects) as subscription:
        info = await subscription.consumer_info()
        delivered = info.delivered.consumer_seq if info.delivered else 0
        total = (info.num_pending or 0) + (delivered or 0)
        messages: list[Msg] = []
        while len(messages) < total:
            messages.append(await subscription.next_msg(timeout=timeout_s))
        return messages
