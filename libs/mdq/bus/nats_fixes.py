"""Two fixes to nats-py that every NATS connection of mdq's processes needs, applied once on
import of ``mdq.bus``.

**A PONG for an abandoned flush.**
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

**Every consumer made by name.** nats-py makes a consumer that has neither a name nor a durable
name (an ordered consumer, an ephemeral pull) with JetStream's nameless request,
``$JS.API.CONSUMER.CREATE.<stream>``, which carries the consumer's name, if any, in its body:
a client allowed that request can name a service's durable consumer there and change it, and no
subject permission can tell. ``add_consumer`` here gives such a consumer a fresh name of its own
(as nats.js v3 and nats.go's ``jetstream`` package do), so nats-py uses the named request,
``$JS.API.CONSUMER.CREATE.<stream>.<name>[.<filter>]``, whose subject the server's permissions
see; the operator's client is refused the nameless one (docs/security.md, "Consumers of its
own").
"""

from __future__ import annotations

import secrets
from typing import Any

from nats.aio.client import Client
from nats.js import api
from nats.js.manager import JetStreamManager

_original_process_pong = Client._process_pong


async def _process_pong(self: Client) -> None:
    pongs = self._pongs
    if pongs and pongs[0].done():  # the answer to a flush that stopped waiting
        pongs.pop(0)
        self._pongs_received += 1
        self._pings_outstanding = 0
        return
    await _original_process_pong(self)


_original_add_consumer = JetStreamManager.add_consumer


def consumer_name() -> str:
    """A fresh consumer name: 22 random letters and digits, as nats.js names its own."""
    return secrets.token_urlsafe(16).replace("-", "0").replace("_", "1")


async def _add_consumer(
    self: JetStreamManager,
    stream: str,
    config: api.ConsumerConfig | None = None,
    timeout: float | None = None,  # noqa: ASYNC109 (nats-py's own signature)
    **params: Any,
) -> api.ConsumerInfo:
    config = (config or api.ConsumerConfig()).evolve(**params)
    if not config.name and not config.durable_name:
        config = config.evolve(name=consumer_name())
    return await _original_add_consumer(self, stream, config, timeout)


def apply() -> None:
    """Install the fixes (idempotent)."""
    Client._process_pong = _process_pong  # type: ignore[method-assign]
    JetStreamManager.add_consumer = _add_consumer  # type: ignore[method-assign]


apply()
