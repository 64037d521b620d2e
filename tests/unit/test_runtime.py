"""A service process under ``mdq.bus.runtime``: SIGTERM stops it cleanly (exit 0, its cleanup
run), also when the first cancel is lost; a crash still exits non-zero. Its parts run side by
side until one ends; its periodic loops outlive a failed run; its stops run the last first."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import nats.errors
import pytest

from mdq.bus.runtime import PartEnded, Service, every, run_parts
from mdq.settings import CommonSettings

SERVICE = """
import asyncio, sys
from pathlib import Path
from mdq.bus.runtime import run_service

marker = Path(sys.argv[1])
how = sys.argv[2]

async def main() -> None:
    marker.write_text("started")
    try:
        if how == "loses-first-cancel":
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                pass  # what Python 3.11's wait_for does to a cancel that meets an answer
            await asyncio.sleep(3600)
        elif how == "crashes":
            raise RuntimeError("boom")
        else:
            await asyncio.sleep(3600)
    finally:
        marker.write_text("cleaned up")

run_service(main)
"""

CASES = {
    "a stop": ("serves", signal.SIGTERM, 0, "cleaned up"),
    "an interrupt": ("serves", signal.SIGINT, 0, "cleaned up"),
    "a stop whose first cancel is lost": ("loses-first-cancel", signal.SIGTERM, 0, "cleaned up"),
    "a crash": ("crashes", None, 1, "cleaned up"),
}


@pytest.mark.parametrize(("how", "sig", "code", "marker_says"), CASES.values(), ids=CASES.keys())
def test_run_service(
    tmp_path: Path, how: str, sig: signal.Signals | None, code: int, marker_says: str
) -> None:
    marker = tmp_path / "marker"
    process = subprocess.Popen(
        [sys.executable, "-c", SERVICE, str(marker), how],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 30
    while not marker.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    if sig is not None:
        process.send_signal(sig)
    output, _ = process.communicate(timeout=20)
    assert process.returncode == code, output.decode()
    assert marker.read_text() == marker_says


# -- the parts of a service ------------------------------------------------------------------


async def forever() -> None:
    await asyncio.Future()


class Forever:
    """A part that runs until cancelled, and says whether it was."""

    def __init__(self) -> None:
        self.cancelled = False

    async def __call__(self) -> None:
        try:
            await asyncio.Future()
        except asyncio.CancelledError:
            self.cancelled = True
            raise


async def fails() -> None:
    await asyncio.sleep(0.01)
    raise ValueError("a part failed")


async def returns() -> None:
    await asyncio.sleep(0.01)


ENDINGS = {
    "a part that fails ends them all with its error": (fails, ValueError, "a part failed"),
    "a part that returns ends them all": (returns, PartEnded, "second ended"),
}


@pytest.mark.parametrize(("second", "raised", "says"), ENDINGS.values(), ids=ENDINGS.keys())
async def test_parts_run_until_one_ends(
    second: Callable[[], Coroutine[Any, Any, None]], raised: type[Exception], says: str
) -> None:
    first = Forever()
    with pytest.raises(raised, match=says):
        await run_parts({"first": first(), "second": second()})
    assert first.cancelled, "the other part ran on"


async def test_a_cancel_stops_every_part() -> None:
    parts = [Forever() for _ in range(3)]
    running = asyncio.create_task(run_parts({str(i): part() for i, part in enumerate(parts)}))
    await asyncio.sleep(0.01)
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    assert all(part.cancelled for part in parts)


FAILED_RUNS = {
    "a bug: its traceback is logged": (RuntimeError("the second run failed"), True),
    "NATS away: one line, no traceback": (nats.errors.TimeoutError(), False),
    "a lost connection: one line, no traceback": (ConnectionResetError("reset by peer"), False),
}


@pytest.mark.parametrize(("error", "traceback"), FAILED_RUNS.values(), ids=FAILED_RUNS)
async def test_a_periodic_loop_goes_on_after_a_failed_run(
    caplog: pytest.LogCaptureFixture, error: Exception, traceback: bool
) -> None:
    runs: list[int] = []

    async def tick() -> None:
        runs.append(len(runs))
        if len(runs) == 2:
            raise error

    looping = asyncio.create_task(every(0.01, tick, what="the test's loop"))
    while len(runs) < 4:  # noqa: ASYNC110 - a loop of the test's own, no event to wait on
        await asyncio.sleep(0.01)
    looping.cancel()
    with pytest.raises(asyncio.CancelledError):
        await looping
    [failure] = [record for record in caplog.records if "the test's loop failed" in record.message]
    assert type(error).__name__ in failure.getMessage() + (failure.exc_text or "")
    assert (failure.exc_info is not None) is traceback


async def test_a_service_stops_its_parts_then_the_last_registered_first() -> None:
    service = Service("test", common=CommonSettings())
    said: list[str] = []
    service.part("serving", forever)

    async def stop(what: str) -> None:
        said.append(what)
        if what == "second":
            raise RuntimeError("stopping the second failed")

    service.on_stop(lambda: stop("first"))
    service.on_stop(lambda: stop("second"))
    service.part("failing", fails)
    with pytest.raises(ValueError, match="a part failed"):
        await service.run()
    assert said == ["second", "first"], "every stop runs, the last registered first"


def test_a_service_has_one_part_of_each_name() -> None:
    service = Service("test", common=CommonSettings())
    service.part("serving", forever)
    with pytest.raises(ValueError, match="serving"):
        service.part("serving", forever)
