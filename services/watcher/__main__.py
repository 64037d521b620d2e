"""Entrypoint: ``python -m services.watcher`` (composition root).

Runs the two halves side by side: the projector (log → PostgreSQL) and the lifecycle
(pod updates and silence → job events). They fail apart: the watcher waits for NATS on start
(``connect(wait=True)``), but never for PostgreSQL. Its pool connects on first use, and the
projector waits out a database that is not there yet or goes away (``mdq.store.projection``),
so pod phases keep becoming ``started`` / ``succeeded`` / ``attempt_failed`` events meanwhile
and the projection catches up from its stored offsets afterwards. An error the projector does
not retry (a log that went backwards, a bad password) stops the whole watcher, non-zero.
"""

from __future__ import annotations

import asyncio
import logging

from mdq.backends.factory import make_backend
from mdq.bus.connect import connect
from mdq.settings import CommonSettings
from services.watcher.app import run_watcher
from services.watcher.settings import WatcherSettings


async def main() -> None:
    common, settings = CommonSettings(), WatcherSettings()
    if not common.database_url:
        raise SystemExit("DATABASE_URL is not set: the watcher writes the history there")
    subjects = common.subjects
    nc = await connect(common.nats_url, name="mdq-watcher", subjects=subjects, wait=True)
    backend = await make_backend(kind=settings.backend, nc=nc, subjects=subjects)
    try:
        await run_watcher(
            nc=nc,
            subjects=subjects,
            database_url=common.database_url,
            backend=backend,
            settings=settings,
        )
    finally:
        await backend.close()
        await nc.drain()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    asyncio.run(main())
