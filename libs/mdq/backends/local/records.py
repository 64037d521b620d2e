"""The local backend's "API server": two JetStream KV buckets and the JSON records in them.

``<ns>_local_pods`` holds one record per pod (the attempt's description, its observed status,
whether deletion was requested) and ``<ns>_local_nodes`` one per node (capacity, readiness,
load, heartbeat, problem). Every process of the local backend shares them; a change is a
read-modify-write on the revision read, retried on conflict. Design: docs/backends.md, "The
node agent"; docs/security.md, "A pod describes an attempt; it never says what to run".
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar, cast

from google.protobuf.message import DecodeError, Message
from nats.js import JetStreamContext
from nats.js.errors import (
    APIError,
    KeyDeletedError,
    KeyNotFoundError,
)
from nats.js.kv import KeyValue

from mdq.backends.port import PodSpec, PodUpdate
from mdq.bus.requests import is_wrong_last_sequence
from mdq.bus.streams import ensure_local_buckets
from mdq.bus.subjects import Subjects
from mdq.contracts import pb
from mdq.core.nodes import NodeSample

log = logging.getLogger(__name__)

MessageT = TypeVar("MessageT", bound=Message)
TERMINAL_PHASES = frozenset({pb.POD_SUCCEEDED, pb.POD_FAILED})
POD_FIELDS = frozenset(
    {
        "name",
        "job_id",
        "attempt",
        "node",
        "cpu",
        "memory_mb",
        "priority_class",
        "spec",
        "resume_from",
        "depends_on",
        "threads",
        "status",
        "deletion_requested",
    }
)
"""The fields of a pod record; anything else in a record is ignored."""


def _encode(message: Message) -> str:
    return base64.b64encode(message.SerializeToString(deterministic=True)).decode("ascii")


def _decode(text: str, message: MessageT) -> MessageT:
    """A message from base64 protobuf; ValueError if it is not one."""
    try:
        message.ParseFromString(base64.b64decode(text, validate=True))
    except DecodeError as error:
        raise ValueError(f"not a {message.DESCRIPTOR.name}: {error}") from None
    return message


@dataclass(frozen=True, slots=True)
class PodStatus:
    """What the node agent last observed about a pod."""

    phase: pb.PodPhase = pb.POD_PENDING
    exit_code: int = 0
    reason: str = ""
    message: str = ""


@dataclass(frozen=True, slots=True)
class PodRecord:
    """One pod as stored in the pods bucket."""

    spec: PodSpec
    status: PodStatus = field(default_factory=PodStatus)
    deletion_requested: bool = False

    @property
    def terminal(self) -> bool:
        return self.status.phase in TERMINAL_PHASES

    def to_json(self) -> bytes:
        spec = self.spec
        document: dict[str, Any] = {
            "name": spec.name,
            "job_id": spec.job_id,
            "attempt": spec.attempt,
            "node": spec.node,
            "cpu": spec.cpu,
            "memory_mb": spec.memory_mb,
            "priority_class": spec.priority_class,
            "spec": _encode(spec.spec),
            "resume_from": _encode(spec.resume_from) if spec.resume_from is not None else None,
            "depends_on": list(spec.depends_on),
            "threads": spec.threads,
            "status": {
                "phase": int(self.status.phase),
                "exit_code": self.status.exit_code,
                "reason": self.status.reason,
                "message": self.status.message,
            },
            "deletion_requested": self.deletion_requested,
        }
        return json.dumps(document, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> PodRecord:
        document = json.loads(data)
        if unknown := sorted(set(document) - POD_FIELDS):
            log.warning(
                "pod record %r carries fields mdq never writes (%s): ignored; a pod only ever "
                "runs the runner",
                document.get("name"),
                ", ".join(unknown),
            )
        status = document.get("status") or {}
        resume = document.get("resume_from")
        spec = PodSpec(
            name=str(document["name"]),
            job_id=str(document["job_id"]),
            attempt=int(document["attempt"]),
            node=str(document["node"]),
            cpu=float(document["cpu"]),
            memory_mb=int(document["memory_mb"]),
            priority_class=str(document.get("priority_class", "")),
            spec=_decode(str(document["spec"]), pb.JobSpec()),
            resume_from=_decode(str(resume), pb.Checkpoint()) if resume else None,
            depends_on=tuple(str(dep) for dep in document.get("depends_on") or ()),
            threads=int(document.get("threads", 1)),
        )
        return cls(
            spec=spec,
            status=PodStatus(
                phase=cast(pb.PodPhase, int(status.get("phase", pb.POD_PENDING))),
                exit_code=int(status.get("exit_code", 0)),
                reason=str(status.get("reason", "")),
                message=str(status.get("message", "")),
            ),
            deletion_requested=bool(document.get("deletion_requested", False)),
        )

    def with_status(self, status: PodStatus) -> PodRecord:
        return replace(self, status=status)

    def to_update(self) -> PodUpdate:
        return PodUpdate(
            pod_name=self.spec.name,
            job_id=self.spec.job_id,
            attempt=self.spec.attempt,
            node=self.spec.node,
            phase=self.status.phase,
            exit_code=self.status.exit_code,
            reason=self.status.reason,
            message=self.status.message,
        )


@dataclass(frozen=True, slots=True)
class NodeRecord:
    """One node as stored in the nodes bucket: its report and when its agent wrote it (every
    heartbeat), under its name.

    A local node is never cordoned and knows no cluster (the router over several clusters adds
    that when it samples): the record keeps the report's other fields only.
    """

    node: NodeSample
    heartbeat_unix: float

    def to_json(self) -> bytes:
        node = self.node
        return json.dumps(
            {
                "problem": node.problem,
                "cpu_capacity": node.cpu_capacity,
                "memory_capacity_mb": node.memory_capacity_mb,
                "ready": node.ready,
                "cpu_load": node.cpu_load,
                "memory_load": node.memory_load,
                "heartbeat_unix": self.heartbeat_unix,
            },
            sort_keys=True,
        ).encode()

    @classmethod
    def from_json(cls, name: str, data: bytes) -> NodeRecord:
        document = json.loads(data)
        return cls(
            NodeSample(
                name=name,
                cpu_capacity=float(document["cpu_capacity"]),
                memory_capacity_mb=int(document["memory_capacity_mb"]),
                ready=bool(document["ready"]),
                cpu_load=float(document["cpu_load"]),
                memory_load=float(document["memory_load"]),
                problem=str(document.get("problem") or ""),
            ),
            heartbeat_unix=float(document["heartbeat_unix"]),
        )


@dataclass(frozen=True, slots=True)
class Buckets:
    """The two buckets of a namespace."""

    pods: KeyValue
    nodes: KeyValue


async def ensure_buckets(js: JetStreamContext, subjects: Subjects, *, replicas: int = 1) -> Buckets:
    """Create (idempotently) and open the pods and nodes buckets of ``subjects``' namespace,
    with ``replicas`` copies (``MDQ_STREAM_REPLICAS``)."""
    pods, nodes = await ensure_local_buckets(js, subjects, replicas=replicas)
    return Buckets(pods=pods, nodes=nodes)


async def read_pod(pods: KeyValue, name: str) -> tuple[PodRecord, int] | None:
    """The pod record and its revision, or None when there is no such pod."""
    try:
        entry = await pods.get(name)
    except (KeyNotFoundError, KeyDeletedError):
        return None
    if not entry.value:
        return None
    return PodRecord.from_json(entry.value), int(entry.revision or 0)


PodChange = Callable[[PodRecord], PodRecord | None]
"""Returns the new record, or None to leave the pod as it is."""


async def update_pod(pods: KeyValue, name: str, change: PodChange) -> PodRecord | None:
    """Apply ``change`` to the current record of ``name`` with optimistic concurrency.

    Returns the record written, or None when the pod is gone or ``change`` declined.
    """
    while True:
        current = await read_pod(pods, name)
        if current is None:
            return None
        record, revision = current
        new = change(record)
        if new is None:
            return None
        try:
            await pods.update(name, new.to_json(), last=revision)
        except APIError as error:
            if is_wrong_last_sequence(error):
                continue
            raise
        return new
