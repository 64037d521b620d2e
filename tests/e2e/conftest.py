"""Fixtures of the end-to-end tests: the whole stack on the session's NATS and PostgreSQL."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from mdq.stack import Stack
from tests.e2e.stacks import session_stack


@pytest.fixture
async def stack(
    nats_url: str, database_url: str, namespace: str, tmp_path: Path
) -> AsyncIterator[Stack]:
    """Every service, two local nodes, recovery's backoff and the metrics' sampling and
    summaries shortened for tests (files with needs of their own define ``stack``
    themselves)."""
    env = {
        "MDQ_RECOVERY_BACKOFF_BASE_S": "1",
        "MDQ_METRICS_INTERVAL_S": "1",
        "MDQ_METRICS_SUMMARY_INTERVAL_S": "10",
    }
    async with session_stack(
        nats_url, database_url, namespace, tmp_path, extra_env=env
    ) as the_stack:
        yield the_stack
