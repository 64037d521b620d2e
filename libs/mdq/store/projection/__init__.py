"""The projection of the event log into PostgreSQL (docs/architecture.md, invariants 1 and 2).

The watcher runs it as the single writer of the database (``services.watcher``); ``mdq replay
--rebuild`` runs the same code into a fresh database, so a rebuilt projection equals the live
one. What it writes, and how: docs/history.md ("How the watcher writes it"); offsets, gaps, the
log's continuity and database outages: docs/durability.md, section 4.

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
from mdq.store.projection.projector import BATCH_SIZE, BATCH_WAIT_S, Projector

__all__ = [
    "BATCH_SIZE",
    "BATCH_WAIT_S",
    "JOBS_CONSUMER",
    "PROGRESS_COLUMNS",
    "PROGRESS_CONSUMER",
    "ConsumerLag",
    "LogContinuityError",
    "Projector",
    "progress_event",
]
