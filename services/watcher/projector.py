"""The watcher's projector: the log into PostgreSQL (the code lives in ``mdq.store.projection``).

The projection is library code so that ``mdq replay --rebuild`` (the CLI, which never imports a
service) runs exactly what the watcher runs; the watcher's entrypoint wires it to its settings.
"""

from mdq.store.projection import (
    JOBS_CONSUMER,
    PROGRESS_CONSUMER,
    ConsumerLag,
    Projector,
)

__all__ = ["JOBS_CONSUMER", "PROGRESS_CONSUMER", "ConsumerLag", "Projector"]
