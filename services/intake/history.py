"""Intake's view of the measured usage the resource recommender learns from.

Intake keeps no database of its own; with ``MDQ_INTAKE_HISTORY_DATABASE_URL`` (a read-only role,
the CLI's reader) it reads ``mdq.store.queries.usage_history`` every
``MDQ_INTAKE_HISTORY_REFRESH_S`` and recommends from the last copy it read, so a slow or absent
database never holds a submit up: without one (or before the first read) every recommendation
is the physical estimate. The copy is bounded (``kinds`` kinds of job, the newest attempts of
each, ``days`` days).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from mdq.core.recommend import UsageHistory
from mdq.store.engine import create_engine
from mdq.store.queries import usage_history

log = logging.getLogger(__name__)


class HistoryReader:
    """The latest measured usage read from PostgreSQL (empty until read, or without a URL)."""

    def __init__(self, *, database_url: str, refresh_s: float, days: int, kinds: int) -> None:
        self._url = database_url
        self._refresh_s = refresh_s
        self._days = days
        self._kinds = kinds
        self._history = UsageHistory([])
        self._task: asyncio.Task[None] | None = None

    def history(self) -> UsageHistory:
        return self._history

    async def refresh(self) -> None:
        """Read the history once (an error keeps the copy read before, and is logged)."""
        engine = create_engine(self._url, pool_size=1)
        try:
            self._history = await usage_history(engine, days=self._days, kinds=self._kinds)
        except Exception as error:
            log.warning("usage history not read (recommending from the last copy): %r", error)
        finally:
            await engine.dispose()

    def start(self) -> None:
        """Keep the copy fresh in the background (nothing to do without a URL)."""
        if self._url and self._task is None:
            self._task = asyncio.create_task(self._keep_fresh(), name="usage-history")

    async def _keep_fresh(self) -> None:
        while True:
            await self.refresh()
            await asyncio.sleep(self._refresh_s)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
