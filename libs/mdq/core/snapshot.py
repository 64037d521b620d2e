"""A service's snapshot: its state at one jobs-stream sequence, so a restart replays only the
tail of the log (pure: encoding, checking, and deciding whether it may be used).

Placement's or recovery's state as compressed JSON in chunks, committed by a small head naming
the chunks, the sequence and the stream's identity (``mdq.bus.snapshots`` stores it). It is
never the truth: ``resume`` uses it only while the log still holds everything after it.

The format and the checks: docs/placement.md, "Restarting from a snapshot".
"""

from __future__ import annotations

import hashlib
import json
import zlib
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from mdq.core.log_continuity import ServerLog, StoredOffset, Verdict, check

HEAD_FORMAT = 1
"""Bumped when the head's or the payload's layout changes; any other is unreadable."""
CHUNK_BYTES = 512 * 1024
"""The largest chunk (NATS' default max payload is 1 MiB; a KV value is one message)."""
SLOTS = ("a", "b")
"""Two sets of chunk keys, used in turn: a snapshot is written into the slot the head does not
name, so a reader of the current one is never overwritten by the next."""


class SnapshotUnreadable(ValueError):
    """The snapshot cannot be used: it does not parse, has another format, or its chunks are
    not the ones its head describes."""


@dataclass(frozen=True, slots=True)
class Head:
    """What one snapshot holds and where its chunks are (the value written last, in one put)."""

    slot: str
    chunks: int
    sha256: str
    """SHA-256 of the uncompressed JSON of the state."""
    stream: str
    stream_created: datetime
    sequence: int
    """The last jobs-stream sequence folded into the state."""
    digest: str | None
    """``log_continuity.message_digest`` of the message at ``sequence`` (None: not read)."""
    jobs: int
    written_at: datetime

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "format": HEAD_FORMAT,
                "slot": self.slot,
                "chunks": self.chunks,
                "sha256": self.sha256,
                "stream": self.stream,
                "stream_created": self.stream_created.isoformat(),
                "sequence": self.sequence,
                "digest": self.digest,
                "jobs": self.jobs,
                "written_at": self.written_at.isoformat(),
            },
            separators=(",", ":"),
        ).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> Head:
        """The head ``to_json`` wrote; raises ``SnapshotUnreadable`` for anything else."""
        try:
            data = json.loads(raw)
            if data.get("format") != HEAD_FORMAT:
                raise SnapshotUnreadable(f"head format {data.get('format')!r}, not {HEAD_FORMAT}")
            head = cls(
                slot=str(data["slot"]),
                chunks=int(data["chunks"]),
                sha256=str(data["sha256"]),
                stream=str(data["stream"]),
                stream_created=datetime.fromisoformat(data["stream_created"]),
                sequence=int(data["sequence"]),
                digest=None if data["digest"] is None else str(data["digest"]),
                jobs=int(data["jobs"]),
                written_at=datetime.fromisoformat(data["written_at"]),
            )
        except SnapshotUnreadable:
            raise
        except (ValueError, TypeError, KeyError, AttributeError) as error:
            raise SnapshotUnreadable(f"head does not parse: {error!r}") from error
        if head.slot not in SLOTS or head.chunks < 1 or head.sequence < 0:
            raise SnapshotUnreadable(f"head out of range: {head}")
        return head


def chunk_key(slot: str, index: int) -> str:
    """The KV key of chunk ``index`` of ``slot``."""
    return f"{slot}.{index}"


def next_slot(head: Head | None) -> str:
    """The slot the next snapshot goes into: the one the current head does not name."""
    return SLOTS[1] if head is not None and head.slot == SLOTS[0] else SLOTS[0]


def encode(state: dict[str, Any]) -> tuple[str, list[bytes]]:
    """The state's (``PlacementState.snapshot()``) SHA-256 and its compressed chunks. The
    nodes' loads are left out: they are read from the nodes stream on every start, and a load
    report alone is no reason to write a snapshot again."""
    content = dict(state, nodes=[])
    raw = json.dumps(content, separators=(",", ":"), sort_keys=True).encode()
    packed = zlib.compress(raw, 6)
    chunks = [packed[i : i + CHUNK_BYTES] for i in range(0, len(packed), CHUNK_BYTES)]
    return hashlib.sha256(raw).hexdigest(), chunks or [b""]


def decode(head: Head, chunks: list[bytes | None]) -> dict[str, Any]:
    """The state ``encode`` cut into ``chunks``; raises ``SnapshotUnreadable`` if a chunk is
    missing or they are not the ones the head describes (a checksum mismatch)."""
    if len(chunks) != head.chunks or any(chunk is None for chunk in chunks):
        raise SnapshotUnreadable(f"chunks missing in slot {head.slot} ({head.chunks} expected)")
    try:
        raw = zlib.decompress(b"".join(chunk or b"" for chunk in chunks))
    except zlib.error as error:
        raise SnapshotUnreadable(f"does not decompress: {error}") from error
    if hashlib.sha256(raw).hexdigest() != head.sha256:
        raise SnapshotUnreadable("checksum mismatch: the chunks are not the head's")
    try:
        data = json.loads(raw)
    except ValueError as error:
        raise SnapshotUnreadable(f"does not parse: {error}") from error
    if not isinstance(data, dict):
        raise SnapshotUnreadable("is not a JSON object")
    if data.get("last_sequence") != head.sequence:
        held = data.get("last_sequence")
        raise SnapshotUnreadable(f"holds the state at sequence {held}, not {head.sequence}")
    return data


@dataclass(frozen=True, slots=True)
class Resume:
    """Where a service starts reading the jobs stream, and why."""

    after: int
    """Restore the snapshot and follow the log from ``after + 1``; 0: replay it all."""
    reason: str


FALLBACK = {
    Verdict.RECREATED: "snapshot of another stream",
    Verdict.HEAD_LOST: "snapshot older than the log's first message",
    Verdict.WENT_BACKWARDS: "snapshot ahead of the log",
    Verdict.REWRITTEN: "snapshot ahead of the log",
}
"""The line a full replay logs, per way the log and the snapshot disagree."""


def resume(head: Head | None, server: ServerLog) -> Resume:
    """Whether the snapshot of ``head`` may be restored on the jobs stream as the server
    holds it now: from the same stream (its creation time; the message at its sequence, when
    both digests are known), not beyond the stream's end, and not older than its first message
    less one (nothing the snapshot lacks has expired)."""
    if head is None:
        return Resume(0, "no snapshot")
    stored = StoredOffset(head.stream, head.sequence, head.stream_created, head.digest)
    continuity = check(stored, server)
    if head.sequence > 0 and not continuity.ok:
        return Resume(0, f"{FALLBACK[continuity.verdict]}: {continuity.explanation}")
    return Resume(
        head.sequence,
        f"snapshot of {head.written_at.isoformat()} at sequence {head.sequence} ({head.jobs} jobs)",
    )
