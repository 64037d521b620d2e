"""``mdq.core.timestamps`` agrees with protobuf's own Timestamp conversions."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from mdq.core.timestamps import set_timestamp, to_datetime

CASES = {
    "now-ish": datetime(2026, 11, 29, 19, 47, 21, 123456, tzinfo=UTC),
    "epoch": datetime(1970, 1, 1, tzinfo=UTC),
    "before the epoch": datetime(1960, 5, 1, 3, 4, 5, 123456, tzinfo=UTC),
    "last microsecond of a second": datetime(2020, 2, 2, 1, 1, 1, 999999, tzinfo=UTC),
    "another zone": datetime(2026, 1, 1, 0, 30, tzinfo=timezone(timedelta(hours=5, minutes=30))),
    "naive is UTC": datetime(2026, 3, 4, 5, 6, 7, 8),
    "far future": datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
}


@pytest.mark.parametrize("at", CASES.values(), ids=CASES.keys())
def test_set_timestamp_matches_from_datetime(at: datetime) -> None:
    ours, theirs = Timestamp(), Timestamp()
    set_timestamp(ours, at)
    theirs.FromDatetime(at)
    assert (ours.seconds, ours.nanos) == (theirs.seconds, theirs.nanos)


@pytest.mark.parametrize(
    ("seconds", "nanos"),
    [(0, 0), (1_795_983_036, 404_169_999), (-305_153_755, 123_456_789), (253_402_300_799, 999)],
)
def test_to_datetime_matches_to_datetime(seconds: int, nanos: int) -> None:
    timestamp = Timestamp(seconds=seconds, nanos=nanos)
    assert to_datetime(timestamp) == timestamp.ToDatetime(tzinfo=UTC)
    assert to_datetime(timestamp).tzinfo is UTC
