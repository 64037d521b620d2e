"""A fix to nats-py that every NATS connection of mdq's processes needs, applied once on import
of ``mdq.bus``.

nats-py (2.16 and before) answers each PONG from the server by taking the oldest waiting
``flush()`` future and setting its result. A flush that gave up waiting (its timeout passed, or
the task awaiting it was cancelled) leaves its cancelled future in that line, so the PONG that
answers its PING raises ``InvalidStateError`` inside the connection's read loop: the read loop
ends, and the connection hears nothing more, while nats-py still calls it connected. A server
that stalled for a few seconds (a full disk, a SIGSTOP, a long GC) was enough: afterwards a
service's consumers went silent and its ``drain()`` waited out its whole timeout.

``_process_pong`` here gives such a PONG to the abandoned flush it answers and sets nothing,
keeping one PONG per PING. It replaces the method on nats-py's ``Client`` class, so FastStream's
connections (which nats-py makes) get it too.
"""

from __future__ import annotations

from nats.aio.client import Client

_original_process_pong = Client._process_pong


async def _process_pong(self: Client) -> None:
    pongs = self._pongs
    if pongs and pongs[0].done():  # the answer to a flush that stopped waiting
        pongs.pop(0)
        self._pongs_received += 1
        self._pings_outstanding = 0
        return
    await _original_process_pong(self)


def apply() -> None:
    """Install the fix (idempotent)."""
    Client._process_pong = _process_pong  # type: ignore[method-assign]


apply()
