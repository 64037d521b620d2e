"""The projector: follows the JOBS and PROGRESS streams and projects each batch into PostgreSQL.

It runs one ``Feed`` per stream and hands each batch to the ``Writer``, retrying the same
batch until it commits and acknowledging it only then. Design: docs/history.md ("How the
watcher writes it") and docs/durability.md, section 4.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from typing import TypeVar

import asyncpg
import nats.errors
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from mdq.backoff import DEFAULT_BACKOFF, Backoff, describe_error
from mdq.bus.log import delivery_position
from mdq.bus.subjects import Subjects
from mdq.core.text import scrub_nul
from mdq.store.engine import SCHEMA_NOT_READY, connection_lost
from mdq.store.projection.feed import (
    JOBS_CONSUMER,
    PROGRESS_CONSUMER,
    ConsumerLag,
    Feed,
    LogContinuityError,
    cancel_fetch,
)
from mdq.store.projection.writer import Batch, Writer, pause

log = logging.getLogger("mdq.store.projection")

Delivered = TypeVar("Delivered")

SCHEMA_RETRY_S = 2.0
BATCH_SIZE = 5000
"""Most events a batch applies in one transaction, unless told otherwise (the watcher's
``MDQ_WATCHER_BATCH_SIZE``, ``mdq replay --rebuild --batch-size``). A batch is what arrived
within ``BATCH_WAIT_S``, so a quiet stream makes small ones; a backlog (a watcher catching up,
a rebuild) is folded 5,000 events a transaction: a batch's fold of its jobs' rows costs about
the same for 2,000 events as for 5,000 (docs/benchmarks.md, "make bench-ingest")."""
BATCH_WAIT_S = 0.2
"""Longest wait to fill a batch, unless told otherwise."""
FOLD_EVERY_S = 1.0
FOLD_EVERY_BATCHES = 20
"""While the PROGRESS consumer is behind, its batches' reports are folded into the jobs'
rows together (``Writer``: queued in ``progress_unfolded``), at least once a second and every
20 batches; a batch that leaves nothing pending in the stream folds at once, so a caught-up
watcher's jobs show each report as soon as it is stored."""


def each_once_in_order(delivered: list[tuple[int, Delivered]]) -> list[tuple[int, Delivered]]:
    """A batch's (stream sequence, message) pairs in stream order, each sequence once (its
    first copy): redeliveries can repeat a sequence or come out of order; the common batch,
    in order already, is returned as it is."""
    if all(a[0] < b[0] for a, b in itertools.pairwise(delivered)):
        return delivered
    return sorted(dict(reversed(delivered)).items())


def decoded(feed: Feed, messages: list[Msg]) -> Batch:
    """A batch's messages in stream order, each sequence once, with their events
    (``Feed.decode``)."""
    # the stream sequence from the reply subject directly: nats-py's ``Msg.metadata``
    # builds dataclasses and a datetime per message, which the projection never reads
    delivered = [(delivery_position(message.reply)[0], message) for message in messages]
    return [
        (sequence, (message, feed.decode(sequence, message)))
        for sequence, message in each_once_in_order(delivered)
    ]


class Projector:
    """Consumes the JOBS and PROGRESS streams and projects them into PostgreSQL."""

    def __init__(
        self,
        *,
        js: JetStreamContext,
        subjects: Subjects,
        pool: asyncpg.Pool,
        batch_size: int = BATCH_SIZE,
        batch_wait_s: float = BATCH_WAIT_S,
        ack_wait_s: float = 60.0,
        jobs_consumer: str = JOBS_CONSUMER,
        progress_consumer: str = PROGRESS_CONSUMER,
        max_retry_delay_s: float = 5.0,
        continuity_check_s: float = 10.0,
        database: str = "the database",
        reconnect: Backoff = DEFAULT_BACKOFF,
    ) -> None:
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        self._max_retry_delay_s = max_retry_delay_s
        self._database = database
        self._feeds = tuple(
            Feed(
                stream=stream,
                consumer=consumer,
                js=js,
                pool=pool,
                batch_size=batch_size,
                batch_wait_s=batch_wait_s,
                ack_wait_s=ack_wait_s,
                continuity_check_s=continuity_check_s,
                records_prefix=records,
            )
            for stream, consumer, records in (
                (subjects.jobs_stream, jobs_consumer, subjects.claim_prefix),
                (subjects.progress_stream, progress_consumer, ""),
            )
        )
        self._stopping = asyncio.Event()
        self._writer = Writer(
            pool=pool, database=database, reconnect=reconnect, stopping=self._stopping
        )
        self.events_projected = 0
        """Events applied (not counting skipped redeliveries and duplicates), for metrics."""
        self._deferred = 0
        """PROGRESS batches committed since the jobs last caught up with their reports."""
        self._deferred_since = 0.0

    @property
    def foreign_events(self) -> int:
        """Events skipped as not what they claim to be (``mdq.bus.codec.foreign_reason``)."""
        return sum(feed.foreign_events for feed in self._feeds)

    @property
    def continuity_checks(self) -> int:
        """Checks of the log's continuity passed (``Feed.verify``), for tests and logs."""
        return sum(feed.continuity_checks for feed in self._feeds)

    # -- life cycle ------------------------------------------------------------------------
    async def run(self) -> None:
        """Project both streams until ``stop()`` is called; raise ``LogContinuityError`` (not
        in an exception group) when a stream is not the log the offsets were projected from."""
        self._stopping.clear()
        try:
            async with asyncio.TaskGroup() as group:
                for feed in self._feeds:
                    group.create_task(self._follow_or_stop(feed), name=f"projector-{feed.consumer}")
        except BaseExceptionGroup as group:
            broken = group.subgroup(LogContinuityError)
            if broken is None:
                raise
            first = broken.exceptions[0]
            while isinstance(first, BaseExceptionGroup):
                first = first.exceptions[0]
            raise first from group
        finally:
            for feed in self._feeds:
                await feed.unsubscribe()
        if self._writer.queued:  # stopped: the jobs catch up with what was stored
            try:
                await self._writer.fold_queued()
            except Exception as error:  # the next start folds them
                log.warning("the jobs could not catch up with their reports on stop: %r", error)

    async def _follow_or_stop(self, feed: Feed) -> None:
        """``_follow``; when it fails, the other feed is asked to stop as well as cancelled. A
        cancellation alone can be lost on Python 3.11 (``asyncio.timeout`` turns one that
        lands as its deadline expires into a TimeoutError), which would leave the other feed
        running and ``run()`` waiting on it for ever."""
        try:
            await self._follow(feed)
        except BaseException:
            self._stopping.set()
            raise

    def stop(self) -> None:
        """Ask ``run()`` to return after the batch in hand is committed (or abandoned) and the
        jobs caught up with the reports stored."""
        self._stopping.set()

    async def lag(self) -> list[ConsumerLag]:
        """How far each consumer is behind its stream (for metrics and logs)."""
        return [await feed.lag() for feed in self._feeds]

    async def _sleep(self, seconds: float) -> None:
        await pause(self._stopping, seconds)

    # -- consuming -------------------------------------------------------------------------
    async def _follow(self, feed: Feed) -> None:
        """Fetch and project batches until stopped; any unexpected error reopens the consumer
        from the stored offset, which is always a correct place to resume.

        The next batch is fetched while the current one is written (the two overlap: NATS
        parsing in this process, the transaction in PostgreSQL); it is only projected after
        the current one committed, and dropped, unacknowledged, when the consumer is reopened.
        """
        ahead: asyncio.Task[list[Msg]] | None = None
        try:
            while not self._stopping.is_set():
                subscription = feed.subscription
                if subscription is None:
                    try:
                        await feed.open()
                    except LogContinuityError:
                        raise  # not transient: stops the watcher
                    except nats.errors.Error as error:
                        log.warning("cannot open consumer %s (%r); retrying", feed.consumer, error)
                        await self._sleep(1.0)
                    except SCHEMA_NOT_READY as error:
                        log.warning(
                            "PostgreSQL at %s has no mdq tables yet (%s): waiting for the "
                            "migrations (mdq.store.migrate); retrying in %.1f s",
                            self._database,
                            describe_error(error),
                            SCHEMA_RETRY_S,
                        )
                        await self._sleep(SCHEMA_RETRY_S)
                    except Exception as error:
                        if not connection_lost(error):
                            raise  # not an outage: stops the watcher
                        await self._writer.reach_database(error)
                    continue
                fetching = ahead or asyncio.create_task(feed.fetch(subscription))
                ahead = None
                try:
                    messages = await fetching
                except nats.errors.Error as error:
                    log.warning("fetch from %s failed, reopening: %r", feed.consumer, error)
                    await feed.unsubscribe()  # reopened at the stored offset
                    await self._sleep(1.0)
                    continue
                fold_due = not messages and self._fold_due(feed)
                if not messages and not feed.verify_due() and not fold_due:
                    continue
                if messages:
                    ahead = asyncio.create_task(feed.fetch(subscription))
                try:
                    if feed.verify_due():
                        await feed.verify()
                    if messages:
                        await self._handle(feed, messages)
                    elif fold_due:  # caught up, with reports left to fold (a start, a stop)
                        await self._writer.fold_queued()
                        self._deferred = 0
                except (asyncio.CancelledError, LogContinuityError):
                    raise
                except Exception as error:
                    if connection_lost(error):  # the periodic check met an outage
                        await self._writer.reach_database(error)
                    else:
                        log.exception(
                            "consumer %s failed; reopening at the stored offset", feed.consumer
                        )
                        await feed.unsubscribe()
                        await self._sleep(1.0)
                if feed.subscription is not subscription:  # rewound or reopened
                    await cancel_fetch(ahead)
                    ahead = None
        finally:
            await cancel_fetch(ahead)

    def _fold_due(self, feed: Feed) -> bool:
        """Whether the jobs are to catch up with reports queued for them, now that ``feed``
        delivered nothing."""
        return feed is self._feeds[1] and self._writer.queued

    def _fold_now(self, last: Msg) -> bool:
        """Whether a PROGRESS batch ending with ``last`` is folded at once (``FOLD_EVERY_S``)."""
        if delivery_position(last.reply)[1] == 0:  # nothing more in the stream: caught up
            return True
        if self._deferred == 0:
            return False
        waited = asyncio.get_running_loop().time() - self._deferred_since
        return self._deferred >= FOLD_EVERY_BATCHES or waited >= FOLD_EVERY_S

    def _count_deferred(self, queued: bool | None) -> None:
        """Count a committed PROGRESS batch that left its reports queued (``queued``), or start
        over after one that folded them; None: the batch changed nothing."""
        if queued is None:
            return
        if not queued:
            self._deferred = 0
        elif self._deferred == 0:
            self._deferred, self._deferred_since = 1, asyncio.get_running_loop().time()
        else:
            self._deferred += 1

    async def _handle(self, feed: Feed, messages: list[Msg]) -> None:
        """Project one batch (retrying the same batch until it commits), then acknowledge.

        A PROGRESS batch of reports alone that follows the offset goes the short way
        (``Feed.report_rows``, ``Writer.project_reports``); any other batch, or one the short
        way turns down, the general one."""
        catch_up = feed is self._feeds[0]  # the JOBS stream
        fold = catch_up or self._fold_now(messages[-1])
        reports = None if catch_up else feed.report_rows(messages)
        ordered: Batch = []
        delay = 0.05
        scrubbed = False
        while True:
            try:
                if reports is not None:
                    outcome = await self._writer.project_reports(feed, reports, fold=fold)
                    if outcome is not None:
                        break
                    reports = None  # turned down: the general way
                if not ordered:
                    ordered = decoded(feed, messages)
                outcome = await self._writer.project(feed, ordered, catch_up=catch_up, fold=fold)
                break
            except asyncio.CancelledError:
                raise
            except Exception as error:
                if isinstance(error, LogContinuityError):
                    raise
                if connection_lost(error):
                    await self._writer.reach_database(error)
                    if self._stopping.is_set():
                        return  # not acknowledged: the next start resumes after the offset
                    # then the same batch again, not at once: a server that answers a ping
                    # but refuses the batch (a full disk) must not be hammered
                    await self._sleep(delay)
                    delay = min(delay * 2, self._max_retry_delay_s)
                    continue
                if isinstance(error, asyncpg.DataError) and not scrubbed:
                    # Text PostgreSQL refuses (a NUL, e.g. in a pod's termination message):
                    # store the batch with U+FFFD in its place rather than stop on it.
                    scrubbed = True
                    reports = None
                    ordered = ordered or decoded(feed, messages)
                    changed = [scrub_nul(e) for _, (_, e) in ordered if e is not None]
                    if any(changed):
                        log.error(
                            "a batch of %s was refused (%s); %d event(s) scrubbed of NULs",
                            feed.consumer,
                            error,
                            sum(changed),
                        )
                        continue
                log.exception("projecting a batch from %s failed; retrying", feed.consumer)
                if self._stopping.is_set():
                    return  # not acknowledged: the next start resumes after the offset
                await self._sleep(delay)
                delay = min(delay * 2, self._max_retry_delay_s)
        feed.projected_seq = max(feed.projected_seq, outcome.covered_seq)
        self.events_projected += outcome.projected
        if not catch_up:
            self._count_deferred(outcome.queued)
        if outcome.stale:
            # Redeliveries, or new events reusing sequence numbers of a log that went
            # backwards: not acknowledged (nor skipped) before the log is known to be the same.
            await feed.verify()
        if outcome.rewind_at is not None:
            log.warning(
                "gap in %s before stream sequence %d; rewinding", feed.consumer, outcome.rewind_at
            )
            await feed.rewind(outcome.rewind_at)
            return
        feed.trusted_start = 0
        last_message = reports.last if reports is not None else ordered[-1][1][0]
        with contextlib.suppress(Exception):
            await last_message.ack()  # AckAll: covers the whole batch
