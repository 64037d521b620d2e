"""Bench-only placement process: the real ``Placement`` service with a backend that creates no
pod (``NoopBackend``), so ``make bench-placement`` measures placement, not process spawning.

Run as ``python bench/placement_noop.py`` with the service's environment (``NATS_URL``,
``MDQ_NAMESPACE``, ``MDQ_PLACEMENT_*``).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator
from pathlib import Path

from mdq.backends.port import PodExists, PodSpec, PodUpdate
from mdq.bus.connect import connect
from mdq.bus.publisher import EventPublisher
from mdq.bus.requests import Requests
from mdq.bus.subjects import Subjects
from mdq.core.nodes import NodeSample
from mdq.settings import CommonSettings
from services.placement.app import Placement
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


DATA_DIR = Path(os.environ.get("MDQ_DATA_DIR", ".mdq/data")).absolute()


async def main() -> None:
    common, settings = CommonSettings(), PlacementSettings()
    subjects = Subjects(common.namespace)
    nc = await connect(common.nats_url, name="mdq-placement-bench", subjects=subjects)
    js = nc.jetstream()
    requests = await Requests(nc).start()
    placement = Placement(
        js=js,
        subjects=subjects,
        publisher=EventPublisher(js=requests, subjects=subjects, producer="placement"),
        backend=NoopBackend(),
        settings=settings,
        namespace=common.namespace,
    )
    try:
        await placement.run()
    finally:
        await nc.drain()


if __name__ == "__main__":
    logging.basicConfig(level=os.environ.get("MDQ_BENCH_LOG_LEVEL", "WARNING"))
    asyncio.run(main())
