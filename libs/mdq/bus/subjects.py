"""Subject and stream names of one mdq namespace (see proto/mdq/v1/mdq.proto)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import quote, unquote

from mdq.contracts import pb

_TOKEN = re.compile(r"^[A-Za-z0-9_-]{1,32}$")
"""A namespace: one subject token of at most 32 characters (every subject, stream and
identity's permissions grow with it: ``mdq.embedded.MAX_CONTROL_LINE``)."""


WILDCARDS = ("*", ">")


def node_token(node: str) -> str:
    """A node's name as one subject token.

    Kubernetes names nodes with DNS subdomains (``ip-10-0-0-1.ec2.internal``), and a dot
    separates a subject's tokens: the dot, ``%`` and anything else a token may not hold are
    percent-escaped (``ip-10-0-0-1%2Eec2%2Einternal``), reversibly (``node_name``); ``/``, which
    joins a cluster and its node, stays. A wildcard stays a wildcard: every node."""
    if node in WILDCARDS:
        return node
    return quote(node, safe="/").replace(".", "%2E")


def node_name(token: str) -> str:
    """The node whose subject token is ``token`` (``node_token`` reversed)."""
    return unquote(token)


STORED_TOKEN = "in"
"""The token a closed bus adds to a tenant's submit subject in the streams account
(``Subjects.submit_stored``)."""


@dataclass(frozen=True, slots=True)
class Subjects:
    """All subjects and stream names under ``namespace`` (default "mdq")."""

    namespace: str = "mdq"
    local_cluster: str = ""
    """The local backend's cluster these names are for ("" the one unnamed cluster): each
    local cluster of a multi-cluster deployment has its own pods and nodes buckets
    (``mdq.backends.clusters``); every other name is the namespace's."""

    def __post_init__(self) -> None:
        if not _TOKEN.match(self.namespace):
            raise ValueError(f"namespace must match {_TOKEN.pattern}: {self.namespace!r}")
        if self.local_cluster and not _TOKEN.match(self.local_cluster):
            raise ValueError(f"local cluster must match {_TOKEN.pattern}: {self.local_cluster!r}")

    def for_local_cluster(self, cluster: str) -> Subjects:
        """The names of ``cluster``'s local backend ("" the unnamed one) in this namespace."""
        return Subjects(self.namespace, cluster)

    # -- subjects ------------------------------------------------------------------------
    @property
    def submit(self) -> str:
        """Fire-and-forget submits of the operator's identity, captured by the submit stream."""
        return f"{self.namespace}.submit"

    @property
    def api_submit(self) -> str:
        """Request-reply submits of the operator's identity."""
        return f"{self.namespace}.api.submit"

    def submit_for(self, tenant: str = "") -> str:
        """Fire-and-forget submits of ``tenant`` ("" = the operator): the server lets each
        tenant publish only on its own token, and intake takes the tenant from it."""
        return f"{self.submit}.{tenant}" if tenant else self.submit

    @property
    def submit_capture(self) -> str:
        """What the submit stream captures: ``NS.*``, the operator's submit subject
        (``NS.submit``) by a wildcard. A stream listening on a literal subject would store what a
        push consumer delivers there (a consumer is active while a subscription on exactly its
        delivery subject exists, and a stream subscribes to its subjects as written), so no
        stream of a closed bus captures a literal subject (docs/security.md, "No delivery into a
        stream"). No other subject of the namespace has one token after it."""
        return f"{self.namespace}.*"

    def submit_stored(self, tenant: str) -> str:
        """Where a submit of ``tenant`` (``submit_for(tenant)``) lands in the streams account
        of a closed bus: one more token, ``in``, which the users account's import adds
        (``mdq.bus.security.permissions.account_bridge``), so its submit stream captures it with a
        wildcard, ``NS.submit.<tenant>.*`` (``submit_capture``). ``tenant`` "*": every
        tenant's."""
        return f"{self.submit_for(tenant)}.{STORED_TOKEN}"

    def api_submit_for(self, tenant: str = "") -> str:
        """Request-reply submits of ``tenant`` ("" = the operator)."""
        return f"{self.api_submit}.{tenant}" if tenant else self.api_submit

    @property
    def api_control(self) -> str:
        """Request-reply job control of the operator's identity (placement's leader answers)."""
        return f"{self.namespace}.api.control"

    def api_control_for(self, tenant: str = "") -> str:
        """Request-reply job control of ``tenant`` ("" = the operator): the server lets each
        tenant request only on its own token, and placement controls that tenant's jobs only."""
        return f"{self.api_control}.{tenant}" if tenant else self.api_control

    @property
    def api_control_subjects(self) -> list[str]:
        """Every job-control subject: the operator's and each tenant's."""
        return [self.api_control, self.api_control_for("*")]

    def tenant_of_control(self, subject: str) -> str:
        """The tenant whose job-control subject ``subject`` is ("" = the operator)."""
        prefix = self.api_control + "."
        return subject[len(prefix) :] if subject.startswith(prefix) else ""

    def runner_creds(self, job_id: str = "*") -> str:
        """Where the runner of ``job_id`` asks for fresh credentials (request-reply;
        ``mdq.bus.security.runner_creds``); ">" for every job, tenants' two-token ids included."""
        return f"{self.namespace}.api.runner_creds.{job_id}"

    def api_inputs(self, job_id: str = "*") -> str:
        """Where the runner of ``job_id`` asks intake for its input files' bytes
        (request-reply, ``mdq.bus.inputs``); ">" for every job, tenants' two-token ids
        included."""
        return f"{self.namespace}.api.inputs.{job_id}"

    def job_of_api_inputs(self, subject: str) -> str:
        """The job id of an ``api_inputs`` subject ("" if it is not one)."""
        base = f"{self.namespace}.api.inputs."
        return subject[len(base) :] if subject.startswith(base) else ""

    def tenant_of_submit(self, subject: str) -> str:
        """The tenant whose submit subject (either entrance) ``subject`` is; "" = operator."""
        for base in (self.submit, self.api_submit):
            if subject.startswith(base + "."):
                return subject[len(base) + 1 :].split(".", 1)[0]  # ``submit_stored`` too
        return ""

    @property
    def api_submit_subjects(self) -> list[str]:
        """Every request-reply submit subject: the operator's and each tenant's."""
        return [self.api_submit, self.api_submit_for("*")]

    def job(self, job_id: str, kind: str) -> str:
        """One lifecycle event of a job."""
        return f"{self.namespace}.job.{job_id}.{kind}"

    def job_all(self, job_id: str = "*") -> str:
        """Every lifecycle event of one job (or of all jobs)."""
        return f"{self.namespace}.job.{job_id}.>"

    def rejected(self, request_id: str = "*") -> str:
        """The refusal of a submit (a tenant's request id has two tokens: ``alice.<hex>``)."""
        return f"{self.namespace}.rejected.{request_id}"

    def claim(self, request_id: str = "*") -> str:
        """Intake's claim of a submit's request id, stored in the jobs stream in one atomic
        batch with the submit's ``submitted`` events: the record of an accepted submit (not an
        event; docs/intake.md, "The registry")."""
        return f"{self.namespace}.claim.{request_id}"

    @property
    def claims(self) -> list[str]:
        """Every claim subject (a tenant's request id has two tokens)."""
        return [self.claim("*"), self.claim("*.*")]

    @property
    def claim_prefix(self) -> str:
        """What every claim subject starts with."""
        return f"{self.namespace}.claim."

    def progress(self, job_id: str = "*") -> str:
        """MD progress of a job (or, with "*", of every job of the operator)."""
        return f"{self.namespace}.progress.{job_id}"

    @property
    def progress_all(self) -> str:
        """MD progress of every job, the operator's and the tenants' (whose ids have two
        tokens)."""
        return f"{self.namespace}.progress.>"

    def tenant_events(self, tenant: str) -> list[str]:
        """Every subject of ``tenant``'s jobs and refusals: what it may read, and what its own
        stream (``tenant_stream``) gathers from the jobs and progress streams."""
        return [
            self.job_all(f"{tenant}.*"),
            self.rejected(f"{tenant}.*"),
            self.progress(f"{tenant}.*"),
        ]

    def node_load(self, node: str = "*") -> str:
        """Load of a node (or of all nodes), its name one token (``node_token``)."""
        return f"{self.namespace}.node.{node_token(node)}.load"

    def node_summary(self, node: str = "*") -> str:
        """The summarised load of a node (or of all nodes), one per interval."""
        return f"{self.namespace}.node.{node_token(node)}.summary"

    def copy(self, job_id: str, part: str = ">") -> str:
        """A part of the copies of ``job_id``'s checkpoints and outputs in the store every
        cluster shares (``copies_stream``, ``mdq.bus.copies``): ``ckpt.<attempt>.<slot>...``
        or ``out.<attempt>...``; ">" for all of them. The fixed ``ckpt``/``out`` token after
        the id keeps one job's subjects from matching another's (a tenant's id has two
        tokens)."""
        return f"{self.namespace}.copy.{job_id}.{part}"

    @property
    def copies_all(self) -> str:
        """Every job's copies (the copies stream's subjects)."""
        return f"{self.namespace}.copy.>"

    def for_event(self, event: pb.Event) -> str:
        """Where ``event`` is published."""
        kind = event.WhichOneof("body")
        if kind == "progress":
            return self.progress(event.job_id)
        if kind == "node_load":
            return self.node_load(event.node_load.node)
        if kind == "node_summary":
            return self.node_summary(event.node_summary.node)
        if kind == "rejected":
            return self.rejected(event.rejected.request_id)
        if not kind or not event.job_id:
            raise ValueError(f"event {event.event_id!r} has no job id or body")
        return self.job(event.job_id, kind)

    # -- streams -------------------------------------------------------------------------
    @property
    def submit_stream(self) -> str:
        return f"{self.namespace.upper()}_SUBMIT"

    @property
    def jobs_stream(self) -> str:
        return f"{self.namespace.upper()}_JOBS"

    @property
    def progress_stream(self) -> str:
        return f"{self.namespace.upper()}_PROGRESS"

    @property
    def nodes_stream(self) -> str:
        return f"{self.namespace.upper()}_NODES"

    @property
    def node_summaries_stream(self) -> str:
        """Each node's summarised load of the last hour and a bit (the console's nodes page)."""
        return f"{self.namespace.upper()}_NODE_SUMMARIES"

    @property
    def copies_stream(self) -> str:
        """The copies of every job's latest checkpoints and its outputs, shared by every
        cluster (``mdq.bus.copies``): what a retry on another cluster resumes from."""
        return f"{self.namespace.upper()}_COPIES"

    def tenant_submit_stream(self, tenant: str) -> str:
        """The stream that captures one tenant's fire-and-forget submits
        (``submit_for(tenant)``): its message ids (idempotency keys) are deduplicated there,
        among the tenant's own only; the submit stream sources it for intake."""
        return f"{self.namespace.upper()}_SUBMIT_{tenant}"

    def tenant_stream(self, tenant: str) -> str:
        """The stream of one tenant's events, sourced from the jobs and progress streams: the
        only stream a tenant may read, so it sees its own jobs and nothing else."""
        return f"{self.namespace.upper()}_TENANT_{tenant}"

    @property
    def pods_bucket(self) -> str:
        """KV bucket of the local backend's pods (its 'API server')."""
        return (
            f"{self.namespace}_local_{self.local_cluster}_pods"
            if self.local_cluster
            else (f"{self.namespace}_local_pods")
        )

    @property
    def nodes_bucket(self) -> str:
        """KV bucket of the local backend's nodes (capacity, heartbeat, live usage)."""
        return (
            f"{self.namespace}_local_{self.local_cluster}_nodes"
            if self.local_cluster
            else (f"{self.namespace}_local_nodes")
        )

    @property
    def clusters_lost_bucket(self) -> str:
        """KV bucket of the watcher: the execution clusters it declared lost and has not
        fenced yet (key: the cluster; value: JSON, when and which pods), which placement and
        metrics read so that nothing is placed there until its stale pods are gone."""
        return f"{self.namespace}_clusters_lost"

    @property
    def waiting_bucket(self) -> str:
        """KV bucket of placement: why each waiting job is not bound yet (``mdq explain``)."""
        return f"{self.namespace}_waiting"

    @property
    def placement_snapshot_bucket(self) -> str:
        """KV bucket of placement: the snapshot of its state a restart begins from."""
        return f"{self.namespace}_placement_snapshot"

    @property
    def recovery_snapshot_bucket(self) -> str:
        """KV bucket of recovery: the snapshot of its state a restart begins from."""
        return f"{self.namespace}_recovery_snapshot"

    @property
    def lease_bucket(self) -> str:
        """KV bucket of placement: the leader lease of its replicas."""
        return f"{self.namespace}_placement"

    @property
    def tenants_bucket(self) -> str:
        """KV bucket of the admin: each tenant's policy (JSON, key: the tenant's name)."""
        return f"{self.namespace}_tenants"

    def inputs_bucket(self, tenant: str = "") -> str:
        """Object Store bucket of the input files of ``tenant``'s jobs ("" = the operator's),
        each object named by its sha256 (``mdq.bus.inputs``): a bucket per tenant, so its size
        limit is the tenant's and the server lets each tenant write only its own."""
        return f"{self.namespace}_inputs_{tenant}" if tenant else f"{self.namespace}_inputs"

    @property
    def control_bucket(self) -> str:
        """KV bucket of placement: each job-control request's key, content and answer (what a
        resend with the same key is answered), for the duplicate window."""
        return f"{self.namespace}_control"
