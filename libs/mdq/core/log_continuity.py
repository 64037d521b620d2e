"""Is the log the projector resumes from the one it stored its offset from? (pure)

The projector stores, with each consumer offset (the last stream sequence committed to
PostgreSQL), the identity of the stream it read: the stream's creation time, and a digest of
the message at the offset. If the log went backwards — JetStream lost its tail (a power cut
with a lazy fsync, a restored volume) or the stream was deleted and recreated — new events
reuse sequence numbers the projector has already stored, and "skip what is at or below the
offset" would drop them silently. ``check`` compares what was stored with what the server says
now and names the case; anything but ``Continuity.ok`` stops the projector
(``mdq.store.projection.LogContinuityError``) until an operator rebuilds the projection from
the log as it is now (``mdq replay --rebuild``, docs/durability.md).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum


class Verdict(StrEnum):
    """What the comparison found."""

    CONTINUOUS = "continuous"
    """The same stream, holding everything up to the offset as it was projected."""
    RECREATED = "recreated"
    """The stream has another creation time: it was deleted and created again."""
    WENT_BACKWARDS = "went-backwards"
    """The stream's last sequence is below the offset: its tail was lost."""
    REWRITTEN = "rewritten"
    """The message at the offset is not the one projected: the tail was lost and the
    sequence numbers were used again by new messages."""
    HEAD_LOST = "head-lost"
    """Messages after the offset are gone (expired or purged) before they were projected."""


@dataclass(frozen=True, slots=True)
class StoredOffset:
    """What PostgreSQL holds for one consumer."""

    stream: str
    offset: int
    """The last stream sequence projected (0: nothing yet)."""
    stream_created: datetime | None
    """The stream's creation time when it was projected (None: not recorded, e.g. a database
    projected before these columns existed)."""
    offset_digest: str | None
    """``message_digest`` of the message at ``offset`` (None: not recorded)."""


@dataclass(frozen=True, slots=True)
class ServerLog:
    """What the JetStream server says about the stream now."""

    created: datetime
    first_seq: int
    last_seq: int
    offset_digest: str | None
    """``message_digest`` of the message the server holds at the stored offset (None: it holds
    none there: expired, purged, deleted or past the end)."""


@dataclass(frozen=True, slots=True)
class Continuity:
    """The verdict, and the sentence an operator reads."""

    verdict: Verdict
    explanation: str

    @property
    def ok(self) -> bool:
        return self.verdict is Verdict.CONTINUOUS


def message_digest(subject: str, data: bytes) -> str:
    """A digest that tells two messages stored at the same sequence apart."""
    digest = hashlib.sha256(subject.encode())
    digest.update(b"\0")
    digest.update(data)
    return digest.hexdigest()


def check(stored: StoredOffset, server: ServerLog) -> Continuity:
    """Compare the stored offset of a consumer with the stream as the server holds it now."""
    offset = stored.offset
    if offset <= 0:
        return Continuity(Verdict.CONTINUOUS, "nothing projected yet")
    if stored.stream_created is not None and stored.stream_created != server.created:
        return Continuity(
            Verdict.RECREATED,
            f"stream {stored.stream} was created at {server.created.isoformat()}, but the "
            f"projection (up to sequence {offset}) was made from a stream created at "
            f"{stored.stream_created.isoformat()}: it was deleted and created again",
        )
    if server.last_seq < offset:
        return Continuity(
            Verdict.WENT_BACKWARDS,
            f"stream {stored.stream} ends at sequence {server.last_seq}, below the projected "
            f"offset {offset}: the log lost its tail, and new events would reuse sequence "
            "numbers already projected",
        )
    if (
        stored.offset_digest is not None
        and server.offset_digest is not None
        and stored.offset_digest != server.offset_digest
    ):
        return Continuity(
            Verdict.REWRITTEN,
            f"the message at sequence {offset} of stream {stored.stream} is not the one "
            "projected there: the log lost its tail and new events reused its sequence numbers",
        )
    if server.first_seq > offset + 1:
        return Continuity(
            Verdict.HEAD_LOST,
            f"stream {stored.stream} starts at sequence {server.first_seq}, but the projection "
            f"stops at {offset}: sequences {offset + 1} to {server.first_seq - 1} were removed "
            "(expired or purged) before they were projected",
        )
    return Continuity(Verdict.CONTINUOUS, f"stream {stored.stream} continues after {offset}")
