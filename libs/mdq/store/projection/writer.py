"""One batch of the projection in one PostgreSQL transaction, and waiting out the database.

The transaction locks the consumer's offset, skips what is at or below it, stops at a gap,
stores the batch's facts (``facts``), folds it into the jobs' rows (``jobs``) and moves the
offset. A batch of progress reports alone is folded later, coalesced with the batches after
it: its transaction queues the attempts it reported on in ``progress_unfolded`` instead, and
a later one (or ``fold_queued``) folds and clears the queue (``jobs.fold_unfolded``). Why
asyncpg and not SQLAlchemy here: docs/history.md ("How the watcher writes it"); offsets,
gaps and database outages: docs/durability.md, section 4.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from typing import Any

import asyncpg
from nats.aio.msg import Msg

from mdq.backoff import Backoff, describe_error
from mdq.contracts import pb
from mdq.core.log_continuity import message_digest
from mdq.core.state import event_time
from mdq.store.engine import connection_lost, out_of_space
from mdq.store.projection.facts import (
    EVENTS,
    FACT_TABLES,
    INSERT_EVENTS,
    PROGRESS,
    Fact,
    Report,
    Stored,
    attempts_of_rows,
    progress_rows,
)
from mdq.store.projection.feed import Feed, ReportRows
from mdq.store.projection.jobs import fold_jobs, fold_unfolded

log = logging.getLogger("mdq.store.projection")

_LOCK_OFFSET = """
INSERT INTO consumer_offsets (consumer, stream, last_seq, updated_at)
VALUES ($1, $2, 0, now()) ON CONFLICT (consumer) DO NOTHING
"""
_READ_OFFSET = "SELECT last_seq FROM consumer_offsets WHERE consumer = $1 FOR UPDATE"
_WRITE_OFFSET = """
UPDATE consumer_offsets SET last_seq = GREATEST(last_seq, $2), stream = $3, updated_at = now(),
    last_digest = $4
WHERE consumer = $1
"""

_QUEUE_UNFOLDED = """
INSERT INTO progress_unfolded (job_id, attempt)
SELECT * FROM unnest($1::text[], $2::int[]) ON CONFLICT DO NOTHING
"""
_TAKE_UNFOLDED = "DELETE FROM progress_unfolded RETURNING job_id, attempt"

Batch = list[tuple[int, tuple[Msg, pb.Event | None]]]
"""A batch in stream order: each sequence with its message and its event (None: skipped)."""


@dataclass(slots=True)
class BatchOutcome:
    """What one transaction did: the highest sequence it covers and where to rewind, if any."""

    covered_seq: int
    rewind_at: int | None
    projected: int
    stale: bool = False
    """The batch held sequences at or below the stored offset (redeliveries, or a log that
    went backwards: checked before they are acknowledged)."""
    queued: bool | None = None
    """Whether the transaction left attempts in ``progress_unfolded`` (None: not changed)."""


async def _locked_offset(connection: asyncpg.Connection, feed: Feed) -> int:
    """``feed``'s stored offset, its row locked until the transaction ends (made, at 0, for
    the consumer's first batch)."""
    stored_offset = await connection.fetchval(_READ_OFFSET, feed.consumer)
    if stored_offset is None:  # the consumer's first batch: its row, then its lock
        await connection.execute(_LOCK_OFFSET, feed.consumer, feed.stream)
        stored_offset = await connection.fetchval(_READ_OFFSET, feed.consumer)
    return int(stored_offset)


async def _write_offset(
    connection: asyncpg.Connection, feed: Feed, covered: int, last: Msg
) -> None:
    """Move ``feed``'s offset to ``covered``, with the digest of ``last``, its message."""
    digest = message_digest(last.subject, last.data)
    await connection.execute(_WRITE_OFFSET, feed.consumer, covered, feed.stream, digest)


async def pause(stopping: asyncio.Event, seconds: float) -> None:
    """Wait ``seconds``, or until ``stopping`` is set."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await stopping.wait()


def _first(pair: tuple[int, pb.Event]) -> int:
    return pair[0]


class RepublishedReport(Exception):
    """The fast path's COPY met a report already stored (or twice in the batch): the batch's
    transaction is rolled back and the batch is written again the careful way."""


async def store_progress(
    connection: asyncpg.Connection,
    stream: str,
    reports: list[Report],
    *,
    careful: bool = False,
    rows: list[tuple[Any, ...]] | None = None,
) -> list[Report]:
    """Store progress reports in ``progress``; return the ones not stored before.

    The fast path is one COPY: the batch holds only messages after the committed offset, so
    its reports are new unless the log holds a republished copy of an older report (same job,
    attempt and step). Then the COPY fails on the primary key and ``RepublishedReport`` is
    raised: the transaction is rolled back and the batch comes again with ``careful``, which
    drops copies within the batch (the first one counts) and stores the rest with ``INSERT ...
    ON CONFLICT DO NOTHING``, which says which reports were new. No savepoint: the fast path
    costs the COPY alone. ``rows``: ``progress_rows`` of ``reports``, where the caller made them.
    """
    if not careful:
        try:
            await connection.copy_records_to_table(
                PROGRESS.table,
                records=progress_rows(stream, reports) if rows is None else rows,
                columns=PROGRESS.names,
            )
        except asyncpg.UniqueViolationError as error:
            raise RepublishedReport from error
        return reports
    unique: dict[tuple[str, int, int], Report] = {}
    for report in reports:
        event = report[1]
        unique.setdefault((event.job_id, event.attempt, event.progress.step), report)
    rows = progress_rows(stream, unique.values())
    stored = await connection.fetch(PROGRESS.sql, *PROGRESS.arrays_of_rows(rows))
    new = {(record["job_id"], record["attempt"], record["step"]) for record in stored}
    return [report for key, report in unique.items() if key in new]


async def _insert_facts(connection: asyncpg.Connection, facts: list[Fact]) -> None:
    """Checkpoint, placement and rejection rows (append-only facts)."""
    for kind, table in FACT_TABLES.items():
        if rows := [fact for fact in facts if fact.kind == kind]:
            await connection.execute(table.sql, *table.arrays(rows))


class Writer:
    """Writes the projection's batches, one transaction at a time, and waits out outages."""

    def __init__(
        self,
        *,
        pool: asyncpg.Pool,
        database: str,
        reconnect: Backoff,
        stopping: asyncio.Event,
    ) -> None:
        self._pool = pool
        self._database = database
        self._reconnect = reconnect
        self._stopping = stopping
        self._write_lock = asyncio.Lock()
        self._database_lock = asyncio.Lock()
        self.queued = True
        """Whether ``progress_unfolded`` may hold attempts this writer queued (so, on start: it
        may, left by a process that stopped before it folded them): a caught-up feed that
        delivers nothing folds them."""

    async def project(
        self, feed: Feed, ordered: Batch, *, catch_up: bool, fold: bool = True
    ) -> BatchOutcome:
        """Project one batch of ``feed`` in one transaction, after any other batch's; with
        ``catch_up`` (the JOBS stream), jobs catch up with their stored reports
        (``jobs.fold_jobs``). Without it, a batch of reports alone is folded with the queued
        ones when ``fold`` says so, and queued otherwise."""
        async with self._write_lock, self._pool.acquire() as connection:
            try:
                async with connection.transaction():
                    outcome = await self._project(
                        connection, feed, ordered, catch_up=catch_up, fold=fold
                    )
            except RepublishedReport:
                async with connection.transaction():
                    outcome = await self._project(
                        connection, feed, ordered, catch_up=catch_up, fold=fold, careful=True
                    )
        if outcome.queued is not None:  # committed
            self.queued = outcome.queued
        return outcome

    async def project_reports(
        self, feed: Feed, reports: ReportRows, *, fold: bool
    ) -> BatchOutcome | None:
        """Project a batch of reports alone (``Feed.report_rows``) in one transaction, as
        ``project`` would, by the short way: the rows COPYed as they are, their attempts queued
        or, with ``fold``, folded. None, with nothing written, where the batch does not follow
        the stored offset or holds a report already stored: ``project`` then takes it the
        general way (a gap, a redelivery, a republished report)."""
        async with self._write_lock, self._pool.acquire() as connection:
            try:
                async with connection.transaction():
                    offset = await _locked_offset(connection, feed)
                    start = reports.first_seq
                    if start <= offset or (
                        start != offset + 1 and offset + 1 != feed.trusted_start
                    ):
                        return None
                    # the rows alone: a report is read again only the careful way (project's)
                    await store_progress(connection, feed.stream, [], rows=reports.rows)
                    queued = await self._queue_or_fold(
                        connection, attempts_of_rows(reports.rows), fold=fold
                    )
                    await _write_offset(connection, feed, reports.last_seq, reports.last)
            except RepublishedReport:
                return None
        self.queued = queued
        return BatchOutcome(
            covered_seq=reports.last_seq,
            rewind_at=None,
            projected=len(reports.rows),
            queued=queued,
        )

    async def fold_queued(self) -> None:
        """Fold the attempts queued in ``progress_unfolded`` and clear the queue, in one
        transaction (the feed is caught up, the projector starts or stops)."""
        async with (
            self._write_lock,
            self._pool.acquire() as connection,
            connection.transaction(),
        ):
            await self._fold_queue(connection, set())
        self.queued = False  # committed

    async def _queue_or_fold(
        self, connection: asyncpg.Connection, attempts: set[tuple[str, int]], *, fold: bool
    ) -> bool:
        """Queue the ``attempts`` of a batch of reports alone in ``progress_unfolded``, or with
        ``fold`` fold them and every queued one; return whether attempts stay queued."""
        if fold:
            await self._fold_queue(connection, attempts)
            return False
        jobs, numbers = zip(*attempts, strict=True)
        await connection.execute(_QUEUE_UNFOLDED, list(jobs), list(numbers))
        return True

    async def _fold_queue(
        self, connection: asyncpg.Connection, attempts: set[tuple[str, int]]
    ) -> None:
        """Fold ``attempts`` and every queued one, and clear the queue: also what another
        watcher queued (replicas share the table) and left there, killed before its fold."""
        for record in await connection.fetch(_TAKE_UNFOLDED):
            attempts.add((record["job_id"], record["attempt"]))
        if attempts:
            await fold_unfolded(connection, attempts)

    async def _project(
        self,
        connection: asyncpg.Connection,
        feed: Feed,
        ordered: Batch,
        *,
        catch_up: bool,
        fold: bool,
        careful: bool = False,
    ) -> BatchOutcome:
        offset = await _locked_offset(connection, feed)
        expected = offset + 1
        accepted: list[tuple[int, pb.Event | None]] = []
        rewind_at: int | None = None
        stale = False
        last_message: Msg | None = None
        for sequence, (message, event) in ordered:
            if sequence <= offset:
                stale = True
                continue
            if sequence != expected and expected != feed.trusted_start:
                rewind_at = expected
                break
            accepted.append((sequence, event))
            last_message = message
            expected = sequence + 1
        if not accepted or last_message is None:
            return BatchOutcome(offset, rewind_at, projected=0, stale=stale)
        if stale:
            # Apply nothing of a batch that may come from a log that went backwards: once
            # the log is verified, it is delivered again from right after the offset.
            return BatchOutcome(offset, rewind_at=offset + 1, projected=0, stale=True)
        projected, queued = await self._apply(
            connection,
            feed.stream,
            accepted,
            catch_up=catch_up,
            careful=careful,
            fold=fold,
        )
        covered = accepted[-1][0]
        await _write_offset(connection, feed, covered, last_message)
        return BatchOutcome(
            covered_seq=covered, rewind_at=rewind_at, projected=projected, queued=queued
        )

    async def _apply(
        self,
        connection: asyncpg.Connection,
        stream: str,
        accepted: list[tuple[int, pb.Event | None]],
        *,
        catch_up: bool,
        careful: bool,
        fold: bool,
    ) -> tuple[int, bool | None]:
        """Write the effects of ``accepted`` (in stream order); return how many were new and
        whether ``progress_unfolded`` holds attempts after it (None: not changed).

        Progress reports go to ``progress`` only (by COPY), every other event to
        ``job_events``; an event already stored (a republished copy) has no other effect.
        Reports alone, without ``catch_up`` (a PROGRESS batch): their attempts are queued, or
        with ``fold`` folded at once with those queued before (``jobs.fold_unfolded``).
        """
        reports: list[Report] = []
        others: list[Fact] = []
        for sequence, event in accepted:
            if event is None:
                continue
            kind = event.WhichOneof("body") or ""
            # a report without a job id has no key in ``progress``: it is kept as an event
            if kind == "progress" and event.job_id:
                reports.append((sequence, event))
            else:
                others.append(Fact(sequence, event, kind, event_time(event)))
        facts: list[Fact] = []
        if others:
            stored = [Stored(stream, fact) for fact in others]
            inserted = await connection.fetch(INSERT_EVENTS, *EVENTS.arrays(stored))
            new_ids = {record["event_id"] for record in inserted}
            for fact in others:
                if fact.event.event_id in new_ids:
                    new_ids.discard(fact.event.event_id)  # a second copy in the batch: duplicate
                    facts.append(fact)
            await _insert_facts(connection, facts)
        new_reports: list[Report] = []
        rows = None
        if reports:
            rows = None if careful else progress_rows(stream, reports)
            new_reports = await store_progress(
                connection, stream, reports, careful=careful, rows=rows
            )
        if not catch_up and not facts:
            if rows is not None:  # the reports alone, all stored: read from the rows
                attempts = attempts_of_rows(rows)
            else:
                attempts = {(event.job_id, event.attempt) for _, event in new_reports}
            if not fold and not attempts:
                return 0, None
            return len(new_reports), await self._queue_or_fold(connection, attempts, fold=fold)
        if facts and new_reports:  # both lists are in stream order: merged only when two
            merged = sorted([(f.sequence, f.event) for f in facts] + new_reports, key=_first)
            events = [event for _, event in merged]
        elif facts:
            events = [fact.event for fact in facts]
        else:
            events = [event for _, event in new_reports]
        if not events:
            return 0, None
        queued: bool | None = None
        if not catch_up:  # events of the PROGRESS stream that are no reports: in order
            await self._fold_queue(connection, set())
            queued = False
        await fold_jobs(connection, events, catch_up=catch_up)
        return len(events), queued

    async def reach_database(self, error: BaseException) -> None:
        """After a connection-class error: drop the pool's connections and wait, with backoff
        and one log line per try, until PostgreSQL answers again (or the projector stops).

        Both feeds may call it at once; the lock makes the second wait behind the first, and
        its first try then succeeds. Nothing is lost meanwhile: the batch in hand was not
        acknowledged and its transaction, if it did not commit, left the offset where it was.
        """
        async with self._database_lock:
            if out_of_space(error):
                log.error(
                    "PostgreSQL at %s is out of disk space (%s): the projection stalls, storing "
                    "and acknowledging nothing, and catches up once the disk has room again "
                    "(mdq_consumer_lag_messages shows what waits)",
                    self._database,
                    describe_error(error),
                )
            else:
                log.warning(
                    "PostgreSQL at %s unavailable (%s); reconnecting",
                    self._database,
                    describe_error(error),
                )
            await self._pool.expire_connections()  # the next acquire opens fresh ones
            delays = self._reconnect.delays()
            failures = 0
            while not self._stopping.is_set():
                try:
                    async with self._pool.acquire() as connection:
                        await connection.fetchval("SELECT 1")
                except Exception as retry_error:
                    if not connection_lost(retry_error):
                        raise
                    failures += 1
                    delay = next(delays)
                    log.warning(
                        "PostgreSQL at %s not reachable (%s); retrying in %.1f s",
                        self._database,
                        describe_error(retry_error),
                        delay,
                    )
                    await pause(self._stopping, delay)
                    continue
                if failures:
                    log.info(
                        "PostgreSQL at %s reachable again after %d failed tries",
                        self._database,
                        failures,
                    )
                return
