"""The JetStream streams (and KV buckets) of a namespace, created or updated idempotently.

Every stream and bucket is created with ``replicas`` copies (``MDQ_STREAM_REPLICAS``: 1 on a
single server, 3 on the production overlay's three-node NATS cluster, docs/durability.md). An
existing stream's replica count is raised to it but never lowered: a process started without
the setting (a CLI on a laptop, an older service) must not scale production streams down;
lower it by hand (``nats stream edit --replicas``) if you mean to.

Each has the size and age limit and the discard policy of ``mdq.bus.storage`` (settings
``MDQ_STORAGE_*``). An update never sets a stream's size limit below what it holds: that would
drop history (discard old) or refuse every new event (discard new) at once; the limit stays at
the stream's size, and a warning says so. A stream's retention cannot change in place (the
server refuses it to or from a work queue): an existing stream with another retention than
this mdq gives it is refused with ``StreamRetentionDiffers``, which says what to do.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Iterable

from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    DiscardPolicy,
    KeyValueConfig,
    RetentionPolicy,
    StorageType,
    StreamConfig,
    StreamConsumerLimits,
    StreamSource,
)
from nats.js.errors import BadRequestError, BucketNotFoundError, NotFoundError
from nats.js.kv import KeyValue

from mdq.bus.fetch import connection_of
from mdq.bus.storage import DAY_S, StorageSettings
from mdq.bus.subjects import Subjects
from mdq.errors import Conflict

log = logging.getLogger("mdq.bus.streams")

MAX_SUBMIT_BYTES = 1024 * 1024
COPY_MAX_MESSAGE_BYTES = 512 * 1024
"""The largest message of the copies stream: a chunk (``mdq.bus.copies.CHUNK_BYTES``) and its
headers."""


def submit_stream_config(
    subjects: Subjects,
    *,
    replicas: int = 1,
    storage: StorageSettings | None = None,
) -> StreamConfig:
    """The stream of the operator's fire-and-forget submits (``NS.submit``), which intake
    reads through its durable consumer. A tenant's submits are in the tenant's own stream
    (``tenant_submit_stream_config``), which intake reads directly, at the tenant's rate: none
    is copied here, so a tenant's flood never grows this stream. A message id is deduplicated
    within an hour."""
    storage = storage or StorageSettings()
    return StreamConfig(
        name=subjects.submit_stream,
        subjects=[subjects.submit_capture],
        retention=RetentionPolicy.LIMITS,
        storage=StorageType.FILE,
        max_age=storage.submit_days * DAY_S,
        max_bytes=int(storage.submit_bytes),
        max_msg_size=MAX_SUBMIT_BYTES,
        duplicate_window=3600.0,
        discard=DiscardPolicy.NEW,  # a full stream refuses the submitter, drops nothing
        num_replicas=replicas,
    )


def tenant_submit_stream_config(
    subjects: Subjects,
    tenant: str,
    *,
    replicas: int = 1,
    storage: StorageSettings | None = None,
    closed: bool = True,
    first_seq: int | None = None,
) -> StreamConfig:
    """One tenant's submits (``NS.submit.<tenant>``), a work queue: intake reads it through
    a durable pull consumer of its own (``tenant_submit_consumer_config``; a work queue
    refuses a second consumer whose filter overlaps it), no faster than the tenant's rate, and
    a submit it has handled and acked leaves the stream. So the stream holds the submits waiting for
    intake, at most ``MDQ_STORAGE_TENANT_SUBMIT_MSGS`` of them and
    ``MDQ_STORAGE_TENANT_SUBMIT_BYTES``: past either the server refuses that tenant's
    publishes (discard new, error 10077), before writing anything, and nobody else's. A flood
    waits here up to the cap. A message id is deduplicated among the tenant's own for an hour,
    also once its submit has left the stream (the server keeps the ids it stored; a restart
    of the server forgets those of submits no longer stored, and intake's registry then
    answers a repeat as the same submit).

    On a ``closed`` bus the submits arrive in the streams account as ``submit_stored``, which
    it captures with a wildcard (a literal subject would take in a push consumer's deliveries,
    ``Subjects.submit_capture``); on an open server (one account, no import to add the token)
    it captures ``NS.submit.<tenant>`` itself.

    A stream made anew starts at ``first_seq`` (``fresh_first_seq``): a keyless submit's
    request id is its sequence here, and a tenant removed and added again must not have its
    new submits' ids taken for the ones of its earlier stream (intake's registry remembers
    those for the duplicate window)."""
    storage = storage or StorageSettings()
    capture = f"{subjects.submit_for(tenant)}.*" if closed else subjects.submit_for(tenant)
    return StreamConfig(
        name=subjects.tenant_submit_stream(tenant),
        subjects=[capture],
        retention=RetentionPolicy.WORK_QUEUE,
        storage=StorageType.FILE,
        max_age=storage.submit_days * DAY_S,
        max_msgs=storage.tenant_submit_msgs,
        max_bytes=int(storage.tenant_submit_bytes),
        max_msg_size=MAX_SUBMIT_BYTES,
        duplicate_window=3600.0,
        discard=DiscardPolicy.NEW,
        num_replicas=replicas,
        first_seq=first_seq,
    )


def fresh_first_seq() -> int:
    """Where a tenant's submit stream made now starts: the time in microseconds, above every
    sequence an earlier stream of that name reached (it would have stored more than one
    submit a microsecond otherwise). A work queue's sequence goes on from its last one when
    its submits have left it, across a restart of the server too, so a sequence names one
    submit for the stream's life."""
    return int(time.time() * 1_000_000)


def stream_configs(
    subjects: Subjects,
    *,
    replicas: int = 1,
    storage: StorageSettings | None = None,
) -> list[StreamConfig]:
    """Definitions of every shared stream: history is kept (limits retention) so replay works,
    within the limits of ``storage`` (default: ``MDQ_STORAGE_*`` from the environment)."""
    storage = storage or StorageSettings()
    configs = [
        submit_stream_config(subjects, storage=storage),
        StreamConfig(
            name=subjects.jobs_stream,
            # "*.>" holds the tenants' two-token job ids too; their request ids have two tokens
            subjects=[
                subjects.job_all("*"),
                subjects.rejected("*"),
                subjects.rejected("*.*"),
                *subjects.claims,  # intake's claims, stored with the submits' events
            ],
            retention=RetentionPolicy.LIMITS,
            storage=StorageType.FILE,
            max_age=storage.jobs_days * DAY_S,
            max_bytes=int(storage.jobs_bytes),
            duplicate_window=3600.0,
            discard=DiscardPolicy.NEW,  # never drops a live job's events (intake stops first)
            allow_atomic=True,  # intake's and placement's batches: one flush each
        ),
        StreamConfig(
            name=subjects.progress_stream,
            subjects=[subjects.progress_all],
            retention=RetentionPolicy.LIMITS,
            storage=StorageType.FILE,
            max_age=storage.progress_days * DAY_S,
            max_bytes=int(storage.progress_bytes),
            duplicate_window=600.0,
            discard=DiscardPolicy.OLD,  # PostgreSQL keeps the history
        ),
        StreamConfig(
            name=subjects.nodes_stream,
            subjects=[subjects.node_load("*")],
            retention=RetentionPolicy.LIMITS,
            storage=StorageType.FILE,
            max_msgs_per_subject=1,
            max_age=storage.nodes_days * DAY_S,
            max_bytes=int(storage.nodes_bytes),
            duplicate_window=60.0,
            discard=DiscardPolicy.OLD,  # a node's next report replaces it anyway
        ),
        StreamConfig(
            name=subjects.node_summaries_stream,
            subjects=[subjects.node_summary("*")],
            retention=RetentionPolicy.LIMITS,
            storage=StorageType.FILE,
            # bounded per node too: a node summarised too often cannot crowd the others out
            max_msgs_per_subject=storage.node_summaries_per_node(),
            max_age=storage.node_summaries_minutes * 60.0,
            max_bytes=int(storage.node_summaries_bytes),
            duplicate_window=120.0,  # two metrics replicas summarise the same minute once
            discard=DiscardPolicy.OLD,  # only the last hour is read
        ),
        StreamConfig(
            name=subjects.copies_stream,
            subjects=[subjects.copies_all],
            retention=RetentionPolicy.LIMITS,
            storage=StorageType.FILE,
            # a subject per chunk of a file of a slot: a slot's new copy replaces its old one
            max_msgs_per_subject=1,
            max_age=storage.copies_days * DAY_S,
            max_bytes=int(storage.copies_bytes),
            max_msg_size=COPY_MAX_MESSAGE_BYTES,
            allow_direct=True,  # a runner reads its own job's copies by subject (direct get)
            discard=DiscardPolicy.OLD,  # the oldest copies (ended jobs' outputs) go first
        ),
    ]
    for config in configs:
        config.num_replicas = replicas
    return configs


def tenant_stream_config(
    subjects: Subjects,
    tenant: str,
    *,
    replicas: int = 1,
    storage: StorageSettings | None = None,
) -> StreamConfig:
    """One tenant's stream: its jobs' events, refusals and progress, sourced by the server
    from the shared streams (which a tenant may not read: they hold everyone's jobs). It is a
    copy (the history stays in PostgreSQL and the shared streams), so it drops its oldest
    events at its limits (``MDQ_STORAGE_TENANT_*``). The tenant makes its own consumers on it
    (ordered and pull, ``mdq.bus.security.permissions.tenant_permissions``): at most
    ``tenant_consumers`` at once, each deleted by the server after ``tenant_consumer_idle_s``
    unused, durable or not."""
    storage = storage or StorageSettings()
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
        max_age=storage.tenant_days * DAY_S,
        max_bytes=int(storage.tenant_bytes),
        discard=DiscardPolicy.OLD,
        num_replicas=replicas,
        max_consumers=storage.tenant_consumers,
        consumer_limits=StreamConsumerLimits(inactive_threshold=storage.tenant_consumer_idle_s),
    )


async def ensure_tenant_stream(
    js: JetStreamContext,
    subjects: Subjects,
    tenant: str,
    *,
    replicas: int = 1,
    storage: StorageSettings | None = None,
) -> None:
    """Create (or bring up to date) ``tenant``'s streams, its events' and its submits'; as
    admin, after ``ensure_streams``. Intake finds the submit stream by itself
    (``tenant_submit_streams``) and makes its consumer there."""
    config = tenant_stream_config(subjects, tenant, replicas=replicas, storage=storage)
    await _create_or_update(js, config, replicas)
    submits = tenant_submit_stream_config(
        subjects,
        tenant,
        replicas=replicas,
        storage=storage,
        closed=closed_bus(js),
        first_seq=fresh_first_seq(),
    )
    await _create_or_update(js, submits, replicas)


async def remove_tenant_streams(js: JetStreamContext, subjects: Subjects, tenant: str) -> bool:
    """Delete ``tenant``'s streams (as admin): its submits' (with intake's consumer of it, so
    intake stops reading it) and its events'; whether its events' stream existed."""
    with contextlib.suppress(NotFoundError):
        await js.delete_stream(subjects.tenant_submit_stream(tenant))
    try:
        return await js.delete_stream(subjects.tenant_stream(tenant))
    except NotFoundError:
        return False


async def tenants_with_streams(js: JetStreamContext, subjects: Subjects) -> list[str]:
    """The tenants that have a stream of their events in this namespace (as admin: the list of
    streams names every tenant)."""
    prefix = subjects.tenant_stream("")
    return sorted(name.removeprefix(prefix) for name in await _stream_names(js, prefix=prefix))


async def tenant_submit_streams(js: JetStreamContext, subjects: Subjects) -> list[str]:
    """The tenants that have a submit stream in this namespace: the streams whose subjects are
    under ``NS.submit.`` (the operator's own stream captures ``NS.*``), asked of the server by
    that subject, so another namespace's streams never answer. What intake follows."""
    prefix = subjects.tenant_submit_stream("")
    names = await _stream_names(js, prefix=prefix, subject=f"{subjects.submit}.>")
    return sorted(name.removeprefix(prefix) for name in names)


async def _stream_names(js: JetStreamContext, *, prefix: str, subject: str = "") -> list[str]:
    """The names of the streams that start with ``prefix`` (and, with ``subject``, whose
    subjects overlap it), read page by page."""
    names: list[str] = []
    offset = 0
    while True:
        asked: dict[str, object] = {"offset": offset}
        if subject:
            asked["subject"] = subject
        reply = await connection_of(js).request(
            "$JS.API.STREAM.NAMES", json.dumps(asked).encode(), timeout=5
        )
        answer = json.loads(reply.data)
        if error := answer.get("error"):
            raise BadRequestError(description=str(error.get("description", error)))
        page = answer.get("streams") or []
        names += [name for name in page if name.startswith(prefix)]
        offset += len(page)
        if not page or offset >= int(answer.get("total", 0)):
            break
    return names


INTAKE_CONSUMER = "intake"
"""The name of intake's durable consumers (``MDQ_INTAKE_DURABLE``'s default): of the submit
stream, and of each tenant's submit stream."""
STREAM_NOT_FOUND = 10059
"""JetStream's error code for a stream that does not exist (10014: a consumer)."""


def tenant_submit_filter(subjects: Subjects, tenant: str, *, closed: bool) -> str:
    """The subject ``tenant``'s submits are stored under in its submit stream: on a closed bus
    ``NS.submit.<tenant>.in`` (``Subjects.submit_stored``), else ``NS.submit.<tenant>``."""
    return subjects.submit_stored(tenant) if closed else subjects.submit_for(tenant)


def tenant_submit_consumer_config(
    subjects: Subjects,
    tenant: str,
    *,
    closed: bool,
    name: str = INTAKE_CONSUMER,
    ack_wait_s: float = 30.0,
    max_ack_pending: int = 256,
) -> ConsumerConfig:
    """Intake's durable pull consumer of ``tenant``'s submit stream, shared by its replicas:
    from the first submit on, filtered on the tenant's stored subject (so that it is made by
    the request that names the filter, the one intake may send, ``mdq.bus.security.permissions``),
    each submit acked once handled."""
    return ConsumerConfig(
        name=name,
        durable_name=name,
        filter_subject=tenant_submit_filter(subjects, tenant, closed=closed),
        ack_policy=AckPolicy.EXPLICIT,
        ack_wait=ack_wait_s,
        max_ack_pending=max_ack_pending,
        deliver_policy=DeliverPolicy.ALL,
    )


async def ensure_tenant_submit_consumer(
    js: JetStreamContext,
    subjects: Subjects,
    tenant: str,
    *,
    name: str = INTAKE_CONSUMER,
    ack_wait_s: float = 30.0,
    max_ack_pending: int = 256,
) -> None:
    """Make intake's consumer of ``tenant``'s submit stream unless it exists (NotFoundError:
    no such stream)."""
    stream = subjects.tenant_submit_stream(tenant)
    try:
        await js.consumer_info(stream, name)
        return
    except NotFoundError as error:
        if error.err_code == STREAM_NOT_FOUND:
            raise
    config = tenant_submit_consumer_config(
        subjects,
        tenant,
        closed=closed_bus(js),
        name=name,
        ack_wait_s=ack_wait_s,
        max_ack_pending=max_ack_pending,
    )
    try:
        await js.add_consumer(stream, config=config)
    except BadRequestError:  # made meanwhile by another replica (or the setup)
        await js.consumer_info(stream, name)


async def _ensure_submit_streams(
    js: JetStreamContext,
    subjects: Subjects,
    tenants: Iterable[str],
    *,
    replicas: int,
    storage: StorageSettings | None,
) -> None:
    """The submit stream, capturing the operator's subject alone and sourcing nothing, then
    each of ``tenants``' submit streams."""
    await _create_or_update(
        js, submit_stream_config(subjects, replicas=replicas, storage=storage), replicas
    )
    closed = closed_bus(js)
    for tenant in sorted(set(tenants)):
        made = tenant_submit_stream_config(
            subjects,
            tenant,
            replicas=replicas,
            storage=storage,
            closed=closed,
            first_seq=fresh_first_seq(),
        )
        await _create_or_update(js, made, replicas)


def closed_bus(js: JetStreamContext) -> bool:
    """Whether ``js`` is connected to a closed bus (the server asks every client to
    authenticate: mdq's two accounts, ``mdq.bus.security.auth``), where a tenant's submits reach
    the streams account as ``Subjects.submit_stored``."""
    info = getattr(connection_of(js), "_server_info", None) or {}
    return bool(info.get("auth_required"))


async def ensure_streams(
    js: JetStreamContext,
    subjects: Subjects,
    *,
    replicas: int = 1,
    storage: StorageSettings | None = None,
) -> None:
    """Create the namespace's streams, or bring existing ones up to date (their replica count
    only ever goes up, their size limit never below what they hold); every tenant with a
    stream of its events gets its submit stream, and the submit stream sources none of them
    (``_ensure_submit_streams``)."""
    for config in stream_configs(subjects, replicas=replicas, storage=storage):
        if config.name == subjects.submit_stream:
            tenants = await tenants_with_streams(js, subjects)
            await _ensure_submit_streams(js, subjects, tenants, replicas=replicas, storage=storage)
            continue
        await _create_or_update(js, config, replicas)


async def _create_or_update(js: JetStreamContext, config: StreamConfig, replicas: int) -> None:
    """Create the stream of ``config``, or update it to ``config`` with its replica count never
    lowered and its size limit never under its size; on a cluster, return once it has a
    leader."""
    name = config.name or ""
    try:
        # Looked up first: the server checks a create against the file store before it sees
        # that the stream exists, so re-creating a big one answers "insufficient storage".
        existing = await js.stream_info(name)
    except NotFoundError:
        try:
            await js.add_stream(config=config)
        except BadRequestError:  # made meanwhile by another process
            existing = await js.stream_info(name)
        else:
            if replicas > 1:
                await await_leader(js, name)
            return
    _same_retention(config, existing.config)
    config.num_replicas = max(replicas, existing.config.num_replicas or 1)
    config.first_seq = existing.config.first_seq  # where it started, once and for all
    if config.max_bytes is not None and config.max_bytes > 0:
        config.max_bytes = _size_limit(name, config.max_bytes, existing.state.bytes)
    # A message count limit below what a work queue holds is kept: with discard new the
    # server drops nothing, it refuses publishes until intake has read the queue below it.
    await js.update_stream(config=config)
    if replicas > 1:
        await await_leader(js, name)


class StreamRetentionDiffers(Conflict):
    """A stream exists with another retention than this mdq gives it (made by another build
    of mdq): the server changes no stream's retention to or from a work queue in place."""


def _same_retention(wanted: StreamConfig, existing: StreamConfig) -> None:
    """Refuse, saying what to do, to update a stream whose retention is not ``wanted``'s."""
    # the server's answer holds the retention as a plain string
    want = RetentionPolicy(wanted.retention or RetentionPolicy.LIMITS)
    have = RetentionPolicy(existing.retention or RetentionPolicy.LIMITS)
    if want == have:
        return
    name = wanted.name or ""
    raise StreamRetentionDiffers(
        f"stream {name} has {have.value} retention, and this mdq makes it {want.value}, which "
        "the server cannot change in place: it was made by another build of mdq. Delete it "
        f"as admin (`nats stream rm {name}`; what it holds is lost, so let intake handle it "
        "first) and run the setup again (`mdq up`; a tenant's: `mdq tenant add`), or start "
        "the stack afresh (remove its state folder, .mdq or MDQ_STATE_DIR)"
    )


def _size_limit(stream: str, wanted: int, held: int) -> int:
    """The size limit to give ``stream``: ``wanted``, never below the ``held`` bytes (that
    would drop history, or refuse every new event, at once); a warning says when it stays."""
    if wanted >= held:
        return wanted
    log.warning(
        "stream %s holds %d bytes, more than its new size limit %d: the limit stays at %d; "
        "trim the stream on purpose first if you mean to",
        stream,
        held,
        wanted,
        held,
    )
    return held


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


async def open_bucket(
    js: JetStreamContext, config: KeyValueConfig, *, storage: StorageSettings | None = None
) -> KeyValue:
    """Open the KV bucket of ``config`` as it is when it exists (created concurrently, or
    with another config), or create it; with at least ``config.replicas``
    copies. An existing bucket is only read first: opening one needs no right to manage it.

    A bucket made here has a size limit: ``config.max_bytes``, or else ``bucket_bytes`` of
    ``storage`` (``MDQ_STORAGE_BUCKET_BYTES``). The setup brings older buckets' limits up to
    date (``ensure_bucket_limits``)."""
    if not config.max_bytes or config.max_bytes < 0:
        config.max_bytes = int((storage or StorageSettings()).bucket_bytes)
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


async def ensure_local_buckets(
    js: JetStreamContext, subjects: Subjects, *, replicas: int = 1
) -> tuple[KeyValue, KeyValue]:
    """Create (idempotently) and open the local backend's pods and nodes buckets of
    ``subjects``' namespace, in that order, with ``replicas`` copies (``MDQ_STREAM_REPLICAS``);
    what they hold is ``mdq.backends.local.records``'."""
    pods, nodes = [
        await open_bucket(
            js, KeyValueConfig(bucket=name, history=1, storage=StorageType.FILE, replicas=replicas)
        )
        for name in (subjects.pods_bucket, subjects.nodes_bucket)
    ]
    return pods, nodes


def bucket_limits(subjects: Subjects, storage: StorageSettings) -> dict[str, tuple[int, float]]:
    """Every bucket of the namespace -> (size limit in bytes, age limit in seconds, 0: none).

    Only intake's registry and job control's answers (the duplicate window) have an age limit
    of these settings; the waiting view and the lease set their own short ones when they make
    their bucket, and the policies, the snapshots and the local backend's tables are state kept
    in place (one value per key), not history, so they have none."""
    bucket = int(storage.bucket_bytes)
    limits = {
        name: (bucket, 0.0)
        for name in (
            subjects.tenants_bucket,
            subjects.pods_bucket,
            subjects.nodes_bucket,
            subjects.waiting_bucket,
            subjects.placement_snapshot_bucket,
            subjects.recovery_snapshot_bucket,
            subjects.lease_bucket,
        )
    }
    # job control's answers, for the same duplicate window as submits'
    limits[subjects.control_bucket] = (int(storage.registry_bytes), storage.registry_days * DAY_S)
    return limits


async def ensure_bucket_limits(
    js: JetStreamContext, subjects: Subjects, storage: StorageSettings | None = None
) -> None:
    """Give the namespace's existing buckets the size (and, where it has one, age) limit of
    ``storage``, as admin: a bucket made without them gets them. A missing bucket is
    left to its owner, which makes it with these limits."""
    for bucket, (max_bytes, max_age) in bucket_limits(
        subjects, storage or StorageSettings()
    ).items():
        await ensure_bucket_limit(
            js,
            bucket,
            max_bytes=max_bytes,
            max_age_s=max_age,
            direct=bucket == subjects.waiting_bucket,  # read by tenants, their own keys
        )


async def ensure_bucket_limit(
    js: JetStreamContext,
    bucket: str,
    *,
    max_bytes: int,
    max_age_s: float = 0.0,
    direct: bool = False,
) -> None:
    """Set an existing bucket's size limit (never below what it holds, as for streams) and,
    when ``max_age_s`` > 0, its age limit; with ``direct``, turn its direct gets on (a bucket
    made before they were). A bucket that does not exist is left alone."""
    try:
        info = await js.stream_info(f"KV_{bucket}")
    except NotFoundError:
        return
    config = info.config
    wanted_bytes = _size_limit(f"KV_{bucket}", max_bytes, info.state.bytes)
    wanted_age = max_age_s if max_age_s > 0 else (config.max_age or 0.0)
    wanted_direct = bool(config.allow_direct) or direct
    if (config.max_bytes, config.max_age or 0.0, bool(config.allow_direct)) == (
        wanted_bytes,
        wanted_age,
        wanted_direct,
    ):
        return
    config.max_bytes, config.max_age = wanted_bytes, wanted_age
    config.allow_direct = wanted_direct
    await js.update_stream(config=config)
    log.info("bucket %s: size limit %d bytes, age limit %g s", bucket, wanted_bytes, wanted_age)
