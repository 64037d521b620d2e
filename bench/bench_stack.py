"""The whole stack for a benchmark: its own embedded NATS and PostgreSQL in a temporary folder,
removed afterwards, and a ``Stack`` on them; and how such a bench fails (``BenchFailed``)."""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mdq.embedded import start_nats, start_postgres
from mdq.stack import Stack


class BenchFailed(RuntimeError):
    """The bench could not measure what it promises (the run exits 1 with the reason)."""


@contextmanager
def failing_as(bench: str, *also: type[Exception]) -> Iterator[None]:
    """Run the block; a ``BenchFailed`` (or one of ``also``) in it is printed on stderr as
    ``bench-<bench> FAILED: <reason>`` and the process exits 1."""
    caught: tuple[type[Exception], ...] = (BenchFailed, *also)
    try:
        yield
    except caught as failure:
        print(f"bench-{bench} FAILED: {failure}", file=sys.stderr, flush=True)
        sys.exit(1)


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
