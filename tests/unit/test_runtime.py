"""A service process under ``mdq.bus.runtime.run_service``: SIGTERM stops it cleanly (exit 0,
its cleanup run), also when the first cancel is lost; a crash still exits non-zero."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

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
