"""A connection that goes silent is given up and replaced: NATS's from both ends, PostgreSQL's.

A server's host that vanishes without closing anything (a crashed node, a pod moved to another
address, a dropped NAT entry) leaves every client waiting on a connection nothing comes through;
nats-py's defaults would notice after about six minutes, nats-server's after four. A silent
network is played by a proxy that stops passing bytes on the connections it holds while
accepting new ones (docs/architecture.md, "A connection that goes silent").
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
from sqlalchemy import text

from mdq.bus.connect import SilenceSettings, connect
from mdq.embedded import (
    SERVER_PING_INTERVAL_S,
    SERVER_PING_MAX,
    end_process,
    free_port,
    nats_config,
    nats_server_binary,
    start_nats,
)
from mdq.store.engine import create_engine

REPO = Path(__file__).resolve().parents[2]


Upstream = Callable[[], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]
"""Opens one connection to the proxied server."""


def tcp_upstream(port: int) -> Upstream:
    return lambda: asyncio.open_connection("127.0.0.1", port)


class SilencingProxy:
    """A TCP proxy on 127.0.0.1 to a server (``upstream``) that can go silent: ``silence()``
    stops it passing bytes, either way, on every connection it holds then, without closing
    any; connections made afterwards pass as before."""

    def __init__(self, upstream: Upstream) -> None:
        self.upstream = upstream
        self.listen_port = 0
        self._open: list[asyncio.Event] = []
        self._server: asyncio.Server | None = None
        self._pumps: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> SilencingProxy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.listen_port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *_: object) -> None:
        if self._server is not None:
            self._server.close()
        for pump in list(self._pumps):
            pump.cancel()
        await asyncio.gather(*self._pumps, return_exceptions=True)

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.listen_port}"

    def silence(self) -> None:
        for passing in self._open:
            passing.clear()
        self._open = []

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream_reader, upstream_writer = await self.upstream()
        passing = asyncio.Event()
        passing.set()
        self._open.append(passing)
        for source, target in ((reader, upstream_writer), (upstream_reader, writer)):
            pump = asyncio.create_task(self._pump(source, target, passing))
            self._pumps.add(pump)
            pump.add_done_callback(self._pumps.discard)

    @staticmethod
    async def _pump(
        source: asyncio.StreamReader, target: asyncio.StreamWriter, passing: asyncio.Event
    ) -> None:
        try:
            while data := await source.read(65536):
                await passing.wait()  # silent: held here for good, the sockets left open
                target.write(data)
                await target.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            target.close()


@pytest.fixture
def open_server(tmp_path: Path) -> Iterator[int]:
    """A NATS server of the embedded default's configuration, without auth: its port."""
    server = start_nats(tmp_path / "nats")
    try:
        yield server.port
    finally:
        server.stop()


@pytest.fixture
async def proxy(open_server: int) -> AsyncIterator[SilencingProxy]:
    async with SilencingProxy(tcp_upstream(open_server)) as running:
        yield running


async def test_a_client_gives_up_a_silent_connection_and_reconnects(
    proxy: SilencingProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MDQ_NATS_PING_INTERVAL_S", "0.5")
    client = await connect(proxy.url, name="silenced")
    try:
        await client.request("$JS.API.INFO", b"", timeout=2)
        proxy.silence()
        with pytest.raises(TimeoutError):  # nothing passes any more
            await client.request("$JS.API.INFO", b"", timeout=0.5)
        # 0.5 s between pings, the third unanswered one gives up: about 1.5 s, far below
        # nats-py's six minutes
        deadline = time.monotonic() + 10
        while client.stats["reconnects"] == 0:
            assert time.monotonic() < deadline, "the silent connection was never given up"
            await asyncio.sleep(0.1)
        answer = await client.request("$JS.API.INFO", b"", timeout=5)
        assert b'"type":"io.nats.jetstream.api.v1.account_info_response"' in answer.data
    finally:
        await client.close()


def test_the_client_settings_ping_within_a_minute_by_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("MDQ_NATS_PING_INTERVAL_S", raising=False)
    monkeypatch.delenv("MDQ_NATS_MAX_OUTSTANDING_PINGS", raising=False)
    settings = SilenceSettings()
    assert settings.ping_interval_s * (settings.max_outstanding_pings + 1) <= 60


def _read_until_closed(sock: socket.socket, limit_s: float) -> bytes:
    """Everything the server sends until it closes the connection, never answering it."""
    sock.settimeout(limit_s)
    received = b""
    with contextlib.suppress(TimeoutError):
        while chunk := sock.recv(4096):
            received += chunk
    return received


def test_the_server_drops_a_client_that_stops_answering(tmp_path: Path) -> None:
    port = free_port()
    store = tmp_path / "nats"
    store.mkdir()
    config = store / "nats.conf"
    config.write_text(nats_config(port=port, store_dir=store, ping_interval_s=0.5))
    server = subprocess.Popen(
        [nats_server_binary(), "-c", str(config), "-l", str(store / "nats.log")],
        stdin=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                sock = socket.create_connection(("127.0.0.1", port), timeout=1)
                break
            except OSError:
                assert time.monotonic() < deadline, "nats-server did not start"
                time.sleep(0.05)
        with sock:
            assert sock.recv(4096).startswith(b"INFO ")
            # a queue subscriber, then silence: it answers none of the server's pings
            sock.sendall(b'CONNECT {"verbose":false,"pedantic":false}\r\nSUB work q 1\r\nPING\r\n')
            started = time.monotonic()
            received = _read_until_closed(sock, limit_s=15)
            waited = time.monotonic() - started
        assert b"Stale Connection" in received, received
        assert waited < 10, f"the server waited {waited:.1f} s on a silent client"
    finally:
        end_process(server, timeout=10)


@pytest.mark.parametrize(
    "path", ["deploy/base/nats.conf", "deploy/overlays/production/nats.conf"], ids=str
)
def test_the_deployed_servers_ping_as_the_embedded_one(path: str) -> None:
    lines = {line.strip() for line in (REPO / path).read_text().splitlines()}
    assert f'ping_interval: "{SERVER_PING_INTERVAL_S:.0f}s"' in lines
    assert f"ping_max: {SERVER_PING_MAX}" in lines


def test_the_embedded_server_pings_its_clients(tmp_path: Path) -> None:
    text = nats_config(port=4222, store_dir=tmp_path)
    assert f'ping_interval: "{round(SERVER_PING_INTERVAL_S * 1000)}ms"' in text.splitlines()
    assert f"ping_max: {SERVER_PING_MAX}" in text.splitlines()


def database_upstream(url: str) -> Upstream:
    """How to reach the server of a PostgreSQL ``url``: its unix socket, or host and port."""
    split = urlsplit(url)
    socket_folder = parse_qs(split.query).get("host", [""])[0]
    port = split.port or 5432
    if socket_folder:
        path = f"{socket_folder}/.s.PGSQL.{port}"
        return lambda: asyncio.open_unix_connection(path)
    host = split.hostname or "127.0.0.1"
    return lambda: asyncio.open_connection(host, port)


async def test_a_silent_database_connection_is_given_up_and_replaced(database_url: str) -> None:
    split = urlsplit(database_url)
    credentials = split.netloc.rsplit("@", 1)[0] + "@" if "@" in split.netloc else ""
    async with SilencingProxy(database_upstream(database_url)) as proxy:
        through = f"postgresql://{credentials}127.0.0.1:{proxy.listen_port}{split.path}"
        engine = create_engine(through, pool_size=1, command_timeout_s=1.0)
        try:
            async with engine.connect() as connection:
                assert (await connection.execute(text("select 1"))).scalar() == 1
            proxy.silence()  # the pool's one connection now hears nothing
            started = time.monotonic()
            with pytest.raises(TimeoutError):  # asyncpg's, or this bound's if it never came
                async with asyncio.timeout(20), engine.connect() as connection:
                    await connection.execute(text("select 2"))
            assert time.monotonic() - started < 10, "the silent connection held on"
            async with asyncio.timeout(30), engine.connect() as connection:  # a new one
                assert (await connection.execute(text("select 3"))).scalar() == 3
        finally:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(5):
                    await engine.dispose()
