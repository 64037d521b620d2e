"""Two fixes to nats-py that every NATS connection of mdq's processes needs, applied once on
import of ``mdq.bus``: a PONG that answers an abandoned ``flush()`` goes to that flush instead
of ending the connection's read loop (``_process_pong``), and every consumer is made by name,
so no client can reach a service's durable consumer through JetStream's nameless create
request (``add_consumer``).

Why each is needed: docs/architecture.md, "When NATS or PostgreSQL is down" (NATS stalls), and
docs/security.md, "Tenants" (no one takes over a service's durable consumer).
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
