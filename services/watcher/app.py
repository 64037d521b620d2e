"""Composition of the watcher's two halves on a connection and a backend (``run_watcher``).

The projector (log → PostgreSQL) and the lifecycle (pod updates and silence → job events) run
side by side and fail apart: neither needs the other, and only the projector needs the
database, which it waits for (``mdq.store.projection``). ``python -m services.watcher`` wires
this to the settings; tests run it with an in-memory backend.
"""

from __future__ import annotations

import asyncio

from nats.aio.client import Client

from mdq.backends.port import ClusterBackend
from mdq.bus.publisher import EventPublisher
from mdq.bus.runtime import run_parts
from mdq.bus.storage import StorageSettings
from mdq.bus.subjects import Subjects
from mdq.store.engine import create_writer_pool, database_location
from mdq.store.partitions import keep_partitions
from services.watcher.lifecycle import Lifecycle, LostRunPolicy
from services.watcher.projector import Projector
from services.watcher.settings import WatcherSettings

POOL_CLOSE_TIMEOUT_S = 10.0


async def run_watcher(
    *,
    nc: Client,
    subjects: Subjects,
    database_url: str,
    backend: ClusterBackend,
    settings: WatcherSettings,
) -> None:
    """Run both halves on this connection and backend until one of them fails, with its error
    (or this is cancelled). Needs no database to start: the projector waits for it."""
    js = nc.jetstream()
    pool = await create_writer_pool(database_url, size=settings.pool_size, connect_now=False)
    projector = Projector(
        js=js,
        subjects=subjects,
        pool=pool,
        batch_size=settings.batch_size,
        batch_wait_s=settings.batch_wait_s,
        database=database_location(database_url),
    )
    lifecycle = Lifecycle(
        js=js,
        subjects=subjects,
        publisher=EventPublisher(js=js, subjects=subjects, producer="watcher"),
        backend=backend,
        lost=LostRunPolicy(
            min_silence_s=settings.lost_min_silence_s,
            interval_factor=settings.lost_interval_factor,
            first_report_s=settings.lost_first_report_s,
        ),
        jobs_log_days=StorageSettings().jobs_days,
    )
    try:
        await run_parts(
            {
                "projector": projector.run(),
                "lifecycle": lifecycle.run(),
                "partitions": keep_partitions(
                    pool,
                    months_ahead=settings.partition_months_ahead,
                    retention_days=settings.history_retention_days,
                    rollup_days=settings.progress_rollup_days,
                    keep_every=settings.progress_rollup_keep_every,
                ),
            }
        )
    finally:
        try:
            await asyncio.wait_for(pool.close(), timeout=POOL_CLOSE_TIMEOUT_S)
        except TimeoutError:  # a connection stuck on a server that went away
            pool.terminate()
