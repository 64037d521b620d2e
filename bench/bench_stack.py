"""The whole stack for a benchmark: its own embedded NATS and PostgreSQL in a temporary folder,
removed afterwards, and a ``Stack`` on them."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mdq.embedded import start_nats, start_postgres
from mdq.stack import Stack


@dataclass(frozen=True, slots=True)
class Servers:
    root: Path
    nats_url: str
    database_url: str


@asynccontextmanager
async def servers(prefix: str) -> AsyncIterator[Servers]:
    """NATS and PostgreSQL in a new folder named from ``prefix``; both stopped and the folder
    removed afterwards."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    nats = start_nats(root / "nats")
    postgres = start_postgres(root / "pg", keep=False)
    try:
        yield Servers(root, nats.url, postgres.url)
    finally:
        nats.stop()
        postgres.stop()
        shutil.rmtree(root, ignore_errors=True)


def stack_on(servers: Servers, namespace: str, **options: Any) -> Stack:
    """A stack on ``servers`` in their folder, /metrics on a free port; ``options`` are
    ``Stack``'s own. ``async with`` starts and stops it."""
    return Stack(
        state_dir=servers.root / "state",
        namespace=namespace,
        nats_url=servers.nats_url,
        database_url=servers.database_url,
        metrics_port=0,
        **options,
    )
