"""Deterministic identities: request, job, pod and event ids (DESIGN invariant 3).

Every id is derived from what the client sent, so a redelivered submit, a restarted service or
a replayed log computes the same ids and JetStream's Nats-Msg-Id deduplication drops the copy.
"""

from __future__ import annotations

import hashlib

REQUEST_ID_HEX = 12


def request_id_for_key(idempotency_key: str) -> str:
    """The request id of a submit that carries an idempotency key."""
    return hashlib.sha256(f"key:{idempotency_key}".encode()).hexdigest()[:REQUEST_ID_HEX]


def request_id_for_sequence(stream_sequence: int) -> str:
    """The request id of a keyless submit captured by the submit stream."""
    return hashlib.sha256(f"seq:{stream_sequence}".encode()).hexdigest()[:REQUEST_ID_HEX]


def job_id(request_id: str, job_name: str) -> str:
    """A job's id: its submit's request id and its name."""
    return f"{request_id}-{job_name}"


def pod_name(job: str, attempt: int) -> str:
    """The pod (or local process) name of one attempt of a job."""
    return f"mdq-{job}-{attempt}"


def event_id(kind: str, job: str, attempt: int, detail: str | int | None = None) -> str:
    """The Nats-Msg-Id of an event: the same fact always gets the same id."""
    base = f"{kind}:{job}:{attempt}"
    return base if detail is None else f"{base}:{detail}"
