"""What the end-to-end tests share: a stack on the session's servers, and waiting for a job's
state to reach PostgreSQL."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import asyncpg

from mdq.stack import Stack
from tests.helpers import wait_for


def session_stack(
    nats_url: str,
    database_url: str,
    namespace: str,
    tmp_path: Path,
    *,
    extra_env: dict[str, str] | None = None,
    **options: Any,
) -> Stack:
    """A stack of local nodes (two unless ``local_nodes`` says otherwise) on the session's NATS
    and PostgreSQL, in ``tmp_path / "state"``, with /metrics on a free port and 15 s for its
    parts to stop; ``options`` are ``Stack``'s own."""
    options.setdefault("local_nodes", 2)
    return Stack(
        state_dir=tmp_path / "state",
        namespace=namespace,
        nats_url=nats_url,
        database_url=database_url,
        metrics_port=0,
        extra_env=extra_env,
        grace_s=15.0,
        **options,
    )


async def wait_for_state(
    db: asyncpg.Connection, job_id: str, state: str, *, timeout: float, what: str
) -> None:
    """Until the projection's row of ``job_id`` is in ``state``; fails as ``wait_for`` does."""

    async def projected() -> bool:
        return bool(await db.fetchval("SELECT state FROM jobs WHERE job_id = $1", job_id) == state)

    await wait_for(projected, timeout=timeout, what=what)
