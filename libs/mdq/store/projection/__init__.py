"""The projection of the event log into PostgreSQL (docs/architecture.md, invariants 1 and 2).

The watcher service runs it as the single writer of the database (``services.watcher``);
``mdq replay --rebuild`` runs the same code into a fresh database, so a rebuilt projection
equals the live one. Two durable pull consumers read the JOBS
stream (every ``job.<id>.<kind>`` event and ``rejected.<request>``) and the PROGRESS stream in
batches (up to ``batch_size`` messages, or what arrived within ``batch_wait_s``, fetched by
``mdq.bus.fetch.BatchFetcher``). Each batch is applied in ONE transaction that also moves the
consumer's offset, and only acknowledged after the commit:

* ``job_events``: every event but progress reports once, by its deterministic event id (looked
  up before the insert, ``... RETURNING``: the table is partitioned by month, so the id alone is
  no key); an event whose id is already stored (a republished copy) has no other effect, so
  replays and republishes change nothing.
* ``progress``: every progress report once, keyed by (job, attempt, step, time), with its envelope;
  one COPY per batch, falling back to ``INSERT ... ON CONFLICT DO NOTHING RETURNING`` when the
  batch holds a republished copy of a stored report (``writer.store_progress``). The view ``events``
  (migration 0003) shows both tables as one.
* ``jobs`` / ``attempts``: the rows of the jobs touched by the batch are locked, turned back
  into ``mdq.core.state.JobView`` objects, the batch's events are folded in stream order with
  ``JobView.apply`` (the same state machine as placement, recovery and ``mdq replay``: fencing
  by attempt, terminal states accept nothing), and the changed rows are written back with
  absolute values. Times come from the events, so the projection is deterministic: a database
  rebuilt from the log is identical.
* ``checkpoints``, ``placements``, ``rejections``: multi-row ``INSERT ... SELECT FROM
  unnest(...) ON CONFLICT DO NOTHING``.
* ``consumer_offsets``: the last stream sequence, locked at the start of the transaction, with
  the digest of the message there (``last_digest``) and the stream's creation time
  (``stream_created``, recorded when the consumer is opened).

Messages at or below the stored offset are skipped (redeliveries). Delivery must be gap-free
for the offset to be a cursor, so a gap (a message delivered to a process that was killed
before committing it, then acknowledged implicitly by a later ``AckAll``) is never papered
over: on start, and whenever a gap shows up, the durable consumer is recreated to start right
after the stored offset. After a kill -9 mid-batch the transaction is rolled back and the
restarted projector resumes exactly after the last committed batch.

Skipping what is at or below the offset is only right if the log is the one the offset was
taken from. When the consumer is opened, when a batch holds sequences at or below the offset,
and every ``continuity_check_s`` while running, the stored offset is compared with the stream
as the server holds it now (``mdq.core.log_continuity.check``: creation time, first and last
sequence, the message at the offset). A stream that was recreated, lost its tail (power cut,
restored volume) or had unprojected messages removed raises ``LogContinuityError``: the
projector stops and stores nothing more, rather than skip new events that reuse sequence
numbers it already projected. It is not transient and must not be retried; the operator
rebuilds the projection from the log as it is (``mdq replay --rebuild``, docs/durability.md).

PostgreSQL may be away when the projector starts or go away while it runs: a connection-class
error (``mdq.store.engine.DATABASE_NOT_READY``: refused, reset, shutting down, disk full) drops
the pool's connections and waits (a full disk is named as such in one ERROR line per try:
"PostgreSQL at <host> is out of disk space (...): the projection stalls ..."), with backoff and
one log line per try ("PostgreSQL at <host> not reachable (...); retrying in 2.0 s"), until the
server answers; then the batch in hand is tried again. It was never acknowledged, and a
transaction cut off before its commit left the offset where it was (one cut off during its
commit may have committed: the offset it moved makes the retry skip those messages), so nothing
is lost or stored twice, however long the outage. Only the projection waits: the watcher's
lifecycle half needs NATS alone. A database without the mdq tables yet (the migrations run
beside the watcher) is waited for on start as well. Any other error while opening a consumer
(``LogContinuityError`` above, a database that does not exist) is not retried: it stops the
projector, and the watcher.

Why asyncpg and not a SQLAlchemy engine for the writer: every write here is one set-based
statement with array parameters per table per batch (the hot path is progress events, compared
in bench/ against raw asyncpg COPY); asyncpg binds typed arrays directly, caches the prepared
statements and adds no per-row cost, and the ORM's unit of work has nothing to offer to an
idempotent projection. Readers (``mdq.store.queries``) use SQLAlchemy.

``projector`` runs it; ``feed`` is one stream's consumer; ``writer`` is one batch's transaction;
``facts`` the append-only tables; ``fold``, ``jobs`` and ``rows`` the jobs and attempts rows.
"""

from mdq.store.projection.facts import PROGRESS_COLUMNS
from mdq.store.projection.feed import (
    JOBS_CONSUMER,
    PROGRESS_CONSUMER,
    ConsumerLag,
    LogContinuityError,
)
from mdq.store.projection.jobs import progress_event
from mdq.store.projection.projector import Projector

__all__ = [
    "JOBS_CONSUMER",
    "PROGRESS_COLUMNS",
    "PROGRESS_CONSUMER",
    "ConsumerLag",
    "LogContinuityError",
    "Projector",
    "progress_event",
]
