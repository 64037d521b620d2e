"""Bench-only placement process: the placement service as ``python -m services.placement`` runs
it (its composition root and service runtime) with a backend that creates no pod
(``NoopBackend``), so the benches measure placement, not process spawning.

Run as ``python bench/placement_noop.py`` with the service's environment (``NATS_URL``,
``MDQ_NAMESPACE``, ``MDQ_NATS_CREDS``, ``MDQ_PLACEMENT_*``).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator

from nats.aio.client import Client

from mdq.backends.port import PodExists, PodSpec, PodUpdate
from mdq.bus.runtime import Service, serve
from mdq.core.nodes import NodeSample
from services.placement.__main__ import compose
from services.placement.settings import PlacementSettings


class NoopBackend:
    """The cluster backend port with pod creation a no-op (it remembers names, nothing else)."""

    def __init__(self) -> None:
        self.pods: set[str] = set()

    async def create_pod(self, pod: PodSpec) -> None:
        if pod.name in self.pods:
            raise PodExists(pod.name)
        self.pods.add(pod.name)

    async def delete_pod(self, name: str) -> None:
        self.pods.discard(name)

    async def watch_pods(self) -> AsyncIterator[PodUpdate]:
        while True:
            await asyncio.sleep(3600)
            if False:  # pragma: no cover - never; makes this an async generator
                yield

    async def sample_nodes(self) -> list[NodeSample]:
        return []

    async def close(self) -> None:
        return None


async def no_pods(service: Service, settings: PlacementSettings, nc: Client) -> NoopBackend:
    """The backend of this bench: no pod is created."""
    del service, settings, nc
    return NoopBackend()


if __name__ == "__main__":
    serve("placement", functools.partial(compose, backend_of=no_pods))
