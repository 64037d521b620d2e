"""The stack's probes of its embedded servers (``mdq.stack.probes``): a running server answers,
a stopped one (SIGSTOP: its connections still accepted by the kernel) and a missing one do not,
each within the probe's limit."""

from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from pathlib import Path

from mdq.embedded import start_nats, start_postgres
from mdq.stack.probes import nats_answers, postgres_answers
from tests.helpers import all_threads_stopped

LIMIT_S = 1.0


@asynccontextmanager
async def stopped(pid: int) -> AsyncIterator[None]:
    """``pid`` stopped (SIGSTOP, every thread of it) for the block."""
    os.kill(pid, signal.SIGSTOP)
    try:
        await all_threads_stopped(pid)
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


async def timed(probe: Awaitable[bool]) -> tuple[bool, float]:
    """The probe's answer and how long it took."""
    started = time.monotonic()
    answered = await probe
    return answered, time.monotonic() - started


async def test_nats_answers_while_it_runs_and_not_while_stopped_or_gone(tmp_path: Path) -> None:
    server = start_nats(tmp_path / "nats")
    try:
        assert await nats_answers(server.port, limit_s=LIMIT_S)
        async with stopped(server.pid):
            answered, took = await timed(nats_answers(server.port, limit_s=LIMIT_S))
        assert not answered and took < LIMIT_S + 0.5
        assert await nats_answers(server.port, limit_s=LIMIT_S), "answers again once resumed"
    finally:
        server.stop()
    assert not await nats_answers(server.port, limit_s=LIMIT_S)


async def test_a_listener_that_says_nothing_is_no_nats() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        answered, took = await timed(nats_answers(port, limit_s=LIMIT_S))
    assert not answered and took < LIMIT_S + 0.5


async def test_postgres_answers_while_it_runs_and_not_while_stopped_or_gone(
    tmp_path: Path,
) -> None:
    server = start_postgres(tmp_path / "pg", keep=False)
    try:
        pid, socket_path = server.pid, server.socket
        assert pid is not None and socket_path is not None and socket_path.is_socket()
        assert await postgres_answers(socket_path, limit_s=LIMIT_S)
        async with stopped(pid):
            answered, took = await timed(postgres_answers(socket_path, limit_s=LIMIT_S))
        assert not answered and took < LIMIT_S + 0.5
        assert await postgres_answers(socket_path, limit_s=LIMIT_S), "answers again once resumed"
    finally:
        server.stop()
    assert not await postgres_answers(socket_path, limit_s=LIMIT_S)
    assert not await postgres_answers(tmp_path / "no-such-socket", limit_s=LIMIT_S)
