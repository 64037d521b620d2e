"""Choosing the execution backend by name: the one place that knows every adapter."""

from __future__ import annotations

import os
from pathlib import Path

from nats.aio.client import Client
from nats.js import JetStreamContext

from mdq.backends.port import ClusterBackend
from mdq.bus.subjects import Subjects
from mdq.errors import InvalidInput

BACKEND_KINDS = ("local", "kubernetes", "clusters")
CLUSTERS_FILE_ENV = "MDQ_CLUSTERS_FILE"
"""The clusters file of the ``clusters`` kind (``mdq.backends.clusters``)."""
CLUSTERS_RELOAD_ENV = "MDQ_CLUSTERS_RELOAD_S"
"""How often the clusters file is read again for changes (seconds, default 2)."""
CLUSTERS_LOST_AFTER_ENV = "MDQ_CLUSTERS_LOST_AFTER_S"
"""How long a cluster may not answer before it is lost (seconds, default 60)."""
CLUSTERS_PROBE_ENV = "MDQ_CLUSTERS_PROBE_S"
"""How often the watcher asks every cluster whether it answers (seconds, default 2)."""


class UnknownBackend(InvalidInput):
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
    clusters_file: Path | None = None,
) -> ClusterBackend:
    """The backend called ``kind``, ready to use: "local" (its buckets exist, with
    ``replicas`` copies) or "kubernetes" (``MDQ_K8S_*`` settings; pods labelled with
    ``subjects``' namespace; their runners reach NATS at ``runner_nats_url``, find the data
    folder at ``data_dir`` and authenticate with credentials minted for each pod's job by the
    issuer in the file ``runner_issuer`` (``MDQ_NATS_RUNNER_ISSUER``), valid for
    ``runner_creds_ttl_s`` and renewed while the attempt lives (``mdq.bus.security.runner_creds``),
    all of which only the service creating pods must give). The local backend's runners get
    theirs from their node agent, which asks placement's desk for them (it holds no key).

    "clusters": several execution clusters (``mdq.backends.clusters.ClusterRouter``), listed
    in ``clusters_file`` (default ``MDQ_CLUSTERS_FILE``), each made as one of the other kinds
    with the same arguments (a Kubernetes cluster's ``kubernetes`` settings over
    ``MDQ_K8S_*``); the file is followed, so clusters come and go without a restart."""
    if kind == "clusters":
        return await _cluster_router(
            clusters_file or Path(os.environ.get(CLUSTERS_FILE_ENV, "")),
            nc=nc,
            subjects=subjects,
            replicas=replicas,
            runner_nats_url=runner_nats_url,
            data_dir=data_dir,
            runner_issuer=runner_issuer,
            runner_creds_ttl_s=runner_creds_ttl_s,
        )
    if kind == "local":
        from mdq.backends.local.api import LocalBackend

        backend = LocalBackend(nc=nc, subjects=subjects, replicas=replicas)
        await backend.buckets()
        return backend
    if kind == "kubernetes":
        from mdq.backends.kubernetes.backend import DEFAULT_DATA_DIR, KubernetesBackend
        from mdq.bus.security.auth import RunnerIssuer

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


async def _cluster_router(
    path: Path,
    *,
    nc: Client | JetStreamContext,
    subjects: Subjects,
    replicas: int,
    runner_nats_url: str,
    data_dir: Path | None,
    runner_issuer: Path | None,
    runner_creds_ttl_s: float | None,
) -> ClusterBackend:
    from mdq.backends.clusters import (
        LOST_AFTER_S,
        ClusterEntry,
        ClusterRouter,
        KvLostClusters,
        read_clusters,
    )

    if not str(path) or str(path) == ".":
        raise UnknownBackend(f"backend kind 'clusters' needs a clusters file ({CLUSTERS_FILE_ENV})")

    async def connect(entry: ClusterEntry) -> ClusterBackend:
        if entry.kind == "local":
            local = subjects.for_local_cluster(entry.name)
            return await make_backend(kind="local", nc=nc, subjects=local, replicas=replicas)
        from mdq.backends.kubernetes.backend import DEFAULT_DATA_DIR, KubernetesBackend
        from mdq.backends.kubernetes.settings import KubernetesSettings
        from mdq.bus.security.auth import RunnerIssuer

        # this cluster's settings over the process's MDQ_K8S_* (init arguments win)
        return await KubernetesBackend.connect(
            settings=KubernetesSettings(**entry.kubernetes),
            mdq_namespace=subjects.namespace,
            runner_nats_url=entry.runner_nats_url or runner_nats_url,
            data_dir=DEFAULT_DATA_DIR if data_dir is None else data_dir,
            runner_issuer=(
                RunnerIssuer.load(runner_issuer, expires_s=runner_creds_ttl_s)
                if runner_issuer
                else None
            ),
        )

    js = nc.jetstream() if isinstance(nc, Client) else nc
    router = ClusterRouter(
        connect=connect,
        lost=KvLostClusters(js, subjects).start(),
        lost_after_s=float(os.environ.get(CLUSTERS_LOST_AFTER_ENV, LOST_AFTER_S)),
        probe_interval_s=float(os.environ.get(CLUSTERS_PROBE_ENV, 2.0)),
    )
    await router.sync(read_clusters(path))  # a bad file at start is an error to see now
    router.follow_in_background(path, interval_s=float(os.environ.get(CLUSTERS_RELOAD_ENV, 2.0)))
    return router
