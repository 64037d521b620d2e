"""The scientist's input files: content-addressed objects in NATS Object Store buckets.

``upload`` puts a job's files into the submitter's bucket (one per tenant, each object named by
its sha256), intake checks the spec against it (``lookup``) and serves each runner the objects
its own spec names (``InputDesk``, ``read_chunk``), and the runner fetches them (``InputFetch``);
``ensure_inputs_bucket`` is the admin's. The whole path, and why a job reads only its own
inputs: docs/engines.md, "Input files".
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import logging
import re
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import nats.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext
from nats.js.api import ObjectInfo, ObjectStoreConfig, StorageType
from nats.js.errors import (
    APIError,
    BadRequestError,
    NotFoundError,
    ObjectNotFoundError,
    ServiceUnavailableError,
)

from mdq.bus.codec import decode_event
from mdq.bus.subjects import Subjects
from mdq.contracts import pb
from mdq.core.ids import tenant_of
from mdq.errors import MdqError, NotFound, PermissionDenied, Unavailable

log = logging.getLogger("mdq.bus.inputs")

SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")
HEADER_ERROR = "Mdq-Error"
HEADER_UNAVAILABLE = "Mdq-Unavailable"
"""An answer saying intake could not serve the request now (the bus): ask again later."""
HEADER_SEQ = "Mdq-Seq"
HEADER_SIZE = "Mdq-Size"
REQUEST_TIMEOUT_S = 10.0
CACHED_JOBS = 1024
"""Jobs whose submitted spec the desk keeps in memory (a runner asks once per chunk)."""
CACHED_OBJECTS = 4096


class InputsError(MdqError):
    """An input file cannot be stored or read; the message says why, for people."""


class InputsFull(InputsError, Unavailable):
    """The bucket is at its size limit (the tenant's)."""


class NoInputsBucket(InputsError, NotFound):
    """The bucket does not exist (the admin makes it: ``mdq up``, ``mdq tenant add``)."""


def sha256_file(path: Path) -> tuple[str, int]:
    """sha256 (hex) and size of a file."""
    digest = hashlib.sha256()
    size = 0
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


def _digest_hex(info: ObjectInfo) -> str:
    """The sha256 (hex) an object's meta records."""
    digest = (info.digest or "").partition("=")[2]
    try:
        return base64.urlsafe_b64decode(digest + "=" * (-len(digest) % 4)).hex()
    except ValueError:
        return ""


def _meta_subject(bucket: str, name: str) -> str:
    return f"$O.{bucket}.M.{base64.urlsafe_b64encode(name.encode()).decode()}"


def _stream(bucket: str) -> str:
    return f"OBJ_{bucket}"


async def ensure_inputs_bucket(
    js: JetStreamContext, subjects: Subjects, tenant: str = "", *, max_bytes: int, replicas: int = 1
) -> str:
    """Create ``tenant``'s inputs bucket ("" = the operator's) or bring its size limit to
    ``max_bytes`` (the admin); returns the bucket's name."""
    bucket = subjects.inputs_bucket(tenant)
    try:
        info = await js.stream_info(_stream(bucket))
    except NotFoundError:
        with contextlib.suppress(BadRequestError):  # made meanwhile
            await js.create_object_store(
                bucket,
                ObjectStoreConfig(
                    description=f"input files of {tenant or 'the operator'}'s jobs (mdq)",
                    max_bytes=max_bytes,
                    storage=StorageType.FILE,
                    replicas=replicas,
                ),
            )
        return bucket
    config = info.config
    if config.max_bytes != max_bytes or (config.num_replicas or 1) < replicas:
        config.max_bytes = max_bytes
        config.num_replicas = max(config.num_replicas or 1, replicas)
        await js.update_stream(config)
    return bucket


@dataclass(frozen=True, slots=True)
class Uploaded:
    """One file in the bucket."""

    sha256: str
    size_bytes: int
    sent: bool
    """False when the object was there already (same sha256 and size): nothing was sent."""


async def upload(js: JetStreamContext, bucket: str, path: Path) -> Uploaded:
    """Put the file at ``path`` into ``bucket`` under its sha256, unless it is there."""
    sha256, size = await asyncio.to_thread(sha256_file, path)
    try:
        store = await js.object_store(bucket)
    except (NotFoundError, ServiceUnavailableError) as error:
        raise NoInputsBucket(
            f"there is no inputs bucket {bucket} (the admin makes it: `mdq up`, or "
            f"`mdq tenant add` for a tenant): {error!r}"
        ) from None
    try:
        info = await store.get_info(sha256)
        if _digest_hex(info) == sha256 and info.size == size:
            return Uploaded(sha256, size, sent=False)
    except ObjectNotFoundError:
        pass
    try:
        with path.open("rb") as handle:
            await store.put(sha256, handle)
    except APIError as error:
        if "maximum bytes" in str(error.description or error).lower():
            raise InputsFull(
                f"the inputs bucket {bucket} is full: {path.name} ({size} bytes) does not fit "
                "(its size limit is the tenant's; the admin can raise it or remove objects)"
            ) from None
        raise InputsError(f"storing {path.name} in {bucket} failed: {error}") from None
    return Uploaded(sha256, size, sent=True)


async def lookup(js: JetStreamContext, bucket: str, sha256: str) -> ObjectInfo | None:
    """The meta of object ``sha256`` in ``bucket`` (a direct get); None when it is not there
    or was deleted; NoInputsBucket when the bucket does not exist."""
    try:
        message = await js.get_msg(
            _stream(bucket), subject=_meta_subject(bucket, sha256), direct=True
        )
    except NotFoundError:
        return None
    except nats.errors.NoRespondersError:  # no stream answers direct gets for that bucket
        raise NoInputsBucket(f"there is no inputs bucket {bucket}") from None
    except APIError as error:
        if error.code == 404 or "stream not found" in str(error.description or "").lower():
            raise NoInputsBucket(f"there is no inputs bucket {bucket}") from None
        raise
    try:
        info = ObjectInfo.from_response(json.loads(message.data or b"{}"))
    except (ValueError, TypeError) as error:
        raise InputsError(f"the meta of {sha256} in {bucket} is unreadable: {error}") from None
    return None if info.deleted else info


def matches(info: ObjectInfo, sha256: str, size_bytes: int) -> bool:
    """Whether an object's meta is of a file with this sha256 and size."""
    return _digest_hex(info) == sha256 and info.size == size_bytes


async def read_chunk(
    js: JetStreamContext, bucket: str, info: ObjectInfo, *, after_seq: int
) -> tuple[bytes, int] | None:
    """The object's first chunk stored after stream sequence ``after_seq`` and its sequence;
    None when there is none."""
    subject = f"$O.{bucket}.C.{info.nuid}"
    try:
        message = await js.get_msg(
            _stream(bucket), seq=after_seq + 1, subject=subject, next=True, direct=True
        )
    except NotFoundError:
        return None
    return message.data or b"", int(message.seq or 0)


class InputDesk:
    """Intake's answers to runners asking for their input files' bytes.

    A request on ``<ns>.api.inputs.<job id>`` is ``{"sha256": ..., "after": <sequence>}``; the
    answer is the object's next chunk after that stream sequence, with the headers
    ``Mdq-Seq`` (the chunk's sequence, the next request's ``after``) and ``Mdq-Size`` (the
    whole object's size), or an ``Mdq-Error`` header saying why not: the job has no submitted
    event, its spec names no input of that sha256, its tenant's bucket holds no such object.
    An error of intake's own (the bus) is an ``Mdq-Unavailable`` header instead: the job's
    input is fine, a later attempt may be served.
    Only the job's own runner may publish on that subject (``mdq.bus.security.permissions``)."""

    def __init__(self, client: Client, subjects: Subjects) -> None:
        self._client = client
        self._js = client.jetstream()
        self._subjects = subjects
        self._specs: OrderedDict[str, pb.JobSpec] = OrderedDict()
        self._objects: OrderedDict[tuple[str, str], ObjectInfo] = OrderedDict()
        self._subscription: Subscription | None = None
        self.served = 0
        """Chunks answered (for tests and logs)."""

    async def start(self, *, queue: str = "intake") -> None:
        self._subscription = await self._client.subscribe(
            self._subjects.api_inputs(">"), queue=queue, cb=self._on_request
        )

    async def stop(self) -> None:
        if self._subscription is not None:
            await self._subscription.unsubscribe()
            self._subscription = None

    async def _on_request(self, message: Msg) -> None:
        if not message.reply:
            return
        try:
            data, headers = await self.answer(message.subject, message.data)
        except Exception as error:  # one runner's request, never the desk; not the job's fault
            log.exception("answering %s failed", message.subject)
            data, headers = b"", {HEADER_UNAVAILABLE: f"{type(error).__name__}: {error}"}
        try:
            await self._client.publish(message.reply, data, headers=headers)
        except Exception as error:  # the runner asks again
            log.warning("could not answer %s: %r", message.subject, error)

    async def answer(self, subject: str, body: bytes) -> tuple[bytes, dict[str, str]]:
        """The answer to one request (data, headers)."""
        job_id = self._subjects.job_of_api_inputs(subject)
        try:
            request = json.loads(body)
            sha256 = str(request["sha256"])
            after = int(request.get("after", 0))
        except (ValueError, KeyError, TypeError):
            return b"", {HEADER_ERROR: 'the request must be {"sha256": "<hex>", "after": <n>}'}
        if not job_id or not SHA256_HEX.match(sha256) or after < 0:
            return b"", {HEADER_ERROR: "bad request: a job id, a sha256 and after >= 0"}
        spec = await self._spec(job_id)
        if spec is None:
            return b"", {HEADER_ERROR: f"job {job_id} has no submitted event"}
        wanted = next((each for each in spec.inputs if each.sha256 == sha256), None)
        if wanted is None:
            return b"", {HEADER_ERROR: f"{sha256[:12]} is not an input file of job {job_id}"}
        bucket = self._subjects.inputs_bucket(tenant_of(job_id))
        info = await self._object(bucket, sha256)
        if info is None or not matches(info, sha256, wanted.size_bytes):
            return b"", {HEADER_ERROR: f"{wanted.name} ({sha256[:12]}) is not in {bucket}"}
        chunk = await read_chunk(self._js, bucket, info, after_seq=after)
        if chunk is None:
            return b"", {HEADER_SEQ: str(after), HEADER_SIZE: str(info.size or 0)}
        data, seq = chunk
        self.served += 1
        return data, {HEADER_SEQ: str(seq), HEADER_SIZE: str(info.size or 0)}

    async def _spec(self, job_id: str) -> pb.JobSpec | None:
        spec = self._specs.get(job_id)
        if spec is not None:
            self._specs.move_to_end(job_id)
            return spec
        try:
            message = await self._js.get_msg(
                self._subjects.jobs_stream, subject=self._subjects.job(job_id, "submitted")
            )
        except NotFoundError:
            return None
        spec = decode_event(message.data or b"").submitted.spec
        _remember(self._specs, job_id, spec, CACHED_JOBS)
        return spec

    async def _object(self, bucket: str, sha256: str) -> ObjectInfo | None:
        key = (bucket, sha256)
        info = self._objects.get(key)
        if info is not None:
            self._objects.move_to_end(key)
            return info
        try:
            info = await lookup(self._js, bucket, sha256)
        except NoInputsBucket:
            return None
        if info is not None:
            _remember(self._objects, key, info, CACHED_OBJECTS)
        return info


K = TypeVar("K")
V = TypeVar("V")


def _remember(cache: OrderedDict[K, V], key: K, value: V, limit: int) -> None:
    cache[key] = value
    while len(cache) > limit:
        cache.popitem(last=False)


class FetchRefused(InputsError, PermissionDenied):
    """Intake refused to serve a file (its message says why); retrying will not help."""


class FetchUnavailable(InputsError, Unavailable):
    """Intake could not serve a file now; a later attempt may."""


@dataclass(frozen=True, slots=True)
class InputFetch:
    """How a runner asks intake for its input files (``InputDesk``)."""

    client: Client
    subjects: Subjects
    job_id: str
    timeout_s: float = REQUEST_TIMEOUT_S

    async def fetch(self, sha256: str, write: Callable[[bytes], None]) -> int:
        """Hand every chunk of the object ``sha256`` to ``write``, in order; the bytes
        written. FetchRefused when intake says no."""
        after = 0
        written = 0
        subject = self.subjects.api_inputs(self.job_id)
        while True:
            request = json.dumps({"sha256": sha256, "after": after}).encode()
            answer = await self.client.request(subject, request, timeout=self.timeout_s)
            headers = answer.headers or {}
            if HEADER_ERROR in headers:
                raise FetchRefused(headers[HEADER_ERROR])
            if HEADER_UNAVAILABLE in headers:
                raise FetchUnavailable(
                    f"intake could not serve {sha256[:12]} now: {headers[HEADER_UNAVAILABLE]}"
                )
            size = int(headers.get(HEADER_SIZE, "0"))
            seq = int(headers.get(HEADER_SEQ, str(after)))
            if answer.data:
                write(answer.data)
                written += len(answer.data)
            if written >= size or seq == after:
                return written
            after = seq
