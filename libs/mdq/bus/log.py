"""Reading the log: a stream's history in order, then live (ordered consumer).

Stateful services (placement, recovery) keep no database of their own: on start they fold the
job log into memory (all of it, or placement the tail after its snapshot: ``start_sequence``),
then act on what they know (level-triggered), then keep folding live events. Everything they
publish has a deterministic id, so acting again after a restart publishes nothing new.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Awaitable, Callable

from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig, DeliverPolicy

from mdq.bus.codec import decode_event, foreign_reason
from mdq.contracts import pb

log = logging.getLogger(__name__)

FOREIGN_EVENTS: collections.Counter[str] = collections.Counter()
"""Events skipped by ``read_log`` as not what they claim to be, by reason ("producer", "a" for
a wrong subject, "no"): a rogue or misconfigured producer shows here and in the log."""

EventHandler = Callable[[int, pb.Event], Awaitable[None]]
CaughtUp = Callable[[], Awaitable[None]]
Skip = Callable[[int], bool]
IDLE_HEARTBEAT_S = 1.0
V1_ACK_TOKENS = 9
V2_ACK_TOKENS = 11


def raise_if_cancelling() -> None:
    """Raise ``CancelledError`` when the current task has been asked to stop.

    nats-py runs each request under ``asyncio.wait_for``, which on Python 3.11 drops a
    cancellation that lands just as its inner future completes: the awaiting code gets the
    answer instead, and a loop that never awaits anything else cancellable runs on for ever
    (a service then does not stop when it is cancelled). The task still counts the cancel
    (``cancelling()``), so a loop calls this after its NATS requests, once per round."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


async def follow_log(
    js: JetStreamContext,
    subject: str,
    *,
    on_event: EventHandler,
    on_caught_up: CaughtUp,
    deliver_policy: DeliverPolicy = DeliverPolicy.ALL,
    skip: Skip | None = None,
    start_sequence: int = 0,
) -> None:
    """Feed every event on ``subject`` to ``on_event`` (with its stream sequence), forever.

    With ``start_sequence`` (> 0), the history starts at that stream sequence (placement
    restored from a snapshot reads only the log's tail); ``deliver_policy`` is then ignored.

    ``on_caught_up`` is awaited once, after the history that existed at the start has been
    fed (at once if there was none). Undecodable messages are skipped: the log is written only
    by mdq, so one means a bug elsewhere, not a reason to stop. A message whose stream sequence
    ``skip`` accepts is not decoded nor fed (an event the caller published and applied itself).
    """
    loop = asyncio.get_running_loop()
    failed: asyncio.Future[None] = loop.create_future()
    caught_up = False

    async def mark_caught_up() -> None:
        nonlocal caught_up
        if not caught_up:
            caught_up = True
            await on_caught_up()

    async def on_message(message: Msg) -> None:
        # A callback, not ``subscription.messages``: nats-py's iterator makes a task and an
        # asyncio.wait per message, which costs placement more than deciding does.
        if failed.done():
            return
        try:
            sequence, pending = delivery_position(message.reply)
            if skip is None or not skip(sequence):
                await _feed(message, sequence, on_event)
            if pending == 0:
                await mark_caught_up()  # the message that leaves nothing pending
        except Exception as error:  # ends follow_log with it, as a failing loop would
            failed.set_exception(error)

    config = None
    if start_sequence > 0:
        deliver_policy = DeliverPolicy.BY_START_SEQUENCE
        config = ConsumerConfig(opt_start_seq=start_sequence)
    subscription = await js.subscribe(
        subject,
        cb=on_message,
        config=config,
        ordered_consumer=True,
        # The server sends a heartbeat after this much silence; two missed ones make nats-py
        # recreate the consumer where it left off (a server restart, a lost consumer), so
        # this bounds how long a follower can be deaf: ~2 s, not nats-py's default ~10 s.
        idle_heartbeat=IDLE_HEARTBEAT_S,
        deliver_policy=deliver_policy,
        pending_msgs_limit=1_000_000,
        pending_bytes_limit=1 << 30,
    )
    try:
        # A push consumer may already have delivered messages when its info comes back: the
        # history is empty only if nothing is pending AND nothing was delivered yet.
        info = await subscription.consumer_info()
        # Cancelled while the info request completed? Without this the follower waited on
        # ``failed`` for ever and its caller's ``await`` hung (test_follow_log, 1 run in 3).
        raise_if_cancelling()
        delivered = info.delivered.consumer_seq if info.delivered else 0
        if info.num_pending == 0 and not delivered:
            await mark_caught_up()
        await failed
    finally:
        with contextlib.suppress(Exception):
            await subscription.unsubscribe()


def delivery_position(reply: str) -> tuple[int, int]:
    """(stream sequence, messages still pending) of a JetStream delivery, from its reply
    subject: ``$JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<consumer seq>.<time>.
    <pending>``, or the longer form with a domain and an account hash after ``$JS.ACK`` (and a
    token more at the end). nats-py's ``Msg.metadata`` parses the same subject into dataclasses
    and a datetime, which costs placement more per event than folding it."""
    tokens = reply.split(".")
    if len(tokens) == V1_ACK_TOKENS:
        return int(tokens[5]), int(tokens[8])
    if len(tokens) >= V2_ACK_TOKENS and tokens[0] == "$JS" and tokens[1] == "ACK":
        return int(tokens[7]), int(tokens[10])
    raise ValueError(f"not a JetStream delivery: {reply!r}")


async def _feed(message: Msg, sequence: int, on_event: EventHandler) -> None:
    try:
        event = decode_event(message.data)
    except Exception:
        return
    if (reason := foreign_reason(event, message.subject)) is not None:
        FOREIGN_EVENTS[reason.split(" ", 1)[0]] += 1
        log.warning("skipped event #%d: %s", sequence, reason)
        return
    await on_event(sequence, event)
