"""Background tasks of test doubles and test helpers whose failures are never lost.

A task a fake server or a test starts beside its main line (a heartbeat, a watch, a process's
supervisor) fails silently when nothing awaits it: asyncio prints "Task exception was never
retrieved" at garbage collection, if ever, and the test passes. ``Background`` keeps each such
task, logs a failure when it happens, and raises every failure (an ``ExceptionGroup``) from
``check`` and ``close``; a task that was cancelled is not a failure.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from types import TracebackType
from typing import Any, Self, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


class BackgroundFailed(ExceptionGroup[Exception]):
    """One or more background tasks of an owner raised."""


class Background:
    """The background tasks of one owner (``"kubelet node-1"``). An async context manager:
    leaving it cancels what still runs and raises what failed."""

    def __init__(self, owner: str) -> None:
        self.owner = owner
        self._tasks: set[asyncio.Task[Any]] = set()
        self._failures: list[tuple[str, Exception]] = []

    def spawn(self, coro: Coroutine[Any, Any, T], *, name: str) -> asyncio.Task[T]:
        """Start ``coro`` as a task named ``name``, kept until it ends."""
        task = asyncio.create_task(coro, name=f"{self.owner}: {name}")
        self._tasks.add(task)
        task.add_done_callback(self._ended)
        return task

    def _ended(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        error = task.exception()
        if isinstance(error, Exception):
            log.error("%s failed", task.get_name(), exc_info=error)
            self._failures.append((task.get_name(), error))

    def fail(self, what: str, error: Exception) -> None:
        """Keep a failure that happened outside a task (a request handler of a fake server)."""
        log.error("%s: %s failed", self.owner, what, exc_info=error)
        self._failures.append((f"{self.owner}: {what}", error))

    @property
    def running(self) -> int:
        """How many tasks still run."""
        return len(self._tasks)

    @property
    def failures(self) -> list[tuple[str, Exception]]:
        """(task name, exception) of every task that raised, in the order they ended."""
        return list(self._failures)

    def check(self) -> None:
        """Raise ``BackgroundFailed`` holding every failure so far (and forget them)."""
        if not self._failures:
            return
        failures, self._failures = self._failures, []
        names = ", ".join(name for name, _ in failures)
        raise BackgroundFailed(
            f"{self.owner}: {len(failures)} background task(s) failed ({names})",
            [error for _, error in failures],
        )

    async def cancel(self, *tasks: asyncio.Task[Any]) -> None:
        """Cancel ``tasks`` and wait until they have ended (a failure is kept for ``check``)."""
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)

    async def close(self) -> None:
        """Cancel every task still running, wait for them all, then ``check``."""
        while self._tasks:
            await self.cancel(*self._tasks)
        self.check()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if exc is None:
            await self.close()
            return
        try:
            await self.close()
        except BackgroundFailed as failed:
            if not isinstance(exc, Exception):
                raise failed from exc
            # The body's own error is raised together with the tasks' failures.
            raise BackgroundFailed(failed.message, [exc, *failed.exceptions]) from exc
