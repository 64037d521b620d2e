"""The Python SDK: submit MD jobs to mdq and follow them on NATS.

``MdqClient`` does everything through the bus, as any other client would: submits (request-reply
or fire-and-forget), a job's history folded by the services' own state machine, the nodes'
load, and job control. Connected as a tenant, the same calls act on the tenant's jobs only.

::

    async with await MdqClient.connect("nats://127.0.0.1:4222") as client:
        ids = await client.submit(load_job_file("examples/demo.yaml"))
        states = await client.wait(ids, timeout=600)

How each call works: README.md, "The Python SDK"; job control: docs/control.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self, TypeVar

import nats.errors
import nats.js.errors
from google.protobuf import json_format
from google.protobuf.message import DecodeError, Message
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError

from mdq.bus.codec import decode_event, encode
from mdq.bus.connect import CREDS_ENV, connect, identity_of_creds
from mdq.bus.inputs import InputsError, Uploaded, upload
from mdq.bus.requests import is_stream_full
from mdq.bus.security.permissions import tenant_of_identity
from mdq.bus.subjects import Subjects
from mdq.contracts import pb
from mdq.core.control import VERB_OF_WORD
from mdq.core.ids import job_id as make_job_id
from mdq.core.ids import request_id_for_key, request_id_for_sequence, request_id_of
from mdq.core.state import JobBook, JobState, JobView
from mdq.errors import InvalidInput, MdqError, NotFound, PermissionDenied, Unavailable
from mdq.sdk.consumers import (
    CONSUMER_IDLE_S,
    consumer_refusal,
    ordered_consumer,
    remove_consumer,
)
from mdq.sdk.inputs import LocalInput, resolve_inputs

SubmitInput = pb.SubmitRequest | Sequence[pb.JobSpec]


class SubmitRefused(InvalidInput):
    """Intake refused a submit; nothing was created. ``field`` is the path of the culprit
    (e.g. ``jobs[0].resources.cpu``), ``""`` for the whole submit."""

    def __init__(self, field: str, message: str, *, request_id: str = "") -> None:
        super().__init__(f"{field}: {message}" if field else message)
        self.field = field
        self.message = message
        self.request_id = request_id


class IntakeUnavailable(Unavailable):
    """Nobody answered a request-reply submit (intake not running, or too slow)."""


class OperatorOnly(PermissionDenied):
    """What the operator's identity alone may read (the nodes' load, the tenants' shares),
    asked with a tenant's credentials: the server would refuse it, so the SDK says so first."""


def tenant_of_creds(creds: str | Path | None) -> str:
    """The tenant a credentials file stands for ("" for the operator's, or none given:
    ``MDQ_NATS_CREDS`` then)."""
    chosen = creds or os.environ.get(CREDS_ENV)
    return tenant_of_identity(identity_of_creds(Path(chosen))) if chosen else ""


class ControlRefused(InvalidInput):
    """A job-control request was refused as a whole; nothing changed. ``field`` is the path of
    the culprit (e.g. ``priority_class``), ``""`` for the whole request."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}" if field else message)
        self.field = field
        self.message = message


class ControlUnavailable(Unavailable):
    """Nobody answered a job-control request in time (placement down, or between leaders)."""


_Reply = TypeVar("_Reply", bound=Message)

CONTROL_RETRY_S = 0.5
"""A job-control request nobody answered is sent again (the same key: safe) after this."""


LOG_COPY_WAIT_S = 2.0
"""How long a job missing from the log is looked for again before it counts as not there: a
tenant's stream is the server's copy of the jobs log, a moment behind it."""


class JobNotInLog(NotFound):
    """Jobs that the log these credentials read does not hold (none such, or another tenant's):
    ``wait`` and ``watch`` say so at once, as ``mdq watch`` does (exit 5), instead of waiting
    for events that will never come. ``job_ids`` names them."""

    def __init__(self, job_ids: Sequence[str]) -> None:
        super().__init__(f"no job {', '.join(job_ids)} in the log")
        self.job_ids = list(job_ids)


class WaitTimeout(MdqError, TimeoutError):
    """``wait`` gave up; ``states`` holds what was known (None: not seen yet)."""

    def __init__(self, message: str, *, states: dict[str, JobState | None]) -> None:
        super().__init__(message)
        self.states = states


@dataclass(frozen=True, slots=True)
class JobUpdate:
    """One event of a watched job, with the job's view after folding it in."""

    job_id: str
    event: pb.Event
    view: JobView | None
    """None until the job's ``submitted`` event has been seen."""
    caught_up: bool = True
    """Whether the lifecycle history of every watched job has been read up to now with this
    event (before, a view may be older than the job's state now)."""

    @property
    def kind(self) -> str:
        return self.event.WhichOneof("body") or ""


def build_request(request: SubmitInput, *, idempotency_key: str | None = None) -> pb.SubmitRequest:
    """A copy of ``request`` (or a submit of the given jobs) with ``idempotency_key`` set if
    given."""
    built = pb.SubmitRequest()
    if isinstance(request, pb.SubmitRequest):
        built.CopyFrom(request)
    else:
        for spec in request:
            built.jobs.add().CopyFrom(spec)
    if idempotency_key is not None:
        built.idempotency_key = idempotency_key
    return built


class MdqClient:
    """An async client of one mdq namespace on one NATS connection."""

    def __init__(
        self,
        *,
        nc: Client,
        subjects: Subjects,
        owns_connection: bool = False,
        tenant: str = "",
    ) -> None:
        self._nc = nc
        self._js = nc.jetstream()
        self._subjects = subjects
        self._owns_connection = owns_connection
        self._tenant = tenant
        # What a tenant may read: its own stream, which holds its jobs' events and progress.
        self._jobs_stream = subjects.tenant_stream(tenant) if tenant else subjects.jobs_stream
        self._progress_stream = (
            subjects.tenant_stream(tenant) if tenant else subjects.progress_stream
        )
        self._published: set[str] = set()
        """Job ids of this client's ``publish_submit``: in the log once intake handles them."""

    @classmethod
    async def connect(
        cls,
        nats_url: str,
        namespace: str = "mdq",
        *,
        name: str = "mdq-sdk",
        creds: str | Path | None = None,
    ) -> MdqClient:
        """Connect to NATS and make sure the namespace's streams exist (so a submit published
        before any service ever ran is kept). ``creds``: the credentials file (default:
        ``MDQ_NATS_CREDS``; ``stack_endpoint`` finds a local stack's)."""
        subjects = Subjects(namespace)
        chosen = creds or os.environ.get(CREDS_ENV)
        tenant = tenant_of_creds(chosen)
        # a tenant may not look at the shared streams (their info included)
        nc = await connect(
            nats_url, name=name, subjects=None if tenant else subjects, creds=chosen or None
        )
        return cls(nc=nc, subjects=subjects, owns_connection=True, tenant=tenant)

    @property
    def subjects(self) -> Subjects:
        return self._subjects

    @property
    def tenant(self) -> str:
        """The tenant this client submits as ("" = the operator), from its credentials."""
        return self._tenant

    @property
    def nc(self) -> Client:
        return self._nc

    async def close(self) -> None:
        """Close the connection if this client opened it."""
        if self._owns_connection and not self._nc.is_closed:
            await self._nc.drain()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *_exc_info: object) -> None:
        await self.close()

    # -- submitting ------------------------------------------------------------------------
    async def submit(
        self,
        request: SubmitInput,
        *,
        idempotency_key: str | None = None,
        timeout: float = 15.0,  # noqa: ASYNC109 - the request-reply timeout of nats-py
    ) -> list[str]:
        """Submit through intake and return the job ids (in the order of the jobs).

        Request-reply submits need an idempotency key: the request's, ``idempotency_key``, or a
        fresh random one. Raises ``SubmitRefused`` (field + message) if intake refuses it and
        ``IntakeUnavailable`` if nobody answers within ``timeout`` seconds.
        """
        built = build_request(request, idempotency_key=idempotency_key)
        if not built.idempotency_key:
            built.idempotency_key = f"sdk-{uuid.uuid4().hex}"
        subject = self._subjects.api_submit_for(self._tenant)
        try:
            reply_msg = await self._nc.request(subject, encode(built), timeout=timeout)
        except nats.errors.NoRespondersError:
            raise IntakeUnavailable(
                f"no intake answers on {subject}: is the stack running?"
            ) from None
        except nats.errors.TimeoutError:
            raise IntakeUnavailable(
                f"intake did not answer on {subject} within {timeout:g} s"
            ) from None
        reply = decode_reply(reply_msg.data)
        if reply.HasField("error") and (reply.error.field or reply.error.message):
            raise SubmitRefused(reply.error.field, reply.error.message, request_id=reply.request_id)
        self._published.update(reply.job_ids)  # in the jobs log; maybe not yet in a tenant's
        return list(reply.job_ids)

    async def submit_when_ready(
        self,
        request: SubmitInput,
        *,
        within_s: float = 300.0,
        answer_within_s: float = 10.0,
        every_s: float = 0.5,
    ) -> list[str]:
        """``submit``, tried again while intake does not answer (a stack that is still
        starting), ``every_s`` apart, each try waiting ``answer_within_s`` seconds, until
        ``within_s`` has passed: then the last ``IntakeUnavailable`` is raised. Every try
        carries the same idempotency key, so a late answer to an earlier try is no second
        submit."""
        built = build_request(request)
        if not built.idempotency_key:
            built.idempotency_key = f"sdk-{uuid.uuid4().hex}"
        deadline = time.monotonic() + within_s
        while True:
            try:
                return await self.submit(built, timeout=answer_within_s)
            except IntakeUnavailable:
                if time.monotonic() >= deadline:
                    raise
                await asyncio.sleep(every_s)

    async def upload_inputs(self, files: Sequence[LocalInput]) -> list[Uploaded]:
        """Put input files into this client's inputs bucket (the tenant's, or the
        operator's), each under its sha256; a file already there is not sent again. Raises
        ``SubmitRefused`` (field "inputs") when the bucket is full or missing."""
        bucket = self._subjects.inputs_bucket(self._tenant)
        uploaded = []
        for file in files:
            try:
                uploaded.append(await upload(self._js, bucket, file.path))
            except InputsError as error:
                raise SubmitRefused("inputs", f"{file.path.name}: {error}") from None
        return uploaded

    async def submit_with_inputs(
        self,
        request: pb.SubmitRequest,
        *,
        base: Path,
        idempotency_key: str | None = None,
        timeout: float = 15.0,  # noqa: ASYNC109 - the request-reply timeout of nats-py
    ) -> list[str]:
        """``submit`` after uploading the input files its jobs name, read from ``base`` (a
        job file's folder; ``mdq.sdk.inputs``): the sha256 and size of each are filled in."""
        files = resolve_inputs(request, base)
        await self.upload_inputs(files)
        return await self.submit(request, idempotency_key=idempotency_key, timeout=timeout)

    async def publish_submit(
        self, request: SubmitInput, *, idempotency_key: str | None = None
    ) -> list[str]:
        """Publish a submit onto ``<ns>.submit`` (a tenant's: ``<ns>.submit.<tenant>``;
        captured by a stream: durable even while
        intake is down) and return the job ids intake will give the jobs if it accepts them.

        A refusal is published as an event; ``wait`` raises ``SubmitRefused`` for it. A keyed
        submit is published with the key as ``Nats-Msg-Id``, so a retried publish is dropped
        (a tenant's among its own submits only: its own submit stream deduplicates them). A
        tenant's submit without a key gets a fresh one: its job ids cannot come from the
        sequence of the submit stream intake reads, which its acknowledgement does not name.
        A full submit stream refuses the publish itself: ``SubmitRefused`` at once, nothing
        stored (a tenant's: its queue of submits waiting for intake, and how many wait).
        """
        if self._tenant and not idempotency_key:
            given = request.idempotency_key if isinstance(request, pb.SubmitRequest) else ""
            idempotency_key = given or uuid.uuid4().hex
        built = build_request(request, idempotency_key=idempotency_key)
        headers = (
            {"Nats-Msg-Id": f"submit:{built.idempotency_key}"} if built.idempotency_key else None
        )
        subject = self._subjects.submit_for(self._tenant)
        try:
            ack = await self._js.publish(subject, encode(built), headers=headers)
        except nats.js.errors.APIError as error:
            if is_stream_full(error) and self._tenant:
                raise SubmitRefused("", await self._tenant_queue_full(error)) from error
            if is_stream_full(error):
                raise SubmitRefused(
                    "",
                    "mdq's submit stream is full (its size limit, MDQ_STORAGE_SUBMIT_BYTES): "
                    "nothing was stored; submit again once intake has caught up or an "
                    "operator has raised the limit",
                ) from error
            raise
        request_id = (
            request_id_for_key(built.idempotency_key, self._tenant)
            if built.idempotency_key
            else request_id_for_sequence(ack.seq, self._tenant)
        )
        job_ids = [make_job_id(request_id, spec.name) for spec in built.jobs]
        self._published.update(job_ids)
        return job_ids

    async def _tenant_queue_full(self, error: nats.js.errors.APIError) -> str:
        """What a tenant is told when its submit stream, the queue of its submits waiting for
        intake, refused a publish: how many wait (read from the stream's info, which the
        tenant may read), which limit it reached, and to try later."""
        stream = self._subjects.tenant_submit_stream(self._tenant)
        limit = str(error.description or "full")
        waiting = ""
        with contextlib.suppress(nats.errors.Error, TimeoutError):  # the refusal is said anyway
            info = await self._js.stream_info(stream)
            messages, cap = info.state.messages, info.config.max_msgs or 0
            size = info.config.max_bytes or 0
            if "messages" in limit and cap > 0:
                limit = f"the most it holds: {cap:,} submits, MDQ_STORAGE_TENANT_SUBMIT_MSGS"
            elif "bytes" in limit and size > 0:
                limit = f"its size limit: {size / 2**20:g} MiB, MDQ_STORAGE_TENANT_SUBMIT_BYTES"
            waiting = f": {messages:,} submits waiting for intake"
        return (
            f"tenant {self._tenant}'s submit queue ({stream}) is full ({limit}){waiting}, "
            "which reads them at the tenant's rate; nothing was stored: publish again later, "
            "once intake has handled some"
        )

    # -- following jobs --------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def _ordered(
        self, targets: Iterable[tuple[str, str]], *, deliver_policy: DeliverPolicy
    ) -> AsyncIterator[asyncio.Queue[tuple[str, Msg]]]:
        """One ordered consumer per stream of the (stream, subject) pairs, all delivering
        (stream, message) into one queue; each is deleted on the way out (``mdq.sdk.consumers``).
        """
        by_stream: dict[str, list[str]] = {}
        for stream, subject in targets:
            listed = by_stream.setdefault(stream, [])
            if subject not in listed:
                listed.append(subject)
        queue: asyncio.Queue[tuple[str, Msg]] = asyncio.Queue()
        async with contextlib.AsyncExitStack() as consumers:
            for stream, subjects in by_stream.items():

                async def deliver(message: Msg, stream: str = stream) -> None:
                    await queue.put((stream, message))

                await consumers.enter_async_context(
                    ordered_consumer(
                        self._js, stream, subjects, cb=deliver, deliver_policy=deliver_policy
                    )
                )
            yield queue

    async def missing_jobs(self, job_ids: Sequence[str]) -> list[str]:
        """Those of ``job_ids`` whose ``submitted`` event is not in the log this client may
        read (a job that does not exist, another tenant's, or one whose submit intake has not
        handled yet)."""
        missing = []
        for job in dict.fromkeys(job_ids):
            try:
                await self._js.get_last_msg(self._jobs_stream, self._subjects.job(job, "submitted"))
            except NotFoundError:
                missing.append(job)
        return missing

    async def require_in_log(self, job_ids: Sequence[str]) -> None:
        """Raise ``JobNotInLog`` naming those of ``job_ids`` that the log this client may read
        does not hold: a job that does not exist, or another tenant's. The check ``mdq watch``,
        ``watch`` and ``wait`` make before they follow jobs. Not missing: a job this client
        published (``publish_submit``) that intake has not handled yet, and one whose submit
        was refused (following it raises ``SubmitRefused``)."""
        missing = [job for job in await self.missing_jobs(job_ids) if job not in self._published]
        refused = {
            rid for rid in {request_id_of(job) for job in missing} if await self._refused(rid)
        }
        unknown = [job for job in missing if request_id_of(job) not in refused]
        # a tenant's log is a copy the server makes of the jobs log: a job another process
        # submitted a moment ago may not be in it yet
        deadline = asyncio.get_running_loop().time() + LOG_COPY_WAIT_S
        while unknown and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.1)
            unknown = await self.missing_jobs(unknown)
        if unknown:
            raise JobNotInLog(unknown)

    async def _refused(self, request_id: str) -> bool:
        """Whether the log holds a refusal of the submit ``request_id``."""
        try:
            await self._js.get_last_msg(self._jobs_stream, self._subjects.rejected(request_id))
        except NotFoundError:
            return False
        return True

    async def watch(
        self,
        job_ids: Sequence[str],
        *,
        include_progress: bool = True,
        settle_s: float = 0.5,
    ) -> AsyncGenerator[JobUpdate, None]:
        """Every event of the given jobs from the start of their history, then live, until
        every job is terminal (plus ``settle_s`` seconds for progress still in flight).

        Reads through one ordered consumer per stream (a tenant's: one in all), deleted when
        the generator ends. Raises ``JobNotInLog`` at once for a job the log these credentials
        read does not hold (``require_in_log``), ``SubmitRefused`` if the submit of a job was
        refused (its job never existed), ``ConsumerRefused`` if the server will not make a
        consumer. Use it with ``contextlib.aclosing`` if you may stop early.
        """
        ids = list(dict.fromkeys(job_ids))
        if not ids:
            return
        await self.require_in_log(ids)
        books = {job: JobBook() for job in ids}
        drained = False
        """Whether the jobs' lifecycle log has been read up to now: a job that ended may have
        been extended since, so it counts as ended only once it is."""
        request_ids = {request_id_of(job) for job in ids}
        targets = [(self._jobs_stream, self._subjects.job_all(job)) for job in ids]
        targets += [(self._jobs_stream, self._subjects.rejected(rid)) for rid in request_ids]
        if include_progress:
            targets += [(self._progress_stream, self._subjects.progress(job)) for job in ids]
        loop = asyncio.get_running_loop()
        settle_until: float | None = None
        async with self._ordered(targets, deliver_policy=DeliverPolicy.ALL) as queue:
            while True:
                if settle_until is None:
                    stream, message = await queue.get()
                else:
                    remaining = settle_until - loop.time()
                    if remaining <= 0:
                        return
                    try:
                        async with asyncio.timeout(remaining):
                            stream, message = await queue.get()
                    except TimeoutError:
                        return
                if stream == self._jobs_stream:
                    drained = _pending(message) == 0
                try:
                    event = decode_event(message.data)
                except DecodeError:
                    event = None
                if event is not None and event.WhichOneof("body") == "rejected":
                    await self._raise_if_refused(event, ids, books)
                elif event is not None and (book := books.get(event.job_id)) is not None:
                    book.apply(0, event)
                    yield JobUpdate(
                        job_id=event.job_id,
                        event=event,
                        view=book.jobs.get(event.job_id),
                        caught_up=drained,
                    )
                if settle_until is None and drained and all(_terminal(books[j], j) for j in ids):
                    if not include_progress:
                        return
                    settle_until = loop.time() + settle_s

    async def _raise_if_refused(
        self, event: pb.Event, ids: Sequence[str], books: dict[str, JobBook]
    ) -> None:
        """A rejected event for one of our request ids refuses our jobs only if they were never
        submitted (a later refused resubmit with the same key changes nothing)."""
        rejected = event.rejected
        for job in ids:
            if request_id_of(job) != rejected.request_id or job in books[job].jobs:
                continue
            try:
                await self._js.get_last_msg(self._jobs_stream, self._subjects.job(job, "submitted"))
            except NotFoundError:
                raise SubmitRefused(
                    rejected.error.field, rejected.error.message, request_id=rejected.request_id
                ) from None

    async def wait_views(
        self,
        job_ids: Sequence[str],
        timeout: float,  # noqa: ASYNC109 - part of the SDK's API
    ) -> dict[str, JobView]:
        """Wait until every job is terminal; return what the log says about each."""
        ids = list(dict.fromkeys(job_ids))
        views: dict[str, JobView] = {}
        try:
            async with asyncio.timeout(timeout):
                async with contextlib.aclosing(self.watch(ids, include_progress=False)) as updates:
                    async for update in updates:
                        if update.view is not None:
                            views[update.job_id] = update.view
        except TimeoutError:
            states = {job: (views[job].state if job in views else None) for job in ids}
            waiting = ", ".join(
                f"{job} ({state or 'not seen'})"
                for job, state in states.items()
                if state is None or not state.terminal
            )
            raise WaitTimeout(
                f"not terminal after {timeout:g} s: {waiting}", states=states
            ) from None
        return {job: views[job] for job in ids}

    async def wait(
        self,
        job_ids: Sequence[str],
        timeout: float,  # noqa: ASYNC109 - part of the SDK's API
    ) -> dict[str, JobState]:
        """Wait until every job is terminal; return each job's final state
        (``JobState.SUCCEEDED`` or ``JobState.FAILED``). Raises ``WaitTimeout``, and
        ``JobNotInLog`` at once for a job the log these credentials read does not hold."""
        views = await self.wait_views(job_ids, timeout)
        return {job: view.state for job, view in views.items()}

    async def progress(
        self, job_ids: Sequence[str]
    ) -> AsyncGenerator[tuple[str, pb.Progress], None]:
        """(job id, progress) for every progress report of the given jobs, from the start,
        until every job is terminal."""
        async with contextlib.aclosing(self.watch(job_ids)) as updates:
            async for update in updates:
                if update.kind == "progress":
                    yield update.job_id, update.event.progress

    # -- job control -----------------------------------------------------------------------
    async def control(
        self,
        verb: str | pb.ControlVerb,
        job_ids: Sequence[str] = (),
        *,
        request_id: str = "",
        labels: dict[str, str] | None = None,
        reason: str = "",
        requested_by: str = "",
        priority_class: str = "",
        extend_steps: int = 0,
        control_key: str | None = None,
        timeout: float = 15.0,  # noqa: ASYNC109 - the request-reply timeout of nats-py
    ) -> pb.ControlReply:
        """Send one job-control request (``verb``: "cancel", "hold", "release", "requeue",
        "reprioritize", "extend", or the ``ControlVerb``) for ``job_ids``, a submit's
        ``request_id`` or a label selector, and return the reply (each job's outcome).

        The request goes under ``control_key`` (default: a fresh one) and is sent again while
        nobody answers (placement restarting, a new leader), for ``timeout`` seconds in all;
        then ``ControlUnavailable``. A refusal raises ``ControlRefused`` (field + message)."""
        request = pb.ControlRequest(
            control_key=control_key or f"sdk-{uuid.uuid4().hex}",
            verb=VERB_OF_WORD[verb] if isinstance(verb, str) else verb,
            job_ids=list(job_ids),
            request_id=request_id,
            labels=labels or {},
            reason=reason,
            requested_by=requested_by,
            priority_class=priority_class,
            extend_steps=extend_steps,
        )
        subject = self._subjects.api_control_for(self._tenant)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            left = deadline - loop.time()
            try:
                reply_msg = await self._nc.request(
                    subject, encode(request), timeout=max(0.1, min(left, 5.0))
                )
                break
            except (nats.errors.NoRespondersError, nats.errors.TimeoutError):
                if loop.time() + CONTROL_RETRY_S >= deadline:
                    raise ControlUnavailable(
                        f"nobody answered on {subject} within {timeout:g} s: is placement running?"
                    ) from None
                await asyncio.sleep(CONTROL_RETRY_S)
        reply = decode_control_reply(reply_msg.data)
        if reply.HasField("error") and (reply.error.field or reply.error.message):
            raise ControlRefused(reply.error.field, reply.error.message)
        return reply

    async def cancel(self, job_ids: Sequence[str] = (), **options: Any) -> pb.ControlReply:
        """Cancel jobs (``control("cancel", ...)``): a running one checkpoints first."""
        return await self.control("cancel", job_ids, **options)

    async def hold(self, job_ids: Sequence[str] = (), **options: Any) -> pb.ControlReply:
        """Hold jobs: not placed until released; a running one stops at a checkpoint."""
        return await self.control("hold", job_ids, **options)

    async def release(self, job_ids: Sequence[str] = (), **options: Any) -> pb.ControlReply:
        """Release held jobs."""
        return await self.control("release", job_ids, **options)

    async def requeue(self, job_ids: Sequence[str] = (), **options: Any) -> pb.ControlReply:
        """Stop running jobs at a checkpoint and place them anew."""
        return await self.control("requeue", job_ids, **options)

    async def reprioritize(
        self, job_ids: Sequence[str] = (), *, priority_class: str, **options: Any
    ) -> pb.ControlReply:
        """Change jobs' priority class ("high", "normal", "low")."""
        return await self.control("reprioritize", job_ids, priority_class=priority_class, **options)

    async def extend(
        self, job_ids: Sequence[str], *, steps: int, **options: Any
    ) -> pb.ControlReply:
        """Continue SUCCEEDED MD jobs for ``steps`` more steps, from their final checkpoint."""
        return await self.control("extend", job_ids, extend_steps=steps, **options)

    async def wait_control(
        self,
        verb: str,
        reply: pb.ControlReply,
        timeout: float,  # noqa: ASYNC109 - part of the SDK's API
    ) -> dict[str, JobView]:
        """Wait until what a request did is in effect for every job it changed (DONE or
        STOPPING): cancel, a terminal state (CANCELLED, or SUCCEEDED/FAILED if the job ended
        first); hold, HELD; release, no longer HELD; requeue, a new attempt; reprioritize, at
        once; extend, the extended run ended. Returns the jobs' views; ``WaitTimeout``."""
        changed = {
            outcome.job_id: outcome
            for outcome in reply.outcomes
            if outcome.result in (pb.CONTROL_DONE, pb.CONTROL_STOPPING)
        }
        views: dict[str, JobView] = {}
        done: set[str] = set()

        def in_effect(job: str, view: JobView) -> bool:
            outcome = changed[job]
            if view.state.terminal and verb != "extend":
                return True
            match verb:
                case "cancel":
                    return view.state.terminal
                case "hold":
                    return view.state is JobState.HELD
                case "release":
                    return view.state is not JobState.HELD
                case "requeue":
                    return view.attempt > outcome.attempt
                case "extend":
                    return view.attempt >= outcome.attempt and view.state.terminal
            return True

        if not changed:
            return views
        try:
            async with asyncio.timeout(timeout):
                async with contextlib.aclosing(
                    self.watch(list(changed), include_progress=False, settle_s=0.0)
                ) as updates:
                    async for update in updates:
                        if update.view is None:
                            continue
                        views[update.job_id] = update.view
                        if not update.caught_up:
                            continue  # a view may be older than its job's state now
                        done = {job for job, view in views.items() if in_effect(job, view)}
                        if done >= changed.keys():
                            return views
        except TimeoutError:
            waiting = ", ".join(
                f"{job} ({views[job].state if job in views else 'not seen'})"
                for job in changed
                if job not in done
            )
            raise WaitTimeout(
                f"{verb} not in effect after {timeout:g} s: {waiting}",
                states={job: views[job].state if job in views else None for job in changed},
            ) from None
        return views

    # -- nodes -----------------------------------------------------------------------------
    async def node_loads(self, *, fetch_timeout_s: float = 5.0) -> dict[str, pb.Event]:
        """The latest ``node_load`` event of every node, by node name (an ephemeral pull
        consumer, deleted before it returns). ``OperatorOnly`` for a tenant: which nodes run
        what is the operator's."""
        if self._tenant:
            raise OperatorOnly(
                f"the nodes' load is the operator's to read; tenant {self._tenant}'s "
                "credentials may not (docs/security.md, Tenants)"
            )
        stream = self._subjects.nodes_stream
        try:
            subscription = await self._js.pull_subscribe(
                self._subjects.node_load("*"),
                stream=stream,
                config=ConsumerConfig(
                    deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
                    ack_policy=AckPolicy.NONE,
                    inactive_threshold=CONSUMER_IDLE_S,
                ),
            )
        except (nats.js.errors.APIError, nats.errors.TimeoutError) as error:
            raise consumer_refusal(stream, error) from error
        loads: dict[str, pb.Event] = {}
        try:
            pending = (await subscription.consumer_info()).num_pending or 0
            while pending > 0:
                messages = await subscription.fetch(min(pending, 256), timeout=fetch_timeout_s)
                for message in messages:
                    pending = message.metadata.num_pending
                    try:
                        event = decode_event(message.data)
                    except DecodeError:
                        continue
                    if event.WhichOneof("body") == "node_load":
                        loads[event.node_load.node] = event
        finally:
            await remove_consumer(self._js, stream, subscription)
        return dict(sorted(loads.items()))


def _pending(message: Msg) -> int:
    """Messages still to come to the ordered consumer that delivered ``message``."""
    try:
        return int(message.metadata.num_pending)
    except Exception:  # not a JetStream delivery: nothing known to follow it
        return 0


def decode_control_reply(data: bytes) -> pb.ControlReply:
    """A ControlReply as placement sent it: protobuf binary, or its JSON mapping."""
    return _decoded(data, pb.ControlReply())


def _terminal(book: JobBook, job: str) -> bool:
    view = book.jobs.get(job)
    return view is not None and view.state.terminal


def decode_reply(data: bytes) -> pb.SubmitReply:
    """A SubmitReply as intake sent it: protobuf binary, or its JSON mapping."""
    return _decoded(data, pb.SubmitReply())


def _decoded(data: bytes, reply: _Reply) -> _Reply:
    """``reply`` filled from ``data``: its JSON mapping when ``data`` is a JSON object (fields
    it does not know are passed over), else protobuf binary."""
    if data.lstrip()[:1] == b"{":
        json_format.ParseDict(json.loads(data), reply, ignore_unknown_fields=True)
    else:
        reply.ParseFromString(data)
    return reply
