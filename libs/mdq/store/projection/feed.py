"""One stream of the projection: its durable consumer and where the projection of it stands.

A ``Feed`` opens, fetches from and rewinds its consumer, decodes what it delivers, checks that
the log still continues the stored offset, and says how far behind it is. Why the offset is a
cursor, what a gap is and what a broken log means: docs/durability.md, section 4.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from typing import Any

import asyncpg
from google.protobuf.message import DecodeError
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, ConsumerInfo, DeliverPolicy
from nats.js.errors import NotFoundError

from mdq.bus.codec import decode_event, foreign_reason, report_checked
from mdq.bus.fetch import BatchFetcher
from mdq.bus.log import delivery_position
from mdq.contracts import pb
from mdq.core.log_continuity import Continuity, ServerLog, StoredOffset, check, message_digest
from mdq.store.projection.facts import report_row

log = logging.getLogger("mdq.store.projection")

MIN_EVENT_SECONDS = -62_135_596_800  # 0001-01-01T00:00:00Z, the first time a datetime holds
MAX_EVENT_SECONDS = 253_402_300_799  # 9999-12-31T23:59:59Z, the last
JOBS_CONSUMER = "watcher-jobs"
PROGRESS_CONSUMER = "watcher-progress"

_READ_STORED = """
SELECT last_seq, stream_created, last_digest FROM consumer_offsets WHERE consumer = $1
"""
_RECORD_STREAM = """
INSERT INTO consumer_offsets (consumer, stream, last_seq, updated_at, stream_created)
VALUES ($1, $2, 0, now(), $3)
ON CONFLICT (consumer) DO UPDATE SET stream_created = EXCLUDED.stream_created
"""


class LogContinuityError(RuntimeError):
    """The log is not the one the stored offset was projected from: stop, do not retry.

    Raised out of ``Projector.run()``; whoever runs the projector must exit non-zero with this
    message (the watcher does), never retry it as a transient failure: nothing changes until an
    operator acts.
    """

    def __init__(self, *, consumer: str, stored: StoredOffset, continuity: Continuity) -> None:
        self.consumer = consumer
        self.stored = stored
        self.continuity = continuity
        super().__init__(
            f"log continuity broken for consumer {consumer} of stream {stored.stream} "
            f"(stored offset {stored.offset}; {continuity.verdict}): {continuity.explanation}. "
            "The projector stopped and projected nothing of it. Events at or below the offset "
            "would be skipped as already projected, so resuming would silently lose them. To "
            "recover, rebuild the projection from the log as it is now: `mdq replay --rebuild "
            "--compare` into a fresh database, then point DATABASE_URL at it "
            "(docs/durability.md)."
        )


@dataclass(frozen=True, slots=True)
class ConsumerLag:
    """How far one of the projector's consumers is behind its stream."""

    consumer: str
    stream: str
    pending: int
    """Messages in the stream not yet delivered to the projector."""
    ack_pending: int
    """Messages delivered but not yet committed and acknowledged."""
    projected_seq: int
    """Last stream sequence committed to PostgreSQL by this process (0 before the first)."""

    @property
    def total(self) -> int:
        return self.pending + self.ack_pending


@dataclass(frozen=True, slots=True, kw_only=True)
class ReportRows:
    """A batch of reports alone, as rows to COPY (``Feed.report_rows``)."""

    first_seq: int
    last_seq: int
    """The batch's stream sequences: every one from ``first_seq`` to ``last_seq``."""
    rows: list[tuple[Any, ...]]
    """``facts.report_row`` of each report, in stream order."""
    last: Msg
    """The batch's last message (its digest is stored with the offset; it is acknowledged)."""


@dataclass(slots=True, kw_only=True)
class Feed:
    """One stream, its durable consumer and where the projection of it stands."""

    stream: str
    consumer: str
    js: JetStreamContext
    pool: asyncpg.Pool
    batch_size: int
    batch_wait_s: float
    ack_wait_s: float
    continuity_check_s: float
    subscription: BatchFetcher | None = None
    trusted_start: int = 0
    """Set after (re)creating the consumer at this sequence: the first message delivered is
    the first one that exists at or after it, so a jump there is not a gap."""
    projected_seq: int = 0
    verified_at: float = 0.0
    """When (``loop.time()``) the log's continuity was last checked."""
    continuity_checks: int = 0
    """Checks of the log's continuity passed (``verify``)."""
    foreign_events: int = 0
    """Events skipped as not what they claim to be (``mdq.bus.codec.foreign_reason``)."""
    records_prefix: str = ""
    """Subjects starting with this hold records the stream keeps beside its events, not events
    (intake's claims, ``Subjects.claim``): passed over ("": none)."""

    # -- the consumer ----------------------------------------------------------------------
    async def fetch(self, subscription: BatchFetcher) -> list[Msg]:
        """Up to ``batch_size`` messages, or what arrived within ``batch_wait_s`` (maybe none)."""
        return await subscription.fetch(self.batch_size, self.batch_wait_s)

    async def open(self) -> None:
        """Check that the log continues the stored offset, then bind to the durable consumer;
        recreate it if it is not right after the offset."""
        offset = await self.verify()
        try:
            info: ConsumerInfo | None = await self.js.consumer_info(self.stream, self.consumer)
        except NotFoundError:
            info = None
        self.projected_seq = offset
        delivered = info.delivered.stream_seq if info and info.delivered else 0
        if info is None or info.config.ack_policy != AckPolicy.ALL or (delivered or 0) != offset:
            await self.rewind(offset + 1)
            return
        await self._subscribe()
        self.trusted_start = 0

    async def rewind(self, start_seq: int) -> None:
        """(Re)create the durable consumer so its next message is ``start_seq``."""
        log.info("consumer %s starts at stream sequence %d", self.consumer, start_seq)
        await self.unsubscribe()
        with contextlib.suppress(NotFoundError):
            await self.js.delete_consumer(self.stream, self.consumer)
        config = ConsumerConfig(
            durable_name=self.consumer,
            description="mdq watcher: projection of the log into PostgreSQL",
            ack_policy=AckPolicy.ALL,
            ack_wait=self.ack_wait_s,
            max_ack_pending=max(1000, 4 * self.batch_size),
            deliver_policy=(
                DeliverPolicy.ALL if start_seq <= 1 else DeliverPolicy.BY_START_SEQUENCE
            ),
            opt_start_seq=None if start_seq <= 1 else start_seq,
        )
        await self.js.add_consumer(self.stream, config=config)
        await self._subscribe()
        self.trusted_start = start_seq

    async def _subscribe(self) -> None:
        await self.unsubscribe()
        fetcher = BatchFetcher(self.js, stream=self.stream, consumer=self.consumer)
        self.subscription = await fetcher.start()

    async def unsubscribe(self) -> None:
        subscription, self.subscription = self.subscription, None
        if subscription is not None:
            with contextlib.suppress(Exception):
                await subscription.close()

    async def lag(self) -> ConsumerLag:
        """How far the consumer is behind its stream."""
        try:
            info = await self.js.consumer_info(self.stream, self.consumer)
            pending, ack_pending = info.num_pending or 0, info.num_ack_pending or 0
        except NotFoundError:
            stream = await self.js.stream_info(self.stream)
            pending, ack_pending = max(0, stream.state.last_seq - self.projected_seq), 0
        return ConsumerLag(
            consumer=self.consumer,
            stream=self.stream,
            pending=pending,
            ack_pending=ack_pending,
            projected_seq=self.projected_seq,
        )

    def decode(self, sequence: int, message: Msg) -> pb.Event | None:
        """The event of a delivered message, or None (logged, unless it is a record the
        stream keeps beside its events) for one not to project."""
        if self.records_prefix and message.subject.startswith(self.records_prefix):
            return None
        try:
            event = decode_event(message.data)
        except DecodeError:
            log.error(
                "undecodable message %s:%d on %s skipped", self.stream, sequence, message.subject
            )
            return None
        if (reason := foreign_reason(event, message.subject)) is not None:
            self.foreign_events += 1
            log.error("%s:%d skipped: %s", self.stream, sequence, reason)
            return None
        if not MIN_EVENT_SECONDS <= event.time.seconds <= MAX_EVENT_SECONDS:
            log.error("event with an impossible time %s:%d skipped", self.stream, sequence)
            return None
        if not event.event_id:
            event.event_id = f"{self.stream}:{sequence}"
        return event

    def report_rows(self, messages: list[Msg]) -> ReportRows | None:
        """The ``progress`` rows of a batch in which every message is a report ``decode``
        passes, with a job id, the stream sequences one after another; None for any other
        batch, which takes the general way (``decode``, which says what it skips). One pass
        and no event kept: the way of a PROGRESS backlog, a batch of reports alone."""
        rows: list[tuple[Any, ...]] = []
        append = rows.append
        stream, records = self.stream, self.records_prefix
        first = expected = delivery_position(messages[0].reply)[0]
        for message in messages:
            sequence = delivery_position(message.reply)[0]
            subject = message.subject
            if sequence != expected or (records and subject.startswith(records)):
                return None
            try:
                event = decode_event(message.data)
            except DecodeError:
                return None
            job = event.job_id
            if (
                not job
                or event.WhichOneof("body") != "progress"
                or (
                    not report_checked(subject, event.producer, job)
                    and foreign_reason(event, subject) is not None
                )
                or not MIN_EVENT_SECONDS <= event.time.seconds <= MAX_EVENT_SECONDS
            ):
                return None
            append(report_row(event, event.event_id or f"{stream}:{sequence}", stream, sequence))
            expected = sequence + 1
        return ReportRows(first_seq=first, last_seq=expected - 1, rows=rows, last=messages[-1])

    # -- the stored offset and the log's continuity ----------------------------------------
    async def _read_offset(self) -> StoredOffset:
        async with self.pool.acquire() as connection:
            row = await connection.fetchrow(_READ_STORED, self.consumer)
        if row is None:
            return StoredOffset(self.stream, 0, None, None)
        return StoredOffset(
            self.stream, int(row["last_seq"]), row["stream_created"], row["last_digest"]
        )

    def verify_due(self) -> bool:
        return asyncio.get_running_loop().time() - self.verified_at >= self.continuity_check_s

    async def verify(self) -> int:
        """Compare the stored offset with the stream on the server; return the offset, or raise
        ``LogContinuityError`` if the log is not the one it was projected from. Records the
        stream's creation time with the offset when it was not recorded yet."""
        stored = await self._read_offset()  # before the server: the offset only grows
        info = await self.js.stream_info(self.stream)
        if info.created is None:
            raise RuntimeError(f"the server gave no creation time for stream {self.stream}")
        server_digest: str | None = None
        if 0 < stored.offset <= (info.state.last_seq or 0):
            with contextlib.suppress(NotFoundError):  # expired, purged or deleted
                held = await self.js.get_msg(self.stream, seq=stored.offset)
                server_digest = message_digest(held.subject or "", held.data or b"")
        server = ServerLog(
            created=info.created,
            first_seq=info.state.first_seq or 0,
            last_seq=info.state.last_seq or 0,
            offset_digest=server_digest,
        )
        continuity = check(stored, server)
        if not continuity.ok:
            error = LogContinuityError(consumer=self.consumer, stored=stored, continuity=continuity)
            log.critical("%s", error)
            raise error
        if stored.stream_created != info.created:  # not recorded yet, or nothing projected
            async with self.pool.acquire() as connection:
                await connection.execute(_RECORD_STREAM, self.consumer, self.stream, info.created)
        self.verified_at = asyncio.get_running_loop().time()
        self.continuity_checks += 1
        return stored.offset


async def cancel_fetch(task: asyncio.Task[list[Msg]] | None) -> None:
    """Cancel a fetch running ahead and wait for it to end (its messages are dropped). A
    cancellation of the caller while it waits is not swallowed (``asyncio.wait`` raises it)."""
    if task is not None:
        task.cancel()
        await asyncio.wait([task])
        if not task.cancelled():
            task.exception()  # retrieved: a fetch that failed as it was dropped is no news
