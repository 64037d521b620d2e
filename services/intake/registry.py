"""What intake remembers between submits: one claim per accepted submit in a JetStream KV
bucket (``Subjects.intake_bucket``), written before the submit's events, and the lookups of
dependencies and of the first submit under a key. The record and why it is a claim:
docs/intake.md, "The registry".
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from google.protobuf.unknown_fields import UnknownFieldSet
from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig, StorageType
from nats.js.errors import APIError, BucketNotFoundError

from mdq.bus.requests import CREATE_ONLY, GroupCommit, KvEntry, Requests, is_wrong_last_sequence
from mdq.bus.storage import DAY_S, StorageSettings
from mdq.bus.streams import await_leader, ensure_bucket_limit, ensure_replicas
from mdq.bus.subjects import Subjects
from mdq.contracts import pb
from mdq.core.ids import request_id_for_key, request_id_of, tenant_of
from mdq.core.tenants import JOB_ID_PATTERN as JOB_ID_PATTERN  # the handlers use it too

NO_MESSAGE_FOUND = 10037
RETENTION_MARGIN = timedelta(days=1)
"""A claim this close to the jobs stream's retention may have outlived its events."""


FINGERPRINT_FIELD = 15
"""Field number of the content fingerprint in a claim record (not one of SubmitReply's)."""
_FINGERPRINT_TAG = bytes([FINGERPRINT_FIELD << 3 | 2])  # length-delimited; one byte below 16
FINGERPRINT_BYTES = 32


@dataclass(frozen=True, slots=True)
class Claim:
    """The record of an accepted submit and when it was written (the server's clock);
    ``fingerprint``: its content's (None: a record that holds none, which no content
    matches)."""

    reply: pb.SubmitReply
    written_at: datetime
    fingerprint: bytes | None = None


class SubmitRegistry:
    """Idempotency records of accepted submits, kept in one KV bucket."""

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
        self._bucket = subjects.intake_bucket
        self._events_retention = events_retention
        self.window_days = window_days
        """The duplicate window: how long a claim is kept (the bucket's age limit)."""
        self._lookups = asyncio.Semaphore(max_concurrent_lookups)
        self._claims = GroupCommit(requests)
        """Claims of the batches handled at the same time go out as one atomic batch."""

    @classmethod
    async def open(
        cls,
        *,
        js: JetStreamContext,
        requests: Requests,
        subjects: Subjects,
        replicas: int = 1,
        storage: StorageSettings | None = None,
    ) -> SubmitRegistry:
        """Open the bucket, creating it (file storage, latest value only, direct gets,
        ``replicas`` copies, the size and age limits of ``storage``) if it is missing, and
        turning on direct gets and atomic batches (``Requests.publish_batch``) where they are
        off (and raising an existing bucket's replica count, and bringing its limits up to
        date). The jobs stream must exist: its
        retention bounds how long a claim's events can be expected in it."""
        storage = storage or StorageSettings()
        window_s = storage.registry_days * DAY_S
        bucket = subjects.intake_bucket
        try:
            await js.key_value(bucket)
        except BucketNotFoundError:
            await js.create_key_value(
                config=KeyValueConfig(
                    bucket=bucket,
                    history=1,
                    storage=StorageType.FILE,
                    direct=True,
                    replicas=replicas,
                    ttl=window_s,
                    max_bytes=int(storage.registry_bytes),
                )
            )
            if replicas > 1:
                await await_leader(js, f"KV_{bucket}")  # writable before the first claim
        else:
            await ensure_replicas(js, f"KV_{bucket}", replicas)
            await ensure_bucket_limit(
                js, bucket, max_bytes=int(storage.registry_bytes), max_age_s=window_s
            )
        info = await js.stream_info(f"KV_{bucket}")
        if not (info.config.allow_direct and info.config.allow_atomic):
            # direct gets for the lookups, atomic batches for the claims (one flush a batch)
            info.config.allow_direct = info.config.allow_atomic = True
            await js.update_stream(info.config)
        jobs = await js.stream_info(subjects.jobs_stream)
        max_age = jobs.config.max_age or 0.0
        retention = timedelta(seconds=max_age) if max_age > 0 else None
        return cls(
            requests=requests,
            subjects=subjects,
            events_retention=retention,
            window_days=storage.registry_days,
        )

    async def _get(self, key: str) -> bytes | None:
        return await self._requests.kv_get(self._bucket, key)

    async def reply_for(self, request_id: str) -> pb.SubmitReply | None:
        """The reply given to an earlier accepted submit with this request id, if any."""
        data = await self._get(f"req.{request_id}")
        return None if data is None else _parse(data)[0]

    async def claim(self, *, request_id: str, reply: pb.SubmitReply, fingerprint: bytes) -> bool:
        """Record a submit about to be accepted (its reply and content fingerprint), unless its
        request id is known: True if this call wrote the record (publish its events next),
        False if one exists."""
        [claimed] = await self.claim_many([(request_id, reply, fingerprint)])
        if isinstance(claimed, Exception):
            raise claimed
        return claimed

    async def claim_many(
        self, submits: Sequence[tuple[str, pb.SubmitReply, bytes]]
    ) -> list[bool | Exception]:
        """``claim`` for many (request id, reply, fingerprint) at once, as KV creates in one
        atomic batch shared with the other submits being claimed at that moment
        (``GroupCommit``): each result is True (claimed), False (known), or the error of its
        write."""
        results = await self._claims.publish(
            [
                (
                    f"$KV.{self._bucket}.req.{request_id}",
                    claim_record(reply, fingerprint),
                    CREATE_ONLY,
                )
                for request_id, reply, fingerprint in submits
            ]
        )
        return [
            False
            if is_wrong_last_sequence(result)
            else result
            if isinstance(result, Exception)
            else True
            for result in results
        ]

    async def existing(self, request_id: str) -> Claim | None:
        """The record of ``request_id`` with its time; None if there is none (or it was
        deleted)."""
        entry: KvEntry | None = await self._requests.kv_entry(self._bucket, f"req.{request_id}")
        if entry is None:
            return None
        reply, fingerprint = _parse(entry.value)
        return Claim(reply=reply, written_at=entry.written_at, fingerprint=fingerprint)

    async def overwrite(
        self, *, request_id: str, reply: pb.SubmitReply, fingerprint: bytes
    ) -> None:
        """Record a submit whatever the key holds (a record deleted by hand leaves a marker
        that a create would trip over)."""
        await self._requests.kv_put(
            self._bucket, f"req.{request_id}", claim_record(reply, fingerprint)
        )

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
        request = json.dumps({"last_by_subj": self._subjects.job(job_id, "submitted")})
        reply = await self._requests.request(
            f"$JS.API.STREAM.MSG.GET.{self._subjects.jobs_stream}", request.encode()
        )
        answer = json.loads(reply.data)
        error = answer.get("error")
        if error is None:
            return base64.b64decode(answer["message"].get("data", ""))
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
