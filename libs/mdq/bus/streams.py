"""The JetStream streams (and KV buckets) of a namespace, created or updated idempotently.

Every stream and bucket is created with ``replicas`` copies (``MDQ_STREAM_REPLICAS``: 1 on a
single server, 3 on the production overlay's three-node NATS cluster, docs/durability.md). An
existing stream's replica count is raised to it but never lowered: a process started without
the setting (a CLI on a laptop, an older service) must not scale production streams down;
lower it by hand (``nats stream edit --replicas``) if you mean to.
"""

from __future__ import annotations

import asyncio

from nats.js import JetStreamContext
from nats.js.api import (
    DiscardPolicy,
    KeyValueConfig,
    RetentionPolicy,
    StorageType,
    StreamConfig,
    StreamSource,
)
from nats.js.errors import BadRequestError, BucketNotFoundError, NotFoundError
from nats.js.kv import KeyValue

from mdq.bus.subjects import Subjects

MAX_SUBMIT_BYTES = 1024 * 1024
DAY = 24 * 3600.0


def stream_configs(subjects: Subjects, *, replicas: int = 1) -> list[StreamConfig]:
    """Definitions of every stream: history is kept (limits retention) so replay works."""
    configs = [
        StreamConfig(
            name=subjects.submit_stream,
            subjects=subjects.submit_subjects,
            retention=RetentionPolicy.LIMITS,
            storage=StorageType.FILE,
            max_age=30 * DAY,
            max_msg_size=MAX_SUBMIT_BYTES,
            duplicate_window=3600.0,
            discard=DiscardPolicy.OLD,
        ),
        StreamConfig(
            name=subjects.jobs_stream,
            # "*.>" holds the tenants' two-token job ids too; their request ids have two tokens
            subjects=[subjects.job_all("*"), subjects.rejected("*"), subjects.rejected("*.*")],
            retention=RetentionPolicy.LIMITS,
            storage=StorageType.FILE,
            max_age=365 * DAY,
            duplicate_window=3600.0,
        ),
        StreamConfig(
            name=subjects.progress_stream,
            subjects=[subjects.progress_all],
            retention=RetentionPolicy.LIMITS,
            storage=StorageType.FILE,
            max_age=90 * DAY,
            duplicate_window=600.0,
        ),
        StreamConfig(
            name=subjects.nodes_stream,
            subjects=[subjects.node_load("*")],
            retention=RetentionPolicy.LIMITS,
            storage=StorageType.FILE,
            max_msgs_per_subject=1,
            max_age=DAY,
            duplicate_window=60.0,
        ),
    ]
    for config in configs:
        config.num_replicas = replicas
    return configs


TENANT_STREAM_MAX_AGE_S = 30 * DAY
"""How long a tenant's own stream keeps its events (the history stays in PostgreSQL and the
jobs and progress streams; this copy is what the tenant may follow and replay)."""


def tenant_stream_config(subjects: Subjects, tenant: str, *, replicas: int = 1) -> StreamConfig:
    """One tenant's stream: its jobs' events, refusals and progress, sourced by the server
    from the shared streams (which a tenant may not read: they hold everyone's jobs)."""
    jobs, refusals, progress = subjects.tenant_events(tenant)
    return StreamConfig(
        name=subjects.tenant_stream(tenant),
        sources=[
            StreamSource(name=subjects.jobs_stream, filter_subject=jobs),
            StreamSource(name=subjects.jobs_stream, filter_subject=refusals),
            StreamSource(name=subjects.progress_stream, filter_subject=progress),
        ],
        retention=RetentionPolicy.LIMITS,
        storage=StorageType.FILE,
        max_age=TENANT_STREAM_MAX_AGE_S,
        num_replicas=replicas,
    )


async def ensure_tenant_stream(
    js: JetStreamContext, subjects: Subjects, tenant: str, *, replicas: int = 1
) -> None:
    """Create (or bring up to date) ``tenant``'s stream; as admin, after ``ensure_streams``."""
    await _create_or_update(js, tenant_stream_config(subjects, tenant, replicas=replicas), replicas)


async def ensure_streams(js: JetStreamContext, subjects: Subjects, *, replicas: int = 1) -> None:
    """Create the namespace's streams, or bring existing ones up to date (their replica count
    only ever goes up)."""
    for config in stream_configs(subjects, replicas=replicas):
        await _create_or_update(js, config, replicas)


async def _create_or_update(js: JetStreamContext, config: StreamConfig, replicas: int) -> None:
    """Create the stream of ``config``, or update it to ``config`` with its replica count never
    lowered; on a cluster, return once it has a leader."""
    try:
        await js.add_stream(config=config)
    except BadRequestError:
        existing = await js.stream_info(config.name or "")
        config.num_replicas = max(replicas, existing.config.num_replicas or 1)
        await js.update_stream(config=config)
    if replicas > 1:
        await await_leader(js, config.name or "")


async def require_streams(js: JetStreamContext, subjects: Subjects, *, replicas: int = 1) -> None:
    """Check that the namespace's streams exist with at least ``replicas`` copies, reading
    only their info; create or update them (``ensure_streams``) only when one is missing or
    short of copies.

    Services start with this: on an mdq server only ``admin`` may create or update a stream
    (``mdq up`` and the setup Job do, before any service starts), so a service that merely
    reads the info needs no management right. A service started before the setup waits for
    it (the create is refused, which ``connect(wait=True)`` retries)."""
    for config in stream_configs(subjects, replicas=replicas):
        try:
            info = await js.stream_info(config.name or "")
        except NotFoundError:
            break
        if (info.config.num_replicas or 1) < replicas:
            break
    else:
        return
    await ensure_streams(js, subjects, replicas=replicas)


LEADER_WAIT_S = 30.0


async def await_leader(
    js: JetStreamContext, stream: str, *, timeout_s: float = LEADER_WAIT_S
) -> None:
    """Return once ``stream`` can take writes: on a cluster, a stream just created (or given
    more copies) has no leader until its replicas elect one, and a publish meanwhile gets no
    response (a replicated lease bucket's first write failed that way under load). A single
    server's stream has no cluster info and returns at once."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        info = await js.stream_info(stream)
        if info.cluster is None or info.cluster.leader:
            return
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError(f"stream {stream} has no leader after {timeout_s:.0f} s")
        await asyncio.sleep(0.1)


async def ensure_replicas(js: JetStreamContext, stream: str, replicas: int) -> None:
    """Raise an existing stream's replica count to ``replicas`` (never lower it). A KV bucket
    ``b`` is the stream ``KV_b``."""
    info = await js.stream_info(stream)
    if (info.config.num_replicas or 1) < replicas:
        info.config.num_replicas = replicas
        await js.update_stream(config=info.config)


async def open_bucket(js: JetStreamContext, config: KeyValueConfig) -> KeyValue:
    """Open the KV bucket of ``config`` as it is when it exists (created concurrently, or
    with another config by an older version), or create it; with at least ``config.replicas``
    copies. An existing bucket is only read first: opening one needs no right to manage it."""
    try:
        kv = await js.key_value(config.bucket)
    except BucketNotFoundError:
        try:
            kv = await js.create_key_value(config=config)
        except BadRequestError:  # created meanwhile by another process
            kv = await js.key_value(config.bucket)
    await ensure_replicas(js, f"KV_{config.bucket}", config.replicas or 1)
    if (config.replicas or 1) > 1:
        await await_leader(js, f"KV_{config.bucket}")
    return kv
