"""Entrypoint: ``python -m services.placement`` (composition root)."""

from __future__ import annotations

import os
from pathlib import Path

from mdq.backends.factory import make_backend
from mdq.bus.publisher import EventPublisher
from mdq.bus.requests import Requests
from mdq.bus.runtime import Service, serve
from mdq.bus.security.auth import RUNNER_ISSUER_ENV, RunnerIssuer
from mdq.bus.security.runner_creds import RenewalDesk, log_verdict
from mdq.bus.storage import StorageSettings
from services.placement.app import Placement
from services.placement.settings import PlacementSettings


async def compose(service: Service) -> None:
    common, settings, subjects = service.common, PlacementSettings(), service.subjects
    replicas = common.stream_replicas
    nc = await service.connect()
    js = nc.jetstream()
    requests = await Requests(nc).start()
    found = os.environ.get(RUNNER_ISSUER_ENV)
    issuer_path = Path(found) if found else None
    backend = await make_backend(
        kind=settings.backend,
        nc=nc,
        subjects=subjects,
        replicas=replicas,
        runner_nats_url=settings.runner_nats_url or common.nats_url,
        data_dir=common.data_dir.resolve(),
        # Kubernetes: each runner pod gets a Secret with credentials for its own job.
        runner_issuer=issuer_path,
        runner_creds_ttl_s=common.runner_creds_ttl_s,
    )
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
