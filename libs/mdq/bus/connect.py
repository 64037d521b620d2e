"""Connecting to NATS the same way in every service."""

from __future__ import annotations

import nats
from nats.aio.client import Client

from mdq.bus.streams import ensure_streams
from mdq.bus.subjects import Subjects


async def connect(
    url: str, *, name: str, subjects: Subjects | None = None, replicas: int = 1
) -> Client:
    """Connect (retrying forever on reconnects) and, if ``subjects`` is given, make sure the
    namespace's streams exist, with at least ``replicas`` copies each."""
    client = await nats.connect(
        url,
        name=name,
        max_reconnect_attempts=-1,
        reconnect_time_wait=0.5,
        connect_timeout=5,
    )
    if subjects is not None:
        await ensure_streams(client.jetstream(), subjects, replicas=replicas)
    return client
