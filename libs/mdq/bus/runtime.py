"""How a service process runs: its main coroutine until it returns or the process is told to
stop, and then a clean exit.

Kubernetes and ``mdq up`` stop a service with SIGTERM (then SIGKILL after a grace period).
``run_service`` turns SIGTERM and SIGINT into a cancel of the service's main coroutine, so its
``finally`` blocks run (drain the NATS connection, close pools and backends) and the process
exits 0. A stop that is not clean (an exception while stopping, a crash) still exits non-zero,
which the stack's supervisor and the tests read as a crash (docs/architecture.md).

On Python 3.11 a cancel can be lost: ``asyncio.wait_for`` (which nats-py runs every request
under) hands back an answer that lands together with the cancel and drops the cancel, so the
service runs on. A stop still running after ``SLOW_STOP_S`` logs where it waits and is
cancelled again, every ``SLOW_STOP_S``.

``configure_logging`` sets up a service's log, each kind of line within a budget
(docs/architecture.md, "Logs a flood cannot fill").
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any

from mdq.core.line_budget import LineBudget

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
SLOW_STOP_S = 1.5
"""After this long stopping, the service logs where it waits, and cancels it again."""

log = logging.getLogger("mdq.runtime")

SHORT_FORMAT = "%(asctime)s %(name)s %(message)s"
LEVEL_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
BUDGET_KEY = "budget_key"
"""A log record's extra field that splits its kind further: intake passes the tenant, so one
tenant's flood of refusals holds back its own lines, not another tenant's."""


class LineBudgetFilter(logging.Filter):
    """Lets through a few lines a second of each kind (logger, message template and the
    record's ``budget_key``: ``mdq.core.line_budget``) and holds back the rest; the next line
    let through says how many of its kind were held back."""

    def __init__(
        self, budget: LineBudget | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__()
        self._budget = budget if budget is not None else LineBudget()
        self._clock = clock
        self._lock = threading.Lock()  # records may come from worker threads too

    def filter(self, record: logging.LogRecord) -> bool:
        template = record.msg if isinstance(record.msg, str) else type(record.msg).__name__
        kind = (record.name, template, getattr(record, BUDGET_KEY, None))
        with self._lock:
            held_back = self._budget.take(kind, self._clock())
        if held_back is None:
            return False
        if held_back and isinstance(record.msg, str):
            record.msg = f"{record.msg} [{held_back} more like this held back]"
        return True


def configure_logging(level: int | str = logging.INFO, *, fmt: str = SHORT_FORMAT) -> None:
    """A service's log: lines to stderr in ``fmt``, each kind of line within its budget
    (``LineBudgetFilter``), so nothing outside the service can fill the log by repeating what
    makes it log (docs/architecture.md, "Logs a flood cannot fill")."""
    logging.basicConfig(level=level.upper() if isinstance(level, str) else level, format=fmt)
    for handler in logging.getLogger().handlers:
        if not any(isinstance(each, LineBudgetFilter) for each in handler.filters):
            handler.addFilter(LineBudgetFilter())


def run_service(main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run ``main()`` in a new event loop until it returns, or until SIGTERM/SIGINT cancels
    it; returns normally after a stop by signal. Any other end (an exception, a cancel that no
    signal asked for) propagates."""
    asyncio.run(_until_signalled(main))


async def _until_signalled(main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    signalled: list[signal.Signals] = []

    def stop(sig: signal.Signals) -> None:
        if not signalled:
            task.cancel(f"stopped by {sig.name}")
            loop.call_later(SLOW_STOP_S, _cancel_again, task)
        signalled.append(sig)

    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, stop, sig)
    try:
        await main()
    except asyncio.CancelledError:
        if not signalled:
            raise
        while task.uncancel():  # every cancel of the stop was answered
            pass
    finally:
        for sig in STOP_SIGNALS:
            loop.remove_signal_handler(sig)


def _cancel_again(main: asyncio.Task[None]) -> None:
    """A stop that takes long: say where the service's main coroutine waits, and cancel it
    again (the first cancel may have been lost), until it ends."""
    if main.done():
        return
    _log_where_it_waits(main)
    main.cancel("stop still running; cancelled again")
    asyncio.get_running_loop().call_later(SLOW_STOP_S, _cancel_again, main)


def _log_where_it_waits(main: asyncio.Task[None]) -> None:
    frames = []
    awaited: Any = main.get_coro()
    while awaited is not None:  # down the chain of awaits to the innermost
        frame = getattr(awaited, "cr_frame", None) or getattr(awaited, "gi_frame", None)
        if frame is not None:
            frames.append(
                f"  {frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}"
            )
        awaited = getattr(awaited, "cr_await", None) or getattr(awaited, "gi_yieldfrom", None)
    log.warning("still stopping after %g s; waiting in:\n%s", SLOW_STOP_S, "\n".join(frames[-4:]))
