"""protobuf Timestamps to and from aware datetimes, without the generated helpers' detours (pure).

``Timestamp.FromDatetime`` goes through ``utctimetuple`` and ``calendar.timegm`` (~2.1 us) and
``ToDatetime`` through rounding helpers (~1.4 us); every event is stamped once and its time read
back by each service that folds it, so these do the same arithmetic in ~0.5 us. Naive datetimes
are taken as UTC, as ``FromDatetime`` takes them. ``utc_now`` is the wall clock that services
stamp and compare these times with unless given their own.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from google.protobuf.timestamp_pb2 import Timestamp

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
SECONDS_PER_DAY = 86_400


def utc_now() -> datetime:
    """Now, as an aware UTC datetime."""
    return datetime.now(UTC)


def set_timestamp(timestamp: Timestamp, at: datetime) -> None:
    """Store ``at`` (microsecond precision) in ``timestamp``."""
    since = (at if at.tzinfo is not None else at.replace(tzinfo=UTC)) - EPOCH
    timestamp.seconds = since.days * SECONDS_PER_DAY + since.seconds
    timestamp.nanos = since.microseconds * 1000


def to_datetime(timestamp: Timestamp) -> datetime:
    """``timestamp`` as an aware UTC datetime (nanoseconds truncated to microseconds)."""
    return EPOCH + timedelta(0, timestamp.seconds, timestamp.nanos // 1000)  # days, s, us
