"""Entrypoint: ``python -m services.placement`` (composition root)."""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

from mdq.auth import RUNNER_ISSUER_ENV
from mdq.backends.factory import make_backend
from mdq.bus.connect import connect
from mdq.bus.publisher import EventPublisher
from mdq.bus.requests import Requests
from mdq.settings import CommonSettings
from services.placement.app import Placement
from services.placement.settings import PlacementSettings


async def main() -> None:
    common, settings = CommonSettings(), PlacementSettings()
    subjects = common.subjects
    replicas = common.stream_replicas
    nc = await connect(
        common.nats_url, name="mdq-placement", subjects=subjects, replicas=replicas, wait=True
    )
    js = nc.jetstream()
    requests = await Requests(nc).start()
    backend = await make_backend(
        kind=settings.backend,
        nc=nc,
        subjects=subjects,
        replicas=replicas,
        runner_nats_url=settings.runner_nats_url or common.nats_url,
        data_dir=common.data_dir.resolve(),
        # Kubernetes: each runner pod gets credentials for its own job, minted with this key.
        runner_issuer=Path(found) if (found := os.environ.get(RUNNER_ISSUER_ENV)) else None,
    )
    placement = Placement(
        js=js,
        subjects=subjects,
        publisher=EventPublisher(js=requests, subjects=subjects, producer="placement"),
        backend=backend,
        settings=settings,
        namespace=common.namespace,
        stream_replicas=replicas,
    )
    try:
        await placement.run()
    finally:
        await backend.close()
        await nc.drain()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    asyncio.run(main())
