"""Entrypoint: ``python -m services.watcher`` (composition root).

Runs the two halves side by side: the projector (log → PostgreSQL) and the lifecycle
(pod updates and silence → job events).

A log that is not the one the projection was made from (``LogContinuityError``: the stream was
recreated or lost its tail) is not a transient failure: the watcher logs why and how to
recover, and exits with ``EXIT_LOG_CONTINUITY`` so that nothing restarts it into skipping
events (docs/durability.md).
"""

from __future__ import annotations

import asyncio
import logging
import sys

from mdq.backends.factory import make_backend
from mdq.bus.connect import connect
from mdq.bus.publisher import EventPublisher
from mdq.settings import CommonSettings
from mdq.store.engine import create_writer_pool
from mdq.store.projection import LogContinuityError
from services.watcher.lifecycle import Lifecycle, LostRunPolicy
from services.watcher.projector import Projector
from services.watcher.settings import WatcherSettings

log = logging.getLogger("mdq.watcher")

EXIT_LOG_CONTINUITY = 3
"""Exit status of a watcher stopped by a broken log (an operator must act)."""


async def main() -> None:
    common, settings = CommonSettings(), WatcherSettings()
    if not common.database_url:
        raise SystemExit("DATABASE_URL is not set: the watcher writes the history there")
    subjects = common.subjects
    replicas = common.stream_replicas
    nc = await connect(common.nats_url, name="mdq-watcher", subjects=subjects, replicas=replicas)
    js = nc.jetstream()
    pool = await create_writer_pool(common.database_url, size=settings.pool_size)
    backend = await make_backend(kind=settings.backend, nc=nc, subjects=subjects, replicas=replicas)
    projector = Projector(
        js=js,
        subjects=subjects,
        pool=pool,
        batch_size=settings.batch_size,
        batch_wait_s=settings.batch_wait_s,
    )
    lifecycle = Lifecycle(
        js=js,
        subjects=subjects,
        publisher=EventPublisher(js=js, subjects=subjects, producer="watcher"),
        backend=backend,
        lost=LostRunPolicy(
            min_silence_s=settings.lost_min_silence_s,
            interval_factor=settings.lost_interval_factor,
        ),
    )
    try:
        async with asyncio.TaskGroup() as group:
            group.create_task(projector.run(), name="projector")
            group.create_task(lifecycle.run(), name="lifecycle")
    finally:
        await backend.close()
        await pool.close()
        await nc.drain()


def run() -> int:
    """Run the watcher; the process's exit status."""
    try:
        asyncio.run(main())
    except BaseExceptionGroup as group:
        broken = group.subgroup(LogContinuityError)
        if broken is None:
            raise
        for error in broken.exceptions:
            log.critical("watcher stopped: %s", error)
        return EXIT_LOG_CONTINUITY
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    sys.exit(run())
