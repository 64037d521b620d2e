"""Choosing the execution backend by name: the one place that knows every adapter."""

from __future__ import annotations

from pathlib import Path

from nats.aio.client import Client
from nats.js import JetStreamContext

from mdq.backends.port import ClusterBackend
from mdq.bus.subjects import Subjects

BACKEND_KINDS = ("local", "kubernetes")


class UnknownBackend(ValueError):
    """The backend kind named in the settings does not exist (yet)."""


async def make_backend(
    *,
    kind: str,
    nc: Client | JetStreamContext,
    subjects: Subjects,
    replicas: int = 1,
    runner_nats_url: str = "",
    data_dir: Path | None = None,
    runner_issuer: Path | None = None,
    runner_creds_ttl_s: float | None = None,
) -> ClusterBackend:
    """The backend called ``kind``, ready to use: "local" (its buckets exist, with
    ``replicas`` copies) or "kubernetes" (``MDQ_K8S_*`` settings; pods labelled with
    ``subjects``' namespace; their runners reach NATS at ``runner_nats_url``, find the data
    folder at ``data_dir`` and authenticate with credentials minted for each pod's job by the
    issuer in the file ``runner_issuer`` (``MDQ_NATS_RUNNER_ISSUER``), valid for
    ``runner_creds_ttl_s`` and renewed while the attempt lives (``mdq.bus.runner_creds``),
    all of which only the service creating pods must give). The local backend's runners get
    these from their node agent."""
    if kind == "local":
        from mdq.backends.local.api import LocalBackend

        backend = LocalBackend(nc=nc, subjects=subjects, replicas=replicas)
        await backend.buckets()
        return backend
    if kind == "kubernetes":
        from mdq.auth import RunnerIssuer
        from mdq.backends.kubernetes.backend import DEFAULT_DATA_DIR, KubernetesBackend

        return await KubernetesBackend.connect(
            mdq_namespace=subjects.namespace,
            runner_nats_url=runner_nats_url,
            data_dir=DEFAULT_DATA_DIR if data_dir is None else data_dir,
            runner_issuer=(
                RunnerIssuer.load(runner_issuer, expires_s=runner_creds_ttl_s)
                if runner_issuer
                else None
            ),
        )
    raise UnknownBackend(f"unknown backend kind {kind!r}: choose one of {', '.join(BACKEND_KINDS)}")
