"""Placement's snapshot (pure): encoding round trip, what is unreadable, and when it may be
restored rather than replaying the whole log."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

import pytest

from mdq.core.log_continuity import ServerLog
from mdq.core.placement_state import PlacementState
from mdq.core.snapshot import (
    CHUNK_BYTES,
    Head,
    SnapshotUnreadable,
    decode,
    encode,
    next_slot,
    resume,
)

CREATED = datetime(2026, 1, 1, tzinfo=UTC)
STATE = dict(PlacementState().snapshot(), last_sequence=10)


def head(**changes: object) -> Head:
    sha256, chunks = encode(STATE)
    base = Head(
        slot="a",
        chunks=len(chunks),
        sha256=sha256,
        stream="T_JOBS",
        stream_created=CREATED,
        sequence=10,
        digest="d10",
        jobs=0,
        written_at=CREATED,
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def server(
    first: int = 1, last: int = 20, created: datetime = CREATED, digest: str | None = "d10"
) -> ServerLog:
    return ServerLog(created=created, first_seq=first, last_seq=last, offset_digest=digest)


@pytest.mark.parametrize(
    ("name", "stored", "log", "after", "reason"),
    [
        ("no snapshot", None, server(), 0, "no snapshot"),
        ("the log continues", head(), server(), 10, "snapshot of"),
        ("nothing after it yet", head(), server(last=10), 10, "snapshot of"),
        ("the log starts right after it", head(), server(first=11, last=20), 10, "snapshot of"),
        ("expired after it", head(), server(first=12), 0, "snapshot older than the log's first"),
        ("recreated", head(), server(created=CREATED + timedelta(1)), 0, "another stream"),
        ("the log lost its tail", head(), server(last=9), 0, "snapshot ahead of the log"),
        ("rewritten", head(), server(digest="other"), 0, "snapshot ahead of the log"),
        ("digest not read", head(digest=None), server(digest="other"), 10, "snapshot of"),
    ],
)
def test_resume(name: str, stored: Head | None, log: ServerLog, after: int, reason: str) -> None:
    verdict = resume(stored, log)
    assert (verdict.after, reason in verdict.reason) == (after, True), name


def test_encode_round_trip_and_chunks() -> None:
    stored = head()
    assert decode(stored, [*encode(STATE)[1]]) == dict(STATE, nodes=[])
    big = dict(STATE, tenants_seen=[f"t{i}-{i * 7919 % 104729}" for i in range(200_000)])
    sha256, chunks = encode(big)
    assert len(chunks) > 1 and all(len(chunk) <= CHUNK_BYTES for chunk in chunks)
    assert decode(head(sha256=sha256, chunks=len(chunks)), [*chunks]) == dict(big, nodes=[])


@pytest.mark.parametrize(
    ("name", "stored", "chunks", "error"),
    [
        ("a chunk missing", head(), [None], "chunks missing"),
        ("too few chunks", head(chunks=2), encode(STATE)[1], "chunks missing"),
        ("not zlib", head(), [b"junk"], "does not decompress"),
        ("another state", head(sha256="0" * 64), encode(STATE)[1], "checksum mismatch"),
        (
            "another sequence",
            head(sha256=encode(dict(STATE, last_sequence=9))[0], sequence=10),
            encode(dict(STATE, last_sequence=9))[1],
            "holds the state at sequence 9, not 10",
        ),
    ],
)
def test_decode_refuses(name: str, stored: Head, chunks: list[bytes | None], error: str) -> None:
    with pytest.raises(SnapshotUnreadable, match=error):
        decode(stored, chunks)


@pytest.mark.parametrize(
    ("name", "raw", "error"),
    [
        ("not json", b"{", "does not parse"),
        ("another format", b'{"format": 99}', "head format 99"),
        ("a field missing", b'{"format": 1}', "does not parse"),
        ("no such slot", head(slot="c").to_json(), "out of range"),
    ],
)
def test_head_refuses(name: str, raw: bytes, error: str) -> None:
    with pytest.raises(SnapshotUnreadable, match=error):
        Head.from_json(raw)


def test_head_round_trip_and_slots_alternate() -> None:
    stored = head()
    assert Head.from_json(stored.to_json()) == stored
    assert [next_slot(None), next_slot(stored), next_slot(head(slot="b"))] == ["a", "b", "a"]
