"""What intake remembers between submits: one claim per accepted submit, stored in the jobs
stream (``Subjects.claim``) in the same write as the submit's ``submitted`` events, and the
lookups of dependencies and of the first submit under a key. The record, why it is a claim and
how the write goes: docs/intake.md, "The registry".
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from google.protobuf.unknown_fields import UnknownFieldSet
from nats.js import JetStreamContext
from nats.js.errors import APIError

from mdq.bus.requests import (
    CREATE_ONLY,
    EXPECTED_LAST_SUBJECT_SEQUENCE,
    AtomicGroupCommit,
    GroupResult,
    Outgoing,
    Requests,
    is_duplicate_in_batch,
    is_wrong_last_sequence,
)
from mdq.bus.storage import DAY_S, StorageSettings
from mdq.bus.subjects import Subjects
from mdq.contracts import pb
from mdq.core.ids import request_id_for_key, request_id_of, tenant_of
from mdq.core.tenants import JOB_ID_PATTERN as JOB_ID_PATTERN  # the handlers use it too

NO_MESSAGE_FOUND = 10037
CLAIMED_REMEMBERED = 65_536
"""How many claimed request ids a process remembers (``SubmitRegistry.claimed_here``)."""
RETENTION_MARGIN = timedelta(days=1)
"""A claim this close to the jobs stream's retention may have outlived its events."""


FINGERPRINT_FIELD = 15
"""Field number of the content fingerprint in a claim record (not one of SubmitReply's)."""
_FINGERPRINT_TAG = bytes([FINGERPRINT_FIELD << 3 | 2])  # length-delimited; one byte below 16
FINGERPRINT_BYTES = 32


ACCEPTED, SEEN, REUSED = "accepted", "seen", "reused"
"""What ``SubmitRegistry.accept`` found: the claim and events are stored; the request id is
claimed already (a retry, a replay, or other content under the key); or it is not, but the log
holds one of the submit's jobs (its claim expired, or was lost)."""


@dataclass(frozen=True, slots=True)
class Stored:
    """The last message the jobs stream holds on a subject, as stored."""

    data: bytes
    written_at: datetime
    sequence: int


@dataclass(frozen=True, slots=True)
class Claim:
    """The record of an accepted submit and when it was written (the server's clock);
    ``fingerprint``: its content's (None: a record that holds none, which no content
    matches)."""

    reply: pb.SubmitReply
    written_at: datetime
    fingerprint: bytes | None = None


class SubmitRegistry:
    """Idempotency records of accepted submits, kept in the jobs stream beside their events."""

    def __init__(
        self,
        *,
        requests: Requests,
        subjects: Subjects,
        events_retention: timedelta | None,
        window_days: float = StorageSettings.model_fields["registry_days"].default,
        max_concurrent_lookups: int = 64,
    ) -> None:
        self._requests = requests
        self._subjects = subjects
        self._events_retention = events_retention
        self.window_days = window_days
        """The duplicate window: how long a claim answers for its key."""
        self._lookups = asyncio.Semaphore(max_concurrent_lookups)
        self._commit = AtomicGroupCommit(requests)
        """Each submit's claim and events, claim first; the submits handled at the same time
        together, as one atomic batch (one flush, each submit all or nothing), or one by one
        when they come to ``PLAIN_UP_TO`` messages or fewer."""
        self._claimed: OrderedDict[str, float] = OrderedDict()
        """Request ids this process found claimed, with when (``time.monotonic``), the latest
        ``CLAIMED_REMEMBERED``: a retry of one goes to its recorded answer without a write
        that the claim would refuse (a refused write fails the whole atomic batch it was in,
        whose other submits are then written again)."""

    @classmethod
    async def open(
        cls,
        *,
        js: JetStreamContext,
        requests: Requests,
        subjects: Subjects,
        storage: StorageSettings | None = None,
    ) -> SubmitRegistry:
        """The registry of ``subjects``' namespace, whose duplicate window is ``storage``'s
        (``MDQ_STORAGE_REGISTRY_DAYS``). The jobs stream must exist: its retention bounds how
        long a claim's events can be expected in it."""
        storage = storage or StorageSettings()
        jobs = await js.stream_info(subjects.jobs_stream)
        max_age = jobs.config.max_age or 0.0
        retention = timedelta(seconds=max_age) if max_age > 0 else None
        return cls(
            requests=requests,
            subjects=subjects,
            events_retention=retention,
            window_days=storage.registry_days,
        )

    async def _latest(self, request_id: str) -> Stored | None:
        """The latest claim record of ``request_id`` in the jobs stream, expired or not."""
        return await self._last_on(self._subjects.claim(request_id))

    def _live(self, stored: Stored | None) -> Stored | None:
        """``stored`` while it is within the duplicate window, else None (expired)."""
        if stored is None:
            return None
        if datetime.now(UTC) - stored.written_at >= timedelta(days=self.window_days):
            return None
        return stored

    def claimed_here(self, request_id: str) -> bool:
        """Whether this process found ``request_id`` claimed within the duplicate window (a
        hint that spares a doomed write: the claim in the jobs stream is what counts)."""
        since = self._claimed.get(request_id)
        return since is not None and time.monotonic() - since < self.window_days * DAY_S

    def _remember(self, request_id: str) -> None:
        self._claimed[request_id] = time.monotonic()
        self._claimed.move_to_end(request_id)
        if len(self._claimed) > CLAIMED_REMEMBERED:
            self._claimed.popitem(last=False)

    async def reply_for(self, request_id: str) -> pb.SubmitReply | None:
        """The reply given to an earlier accepted submit with this request id, if any."""
        stored = self._live(await self._latest(request_id))
        return None if stored is None else _parse(stored.data)[0]

    async def accept(
        self,
        *,
        request_id: str,
        reply: pb.SubmitReply,
        fingerprint: bytes,
        events: Sequence[Outgoing],
    ) -> str | Exception:
        """Store the claim of a submit about to be accepted (its reply and content
        fingerprint) and then its ``events`` (create-only), as one write shared with the other
        submits of the moment (``AtomicGroupCommit``): ``ACCEPTED``; ``SEEN`` when the request
        id is claimed already (nothing stored); ``REUSED`` when the log holds one of the jobs
        (the claim may be stored; the events are not all); or the error of the write (a full
        jobs stream, a timeout; the claim may be stored without all its events, which a retry
        completes). A claim older than the duplicate window counts as none, and is claimed
        anew after."""
        subject, record = self._subjects.claim(request_id), claim_record(reply, fingerprint)
        written = await self._commit.publish([(subject, record, CREATE_ONLY), *events])
        if (outcome := self._outcome(request_id, written)) is not None:
            return outcome
        stored = await self._latest(request_id)
        if self._live(stored) is not None:
            self._remember(request_id)
            return SEEN
        if stored is None:
            return REUSED  # not claimed, yet one of its jobs is in the log
        after = {EXPECTED_LAST_SUBJECT_SEQUENCE: str(stored.sequence)}  # expired: claim anew
        again = await self._commit.publish([(subject, record, after), *events])
        if (outcome := self._outcome(request_id, again)) is not None:
            return outcome
        latest = await self._latest(request_id)
        if latest is not None and latest.sequence != stored.sequence:
            self._remember(request_id)
            return SEEN  # claimed by another submit in between
        return REUSED

    def _outcome(self, request_id: str, written: GroupResult) -> str | Exception | None:
        """What a write of a claim and its events settles: ``ACCEPTED`` (all stored),
        ``REUSED`` (the claim stored, an event refused as in the log already) or the write's
        error; None when nothing was stored because the claim, or one of the events, is in
        the log already (which one: the caller looks)."""
        if written.error is None or written.stored:  # the claim is stored
            self._remember(request_id)
            if written.error is None:
                return ACCEPTED
            return REUSED if _already_there(written.error) else written.error
        return None if _already_there(written.error) else written.error

    async def existing(self, request_id: str) -> Claim | None:
        """The record of ``request_id`` with its time; None if there is none (or it
        expired)."""
        stored = self._live(await self._latest(request_id))
        if stored is None:
            return None
        reply, fingerprint = _parse(stored.data)
        return Claim(reply=reply, written_at=stored.written_at, fingerprint=fingerprint)

    async def overwrite(
        self, *, request_id: str, reply: pb.SubmitReply, fingerprint: bytes
    ) -> None:
        """Record a submit whatever its request id's claim holds (the latest record is the
        one that counts)."""
        await self._requests.publish(
            self._subjects.claim(request_id), claim_record(reply, fingerprint)
        )
        self._remember(request_id)

    async def needs_events(self, claim: Claim, last_job_id: str) -> bool:
        """Whether a claimed submit's events must be published (again): the last of them is
        not in the log, and the claim is young enough that it should be (older claims may
        have outlived their events, and publishing them would run the jobs once more)."""
        if await self.has_submitted(last_job_id):
            return False
        if self._events_retention is None:
            return True
        return datetime.now(UTC) - claim.written_at < self._events_retention - RETENTION_MARGIN

    async def submitted_within_window(self, job_id: str) -> bool:
        """Whether the log's ``submitted`` event of ``job_id`` is younger than the duplicate
        window (so no claim of it can have expired yet)."""
        data = await self._last_submitted(job_id)
        if data is None:
            return False
        written = pb.Event.FromString(data).time.ToDatetime(tzinfo=UTC)
        return datetime.now(UTC) - written < timedelta(days=self.window_days)

    async def has_submitted(self, job_id: str) -> bool:
        """Whether the jobs stream holds the ``submitted`` event of ``job_id``."""
        return await self._last_submitted(job_id) is not None

    async def submitted(self, job_ids: Sequence[str]) -> list[pb.JobSubmitted | None]:
        """The ``submitted`` event body of each job (None where the log has none)."""

        async def one(job_id: str) -> pb.JobSubmitted | None:
            async with self._lookups:
                data = await self._last_submitted(job_id)
            if data is None:
                return None
            event = pb.Event.FromString(data)
            return event.submitted if event.WhichOneof("body") == "submitted" else None

        return list(await asyncio.gather(*(one(job_id) for job_id in job_ids)))

    async def _last_submitted(self, job_id: str) -> bytes | None:
        """The stored ``submitted`` event of ``job_id``, None if the log has none."""
        found = await self._last_on(self._subjects.job(job_id, "submitted"))
        return None if found is None else found.data

    async def _last_on(self, subject: str) -> Stored | None:
        """The last message the jobs stream holds on ``subject``: its data, time and
        sequence; None if there is none."""
        request = json.dumps({"last_by_subj": subject})
        reply = await self._requests.request(
            f"$JS.API.STREAM.MSG.GET.{self._subjects.jobs_stream}", request.encode()
        )
        answer = json.loads(reply.data)
        error = answer.get("error")
        if error is None:
            message = answer["message"]
            return Stored(
                data=base64.b64decode(message.get("data", "")),
                written_at=datetime.fromisoformat(message["time"]),
                sequence=int(message["seq"]),
            )
        if error.get("err_code") == NO_MESSAGE_FOUND:
            return None
        raise APIError.from_error(error)

    async def resolve(self, ref: str, tenant: str = "") -> str | None:
        """A dependency given as a job id or as the key of a single-job submit -> its job id,
        once that job is in the log. A tenant's submit may name only its own jobs and keys
        (another tenant's job is unknown to it, exactly as a job that does not exist)."""
        if JOB_ID_PATTERN.fullmatch(ref):
            if tenant and tenant_of(ref) != tenant:
                return None
            reply = await self.reply_for(request_id_of(ref))
            if reply is not None and ref in reply.job_ids:
                return ref if await self.has_submitted(ref) else None
            if await self.has_submitted(ref):  # claimed before the window (or refused since)
                return ref
        reply = await self.reply_for(request_id_for_key(ref, tenant))
        if reply is not None and len(reply.job_ids) == 1:
            return reply.job_ids[0] if await self.has_submitted(reply.job_ids[0]) else None
        return None

    async def resolve_all(self, refs: Iterable[str], tenant: str = "") -> dict[str, str]:
        """Resolve many references of ``tenant``'s submit at once; unknown ones are left out
        of the result."""
        unique = list(dict.fromkeys(refs))
        if not unique:  # most submits: no need to start anything
            return {}

        async def bounded(ref: str) -> str | None:
            async with self._lookups:  # a submit may name hundreds of dependencies
                return await self.resolve(ref, tenant)

        resolved = await asyncio.gather(*(bounded(ref) for ref in unique))
        return {ref: job for ref, job in zip(unique, resolved, strict=True) if job is not None}


def _already_there(error: Exception) -> bool:
    """Whether a write was refused because what it holds is in the log already: a claim or a
    job (an expected last subject sequence), or an event within the duplicate window."""
    return is_wrong_last_sequence(error) or is_duplicate_in_batch(error)


def claim_record(reply: pb.SubmitReply, fingerprint: bytes) -> bytes:
    """A claim record: the reply, then the fingerprint as field ``FINGERPRINT_FIELD``."""
    return (
        reply.SerializeToString(deterministic=True)
        + _FINGERPRINT_TAG
        + bytes([len(fingerprint)])
        + fingerprint
    )


def _parse(data: bytes) -> tuple[pb.SubmitReply, bytes | None]:
    """The reply and fingerprint of a claim record (None: the record holds none)."""
    reply = pb.SubmitReply()
    reply.ParseFromString(data)
    fingerprint = None
    unknown = UnknownFieldSet(reply)
    for index in range(len(unknown)):
        field = unknown[index]
        if field.field_number == FINGERPRINT_FIELD and isinstance(field.data, bytes):
            fingerprint = field.data
    reply.DiscardUnknownFields()  # never handed on to a client
    return reply, fingerprint
