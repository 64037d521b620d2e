"""Publishing events to JetStream with their deterministic id as Nats-Msg-Id.

The transport is a ``JetStreamContext`` or, on hot paths, ``mdq.bus.requests.Requests``
(``publish_each`` then sends a batch with no task per event).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime

from google.protobuf.message import Message
from nats.js.api import PubAck

from mdq.bus.codec import encode
from mdq.bus.requests import PUBLISH_ERRORS, GroupCommit, JetStreamPublish, Outgoing, Requests
from mdq.bus.subjects import Subjects
from mdq.contracts import pb
from mdq.core.events import make_event


class EventPublisher:
    """Publishes envelopes for one producer; a republished event is dropped by JetStream."""

    def __init__(
        self,
        *,
        js: JetStreamPublish,
        subjects: Subjects,
        producer: str,
        max_in_flight: int = 256,
    ) -> None:
        self._js = js
        self._subjects = subjects
        self._producer = producer
        self._slots = asyncio.Semaphore(max_in_flight)
        self._group = GroupCommit(js) if isinstance(js, Requests) else None
        """``publish_each``'s batches, one in flight (the producer's events: one stream)."""

    @property
    def subjects(self) -> Subjects:
        return self._subjects

    def producer_of(self, kind: str) -> str:
        """The producer an event of ``kind`` is stamped with: this publisher's, whatever the
        kind."""
        return self._producer

    def event(
        self,
        kind: str,
        body: Message,
        *,
        job_id: str,
        attempt: int,
        detail: str | int | None = None,
    ) -> pb.Event:
        """A new envelope from this producer, stamped now."""
        return make_event(
            kind,
            body,
            job_id=job_id,
            attempt=attempt,
            producer=self.producer_of(kind),
            at=datetime.now(UTC),
            detail=detail,
        )

    async def publish(self, event: pb.Event, *, headers: dict[str, str] | None = None) -> PubAck:
        """Publish one event and wait for the stream's acknowledgement (``headers`` are added,
        e.g. an expected last sequence). The caller bounds its own concurrency (intake's
        request slots, say); the fan-outs below are bounded here."""
        subject, payload, with_id = self.outgoing(event, headers)
        return await self._js.publish(subject, payload, headers=with_id)

    def outgoing(self, event: pb.Event, headers: dict[str, str] | None = None) -> Outgoing:
        """``event`` as a message to publish (its subject, bytes and headers: its id as
        ``Nats-Msg-Id``, then ``headers``), for a batch the caller commits itself."""
        return (
            self._subjects.for_event(event),
            encode(event),
            {"Nats-Msg-Id": event.event_id} | (headers or {}),
        )

    async def _bounded(self, event: pb.Event, headers: dict[str, str] | None = None) -> PubAck:
        async with self._slots:
            return await self.publish(event, headers=headers)

    async def publish_each(
        self, events: Sequence[tuple[pb.Event, dict[str, str] | None]]
    ) -> list[PubAck | Exception]:
        """Publish events of one stream side by side, each with its added headers; each
        result is the event's ack or the JetStream error of its publish (``APIError``,
        ``TimeoutError``, ...), in order. Over ``Requests`` they go as atomic batches, one
        flush each (8 or fewer: plain publishes side by side), shared with this publisher's
        other callers of the moment (``GroupCommit``), and cost no task per event."""
        if self._group is not None:
            return await self._group.publish(
                [self.outgoing(event, headers) for event, headers in events]
            )
        results = await asyncio.gather(
            *(self._bounded(event, headers) for event, headers in events),
            return_exceptions=True,
        )
        out: list[PubAck | Exception] = []
        for result in results:
            if isinstance(result, BaseException) and not isinstance(result, PUBLISH_ERRORS):
                raise result
            out.append(result)
        return out

    async def publish_all(self, events: Iterable[pb.Event]) -> list[PubAck]:
        """Publish many events concurrently (bounded), in no particular order."""
        return list(await asyncio.gather(*(self._bounded(event) for event in events)))

    async def emit(
        self,
        kind: str,
        body: Message,
        *,
        job_id: str,
        attempt: int,
        detail: str | int | None = None,
    ) -> pb.Event:
        """Build and publish one event; return it."""
        event = self.event(kind, body, job_id=job_id, attempt=attempt, detail=detail)
        await self.publish(event)
        return event
