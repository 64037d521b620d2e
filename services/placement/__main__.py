"""Entrypoint: ``python -m services.placement`` (composition root)."""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from pathlib import Path

from nats.aio.client import Client

from mdq.backends.factory import make_backend
from mdq.backends.port import ClusterBackend
from mdq.bus.publisher import EventPublisher
from mdq.bus.requests import Requests
from mdq.bus.runtime import Service, serve
from mdq.bus.security.auth import RUNNER_ISSUER_ENV, RunnerIssuer
from mdq.bus.security.runner_creds import RenewalDesk, log_verdict
from mdq.bus.storage import StorageSettings
from services.placement.app import Placement
from services.placement.settings import PlacementSettings

BackendMaker = Callable[[Service, PlacementSettings, Client], Awaitable[ClusterBackend]]
"""Makes the cluster backend placement binds pods with, from the service, its settings and its
connection."""


def _runner_issuer_path() -> Path | None:
    found = os.environ.get(RUNNER_ISSUER_ENV)
    return Path(found) if found else None


async def configured_backend(
    service: Service, settings: PlacementSettings, nc: Client
) -> ClusterBackend:
    """The backend of ``MDQ_PLACEMENT_BACKEND`` (``mdq.backends.factory``)."""
    common = service.common
    return await make_backend(
        kind=settings.backend,
        nc=nc,
        subjects=service.subjects,
        replicas=common.stream_replicas,
        runner_nats_url=settings.runner_nats_url or common.nats_url,
        data_dir=common.data_dir.resolve(),
        # Kubernetes: each runner pod gets a Secret with credentials for its own job.
        runner_issuer=_runner_issuer_path(),
        runner_creds_ttl_s=common.runner_creds_ttl_s,
    )


async def compose(service: Service, backend_of: BackendMaker = configured_backend) -> None:
    """Placement with its backend (``backend_of``: the configured one; a bench swaps in
    one that creates no pod, and runs everything else as here)."""
    common, settings, subjects = service.common, PlacementSettings(), service.subjects
    replicas = common.stream_replicas
    nc = await service.connect()
    js = nc.jetstream()
    requests = await Requests(nc).start()
    issuer_path = _runner_issuer_path()
    backend = await backend_of(service, settings, nc)
    service.on_stop(backend.close)
    placement = Placement(
        js=js,
        subjects=subjects,
        publisher=EventPublisher(js=requests, subjects=subjects, producer="placement"),
        backend=backend,
        settings=settings,
        namespace=common.namespace,
        stream_replicas=replicas,
        jobs_log_days=StorageSettings().jobs_days,
        nc=nc,  # job control is answered on it while this replica leads
    )
    if issuer_path is not None:
        # Placement alone holds the runner issuer: it mints the first credentials of the local
        # node agents' pods (which hold no key) and renews every runner's while its attempt is
        # the live one in the jobs log; it refuses any name that is not a job id.
        issuer = RunnerIssuer.load(issuer_path, expires_s=common.runner_creds_ttl_s)
        desk = await RenewalDesk(
            nc, subjects, mint=issuer.creds, verdict=log_verdict(js, subjects)
        ).start()
        service.on_stop(desk.close)
    service.part("placement", placement.run)


if __name__ == "__main__":
    serve("placement", compose)
