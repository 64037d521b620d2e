"""A service process made the one way every mdq service is (``mdq.bus.runtime.serve``), run on
a real NATS server: SIGTERM stops it after its parts, with its stops run while its connection
is still up; a part that ends ends the process non-zero; its liveness file is renewed while
its loop runs, also while it waits for a server, and goes stale when the loop is stuck."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from mdq.health import age_problem

SERVICE = """
import asyncio, sys, time
from pathlib import Path
from mdq.bus.runtime import Service, serve

marker = Path(sys.argv[1])
how = sys.argv[2]

async def compose(service: Service) -> None:
    marker.write_text("composing")
    nc = await service.connect()

    async def stopping() -> None:
        marker.write_text(f"stopped, connected: {nc.is_connected}")

    async def serving() -> None:
        marker.write_text("serving")
        if how == "stuck":
            await asyncio.sleep(0.5)
            time.sleep(3600)  # a call that blocks the loop
        elif how == "ends":
            await asyncio.sleep(0.2)
            return
        await asyncio.Future()

    service.on_stop(stopping)
    service.part("serving", serving)

serve("probe", compose)
"""


@contextmanager
def service_process(
    tmp_path: Path, how: str, nats_url: str, namespace: str
) -> Iterator[tuple[subprocess.Popen[str], Path, Path]]:
    marker, alive = tmp_path / "marker", tmp_path / "alive"
    env = {
        **os.environ,
        "NATS_URL": nats_url,
        "MDQ_NAMESPACE": namespace,
        "MDQ_HEALTH_FILE": str(alive),
    }
    env.pop("MDQ_NATS_CREDS", None)
    process = subprocess.Popen(
        [sys.executable, "-c", SERVICE, str(marker), how],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        yield process, marker, alive
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate(timeout=20)


def wait_until(condition: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def says(marker: Path, text: str) -> bool:
    return marker.exists() and marker.read_text() == text


def test_a_stop_runs_the_stops_before_the_connection_closes(
    tmp_path: Path, nats_url: str, namespace: str
) -> None:
    with service_process(tmp_path, "serves", nats_url, namespace) as (process, marker, alive):
        wait_until(lambda: says(marker, "serving"), "the service to serve")
        assert age_problem(alive, 10.0) == ""
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=20)
        assert process.returncode == 0, output
        assert marker.read_text() == "stopped, connected: True"


def test_a_part_that_ends_ends_the_service_non_zero(
    tmp_path: Path, nats_url: str, namespace: str
) -> None:
    with service_process(tmp_path, "ends", nats_url, namespace) as (process, marker, _):
        output, _ = process.communicate(timeout=30)
        assert process.returncode != 0, output
        assert "serving ended" in output
        assert marker.read_text() == "stopped, connected: True"


def test_a_stuck_loop_lets_its_liveness_file_go_stale(
    tmp_path: Path, nats_url: str, namespace: str
) -> None:
    with service_process(tmp_path, "stuck", nats_url, namespace) as (process, marker, alive):
        wait_until(lambda: says(marker, "serving"), "the service to serve")
        wait_until(lambda: age_problem(alive, 2.0) != "", "the file to go stale", timeout=20)
        assert process.poll() is None, "the stuck service should still be there"
        probe = subprocess.run(
            [sys.executable, "-m", "mdq.health", str(alive), "2"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert probe.returncode == 1, probe.stderr
        assert "last renewed" in probe.stderr


def test_waiting_for_a_server_is_no_fault_and_stops_cleanly(tmp_path: Path, namespace: str) -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        nowhere = f"nats://127.0.0.1:{unused.getsockname()[1]}"
    with service_process(tmp_path, "serves", nowhere, namespace) as (process, marker, alive):
        wait_until(lambda: says(marker, "composing"), "the service to start")
        wait_until(alive.exists, "the liveness file")
        first = alive.stat().st_mtime
        wait_until(lambda: alive.stat().st_mtime > first, "the file to be renewed", timeout=20)
        assert says(marker, "composing"), "no server, yet it composed"
        assert process.poll() is None
        process.send_signal(signal.SIGTERM)  # a stop while it waits is a clean stop
        output, _ = process.communicate(timeout=20)
        assert process.returncode == 0, output
