"""What intake remembers between submits: a JetStream KV bucket (``Subjects.intake_bucket``).

One key per accepted submit: ``req.<request_id>`` -> the serialized ``pb.SubmitReply``. It is
written last, after every event of the submit was published, so it is the commit marker of a
submit: when it exists, a repeated submit with the same key gets this reply and nothing is
published.

The same record answers the two questions a later submit asks about its dependencies, because
ids are derived, not allocated (``mdq.core.ids``):

- a job id ``<request_id>-<name>`` is known when ``req.<request_id>`` lists it;
- the idempotency key of a single-job submit names that job: its request id is
  ``request_id_for_key(key)``, and ``req.<that id>`` holds exactly one job id.

So an accepted submit costs one KV write. Buckets written by earlier versions also hold
``job.<job_id>`` and ``key.<sha256(key)>`` records; they are still read when the new lookup
finds nothing, so old dependencies keep resolving. The bucket serves reads with direct gets
(``allow_direct``), which skip the JetStream API's JSON envelope, and reads and writes go through
``mdq.bus.requests.Requests`` (intake's hot path).

Refused submits are not remembered (see ``services.intake.handlers``).
"""

from __future__ import annotations

import asyncio
import hashlib
import re
from collections.abc import Iterable

from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig, StorageType
from nats.js.errors import BucketNotFoundError

from mdq.bus.requests import Requests
from mdq.contracts import pb
from mdq.core.ids import REQUEST_ID_HEX, request_id_for_key

JOB_ID_PATTERN = re.compile(rf"[0-9a-f]{{{REQUEST_ID_HEX}}}-[a-z][a-z0-9-]{{0,39}}")  # fullmatch


def key_digest(idempotency_key: str) -> str:
    """The KV-safe form of a client's idempotency key (the legacy ``key.*`` records)."""
    return hashlib.sha256(idempotency_key.encode()).hexdigest()


class SubmitRegistry:
    """Idempotency records of accepted submits, kept in one KV bucket."""

    def __init__(
        self, *, requests: Requests, bucket: str, max_concurrent_lookups: int = 64
    ) -> None:
        self._requests = requests
        self._bucket = bucket
        self._lookups = asyncio.Semaphore(max_concurrent_lookups)

    @classmethod
    async def open(cls, *, js: JetStreamContext, requests: Requests, bucket: str) -> SubmitRegistry:
        """Open the bucket, creating it (file storage, latest value only, direct gets) if it is
        missing, and turning on direct gets for a bucket created without them."""
        try:
            await js.key_value(bucket)
        except BucketNotFoundError:
            await js.create_key_value(
                config=KeyValueConfig(
                    bucket=bucket, history=1, storage=StorageType.FILE, direct=True
                )
            )
        else:
            info = await js.stream_info(f"KV_{bucket}")
            if not info.config.allow_direct:
                info.config.allow_direct = True
                await js.update_stream(info.config)
        return cls(requests=requests, bucket=bucket)

    async def _get(self, key: str) -> bytes | None:
        return await self._requests.kv_get(self._bucket, key)

    async def reply_for(self, request_id: str) -> pb.SubmitReply | None:
        """The reply given to an earlier accepted submit with this request id, if any."""
        data = await self._get(f"req.{request_id}")
        if data is None:
            return None
        reply = pb.SubmitReply()
        reply.ParseFromString(data)
        return reply

    async def resolve(self, ref: str) -> str | None:
        """A dependency given as a job id or as the key of a single-job submit -> its job id."""
        if JOB_ID_PATTERN.fullmatch(ref):
            reply = await self.reply_for(ref[:REQUEST_ID_HEX])
            if reply is not None and ref in reply.job_ids:
                return ref
            if reply is None and await self._get(f"job.{ref}") is not None:  # legacy record
                return ref
        reply = await self.reply_for(request_id_for_key(ref))
        if reply is not None:
            return reply.job_ids[0] if len(reply.job_ids) == 1 else None
        found = await self._get(f"key.{key_digest(ref)}")  # legacy record
        return found.decode() if found is not None else None

    async def resolve_all(self, refs: Iterable[str]) -> dict[str, str]:
        """Resolve many references at once; unknown ones are left out of the result."""
        unique = list(dict.fromkeys(refs))
        if not unique:  # most submits: no need to start anything
            return {}

        async def bounded(ref: str) -> str | None:
            async with self._lookups:  # a submit may name hundreds of dependencies
                return await self.resolve(ref)

        resolved = await asyncio.gather(*(bounded(ref) for ref in unique))
        return {ref: job for ref, job in zip(unique, resolved, strict=True) if job is not None}

    async def remember(self, *, request_id: str, reply: pb.SubmitReply) -> None:
        """Record an accepted submit (the commit marker: call it after publishing its events)."""
        await self._requests.kv_put(
            self._bucket, f"req.{request_id}", reply.SerializeToString(deterministic=True)
        )
