"""Entrypoint: ``python -m services.watcher`` (composition root).

Runs the two halves side by side: the projector (log → PostgreSQL) and the lifecycle
(pod updates and silence → job events).
"""

from __future__ import annotations

import asyncio
import logging

from mdq.backends.factory import make_backend
from mdq.bus.connect import connect
from mdq.bus.publisher import EventPublisher
from mdq.settings import CommonSettings
from mdq.store.engine import create_writer_pool
from services.watcher.lifecycle import Lifecycle, LostRunPolicy
from services.watcher.projector import Projector
from services.watcher.settings import WatcherSettings


async def main() -> None:
    common, settings = CommonSettings(), WatcherSettings()
    if not common.database_url:
        raise SystemExit("DATABASE_URL is not set: the watcher writes the history there")
    subjects = common.subjects
    nc = await connect(common.nats_url, name="mdq-watcher", subjects=subjects)
    js = nc.jetstream()
    pool = await create_writer_pool(common.database_url, size=settings.pool_size)
    backend = await make_backend(kind=settings.backend, nc=nc, subjects=subjects)
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


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    asyncio.run(main())
