"""What the end-to-end tests share: a stack on the session's servers or with a NATS of its own,
the operator's SDK client of a stack, waiting for a job's state to reach PostgreSQL, and
reading its attempts' rows there."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from mdq.sdk.client import MdqClient
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


def own_stack(
    tmp_path: Path, database_url: str, monkeypatch: pytest.MonkeyPatch, **options: Any
) -> Stack:
    """A stack with its embedded NATS (which authenticates every connection; none of the
    caller's NATS settings left in the environment) on the session's PostgreSQL: one local node
    unless ``local_nodes`` says otherwise, in ``tmp_path / "state"``, with /metrics on a free
    port and 15 s for its parts to stop unless ``grace_s`` says otherwise; ``options`` are
    ``Stack``'s own."""
    monkeypatch.delenv("NATS_URL", raising=False)
    monkeypatch.delenv("MDQ_NATS_CREDS", raising=False)
    options.setdefault("local_nodes", 1)
    options.setdefault("grace_s", 15.0)
    return Stack(state_dir=tmp_path / "state", database_url=database_url, metrics_port=0, **options)


async def operator_client(stack: Stack) -> MdqClient:
    """The SDK on a started ``stack``'s NATS, with the stack's own (the operator's)
    credentials."""
    return await MdqClient.connect(
        stack.info.nats_url, stack.namespace, creds=stack.info.nats_creds
    )


async def attempt_rows(
    database_url: str, job_ids: Iterable[str], columns: str
) -> dict[tuple[str, int], asyncpg.Record]:
    """The ``columns`` of every attempt of ``job_ids`` in PostgreSQL, by job id and attempt."""
    db = await asyncpg.connect(database_url)
    try:
        rows = await db.fetch(
            f"SELECT job_id, attempt, {columns} FROM attempts WHERE job_id = ANY($1::text[])",
            list(job_ids),
        )
    finally:
        await db.close()
    return {(row["job_id"], row["attempt"]): row for row in rows}


async def wait_for_state(
    db: asyncpg.Connection, job_id: str, state: str, *, timeout: float, what: str
) -> None:
    """Until the projection's row of ``job_id`` is in ``state``; fails as ``wait_for`` does."""

    async def projected() -> bool:
        return bool(await db.fetchval("SELECT state FROM jobs WHERE job_id = $1", job_id) == state)

    await wait_for(projected, timeout=timeout, what=what)
