"""A NATS connection survives a flush that gave up while its server stalled
(``mdq.bus.nats_fixes``): afterwards it still hears its subscriptions, and drains at once."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import nats.errors
import pytest
from nats.aio.msg import Msg

from mdq.bus.connect import connect
from mdq.embedded import start_nats
from tests.helpers import all_threads_stopped


async def test_a_connection_hears_again_after_a_flush_timed_out_on_a_stalled_server(
    tmp_path: Path,
) -> None:
    server = start_nats(tmp_path / "nats")
    client = await connect(server.url, name="stalled")
    try:
        heard: asyncio.Queue[bytes] = asyncio.Queue()

        async def on_message(message: Msg) -> None:
            await heard.put(message.data)

        await client.subscribe("probe", cb=on_message)
        await client.flush()
        os.kill(server.pid, signal.SIGSTOP)  # alive, but answers nothing
        await all_threads_stopped(server.pid)
        try:
            with pytest.raises(nats.errors.FlushTimeoutError):
                await client.flush(timeout=1)
        finally:
            os.kill(server.pid, signal.SIGCONT)
        # the PONG of the abandoned flush arrives now; the connection must go on reading
        await client.publish("probe", b"after the stall")
        assert await asyncio.wait_for(heard.get(), timeout=10) == b"after the stall"
        await client.flush(timeout=5)
        await asyncio.wait_for(client.drain(), timeout=5)
    finally:
        if not client.is_closed:
            await client.close()
        server.stop()
