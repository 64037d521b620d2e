"""The embedded NATS server runs JetStream with fsync before every acknowledgement.

``mdq.embedded.start_nats`` (``make run``, ``mdq up``, the tests) is started as it is by
default, with only its HTTP monitoring endpoint turned on, and the running server is asked
(``/jsz?config=1``) whether it syncs always. The server-default interval, which benches use
side by side, answers differently: the check can tell the two apart.
"""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from mdq.embedded import SYNC_ALWAYS, SYNC_SERVER_DEFAULT, free_port, nats_config, start_nats


def jetstream_config(monitor_port: int) -> dict[str, Any]:
    """The JetStream configuration the running server reports."""
    url = f"http://127.0.0.1:{monitor_port}/jsz?config=1"
    deadline = time.monotonic() + 20
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                config: dict[str, Any] = json.load(response)["config"]
                return config
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def test_the_embedded_server_syncs_every_write(tmp_path: Path) -> None:
    monitor = free_port()
    server = start_nats(tmp_path / "nats", monitor_port=monitor)
    try:
        config = jetstream_config(monitor)
    finally:
        server.stop()
    assert config["sync_always"] is True
    assert Path(config["store_dir"]).is_relative_to(tmp_path / "nats")


def test_the_server_default_is_told_apart(tmp_path: Path) -> None:
    monitor = free_port()
    server = start_nats(tmp_path / "nats", monitor_port=monitor, sync_interval=SYNC_SERVER_DEFAULT)
    try:
        config = jetstream_config(monitor)
    finally:
        server.stop()
    assert not config.get("sync_always", False)


@pytest.mark.parametrize("monitor_port", [None, 8222])
def test_the_monitor_port_changes_nothing_else(monitor_port: int | None) -> None:
    """What the first test checks is the configuration every embedded server gets."""
    plain = nats_config(port=4300, store_dir=Path("/s")).splitlines()
    with_monitor = nats_config(port=4300, store_dir=Path("/s"), monitor_port=monitor_port)
    extra = [line for line in with_monitor.splitlines() if line not in plain]
    assert extra == ([] if monitor_port is None else [f'http: "127.0.0.1:{monitor_port}"'])
    assert f"  sync_interval: {SYNC_ALWAYS}" in plain
