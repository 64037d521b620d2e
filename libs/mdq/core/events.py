"""Building events: the envelope with its deterministic id (pure; the caller passes the time)."""

from __future__ import annotations

from datetime import datetime

from google.protobuf.message import Message

from mdq.contracts import pb
from mdq.core.ids import event_id
from mdq.core.timestamps import set_timestamp


def make_event(
    kind: str,
    body: Message,
    *,
    job_id: str,
    attempt: int,
    producer: str,
    at: datetime,
    detail: str | int | None = None,
) -> pb.Event:
    """Wrap ``body`` (the message of Event.body case ``kind``) in an envelope."""
    event = pb.Event(
        event_id=event_id(kind, job_id or "-", attempt, detail),
        job_id=job_id,
        attempt=attempt,
        producer=producer,
    )
    set_timestamp(event.time, at)
    getattr(event, kind).CopyFrom(body)
    return event
