"""Subject and stream names of one mdq namespace (see proto/mdq/v1/mdq.proto)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from mdq.contracts import pb

_TOKEN = re.compile(r"^[A-Za-z0-9_-]+$")


@dataclass(frozen=True, slots=True)
class Subjects:
    """All subjects and stream names under ``namespace`` (default "mdq")."""

    namespace: str = "mdq"

    def __post_init__(self) -> None:
        if not _TOKEN.match(self.namespace):
            raise ValueError(f"namespace must match {_TOKEN.pattern}: {self.namespace!r}")

    # -- subjects ------------------------------------------------------------------------
    @property
    def submit(self) -> str:
        """Fire-and-forget submits, captured by the submit stream."""
        return f"{self.namespace}.submit"

    @property
    def api_submit(self) -> str:
        """Request-reply submits."""
        return f"{self.namespace}.api.submit"

    def job(self, job_id: str, kind: str) -> str:
        """One lifecycle event of a job."""
        return f"{self.namespace}.job.{job_id}.{kind}"

    def job_all(self, job_id: str = "*") -> str:
        """Every lifecycle event of one job (or of all jobs)."""
        return f"{self.namespace}.job.{job_id}.>"

    def rejected(self, request_id: str = "*") -> str:
        """The refusal of a submit."""
        return f"{self.namespace}.rejected.{request_id}"

    def progress(self, job_id: str = "*") -> str:
        """MD progress of a job (or of all jobs)."""
        return f"{self.namespace}.progress.{job_id}"

    def node_load(self, node: str = "*") -> str:
        """Load of a node (or of all nodes)."""
        return f"{self.namespace}.node.{node}.load"

    def for_event(self, event: pb.Event) -> str:
        """Where ``event`` is published."""
        kind = event.WhichOneof("body")
        if kind == "progress":
            return self.progress(event.job_id)
        if kind == "node_load":
            return self.node_load(event.node_load.node)
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
    def pods_bucket(self) -> str:
        """KV bucket of the local backend's pods (its 'API server')."""
        return f"{self.namespace}_local_pods"

    @property
    def nodes_bucket(self) -> str:
        """KV bucket of the local backend's nodes (capacity, heartbeat, live usage)."""
        return f"{self.namespace}_local_nodes"

    @property
    def waiting_bucket(self) -> str:
        """KV bucket of placement: why each waiting job is not bound yet (``mdq explain``)."""
        return f"{self.namespace}_waiting"

    @property
    def tenants_bucket(self) -> str:
        """KV bucket of the admin: each tenant's policy (JSON, key: the tenant's name)."""
        return f"{self.namespace}_tenants"

    @property
    def intake_bucket(self) -> str:
        """KV bucket of intake: idempotency keys and known job ids."""
        return f"{self.namespace}_intake"
