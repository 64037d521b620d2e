"""Entrypoint: ``python -m services.watcher`` (composition root).

Runs the two halves side by side: the projector (log → PostgreSQL) and the lifecycle (pod
updates and silence → job events). It waits for NATS on start but never for PostgreSQL, and
exits with ``EXIT_LOG_CONTINUITY`` when the log is not the one the projection was made from.
Design: docs/architecture.md, "When NATS or PostgreSQL is down"; docs/durability.md, section 4.
"""

from __future__ import annotations

import logging
import sys

from mdq.backends.factory import make_backend
from mdq.bus.connect import connect
from mdq.bus.runtime import configure_logging, run_service
from mdq.bus.subjects import Subjects
from mdq.settings import CommonSettings
from mdq.store.projection import LogContinuityError
from services.watcher.app import run_watcher
from services.watcher.settings import WatcherSettings

log = logging.getLogger("mdq.watcher")

EXIT_LOG_CONTINUITY = 3
"""Exit status of a watcher stopped by a broken log (an operator must act)."""


async def main() -> None:
    common, settings = CommonSettings(), WatcherSettings()
    if not common.database_url:
        raise SystemExit("DATABASE_URL is not set: the watcher writes the history there")
    subjects = Subjects(common.namespace)
    replicas = common.stream_replicas
    nc = await connect(
        common.nats_url, name="mdq-watcher", subjects=subjects, replicas=replicas, wait=True
    )
    backend = await make_backend(kind=settings.backend, nc=nc, subjects=subjects, replicas=replicas)
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


def run() -> int:
    """Run the watcher; the process's exit status."""
    try:
        run_service(main)
    except BaseExceptionGroup as group:
        broken = group.subgroup(LogContinuityError)
        if broken is None:
            raise
        for error in broken.exceptions:
            log.critical("watcher stopped: %s", error)
        return EXIT_LOG_CONTINUITY
    return 0


if __name__ == "__main__":
    configure_logging()
    sys.exit(run())
