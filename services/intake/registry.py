"""What intake remembers between submits: a JetStream KV bucket (``Subjects.intake_bucket``).

Keys (all values are bytes):

- ``req.<request_id>`` -> the serialized ``pb.SubmitReply`` of an accepted submit. It is written
  last, after every event of the submit was published, so it is the commit marker of a submit:
  when it exists, a repeated submit with the same key gets this reply and nothing is published.
- ``job.<job_id>`` -> ``b"1"`` for every accepted job, so a later submit may depend on it by id.
- ``key.<sha256(idempotency_key)>`` -> the job id of a single-job submit, so a later submit may
  depend on it by the idempotency key it was submitted with. The key is hashed because a client
  key may hold characters a KV key may not.

Refused submits are not remembered (see ``services.intake.handlers``).
"""

from __future__ import annotations

import asyncio
import hashlib
import re
from collections.abc import Iterable

from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig, StorageType
from nats.js.errors import BucketNotFoundError, KeyNotFoundError
from nats.js.kv import KeyValue

from mdq.contracts import pb
from mdq.core.ids import REQUEST_ID_HEX

JOB_ID_PATTERN = re.compile(rf"[0-9a-f]{{{REQUEST_ID_HEX}}}-[a-z][a-z0-9-]{{0,39}}")  # fullmatch
KNOWN = b"1"


def key_digest(idempotency_key: str) -> str:
    """The KV-safe form of a client's idempotency key."""
    return hashlib.sha256(idempotency_key.encode()).hexdigest()


class SubmitRegistry:
    """Idempotency records and known jobs, kept in one KV bucket."""

    def __init__(self, *, kv: KeyValue, max_concurrent_lookups: int = 64) -> None:
        self._kv = kv
        self._lookups = asyncio.Semaphore(max_concurrent_lookups)

    @classmethod
    async def open(cls, *, js: JetStreamContext, bucket: str) -> SubmitRegistry:
        """Open the bucket, creating it (file storage, latest value only) if it is missing."""
        try:
            kv = await js.key_value(bucket)
        except BucketNotFoundError:
            kv = await js.create_key_value(
                config=KeyValueConfig(bucket=bucket, history=1, storage=StorageType.FILE)
            )
        return cls(kv=kv)

    async def _get(self, key: str) -> bytes | None:
        async with self._lookups:
            try:
                entry = await self._kv.get(key)
            except KeyNotFoundError:  # also raised for a deleted key
                return None
        return entry.value

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
        if JOB_ID_PATTERN.fullmatch(ref) and await self._get(f"job.{ref}") is not None:
            return ref
        found = await self._get(f"key.{key_digest(ref)}")
        return found.decode() if found is not None else None

    async def resolve_all(self, refs: Iterable[str]) -> dict[str, str]:
        """Resolve many references at once; unknown ones are left out of the result."""
        unique = list(dict.fromkeys(refs))
        resolved = await asyncio.gather(*(self.resolve(ref) for ref in unique))
        return {ref: job for ref, job in zip(unique, resolved, strict=True) if job is not None}

    async def remember(
        self, *, request_id: str, idempotency_key: str, reply: pb.SubmitReply
    ) -> None:
        """Record an accepted submit: its jobs and key first, the reply (commit marker) last."""
        puts = [self._kv.put(f"job.{job}", KNOWN) for job in reply.job_ids]
        if idempotency_key and len(reply.job_ids) == 1:
            puts.append(
                self._kv.put(f"key.{key_digest(idempotency_key)}", reply.job_ids[0].encode())
            )
        await asyncio.gather(*puts)
        await self._kv.put(f"req.{request_id}", reply.SerializeToString(deterministic=True))
