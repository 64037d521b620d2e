"""Deterministic identities: request, job, pod and event ids (docs/architecture.md, invariant 3).

Every id is derived from what the client sent, so a redelivered submit, a restarted service or
a replayed log computes the same ids and JetStream's Nats-Msg-Id deduplication drops the copy.
"""

from __future__ import annotations

import hashlib

REQUEST_ID_HEX = 12


TENANT_SEPARATOR = "."
"""Between a tenant's name and the rest of its request and job ids: the tenant is a subject
token of its own (``mdq.job.<tenant>.<hex>-<name>.<kind>``), so the server can enforce who
reads what with subject permissions."""


def _scoped(tenant: str, hex_id: str) -> str:
    return f"{tenant}{TENANT_SEPARATOR}{hex_id}" if tenant else hex_id


def request_id_for_key(idempotency_key: str, tenant: str = "") -> str:
    """The request id of a submit that carries an idempotency key: keys are per tenant (two
    tenants' "run-1" are two requests, and neither learns of the other's)."""
    seed = f"key:{tenant}:{idempotency_key}" if tenant else f"key:{idempotency_key}"
    return _scoped(tenant, hashlib.sha256(seed.encode()).hexdigest()[:REQUEST_ID_HEX])


def request_id_for_sequence(stream_sequence: int, tenant: str = "") -> str:
    """The request id of a keyless submit captured by the submit stream."""
    digest = hashlib.sha256(f"seq:{stream_sequence}".encode()).hexdigest()[:REQUEST_ID_HEX]
    return _scoped(tenant, digest)


def tenant_of(job_or_request_id: str) -> str:
    """The tenant of a job (or request) id; "" for the operator's jobs, which have none."""
    tenant, separator, _ = job_or_request_id.partition(TENANT_SEPARATOR)
    return tenant if separator else ""


def request_id_of(job: str) -> str:
    """The request id of the submit that made ``job`` (its tenant, if any, and hex digits)."""
    tenant, separator, rest = job.rpartition(TENANT_SEPARATOR)
    return f"{tenant}{separator}{rest[:REQUEST_ID_HEX]}"


def job_name_of(job: str) -> str:
    """The name a job was given in its submit (its id less the tenant and request id)."""
    return job.rpartition(TENANT_SEPARATOR)[2][REQUEST_ID_HEX + 1 :]


def job_id(request_id: str, job_name: str) -> str:
    """A job's id: its submit's request id and its name."""
    return f"{request_id}-{job_name}"


def pod_name(job: str, attempt: int) -> str:
    """The pod (or local process) name of one attempt of a job: a DNS label (a Kubernetes
    pod's hostname is its name), so a tenant's dot becomes a dash."""
    return f"mdq-{job.replace(TENANT_SEPARATOR, '-')}-{attempt}"


def event_id(kind: str, job: str, attempt: int, detail: str | int | None = None) -> str:
    """The Nats-Msg-Id of an event: the same fact always gets the same id."""
    base = f"{kind}:{job}:{attempt}"
    return base if detail is None else f"{base}:{detail}"
