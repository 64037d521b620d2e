"""Log continuity: when the projector may resume after its stored offset, as named cases."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from mdq.core.log_continuity import (
    ServerLog,
    StoredOffset,
    Verdict,
    check,
    message_digest,
)
from tests.tables import named_cases

CREATED = datetime(2026, 11, 29, 12, 0, 0, 123456, tzinfo=UTC)
LATER = CREATED + timedelta(days=2)
A = message_digest("mdq.job.a.submitted", b"first")
B = message_digest("mdq.job.b.submitted", b"other")

# (name, stored: (offset, created, digest), server: (created, first, last, digest at offset),
#  verdict)
CASES = [
    ("nothing projected yet", (0, None, None), (CREATED, 1, 10, None), Verdict.CONTINUOUS),
    (
        "nothing projected, stream recreated since a reset",
        (0, CREATED, None),
        (LATER, 1, 3, None),
        Verdict.CONTINUOUS,
    ),
    ("caught up", (10, CREATED, A), (CREATED, 1, 10, A), Verdict.CONTINUOUS),
    ("behind", (10, CREATED, A), (CREATED, 1, 50, A), Verdict.CONTINUOUS),
    (
        "projected before the identity was recorded",
        (10, None, None),
        (CREATED, 1, 12, A),
        Verdict.CONTINUOUS,
    ),
    (
        "head expired after it was projected",
        (10, CREATED, A),
        (CREATED, 8, 12, A),
        Verdict.CONTINUOUS,
    ),
    (
        "the message at the offset expired, the next is there",
        (10, CREATED, A),
        (CREATED, 11, 12, None),
        Verdict.CONTINUOUS,
    ),
    (
        "everything projected, then the stream purged",
        (10, CREATED, A),
        (CREATED, 11, 10, None),
        Verdict.CONTINUOUS,
    ),
    ("stream recreated", (10, CREATED, A), (LATER, 1, 30, None), Verdict.RECREATED),
    (
        "stream recreated, as long as before",
        (10, CREATED, A),
        (LATER, 1, 10, B),
        Verdict.RECREATED,
    ),
    ("tail lost", (10, CREATED, A), (CREATED, 1, 7, None), Verdict.WENT_BACKWARDS),
    (
        "tail lost, stream now empty",
        (10, CREATED, A),
        (CREATED, 0, 0, None),
        Verdict.WENT_BACKWARDS,
    ),
    (
        "tail lost before the identity was recorded",
        (10, None, None),
        (CREATED, 1, 7, None),
        Verdict.WENT_BACKWARDS,
    ),
    (
        "tail lost and the sequences used again",
        (10, CREATED, A),
        (CREATED, 1, 15, B),
        Verdict.REWRITTEN,
    ),
    (
        "unprojected messages expired",
        (10, CREATED, A),
        (CREATED, 14, 20, None),
        Verdict.HEAD_LOST,
    ),
]


@named_cases(("stored", "server", "verdict"), CASES)
def test_check(
    stored: tuple[int, datetime | None, str | None],
    server: tuple[datetime, int, int, str | None],
    verdict: Verdict,
) -> None:
    offset, created, digest = stored
    result = check(StoredOffset("MDQ_JOBS", offset, created, digest), ServerLog(*server))
    assert result.verdict is verdict
    assert result.ok is (verdict is Verdict.CONTINUOUS)
    if not result.ok:
        # The operator reads which stream and which offset.
        assert "MDQ_JOBS" in result.explanation and str(offset) in result.explanation


def test_the_digest_tells_messages_apart() -> None:
    assert message_digest("s", b"x") == message_digest("s", b"x")
    assert message_digest("s", b"x") != message_digest("s", b"y")
    assert message_digest("s", b"x") != message_digest("t", b"x")
    assert message_digest("ab", b"c") != message_digest("a", b"bc")
