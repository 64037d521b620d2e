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
from mdq.bus.runtime import Service, serve
from mdq.store.projection import LogContinuityError
from services.watcher.app import run_watcher
from services.watcher.settings import WatcherSettings

log = logging.getLogger("mdq.watcher")

EXIT_LOG_CONTINUITY = 3
"""Exit status of a watcher stopped by a broken log (an operator must act)."""


async def compose(service: Service) -> None:
    common, settings = service.common, WatcherSettings()
    if not common.database_url:
        raise SystemExit("DATABASE_URL is not set: the watcher writes the history there")
    nc = await service.connect()
    backend = await make_backend(
        kind=settings.backend, nc=nc, subjects=service.subjects, replicas=common.stream_replicas
    )
    service.on_stop(backend.close)
    service.part(
        "watcher",
        lambda: run_watcher(
            nc=nc,
            subjects=service.subjects,
            database_url=common.database_url,
            backend=backend,
            settings=settings,
        ),
    )


def run() -> int:
    """Run the watcher; the process's exit status."""
    try:
        serve("watcher", compose)
    except LogContinuityError as error:
        log.critical("watcher stopped: %s", error)
        return EXIT_LOG_CONTINUITY
    return 0


if __name__ == "__main__":
    sys.exit(run())
