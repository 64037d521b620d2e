"""Who may do what on the bus: the one table of NATS permissions, per identity.

Every process connects as one identity and the server enforces what that identity may publish
and subscribe to. The server's configuration and every identity's credentials are generated
from this table (by ``mdq.bus.security.auth``), and the consumers' own check shares its event
kinds and their producers (``mdq.core.producers``). Pure: no I/O.

The rules and the generated table: docs/security.md, "Who may do what".
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from mdq.bus.subjects import Subjects
from mdq.core.producers import EVENT_PRODUCERS

SERVICES = ("intake", "placement", "watcher", "recovery", "metrics", "agent", "console")
"""The long-running identities, one credential each."""

IDENTITIES = (*SERVICES, "cli", "runners", "admin")
"""Every identity ``mdq up`` and the generator issue. A runner gets credentials of its own per
attempt (the node agent mints them; on Kubernetes placement does, into a Secret per pod);
``runners`` is the shared fallback of a Kubernetes backend given no runner issuer."""

RUNNER_KINDS = ("progress", "checkpoint", "outputs", "usage", "copied", "fetched")
"""What a runner reports about its own job."""

COPY_PARTS = ("ckpt", "out")
"""A job's parts in the copies stream: its checkpoints' copies and its outputs'."""


def _copies(subjects: Subjects, job: str) -> list[str]:
    """Write and read (direct get by subject) the copies of ``job`` ("*": of every job) in
    the store every cluster shares (``mdq.bus.copies``): a runner's own job's, nothing else."""
    if job == "*":
        stream = subjects.copies_stream
        return [subjects.copies_all, f"$JS.API.DIRECT.GET.{stream}.{subjects.copies_all}"]
    parts = [subjects.copy(job, f"{part}.>") for part in COPY_PARTS]
    return [*parts, *(f"$JS.API.DIRECT.GET.{subjects.copies_stream}.{part}" for part in parts)]


@dataclass(frozen=True, slots=True)
class Permissions:
    """What one identity may publish and subscribe to, as NATS subject patterns."""

    identity: str
    publish: tuple[str, ...]
    subscribe: tuple[str, ...]
    respond: bool = False
    """May answer requests it received (a reply to the request's inbox, once, promptly)."""
    inbox_prefix: str = ""
    """Where its replies come back; only it may subscribe there."""
    publish_deny: tuple[str, ...] = ()
    """Carved out of ``publish``: the services' durable consumers, which a reader that may
    make pull consumers of its own on their stream must not pull from, acknowledge, change or
    delete."""
    max_subscriptions: int = -1
    """Subscriptions one connection may hold (-1: no limit), enforced by the server."""
    max_payload: int = -1
    """The largest message one connection may publish, bytes (-1: the server's)."""


DEFAULT_INBOX = "_INBOX"
"""Every NATS client's default reply prefix: the CLI identity's, so that a plain client (the
README's nats-py snippet, the ``nats`` CLI) needs its credentials and no other option. Nobody
else listens there: every service and runner has its own prefix."""


def inbox_prefix(identity: str) -> str:
    """The reply-inbox prefix of ``identity``: ``_INBOX_<identity>``, dots kept (a tenant's job
    id, a runner's identity, has one, and the server fills the runner template's
    ``_INBOX_{{name()}}`` with the name as it is). Prefixes never overlap: a tenant may not be
    named after an identity (``mdq.core.tenants.RESERVED``), so ``_INBOX_intake.>`` holds no
    tenant's runner inbox."""
    if identity == "cli":
        return DEFAULT_INBOX
    return "_INBOX_" + identity


def _inputs_upload(subjects: Subjects, tenant: str = "") -> list[str]:
    """Put files into the inputs bucket of ``tenant`` ("" = the operator's) and read it back
    (``mdq.bus.inputs.upload``: the bucket's info, an object's meta, its own objects' purge
    when a put fails): that bucket and no other."""
    bucket = subjects.inputs_bucket(tenant)
    stream = f"OBJ_{bucket}"
    return [f"$O.{bucket}.>", *_read_stream(stream), f"$JS.API.STREAM.PURGE.{stream}"]


INPUTS_READ = ("$JS.API.DIRECT.GET.*", "$JS.API.DIRECT.GET.*.$O.*.M.*")
"""Intake reads every inputs bucket (a tenant's is made when the tenant is added, so it is not
named in advance): an object's meta by its name, its chunks by sequence (direct gets)."""


def _read_stream(stream: str) -> list[str]:
    """Read a stream through ephemeral ordered consumers and direct gets (no durable).

    Consumers are made by name (``$JS.API.CONSUMER.CREATE.<stream>.<name>[.<filter>]``, as
    ``mdq.bus.nats_fixes`` makes nats-py do), never with the nameless request, whose body may
    name any consumer of the stream, a service's durable included, where no permission sees
    it; the named request's subject carries the name, so ``service_permissions`` denies the
    other services' durables (``_protected``)."""
    return [
        f"$JS.API.STREAM.INFO.{stream}",
        f"$JS.API.STREAM.MSG.GET.{stream}",
        f"$JS.API.DIRECT.GET.{stream}.>",
        f"$JS.API.CONSUMER.CREATE.{stream}.>",
        f"$JS.API.CONSUMER.INFO.{stream}.*",
        f"$JS.FC.{stream}.>",
    ]


def _nameless_creates(publish: Iterable[str], subjects: Subjects) -> list[str]:
    """JetStream's nameless consumer-create request (the consumer's name, if any, in the
    body), which stock clients of older APIs use (nats-py's ordered consumers without
    ``mdq.bus.nats_fixes``, nats.go's legacy ``Subscribe``), on each stream ``publish`` may
    make consumers on that holds no service's durable consumer (a tenant's own stream, a
    bucket, the nodes' streams): nowhere a body could name a durable."""
    prefix = "$JS.API.CONSUMER.CREATE."
    durable_streams = {subjects.submit_stream, subjects.jobs_stream, subjects.progress_stream}
    streams = [
        rest.removesuffix(".>")
        for pattern in publish
        if (rest := _after(pattern, prefix)) and rest.endswith(".>") and rest.count(".") == 1
    ]
    return [prefix + stream for stream in streams if stream not in durable_streams]


def _pull_reader(stream: str) -> list[str]:
    """Read a stream through pull consumers of one's own making, as any language's stock client
    does (nats.js ``js.consumers.get()``, nats.go ``OrderedConsumer``, nats-py
    ``pull_subscribe``): create one by name (with its filter in the subject or not), pull,
    acknowledge, delete it. The services' durables on that stream are carved out
    (``_protected``); the stream's own limits bound how many a tenant keeps
    (``mdq.bus.streams.tenant_stream_config``)."""
    return [
        f"$JS.API.CONSUMER.CREATE.{stream}.>",
        f"$JS.API.CONSUMER.MSG.NEXT.{stream}.*",
        f"$JS.API.CONSUMER.DELETE.{stream}.*",
        f"$JS.ACK.{stream}.>",
    ]


def _durables(subjects: Subjects, names: Names) -> list[tuple[str, str, str]]:
    """The services' durable consumers: (owner, stream, consumer)."""
    jobs_consumer, progress_consumer = names.watcher_consumers
    return [
        ("intake", subjects.submit_stream, names.intake_consumer),
        ("watcher", subjects.jobs_stream, jobs_consumer),
        ("watcher", subjects.progress_stream, progress_consumer),
    ]


def _protected(
    identity: str, publish: Iterable[str], subjects: Subjects, names: Names
) -> list[str]:
    """What ``identity``, allowed ``publish``, may not do to another service's durable
    consumer on a stream it may make consumers on: change (create it anew under its name),
    delete, pull from, acknowledge for it."""
    allowed = set(publish)
    out: list[str] = []
    for owner, stream, durable in _durables(subjects, names):
        if owner == identity or f"$JS.API.CONSUMER.CREATE.{stream}.>" not in allowed:
            continue
        out += [
            f"$JS.API.CONSUMER.CREATE.{stream}.{durable}",
            f"$JS.API.CONSUMER.CREATE.{stream}.{durable}.>",
            f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{durable}",
            f"$JS.API.CONSUMER.DELETE.{stream}.{durable}",
            f"$JS.ACK.{stream}.{durable}.>",
        ]
    return out


def _durable(stream: str, consumer: str) -> list[str]:
    """Own and read through one durable pull consumer ``consumer`` of ``stream``."""
    return [
        f"$JS.API.CONSUMER.CREATE.{stream}.{consumer}",
        f"$JS.API.CONSUMER.CREATE.{stream}.{consumer}.>",
        f"$JS.API.CONSUMER.DURABLE.CREATE.{stream}.{consumer}",
        f"$JS.API.CONSUMER.DELETE.{stream}.{consumer}",
        f"$JS.API.CONSUMER.INFO.{stream}.{consumer}",
        f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{consumer}",
        f"$JS.ACK.{stream}.{consumer}.>",
    ]


def _tenant_submit_consumers(subjects: Subjects, consumer: str) -> list[str]:
    """Make, and read through, a durable pull consumer named ``consumer`` of each tenant's
    submit stream (intake's, ``mdq.bus.streams.tenant_submit_consumer_config``). The streams
    are made when tenants are added, so they are not named here (a stream's name is one token:
    no pattern says "every tenant's submit stream"); the create is granted only by the
    request that names the consumer's filter, a tenant's stored submit subject
    (``NS.submit.<tenant>.in``), which the server refuses on any stream that does not hold
    those subjects: a tenant's submit stream alone. No other identity may make consumers
    there."""
    return [
        f"$JS.API.CONSUMER.CREATE.*.{consumer}.{subjects.submit_stored('*')}",
        f"$JS.API.CONSUMER.INFO.*.{consumer}",
        f"$JS.API.CONSUMER.MSG.NEXT.*.{consumer}",
        f"$JS.ACK.*.{consumer}.>",
    ]


def _bucket(bucket: str, *, write: bool, own: bool = False) -> list[str]:
    """Read (get, watch) a KV bucket; with ``write`` put, update and delete its keys; with
    ``own`` also create it and change its configuration (never purge or delete it)."""
    subjects = _read_stream(f"KV_{bucket}")
    if write:
        subjects.append(f"$KV.{bucket}.>")
    if own:
        subjects += [f"$JS.API.STREAM.CREATE.KV_{bucket}", f"$JS.API.STREAM.UPDATE.KV_{bucket}"]
    return subjects


def _events(subjects: Subjects, kinds: Iterable[str], job: str = "*") -> list[str]:
    """The subjects of the event kinds given, for one job (or, with "*", every job: the
    operator's, whose ids are one token, and the tenants', whose ids are two)."""
    jobs = [job] if job != "*" else ["*", "*.*"]
    out = []
    for kind in kinds:
        if kind == "node_load":
            out.append(subjects.node_load())
        elif kind == "node_summary":
            out.append(subjects.node_summary())
        elif kind == "rejected":
            out += [subjects.rejected(), subjects.rejected("*.*")] if job == "*" else []
        else:
            for each in jobs:
                is_progress = kind == "progress"
                out.append(subjects.progress(each) if is_progress else subjects.job(each, kind))
    return out


def _owned(identity: str) -> list[str]:
    return sorted(kind for kind, producers in EVENT_PRODUCERS.items() if identity in producers)


COMMON_PUBLISH = ("$JS.API.INFO", "$JS.API.STREAM.NAMES")
"""Harmless lookups every JetStream client makes (account info, a stream by its subject)."""


@dataclass(frozen=True, slots=True)
class Names:
    """The durable consumers and buckets that belong to one service, named where the service
    defines them (passed in, so this module depends on no service)."""

    intake_consumer: str = "intake"
    watcher_consumers: tuple[str, str] = ("watcher-jobs", "watcher-progress")
    lease_bucket: str = ""
    """Placement's leader lease ("" = ``<namespace>_placement``)."""
    local_clusters: tuple[str, ...] = ()
    """Named local clusters (``mdq up --clusters``): each has pods and nodes buckets of its
    own, granted as the unnamed cluster's are."""


def _local_buckets(
    subjects: Subjects, names: Names, *, pods: bool | None, nodes: bool | None
) -> list[str]:
    """The local backend's buckets of every local cluster: ``pods`` / ``nodes`` None (not at
    all), False (read) or True (write)."""
    out: list[str] = []
    for cluster in ("", *names.local_clusters):
        local = subjects.for_local_cluster(cluster)
        if pods is not None:
            out += _bucket(local.pods_bucket, write=pods)
        if nodes is not None:
            out += _bucket(local.nodes_bucket, write=nodes)
    return out


def service_permissions(identity: str, subjects: Subjects, names: Names = Names()) -> Permissions:
    """The permissions of one long-running identity (``IDENTITIES``)."""
    lease_bucket = names.lease_bucket or subjects.lease_bucket
    jobs, progress, nodes, submit, summaries = (
        subjects.jobs_stream,
        subjects.progress_stream,
        subjects.nodes_stream,
        subjects.submit_stream,
        subjects.node_summaries_stream,
    )
    publish: list[str] = [*COMMON_PUBLISH, *_events(subjects, _owned(identity))]
    # every service checks on start that the streams exist (``require_streams``)
    publish += [
        f"$JS.API.STREAM.INFO.{stream}"
        for stream in (submit, jobs, progress, nodes, summaries, subjects.copies_stream)
    ]
    subscribe: list[str] = []
    deny: list[str] = []
    respond = False
    if identity == "admin":
        return Permissions(identity, ("$JS.>", "$KV.>", f"{subjects.namespace}.>"), (">",), True)
    if identity == "intake":
        publish += [*_durable(submit, names.intake_consumer), *_read_stream(jobs)]
        # each tenant's submits, from the tenant's own stream at its rate
        publish += _tenant_submit_consumers(subjects, names.intake_consumer)
        publish += subjects.claims  # its claims of request ids, in the jobs stream
        # tenants' policies (the admin's), and their usage as placement counts it
        publish += _bucket(subjects.tenants_bucket, write=False)
        publish += _bucket(subjects.waiting_bucket, write=False)
        publish += INPUTS_READ  # submits' input files, and runners' requests for them
        subscribe += subjects.api_submit_subjects
        subscribe.append(subjects.api_inputs(">"))
        respond = True
    elif identity == "placement":
        publish += [*_read_stream(jobs), *_read_stream(nodes)]
        publish += _bucket(subjects.waiting_bucket, write=True, own=True)
        publish += _bucket(lease_bucket, write=True, own=True)
        publish += _bucket(subjects.placement_snapshot_bucket, write=True, own=True)
        # job control's answers, by control key (services.placement.control)
        publish += _bucket(subjects.control_bucket, write=True, own=True)
        publish += _local_buckets(subjects, names, pods=True, nodes=False)
        publish += _bucket(subjects.clusters_lost_bucket, write=False)
        publish += _bucket(subjects.tenants_bucket, write=False)
        subscribe.append(subjects.runner_creds(">"))  # it mints every runner's credentials
        subscribe += subjects.api_control_subjects  # job control, answered by the leader
        respond = True
    elif identity == "watcher":
        jobs_consumer, progress_consumer = names.watcher_consumers
        publish += [*_durable(jobs, jobs_consumer), *_durable(progress, progress_consumer)]
        publish += [*_read_stream(jobs), *_read_stream(progress)]
        publish += _local_buckets(subjects, names, pods=True, nodes=False)
        # the clusters it declares lost, until it has fenced them (mdq.backends.clusters)
        publish += _bucket(subjects.clusters_lost_bucket, write=True, own=True)
    elif identity == "recovery":
        publish += [*_read_stream(jobs), *_read_stream(progress)]
        publish += _bucket(subjects.recovery_snapshot_bucket, write=True, own=True)
        publish += _local_buckets(subjects, names, pods=True, nodes=None)
    elif identity == "metrics":
        publish += [*_read_stream(jobs), *_read_stream(progress), *_read_stream(nodes)]
        publish += _local_buckets(subjects, names, pods=False, nodes=False)
        publish += _bucket(subjects.clusters_lost_bucket, write=False)
        publish += _bucket(subjects.waiting_bucket, write=False)  # the tenants' fair shares
    elif identity == "agent":
        publish += _local_buckets(subjects, names, pods=True, nodes=True)
        # its pods' runners' first credentials, asked of placement (it holds no key)
        publish += [subjects.runner_creds("*"), subjects.runner_creds("*.*")]
    elif identity == "runners":
        return Permissions(
            identity=identity,
            publish=(
                *_events(subjects, RUNNER_KINDS),
                *_copies(subjects, "*"),
                subjects.api_inputs(">"),
            ),
            subscribe=(f"{inbox_prefix(identity)}.>",),
            inbox_prefix=inbox_prefix(identity),
        )
    elif identity == "console":
        # a reader of every job's events (ordered consumers: live charts and states, the
        # nodes' load and their last hour) that may submit and control jobs on the operator's
        # request-reply entrances (its submit page, its job-control buttons)
        publish += [subjects.api_submit, subjects.api_control]
        publish += [*_read_stream(jobs), *_read_stream(progress), *_read_stream(nodes)]
        publish += _read_stream(summaries)
    elif identity == "cli":
        publish += [subjects.submit, subjects.api_submit, subjects.api_control]
        publish += _inputs_upload(subjects)  # the operator's jobs' input files
        # what a person reads, with mdq's commands or any stock client: ordered and pull
        # consumers of its own (never a service's durable: ``_protected``)
        for stream in (jobs, progress, nodes, summaries):
            publish += [*_read_stream(stream), *_pull_reader(stream)]
        publish += _bucket(subjects.waiting_bucket, write=False)
    else:
        raise ValueError(f"unknown identity {identity!r}; known: {', '.join(IDENTITIES)}")
    prefix = inbox_prefix(identity)
    subscribe.append(f"{prefix}.>")
    deny += _protected(identity, publish, subjects, names)
    publish += _nameless_creates(publish, subjects)
    return Permissions(
        identity=identity,
        publish=tuple(dict.fromkeys(publish)),
        subscribe=tuple(subscribe),
        respond=respond,
        inbox_prefix=prefix,
        publish_deny=tuple(deny),
    )


TENANT_MAX_SUBSCRIPTIONS = 256
"""Subscriptions a tenant's connection may hold: its replies' and its consumers' (at most
``MDQ_STORAGE_TENANT_CONSUMERS`` of those) with room to spare, not a flood of them."""
TENANT_MAX_PAYLOAD = 1024 * 1024
"""The largest message a tenant may publish: a submit at its largest (``MAX_SUBMIT_BYTES``)."""

TENANT_PREFIX = "tenant."
"""A tenant's identity is ``tenant.<name>`` (its credentials' name, ``identity_of_creds``)."""


def tenant_identity(tenant: str) -> str:
    """The NATS identity of ``tenant``."""
    return TENANT_PREFIX + tenant


def tenant_of_identity(identity: str) -> str:
    """The tenant an identity stands for ("" if it is not a tenant's)."""
    return identity.removeprefix(TENANT_PREFIX) if identity.startswith(TENANT_PREFIX) else ""


def tenant_permissions(subjects: Subjects, tenant: str) -> Permissions:
    """A tenant may submit and control jobs on its own subjects (placement acts on its own
    jobs only), read and follow its own stream (its jobs' events, refusals and progress,
    ``Subjects.tenant_stream``), read the info of its own submit stream (how many of its
    submits wait for intake: what the SDK says when the stream is full; no consumer, no
    message) and placement's word on why each of its own jobs waits (the waiting bucket's keys
    of its job ids, by direct get): nothing else. Not even the
    names of the streams or the account's figures (``$JS.API.STREAM.NAMES`` would list the
    other tenants' streams): a tenant's client names its stream itself."""
    identity = tenant_identity(tenant)
    stream = subjects.tenant_stream(tenant)
    prefix = inbox_prefix(identity)
    publish = [
        subjects.submit_for(tenant),
        subjects.api_submit_for(tenant),
        subjects.api_control_for(tenant),
    ]
    publish += [*_read_stream(stream), *_pull_reader(stream)]
    publish.append(f"$JS.API.STREAM.INFO.{subjects.tenant_submit_stream(tenant)}")
    # why its own jobs wait: placement's entries of their ids, by a direct get of each key
    waiting = subjects.waiting_bucket
    publish.append(f"$JS.API.DIRECT.GET.KV_{waiting}.$KV.{waiting}.{tenant}.>")
    publish += _inputs_upload(subjects, tenant)  # its jobs' input files, in its own bucket
    publish += _nameless_creates(publish, subjects)
    return Permissions(
        identity=identity,
        publish=tuple(dict.fromkeys(publish)),
        subscribe=(f"{prefix}.>",),
        inbox_prefix=prefix,
        max_subscriptions=TENANT_MAX_SUBSCRIPTIONS,
        max_payload=TENANT_MAX_PAYLOAD,
    )


RUNNER_NAME = "{{name()}}"
"""In a runner's permission template, the job id: the name its credentials were issued to."""


def runner_permissions(subjects: Subjects, job_id: str = RUNNER_NAME) -> Permissions:
    """A runner may publish its own job's progress, checkpoints and outputs, ask for fresh
    credentials and for its input files for its own job, and hear the answers in its own inbox:
    nothing else, not even the names of the streams or the account's figures
    (``COMMON_PUBLISH``: they would name, or count, the tenants).

    Its identity is the job id (ids never clash with a service's name: they start with 12 hex
    digits and a dash). With the default ``job_id`` this is the template of the account's
    runner signing key (``mdq.bus.security.auth``): the server fills in the job id of each runner's
    credentials, so whoever holds that key can mint runner credentials, and nothing more."""
    identity = job_id
    prefix = inbox_prefix(identity)
    renewal = subjects.runner_creds(job_id)  # fresh credentials for its own job only
    return Permissions(
        identity=identity,
        publish=(
            *_events(subjects, RUNNER_KINDS, job_id),
            *_copies(subjects, job_id),
            renewal,
            subjects.api_inputs(job_id),  # its own job's input files, served by intake
        ),
        subscribe=(f"{prefix}.>",),
        inbox_prefix=prefix,
    )


PULL_REQUESTS = "$JS.API.CONSUMER.MSG.NEXT.>"
"""A pull consumer's requests: one request, up to a batch of messages back."""
JETSTREAM_API = (
    "$JS.API.INFO",
    "$JS.API.STREAM.>",
    "$JS.API.DIRECT.>",
    "$JS.API.ACCOUNT.>",
    "$JS.API.META.>",
    "$JS.API.SERVER.>",
    *(
        f"$JS.API.CONSUMER.{verb}.>"
        for verb in ("CREATE", "DURABLE", "INFO", "DELETE", "NAMES", "LIST", "PAUSE", "UNPIN")
    ),
    "$JS.API.CONSUMER.LEADER.>",
    PULL_REQUESTS,
)
"""The JetStream API, in parts that do not overlap (an import matches one of them only), so
that pull requests alone are bridged with many answers."""


@dataclass(frozen=True, slots=True)
class Bridge:
    """What crosses between the two accounts of a deployment (``mdq.bus.security.auth``): the
    *streams* account holds every stream and bucket and no user may log in to it; every identity
    logs in to the *users* account, which reaches the streams through imports.

    A JetStream API request is answered in the requester's own account, on the reply subject it
    named there, so naming a stream's subject as the reply subject (nats-server discussion
    #8924) stores nothing: no stream listens in the users account. The same holds for a push
    consumer's delivery subject, which the server delivers in the streams account, where only
    the inboxes exported back have any interest."""

    services: tuple[str, ...]
    """Subjects the users account sends into the streams account (requests and publishes whose
    answer, if any, comes back to the sender): the JetStream API, acknowledgements, flow
    control, KV writes, and the subjects the streams capture."""
    streams: tuple[str, ...]
    """Subjects the streams account sends back unasked: push consumers' deliveries (ordered
    consumers, KV watches) to each identity's reply inbox."""
    mapped: tuple[tuple[str, str], ...] = ()
    """Subjects the users account sends into the streams account under another name: (the
    subject its clients publish on, the subject it lands on there). A tenant's submit gains a
    token (``Subjects.submit_stored``), so its stream captures it with a wildcard."""
    multi_response: tuple[str, ...] = (PULL_REQUESTS,)
    """Services whose one request may have many answers (a pull request's messages): the
    server keeps the way back open until none came for a while (2 minutes), so only these are
    bridged that way; every other request's way back closes with its one answer."""


def account_bridge(subjects: Subjects) -> Bridge:
    """The imports and exports between the users and the streams account of ``subjects``'s
    namespace. Only mdq's streams' subjects cross, never request-reply subjects of services
    (``mdq.api.>`` stays in the users account, between its client and intake)."""
    captured = [
        # The operator's submit subject is one token under the namespace, but bridged by a
        # wildcard: a JetStream answer landing in the users account on a subject that is
        # imported *literally* is passed on into the streams account (and stored), while on a
        # wildcard import it is not (nats-server 2.15; test_bus_permissions'
        # test_the_reply_subject_trick_stores_nothing). No other subject has one token there.
        f"{subjects.namespace}.*",
        subjects.job_all("*"),
        f"{subjects.namespace}.rejected.>",
        f"{subjects.namespace}.claim.>",
        subjects.progress_all,
        # the nodes' load reports and their summaries (NS_NODES, NS_NODE_SUMMARIES)
        f"{subjects.namespace}.node.>",
        subjects.copies_all,  # the runners' copies of checkpoints and outputs (NS_COPIES)
        "$O.>",  # the input files' object stores (an upload's chunks and meta)
    ]
    inboxes = [inbox_prefix(identity) for identity in IDENTITIES if identity != "runners"]
    inboxes.append(inbox_prefix(TENANT_PREFIX.rstrip(".")))
    return Bridge(
        services=(*JETSTREAM_API, "$JS.ACK.>", "$JS.FC.>", "$KV.>", *captured),
        streams=tuple(f"{prefix}.>" for prefix in inboxes),
        # a tenant's submit, NS.submit.<tenant>, lands as NS.submit.<tenant>.in (no stream may
        # listen on a literal subject: a push consumer could deliver into it)
        mapped=((subjects.submit_for("*"), subjects.submit_stored("*")),),
    )


def markdown_table(subjects: Subjects | None = None) -> str:
    """The permission table of docs/security.md, generated from the patterns of this module (a
    test keeps the two equal): what each identity may publish, read, own and listen to."""
    subjects = subjects or Subjects()
    rows = [
        "| identity | publishes | reads (streams; buckets) | writes buckets | owns | listens on |",
        "|---|---|---|---|---|---|",
    ]
    for identity in IDENTITIES:
        rows.append(_row(service_permissions(identity, subjects), subjects))
    rows.append(_row(runner_permissions(subjects, "<job>"), subjects))
    rows.append(_row(tenant_permissions(subjects, "<tenant>"), subjects))
    return "\n".join(rows) + "\n"


def _after(pattern: str, prefix: str) -> str | None:
    return pattern[len(prefix) :] if pattern.startswith(prefix) else None


def _row(permissions: Permissions, subjects: Subjects) -> str:
    if permissions.identity == "admin":
        return "| `admin` | everything | everything | everything | every stream and bucket | `>` |"
    events: list[str] = []
    streams: list[str] = []
    buckets: list[str] = []
    writes: list[str] = []
    owns: list[str] = []
    for pattern in permissions.publish:
        if not pattern.startswith(("$", "_")):
            events.append(pattern)
        elif pattern == "$JS.API.DIRECT.GET.*":
            streams.append("any stream's messages by sequence (the inputs buckets)")
        elif pattern == "$JS.API.DIRECT.GET.*.$O.*.M.*":
            streams.append("any object store's metas by name")
        elif (info := _after(pattern, "$JS.API.STREAM.INFO.")) and info.startswith(
            subjects.tenant_submit_stream("")
        ):
            streams.append(f"{info} (its info alone: the submits waiting)")
        elif (direct := _after(pattern, "$JS.API.DIRECT.GET.")) and direct.partition(".")[2] != ">":
            read, _, subject = direct.partition(".")  # direct gets of some subjects only
            streams.append(f"{read} ({subject})")
        elif (
            (stream := _after(pattern, "$JS.API.CONSUMER.CREATE."))
            and stream.endswith(".>")
            and stream.count(".") == 1
        ):
            stream = stream.removesuffix(".>")  # a reader: it makes consumers of its own
            if f"$JS.API.CONSUMER.MSG.NEXT.{stream}.*" in permissions.publish:
                stream += " (pull)"
            (buckets if stream.startswith("KV_") else streams).append(stream.removeprefix("KV_"))
        elif durable := _after(pattern, "$JS.API.CONSUMER.DURABLE.CREATE."):
            owns.append(f"consumer {durable.replace('.', '/')}")
        elif (each := _after(pattern, "$JS.API.CONSUMER.CREATE.*.")) and each.endswith(
            f".{subjects.submit_stored('*')}"
        ):
            consumer = each.partition(".")[0]
            stream = subjects.tenant_submit_stream("<tenant>")
            owns.append(f"consumer {stream}/{consumer} (each tenant's)")
        elif (bucket := _after(pattern, "$KV.")) is not None:
            writes.append(bucket.removesuffix(".>"))
        elif (bucket := _after(pattern, "$O.")) is not None:
            writes.append(f"object store {bucket.removesuffix('.>')}")
        elif bucket := _after(pattern, "$JS.API.STREAM.CREATE.KV_"):
            owns.append(f"bucket {bucket}")

    def cell(items: list[str]) -> str:
        return ", ".join(f"`{item}`" for item in items) or "—"

    reads = cell(streams) + ("; " + cell(buckets) if buckets else "")
    name = f"`{permissions.identity}`"
    if permissions.identity.startswith("<"):
        name = f"runner of {name}"
    elif tenant := tenant_of_identity(permissions.identity):
        name = f"tenant `{tenant}` (identity `{permissions.identity}`)"
    listens = cell(list(permissions.subscribe))
    if permissions.respond:
        listens += " (answers requests)"
    return f"| {name} | {cell(events)} | {reads} | {cell(writes)} | {cell(owns)} | {listens} |"


if __name__ == "__main__":
    print(markdown_table(), end="")
