"""Whether an embedded server answers at all, asked without logging in: a server that is
stopped or deadlocked still has its connections accepted by the kernel, and then says nothing.
The stack's supervision restarts one that says nothing for long (docs/architecture.md, "On one
machine: the stack")."""

from __future__ import annotations

import asyncio
import struct
from pathlib import Path

SSL_REQUEST = struct.pack("!ii", 8, 80877103)
"""PostgreSQL's SSLRequest: answered with one byte, ``S`` or ``N``, before any login."""


async def nats_answers(port: int, *, limit_s: float, host: str = "127.0.0.1") -> bool:
    """True when nats-server greets a new connection with its ``INFO`` line within
    ``limit_s``."""
    try:
        async with asyncio.timeout(limit_s):
            reader, writer = await asyncio.open_connection(host, port)
            try:
                return (await reader.readline()).startswith(b"INFO ")
            finally:
                writer.close()
    except (OSError, TimeoutError):
        return False


async def postgres_answers(socket: Path, *, limit_s: float) -> bool:
    """True when the PostgreSQL listening on the unix ``socket`` answers an SSLRequest within
    ``limit_s`` (the postmaster starts a backend for the connection, which answers it)."""
    try:
        async with asyncio.timeout(limit_s):
            reader, writer = await asyncio.open_unix_connection(str(socket))
            try:
                writer.write(SSL_REQUEST)
                await writer.drain()
                return await reader.read(1) in (b"S", b"N")
            finally:
                writer.close()
    except (OSError, TimeoutError):
        return False
