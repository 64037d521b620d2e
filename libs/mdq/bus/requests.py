"""JetStream publishes and requests for the hot paths, over one reply subscription.

``Requests`` sends the JetStream API requests of intake and placement through one wildcard
reply subscription, names each with a counter and times them out from one shared timer,
parsing the replies as nats-py does, so callers see the same types and errors. Design:
docs/intake.md, "The registry"; group commit: docs/durability.md.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections import deque
from collections.abc import Sequence
from typing import Generic, NamedTuple, Protocol, TypeVar

import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js.api import PubAck

STATUS = "Status"
NO_RESPONDERS = "503"
EXPECTED_LAST_SUBJECT_SEQUENCE = "Nats-Expected-Last-Subject-Sequence"
CREATE_ONLY = {EXPECTED_LAST_SUBJECT_SEQUENCE: "0"}
"""Headers of a write that JetStream refuses when its subject (a KV key) was ever written."""
WRONG_LAST_SEQUENCE = (10071, 10164)
"""JetStream's error codes for an expected last (subject) sequence that did not hold (the
second is what newer servers send)."""
BATCH_ID = "Nats-Batch-Id"
BATCH_SEQUENCE = "Nats-Batch-Sequence"
BATCH_COMMIT = "Nats-Batch-Commit"
Result = TypeVar("Result")
"""What one caller of a group commit gets back."""
MAX_ATOMIC_BATCH = 1000
"""The most messages nats-server takes in one atomic batch (its default limit)."""
PLAIN_UP_TO = 8
"""The most messages written as plain publishes in flight together rather than as one atomic
batch: on a stream of one replica nats-server 2.15 stages each atomic batch in a file store of
its own, about 2 ms before its ack whatever the sync interval, while each plain fsynced publish
in flight beside others adds about 0.2 ms; on three replicas the two cost the same up to here
(docs/durability.md, "Group commit")."""
DEFAULT_TIMEOUT_S = 5.0
SWEEP_S = 0.05
"""Requests with the default timeout time out at most this late (one timer for them all)."""
PUBLISH_ERRORS: tuple[type[Exception], ...] = (nats.errors.TimeoutError, nats.js.errors.Error)
"""Errors of one publish (no ack in time, refused by the stream), as opposed to the
connection's."""
Outgoing = tuple[str, bytes, dict[str, str] | None]
"""A message to store: subject, payload, headers."""


class JetStreamPublish(Protocol):
    """What publishing an event needs: ``JetStreamContext`` or ``Requests``."""

    async def publish(
        self,
        subject: str,
        payload: bytes = b"",
        timeout: float | None = None,  # noqa: ASYNC109 - nats-py's signature
        stream: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> PubAck: ...


class Requests:
    """Request-reply over one inbox subscription (``start()`` before use)."""

    def __init__(self, nc: Client, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self._nc = nc
        self._timeout_s = timeout_s
        self._prefix = f"{self._nc.new_inbox()}."  # under this identity's own inbox prefix
        self._tokens = itertools.count()
        self._waiting: dict[str, asyncio.Future[Msg]] = {}
        self._subscription: Subscription | None = None
        self._deadlines: deque[tuple[float, str]] = deque()
        """(deadline, token) of requests with the default timeout, in the order sent."""
        self._sweep: asyncio.TimerHandle | None = None
        self._batch_prefix = f"{self._prefix[:-1].rsplit('.', 1)[-1]}."
        """Atomic batch ids: this connection's inbox token and a counter (at most 64 bytes)."""
        self._batches = itertools.count()

    async def start(self) -> Requests:
        if self._subscription is None:
            self._subscription = await self._nc.subscribe(
                self._prefix + "*", cb=self._on_reply, pending_msgs_limit=1_000_000
            )
        return self

    async def close(self) -> None:
        subscription, self._subscription = self._subscription, None
        if subscription is not None and not self._nc.is_closed:
            await subscription.unsubscribe()
        for future in self._waiting.values():
            if not future.done():
                future.set_exception(nats.errors.ConnectionClosedError())
        self._waiting.clear()
        self._deadlines.clear()
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None

    async def _on_reply(self, message: Msg) -> None:
        future = self._waiting.pop(message.subject[len(self._prefix) :], None)
        if future is not None and not future.done():
            future.set_result(message)

    async def request(
        self,
        subject: str,
        payload: bytes,
        *,
        headers: dict[str, str] | None = None,
        timeout_s: float | None = None,
    ) -> Msg:
        """Send one request and wait for its reply; ``NoRespondersError`` if nobody listens."""
        loop = asyncio.get_running_loop()
        token, future = self._expect(loop)
        timer = self._expire_later(loop, token, future, timeout_s)
        try:
            await self._nc.publish(subject, payload, reply=self._prefix + token, headers=headers)
            message = await future
        finally:
            if timer is not None:
                timer.cancel()
            self._waiting.pop(token, None)
        if message.headers and message.headers.get(STATUS) == NO_RESPONDERS:
            raise nats.errors.NoRespondersError
        return message

    def _expect(self, loop: asyncio.AbstractEventLoop) -> tuple[str, asyncio.Future[Msg]]:
        """A fresh reply token and the future its reply will resolve."""
        if self._subscription is None:
            raise RuntimeError("Requests.start() was not called")
        token = str(next(self._tokens))
        future: asyncio.Future[Msg] = loop.create_future()
        self._waiting[token] = future
        return token, future

    def _expire_later(
        self,
        loop: asyncio.AbstractEventLoop,
        token: str,
        future: asyncio.Future[Msg],
        timeout_s: float | None,
    ) -> asyncio.TimerHandle | None:
        """Arrange for ``future`` to time out. Requests with the default timeout share one
        timer (``_expire_due``), at most ``SWEEP_S`` late; others get their own."""
        if timeout_s is not None and timeout_s != self._timeout_s:
            return loop.call_later(timeout_s, _expire, future)
        self._deadlines.append((loop.time() + self._timeout_s, token))
        if self._sweep is None:
            self._sweep = loop.call_at(self._deadlines[0][0], self._expire_due, loop)
        return None

    def _expire_due(self, loop: asyncio.AbstractEventLoop) -> None:
        self._sweep = None
        now = loop.time()
        deadlines = self._deadlines
        while deadlines and deadlines[0][0] <= now:
            future = self._waiting.get(deadlines.popleft()[1])
            if future is not None:  # still waiting (answered ones are forgotten)
                _expire(future)
        if deadlines:
            self._sweep = loop.call_at(max(deadlines[0][0], now + SWEEP_S), self._expire_due, loop)

    async def publish(
        self,
        subject: str,
        payload: bytes = b"",
        timeout: float | None = None,  # noqa: ASYNC109 - nats-py's signature
        stream: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> PubAck:
        """``JetStreamContext.publish``: store one message, return the stream's ack."""
        if stream is not None:
            headers = (headers or {}) | {"Nats-Expected-Stream": stream}
        try:
            reply = await self.request(subject, payload, headers=headers, timeout_s=timeout)
        except nats.errors.NoRespondersError:
            raise nats.js.errors.NoStreamResponseError from None
        return _pub_ack(reply)

    async def publish_many(
        self, messages: Sequence[Outgoing], *, timeout_s: float | None = None
    ) -> list[PubAck | Exception]:
        """Store many messages side by side: all are sent, then all acks awaited, under one
        timer. Each result is the message's ack or the error of its publish (``APIError``,
        ``TimeoutError``, ``NoStreamResponseError``), in the order of ``messages``.

        One call costs no task and no timer per message, which is what placement's bindings
        need; an error of the connection itself (closed, draining) is raised."""
        loop = asyncio.get_running_loop()
        waiting: list[tuple[str, asyncio.Future[Msg]]] = []
        timer = loop.call_later(timeout_s or self._timeout_s, _expire_all, waiting)
        try:
            for subject, payload, headers in messages:
                token, future = self._expect(loop)
                waiting.append((token, future))
                await self._nc.publish(
                    subject, payload, reply=self._prefix + token, headers=headers
                )
            results: list[PubAck | Exception] = []
            for _, future in waiting:
                try:
                    results.append(_pub_ack(await future))
                except PUBLISH_ERRORS as error:
                    results.append(error)
            return results
        finally:
            timer.cancel()
            for token, _ in waiting:
                self._waiting.pop(token, None)

    async def publish_batch(
        self, messages: Sequence[Outgoing], *, timeout_s: float | None = None
    ) -> list[PubAck | Exception]:
        """``publish_many`` for messages that all go to one stream, stored as JetStream atomic
        batches (``MAX_ATOMIC_BATCH`` messages each, sent one after another): the server
        writes a batch and fsyncs it once, so under ``sync_interval: always`` a batch costs one
        flush instead of one per message (docs/durability.md, "Group commit"). Each message
        keeps its headers (``Nats-Msg-Id``, expected last subject sequences): the server checks
        them all before it stores any.

        A batch is all or nothing, so when the server refuses one (a duplicate id, an
        expectation that does not hold, a stream without ``allow_atomic``, a full stream), it
        stored none of it, and its messages are published again one by one (``publish_many``)
        so that each gets its own answer exactly as without batching. A batch whose commit was
        not answered in time is not retried: each of its messages gets the ``TimeoutError``,
        as a single publish would. Up to ``PLAIN_UP_TO`` messages are published plainly,
        side by side (``publish_many``): sooner, with the same answers."""
        if len(messages) <= PLAIN_UP_TO:
            return await self.publish_many(messages, timeout_s=timeout_s)
        results: list[PubAck | Exception] = []
        for first in range(0, len(messages), MAX_ATOMIC_BATCH):
            chunk = messages[first : first + MAX_ATOMIC_BATCH]
            try:
                last = await self._atomic_batch(chunk, timeout_s)
            except PUBLISH_ERRORS as error:
                if isinstance(error, nats.errors.TimeoutError):
                    results.extend(error for _ in chunk)
                else:
                    results.extend(await self.publish_many(chunk, timeout_s=timeout_s))
                continue
            results.extend(_acks_up_to(last, len(chunk)))
        return results

    async def publish_groups(
        self, groups: Sequence[Sequence[Outgoing]], *, timeout_s: float | None = None
    ) -> list[list[PubAck] | Exception]:
        """Store each group of messages (all for one stream, at most ``MAX_ATOMIC_BATCH``
        together) all or nothing: each result is the group's acks, or the error that kept
        the whole group out. They go as one atomic batch; when the server refuses it, no group
        was stored, and the halves are sent again, each on its own, down to the group that was
        refused (a few flushes more, however many groups came). A batch whose commit was not
        answered in time gives every group the ``TimeoutError``: none, some or all may be
        stored, as with a single publish."""
        messages = [message for group in groups for message in group]
        if not messages:
            return [[] for _ in groups]
        try:
            if len(messages) == 1:
                subject, payload, headers = messages[0]
                last = await self.publish(subject, payload, timeout=timeout_s, headers=headers)
            else:
                last = await self._atomic_batch(messages, timeout_s)
        except PUBLISH_ERRORS as error:
            if isinstance(error, nats.errors.TimeoutError) or len(groups) == 1:
                return [error for _ in groups]
            middle = len(groups) // 2
            first = await self.publish_groups(groups[:middle], timeout_s=timeout_s)
            return first + await self.publish_groups(groups[middle:], timeout_s=timeout_s)
        acks = _acks_up_to(last, len(messages))
        results: list[list[PubAck] | Exception] = []
        for group in groups:
            results.append(acks[: len(group)])
            acks = acks[len(group) :]
        return results

    async def _atomic_batch(self, messages: Sequence[Outgoing], timeout_s: float | None) -> PubAck:
        """Send ``messages`` as one atomic batch; the commit's ack (its ``seq`` is the last
        message's, the batch's messages are stored one after another)."""
        batch = f"{self._batch_prefix}{next(self._batches)}"
        last = len(messages) - 1
        for index in range(last):
            subject, payload, headers = messages[index]
            await self._nc.publish(
                subject,
                payload,
                headers=(headers or {}) | {BATCH_ID: batch, BATCH_SEQUENCE: str(index + 1)},
            )
        subject, payload, headers = messages[last]
        return await self.publish(
            subject,
            payload,
            timeout=timeout_s,
            headers=(headers or {})
            | {BATCH_ID: batch, BATCH_SEQUENCE: str(last + 1), BATCH_COMMIT: "1"},
        )


def _acks_up_to(last: PubAck, count: int) -> list[PubAck]:
    """The acks of the ``count`` messages of an atomic batch whose commit ``last`` acked: the
    server stores them one after another, the last at ``last.seq``."""
    first = last.seq - count + 1
    return [
        PubAck(stream=last.stream, seq=first + index, domain=last.domain) for index in range(count)
    ]


class _Committer(Generic[Result]):
    """At most one atomic batch in flight for one stream, and what callers hand in meanwhile
    goes out together in the next, as etcd's and Kafka's writers do: whole callers' lists, in
    order, up to ``MAX_ATOMIC_BATCH`` messages. Small concurrent batches would each cost a
    flush and compete for the server's batches in flight per stream; this way a stream's
    writers share one flush however they arrive. How a batch is written and what each caller
    gets back: the subclasses' ``_commit``."""

    def __init__(self, requests: Requests) -> None:
        self._requests = requests
        self._waiting: deque[tuple[Sequence[Outgoing], asyncio.Future[Result]]] = deque()
        self._committer: asyncio.Task[None] | None = None

    async def _submit(self, messages: Sequence[Outgoing]) -> Result:
        future: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
        self._waiting.append((messages, future))
        committer = self._committer
        if committer is None or committer.done() or committer.get_loop() is not future.get_loop():
            self._committer = asyncio.create_task(self._commit_all())
        return await future

    async def _commit(self, groups: list[Sequence[Outgoing]]) -> list[Result]:
        raise NotImplementedError

    async def _commit_all(self) -> None:
        while self._waiting:
            taken = [self._waiting.popleft()]
            count = len(taken[0][0])
            while self._waiting and count + len(self._waiting[0][0]) <= MAX_ATOMIC_BATCH:
                count += len(self._waiting[0][0])
                taken.append(self._waiting.popleft())
            try:
                results = await self._commit([group for group, _ in taken])
            except BaseException as error:  # the connection: every caller of the batch sees it
                for _, future in taken:
                    if not future.done():
                        future.set_exception(error)
                if isinstance(error, asyncio.CancelledError):
                    raise
                continue
            for (_, future), result in zip(taken, results, strict=True):
                if not future.done():
                    future.set_result(result)


class GroupCommit(_Committer[list[PubAck | Exception]]):
    """Group commit (``_Committer``) in which each message gets its own result, exactly as
    from ``Requests.publish_batch`` (a refused batch is published again message by message; a
    list longer than ``MAX_ATOMIC_BATCH`` goes alone, in chunks)."""

    async def publish(self, messages: Sequence[Outgoing]) -> list[PubAck | Exception]:
        """Store ``messages`` (all for this stream) with the next batch; their results."""
        if not messages:
            return []
        return await self._submit(messages)

    async def _commit(self, groups: list[Sequence[Outgoing]]) -> list[list[PubAck | Exception]]:
        results = await self._requests.publish_batch([m for group in groups for m in group])
        out, first = [], 0
        for group in groups:
            out.append(results[first : first + len(group)])
            first += len(group)
        return out


class GroupResult(NamedTuple):
    """What became of one caller's messages in an ``AtomicGroupCommit``: the acks of those
    stored (a prefix of them, in order), and the error of the first one refused (None: all
    were stored)."""

    stored: list[PubAck]
    error: Exception | None


class AtomicGroupCommit(_Committer[GroupResult]):
    """Group commit (``_Committer``) for callers whose first message vouches for the rest (a
    claim and the events it records): the messages of the callers of the moment go as one
    atomic batch, each caller's all or nothing (``Requests.publish_groups``). When the batch
    would hold ``PLAIN_UP_TO`` messages or fewer, each caller's messages are written one by
    one instead, in order, up to the first one refused (the callers side by side): plain
    publishes are sooner than a small atomic batch, and a caller's first message, written
    first, still vouches for the rest. The caller tells the two apart by
    ``GroupResult.stored``."""

    async def publish(self, messages: Sequence[Outgoing]) -> GroupResult:
        """Store ``messages`` (all for this stream, at most ``MAX_ATOMIC_BATCH``) with the next
        batch: all of them, none of them, or (in a small batch) the first ones."""
        if not 1 <= len(messages) <= MAX_ATOMIC_BATCH:
            raise ValueError(f"a group holds 1 to {MAX_ATOMIC_BATCH} messages")
        return await self._submit(messages)

    async def _in_order(self, group: Sequence[Outgoing]) -> GroupResult:
        """Write ``group`` message by message, up to its first refusal."""
        stored: list[PubAck] = []
        for subject, payload, headers in group:
            try:
                stored.append(await self._requests.publish(subject, payload, headers=headers))
            except PUBLISH_ERRORS as error:
                return GroupResult(stored, error)
        return GroupResult(stored, None)

    async def _commit(self, groups: list[Sequence[Outgoing]]) -> list[GroupResult]:
        if sum(len(group) for group in groups) <= PLAIN_UP_TO:
            return list(await asyncio.gather(*(self._in_order(group) for group in groups)))
        return [
            GroupResult([], result) if isinstance(result, Exception) else GroupResult(result, None)
            for result in await self._requests.publish_groups(groups)
        ]


STREAM_FULL = 10077
"""JetStream's err_code for a publish to a stream at its size limit ("maximum bytes exceeded",
a stream that discards new messages, ``mdq.bus.storage``)."""


def is_stream_full(error: object) -> bool:
    """Whether a publish was refused because its stream is at its size limit."""
    return isinstance(error, nats.js.errors.APIError) and error.err_code == STREAM_FULL


BATCH_DUPLICATE = 10201
"""JetStream's err_code for an atomic batch refused because one of its messages repeats the
``Nats-Msg-Id`` of a message stored within the stream's duplicate window."""


def is_duplicate_in_batch(error: object) -> bool:
    """Whether an atomic batch was refused because one of its messages was stored before."""
    return isinstance(error, nats.js.errors.APIError) and error.err_code == BATCH_DUPLICATE


def is_wrong_last_sequence(error: object) -> bool:
    """Whether a conditional write (a fenced publish, a KV create or update) was refused
    because its expected last (subject) sequence did not hold: someone wrote there first."""
    return isinstance(error, nats.js.errors.KeyWrongLastSequenceError) or (
        isinstance(error, nats.js.errors.APIError) and error.err_code in WRONG_LAST_SEQUENCE
    )


def _expire(future: asyncio.Future[Msg]) -> None:
    if not future.done():
        future.set_exception(nats.errors.TimeoutError())


def _expire_all(waiting: list[tuple[str, asyncio.Future[Msg]]]) -> None:
    for _, future in waiting:
        _expire(future)


def _pub_ack(reply: Msg) -> PubAck:
    """The stream's ack in a reply, or the error it carries (``APIError``; no stream for the
    subject). ``PubAck.from_response`` introspects the dataclass's fields on every call: a
    third of an ack's cost here."""
    if reply.headers and reply.headers.get(STATUS) == NO_RESPONDERS:
        raise nats.js.errors.NoStreamResponseError
    answer = json.loads(reply.data)
    if "error" in answer:
        raise nats.js.errors.APIError.from_error(answer["error"])
    if len(answer.keys() - _PLAIN_ACK_FIELDS):  # atomic batches, counters: nats-py knows them
        return PubAck.from_response(answer)
    return PubAck(
        stream=answer["stream"],
        seq=answer["seq"],
        domain=answer.get("domain"),
        duplicate=answer.get("duplicate"),
    )


_PLAIN_ACK_FIELDS = frozenset({"stream", "seq", "domain", "duplicate"})
