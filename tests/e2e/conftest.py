"""Fixtures of the end-to-end tests: the whole stack on the session's NATS and PostgreSQL."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from mdq.stack import Stack


@pytest.fixture
async def stack(
    nats_url: str, database_url: str, namespace: str, tmp_path: Path
) -> AsyncIterator[Stack]:
    """Every service, two local nodes, recovery's backoff and the metrics' sampling and
    summaries shortened for tests (files with needs of their own define ``stack``
    themselves)."""
    the_stack = Stack(
        state_dir=tmp_path / "state",
        namespace=namespace,
        nats_url=nats_url,
        database_url=database_url,
        local_nodes=2,
        metrics_port=0,
        extra_env={
            "MDQ_RECOVERY_BACKOFF_BASE_S": "1",
            "MDQ_METRICS_INTERVAL_S": "1",
            "MDQ_METRICS_SUMMARY_INTERVAL_S": "10",
        },
        grace_s=15.0,
    )
    await the_stack.start()
    try:
        yield the_stack
    finally:
        await the_stack.stop()
