"""How a service process runs, the same way for every mdq service: ``serve(name, compose)`` is
its entrypoint, ``Service`` what it composes (connections under its own identity, parts side by
side, stops), ``run_service`` its stop on SIGTERM/SIGINT, ``configure_logging`` its log within a
budget. Design: docs/architecture.md, "One service runtime" and "Logs a flood cannot fill".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any

from nats.aio.client import Client

from mdq.bus.connect import connect
from mdq.bus.log import raise_if_cancelling
from mdq.bus.outage import warn_try_failed
from mdq.bus.subjects import Subjects
from mdq.core.line_budget import LineBudget
from mdq.health import renewed_while
from mdq.memory import keep_state_out_of_gc
from mdq.settings import CommonSettings

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
    it; returns normally after a stop by signal (the process exits 0). Any other end (an
    exception, a cancel that no signal asked for) propagates: a crash exits non-zero.

    On Python 3.11 a cancel can be lost: ``asyncio.wait_for`` (which nats-py runs every
    request under) hands back an answer that lands together with the cancel and drops the
    cancel. A stop still running after ``SLOW_STOP_S`` logs where it waits and is cancelled
    again, every ``SLOW_STOP_S``."""
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


Part = Callable[[], Coroutine[Any, Any, object]]
"""A long-running piece of a service: a coroutine function that runs until the service stops."""


class PartEnded(RuntimeError):
    """A part of a service returned: every part runs until its service is stopped."""


async def run_parts(parts: Mapping[str, Coroutine[Any, Any, object]]) -> None:
    """Run ``parts`` (name → coroutine) side by side until one of them ends, then cancel the
    others and wait for them. The part that ended first decides what is raised: its error, or
    ``PartEnded`` when it returned; a cancel of this call cancels every part."""
    tasks = [asyncio.create_task(coroutine, name=name) for name, coroutine in parts.items()]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        first = next(task for task in tasks if task in done)
        first.result()  # its error, if it failed
        raise PartEnded(f"{first.get_name()} ended")
    finally:
        for task in tasks:
            task.cancel()
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        for task, outcome in zip(tasks, outcomes, strict=True):
            if isinstance(outcome, Exception) and not task.cancelled():
                log.debug("%s ended with %r", task.get_name(), outcome)


async def every(interval_s: float, tick: Part, *, what: str) -> None:
    """Run ``tick()`` now and then ``interval_s`` seconds after each run ended, forever; a run
    that fails is logged (``what`` names it: one line when NATS is away, the traceback for
    anything else, ``warn_try_failed``) and the next one runs as planned."""
    while True:
        try:
            await tick()
        except Exception as error:
            raise_if_cancelling()
            warn_try_failed(log, f"{what} failed; again in {interval_s:g} s", error)
        raise_if_cancelling()  # a cancel that the tick's NATS requests dropped
        await asyncio.sleep(interval_s)


class Service:
    """One mdq service process on the bus, the same way for every service: its settings, its
    connections under its own identity, the parts it runs side by side and its stop
    (docs/architecture.md, "One service runtime"; ``every`` is a part's periodic loop).

    A composition root makes one, connects, adds parts and ``run``s it (``serve`` does all of
    that for a ``python -m services.<name>`` entrypoint). ``run`` ends when a part ends: a part
    that raises ends the service with that error and one that returns with ``PartEnded`` (the
    process exits non-zero and its supervisor, ``mdq up`` or Kubernetes, starts it again); a
    stop by SIGTERM/SIGINT cancels every part. Either way, what was registered with ``on_stop``
    then runs, the last registered first, and the connections are drained last of all.
    """

    def __init__(self, name: str, *, common: CommonSettings | None = None) -> None:
        self.name = name
        self.common = common if common is not None else CommonSettings()
        self.subjects = Subjects(self.common.namespace)
        self._parts: dict[str, Part] = {"gc": keep_state_out_of_gc}
        self._stops: list[Part] = []
        self._connections: list[Client] = []

    async def connect(self) -> Client:
        """A connection under this service's identity (the credentials of ``MDQ_NATS_CREDS``),
        once a server answers and the namespace's streams exist. Drained when the service
        stops, after its parts and ``on_stop`` callbacks."""
        connection = await connect(
            self.common.nats_url,
            name=f"mdq-{self.name}",
            subjects=self.subjects,
            replicas=self.common.stream_replicas,
            wait=True,
        )
        self._connections.append(connection)
        return connection

    def part(self, name: str, run: Part) -> None:
        """Run ``run()`` side by side with the other parts until the service stops; its end
        (return or error) stops the service."""
        if name in self._parts:
            raise ValueError(f"{self.name} has a part named {name!r} already")
        self._parts[name] = run

    def on_stop(self, stop: Part) -> None:
        """Call ``stop()`` when the service stops, after its parts ended (the last registered
        first, each one even when one before it failed)."""
        self._stops.append(stop)

    async def run(self) -> None:
        """Run every part until one ends or this is cancelled, then ``stop``."""
        try:
            await run_parts({name: run() for name, run in self._parts.items()})
        finally:
            await self.stop()

    async def stop(self) -> None:
        """Call the ``on_stop`` callbacks, the last first, then drain the connections."""
        stops, self._stops = self._stops, []
        for stop in reversed(stops):
            try:
                await asyncio.shield(stop())
            except Exception:
                log.exception("%s: stopping failed", self.name)
        connections, self._connections = self._connections, []
        for connection in reversed(connections):
            with contextlib.suppress(Exception):
                await asyncio.shield(connection.drain())


def serve(
    name: str,
    compose: Callable[[Service], Awaitable[object]],
    *,
    level: int | str = logging.INFO,
    fmt: str = SHORT_FORMAT,
) -> None:
    """A service's ``main``: its log, then ``compose`` the service (connect, add parts) and run
    it until SIGTERM/SIGINT stops it (``run_service``). What ``compose`` registered is stopped
    also when composing fails halfway."""
    configure_logging(level, fmt=fmt)

    async def main() -> None:
        service = Service(name)
        # renewed from the start: composing may wait long for a server, which is no fault
        async with renewed_while(service.common.health_file):
            try:
                await compose(service)
            except BaseException:
                await service.stop()
                raise
            await service.run()

    run_service(main)
