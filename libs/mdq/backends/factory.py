"""Choosing the execution backend by name: the one place that knows every adapter."""

from __future__ import annotations

from nats.aio.client import Client
from nats.js import JetStreamContext

from mdq.backends.port import ClusterBackend
from mdq.bus.subjects import Subjects

BACKEND_KINDS = ("local",)


class UnknownBackend(ValueError):
    """The backend kind named in the settings does not exist (yet)."""


async def make_backend(
    *, kind: str, nc: Client | JetStreamContext, subjects: Subjects
) -> ClusterBackend:
    """The backend called ``kind`` ("local"), ready to use (its buckets exist)."""
    if kind == "local":
        from mdq.backends.local.api import LocalBackend

        backend = LocalBackend(nc=nc, subjects=subjects)
        await backend.buckets()
        return backend
    raise UnknownBackend(
        f"unknown backend kind {kind!r}: choose one of {', '.join(BACKEND_KINDS)}"
        + (" (the Kubernetes backend is not available yet)" if kind == "kubernetes" else "")
    )
