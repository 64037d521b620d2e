"""Making a namespace's streams (and the local backend's buckets) as the admin identity.

Only ``admin`` may create, update, purge or delete a stream or a bucket, so this one step runs
as admin before the services, the same everywhere: ``mdq up`` calls ``prepare_bus``, compose
and Kubernetes run ``python -m mdq.bus.setup``. It also makes the tenants bucket and the
operator's inputs bucket, applies the storage limits and replica count, and is idempotent.

Where it runs and why: docs/security.md, "NATS: every connection proves who it is"; limits and
replicas: docs/durability.md, sections 2 and 5.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
from pathlib import Path

from mdq.bus.connect import connect
from mdq.bus.inputs import ensure_inputs_bucket
from mdq.bus.storage import StorageSettings
from mdq.bus.streams import ensure_bucket_limits, ensure_local_buckets, ensure_streams
from mdq.bus.subjects import Subjects
from mdq.bus.tenants import ensure_tenants_bucket

log = logging.getLogger("mdq.bus.setup")


async def prepare_bus(
    nats_url: str,
    *,
    namespace: str,
    replicas: int = 1,
    local_backend: bool = False,
    creds: Path | str | None = None,
    storage: StorageSettings | None = None,
    local_clusters: tuple[str, ...] = (),
) -> None:
    """Create or update the streams of ``namespace`` and its tenants bucket (and, with
    ``local_backend``, the local backend's KV buckets, of each of ``local_clusters`` too),
    connected with ``creds`` (default:
    ``MDQ_NATS_CREDS``), which must be the admin's on an mdq server; every stream and
    bucket with the limits of ``storage`` (default: ``MDQ_STORAGE_*``)."""
    storage = storage or StorageSettings()
    subjects = Subjects(namespace)
    client = await connect(nats_url, name="mdq-bus-setup", wait=True, creds=creds)
    try:
        js = client.jetstream()
        await ensure_streams(js, subjects, replicas=replicas, storage=storage)
        await ensure_tenants_bucket(js, subjects, replicas=replicas)
        await ensure_inputs_bucket(
            js, subjects, max_bytes=int(storage.inputs_bytes), replicas=replicas
        )
        if local_backend:
            await ensure_local_buckets(js, subjects, replicas=replicas)
        for cluster in local_clusters:
            await ensure_local_buckets(js, subjects.for_local_cluster(cluster), replicas=replicas)
        await ensure_bucket_limits(js, subjects, storage)
    finally:
        await client.close()


def main(argv: list[str] | None = None) -> int:
    from mdq.settings import CommonSettings

    parser = argparse.ArgumentParser(
        prog="python -m mdq.bus.setup",
        description="Create or update mdq's streams as the admin identity (MDQ_NATS_CREDS).",
    )
    parser.add_argument(
        "--local-backend", action="store_true", help="also the local backend's KV buckets"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    settings = CommonSettings()
    asyncio.run(
        prepare_bus(
            settings.nats_url,
            namespace=settings.namespace,
            replicas=settings.stream_replicas,
            local_backend=args.local_backend,
        )
    )
    log.info("streams of namespace %s ready", settings.namespace)
    print(f"streams of namespace {settings.namespace} ready", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
