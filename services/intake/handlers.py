"""Intake's handling of one submit: decode -> validate -> claim -> publish.

The same steps serve both entrances, the submit stream (fire-and-forget) and request-reply;
``SubmitHandler.handle`` runs them for a batch of submits. The crash-safe order, idempotency
keys and their window, the full jobs log and refusals: docs/intake.md.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache

from mdq.bus.codec import decode_submit, encode, submit_is_json, to_json
from mdq.bus.publisher import EventPublisher
from mdq.bus.requests import CREATE_ONLY, Outgoing, is_stream_full, is_wrong_last_sequence
from mdq.bus.runtime import BUDGET_KEY
from mdq.contracts import pb
from mdq.core.documents import printable, quoted
from mdq.core.fingerprint import Content, Earlier, changes, content_fingerprint, content_of
from mdq.core.ids import (
    job_id,
    job_name_of,
    request_id_for_key,
    request_id_for_sequence,
    tenant_of,
)
from mdq.core.recommend import History, RecommendationMemo
from mdq.core.spec import AcceptedJob, SpecError, SpecMemo, validate_key, validate_submit
from mdq.core.tenants import RateRefusal, RunawayLimits, apply_runaway_limits
from mdq.forcefields import ForceFieldFolders
from services.intake.inputs import InputsCheck
from services.intake.registry import (
    ACCEPTED,
    JOB_ID_PATTERN,
    REUSED,
    SEEN,
    Claim,
    SubmitRegistry,
)
from services.intake.room import JobsLogRoom
from services.intake.tenants import TenantGate

log = logging.getLogger(__name__)

JSON_CONTENT_TYPE = "application/json"
PROTOBUF_CONTENT_TYPE = "application/x-protobuf"


def is_json(data: bytes) -> bool:
    """Whether a client sent the JSON mapping (``mdq.bus.codec.submit_is_json``, the test
    its decoding uses): a bare ``null`` or ``42`` is JSON too, and is answered in JSON."""
    return submit_is_json(data)


def serialize_reply(reply: pb.SubmitReply, *, as_json: bool) -> bytes:
    """The reply in the encoding the client used."""
    return to_json(reply).encode() if as_json else encode(reply)


def external_refs(request: pb.SubmitRequest) -> list[str]:
    """Dependencies that are not names of jobs in this submit (job ids or keys)."""
    refs = [ref for job in request.jobs for ref in job.depends_on]
    if not refs:  # most submits
        return refs
    names = {job.name for job in request.jobs}
    return [ref for ref in refs if ref not in names]


def check_job_ids(request: pb.SubmitRequest, *, request_id: str) -> None:
    """Every job id must be usable as a subject token and a KV key before anything is published.

    ``validate_submit`` already checks names; this guards the log against a gap there (a name
    with a trailing newline passes a ``$``-anchored pattern and would break the subject).
    """
    for index, job in enumerate(request.jobs):
        if not JOB_ID_PATTERN.fullmatch(job_id(request_id, job.name)):
            raise SpecError(
                f"jobs[{index}].name",
                "must be 1 to 40 lowercase letters, digits or '-', starting with a letter",
            )


MAX_FIELD_CHARS = 300
MAX_MESSAGE_CHARS = 1000


def submit_error(error: SpecError) -> pb.SubmitError:
    """The error as the client reads it: cut short (a field path or message may quote what
    the client sent, which can be up to a megabyte) and encodable (no lone surrogates)."""
    return pb.SubmitError(
        field=printable(error.field, MAX_FIELD_CHARS),
        message=printable(error.message, MAX_MESSAGE_CHARS),
    )


def refusal(request_id: str, error: SpecError) -> pb.SubmitReply:
    return pb.SubmitReply(request_id=request_id, error=submit_error(error))


def submitted_event(
    publisher: EventPublisher,
    job: AcceptedJob,
    *,
    request: pb.SubmitRequest,
    request_id: str,
) -> pb.Event:
    # Filled in place in the envelope: building the body apart copies the spec twice.
    event = publisher.event(
        "submitted", pb.JobSubmitted(), job_id=job_id(request_id, job.name), attempt=0
    )
    body = event.submitted
    body.spec.CopyFrom(job.spec)
    body.request_id = request_id
    body.idempotency_key = request.idempotency_key
    body.depends_on_ids.extend(job.depends_on_ids)
    body.submitted_by = request.submitted_by
    if job.recommended is not None:
        body.recommended.CopyFrom(job.recommended)
    return event


def rejected_event(
    publisher: EventPublisher,
    *,
    request_id: str,
    idempotency_key: str,
    error: SpecError,
    variant: str = "",
) -> pb.Event:
    """The ``rejected`` event of a refused submit; its id is ``rejected:-:0:<request_id>``, or
    ``...:<request_id>:<variant>`` for a refusal of its own under a request id (a changed
    content under a key already used, say), which deduplication must not merge with another."""
    body = pb.JobRejected(
        request_id=request_id, idempotency_key=idempotency_key, error=submit_error(error)
    )
    detail = f"{request_id}:{variant}" if variant else request_id
    return publisher.event("rejected", body, job_id="", attempt=0, detail=detail)


@dataclass(frozen=True, slots=True)
class Arrival:
    """One submit as it arrived: its bytes, and the tenant whose subject it came on ("" = the
    operator's), which the server enforced: only that tenant may publish there."""

    data: bytes
    tenant: str = ""
    rate_taken: bool = False
    """Its tenant's rate token was taken as it arrived (request-reply: intake asks the rate
    before it reads a request); otherwise the rate is asked before it is validated."""


def decode_as(data: bytes, tenant: str) -> pb.SubmitRequest:
    """The submit request, with ``submitted_by`` the tenant it came from: never what a
    tenant's payload says (the operator's identity may name who it submits for)."""
    request = decode_submit(data)
    if tenant:
        request.submitted_by = tenant
    return request


Outcome = pb.SubmitReply | Exception
"""What became of one request-reply submit: its reply, or why it has none."""
Answer = Callable[[int, Outcome], Awaitable[None]]
"""Called with (index in the batch, outcome) once for each submit of a batch."""


@dataclass(slots=True)
class _Ready:
    """A request-reply submit that passed every check needing no I/O."""

    index: int
    request: pb.SubmitRequest
    request_id: str
    accepted: list[AcceptedJob]
    reply: pb.SubmitReply
    fingerprint: bytes
    answered_now: bool = False
    """A request-reply submit (its client waits for the answer), not a stream submit."""


@cache
def force_field_exists(name: str) -> bool:
    """Whether a job may name this force field: a file of OpenMM's own data or of the
    operator's MDQ_FORCEFIELD_DIR (read once per process; never the working folder)."""
    return _force_field_folders().exists(name)


@cache
def _force_field_folders() -> ForceFieldFolders:
    return ForceFieldFolders.from_env()


def acceptance(
    request: pb.SubmitRequest,
    *,
    request_id: str,
    resolved: Mapping[str, str],
    key_required: bool,
    history: History | None = None,
    specs: SpecMemo | None = None,
    recommendations: RecommendationMemo | None = None,
) -> tuple[list[AcceptedJob], pb.SubmitReply, bytes]:
    """The jobs of a submit in publishing order, the reply that names them and the content
    fingerprint; SpecError if it cannot be accepted (``resolved``: its dependencies on
    earlier jobs, as job ids). With ``history`` (measured usage, ``mdq.core.recommend``), each
    job gets a resource recommendation, and an ``auto`` job's resources are filled in from it
    (after the fingerprint: a resubmit is the same content whatever history learned since).
    ``specs``: the memo that normalizes the jobs (it checks force fields as
    ``force_field_exists`` does); None: ``normalize_job`` each time. ``recommendations``: the
    memo that recommends (None: one for this submit)."""
    accepted = validate_submit(
        request,
        request_id=request_id,
        resolve_external=resolved.get,
        key_required=key_required,
        force_field_exists=force_field_exists,
        specs=specs,
    )
    check_job_ids(request, request_id=request_id)
    reply = pb.SubmitReply(
        request_id=request_id, job_ids=[job_id(request_id, job.name) for job in request.jobs]
    )
    by_name = {job.name: job.spec for job in accepted}
    fingerprint = content_fingerprint(
        [by_name[job.name] for job in request.jobs], request.submitted_by
    )
    if history is not None:
        memo = recommendations if recommendations is not None else RecommendationMemo()
        accepted = [_recommended(job, history, memo) for job in accepted]
    else:
        for index, job in enumerate(request.jobs):
            if job.resources.auto and not (job.resources.cpu and job.resources.memory_mb):
                raise SpecError(
                    f"jobs[{index}].resources.auto",
                    "this intake recommends no resources (MDQ_INTAKE_RECOMMEND_RESOURCES=false): "
                    "state cpu and memory_mb",
                )
    return accepted, reply, fingerprint


def limited(
    request: pb.SubmitRequest,
    accepted: list[AcceptedJob],
    tenant: str,
    limits: Callable[[str], RunawayLimits],
) -> list[AcceptedJob]:
    """The accepted jobs held to ``tenant``'s runaway limits (``apply_runaway_limits``: a job
    above one is refused naming its field in the submit; an unset wall time or disk gets the
    limit, after the fingerprint, so a resubmit is the same content whatever the limits
    became)."""
    index = {job.name: i for i, job in enumerate(request.jobs)}
    bounds = limits(tenant)
    return [
        job.with_spec(apply_runaway_limits(tenant, bounds, job.spec, f"jobs[{index[job.name]}]"))
        for job in accepted
    ]


def with_auto_resources(request: pb.SubmitRequest) -> pb.SubmitRequest:
    """``request`` with every job that states neither resources.cpu nor resources.memory_mb
    marked resources.auto (MDQ_INTAKE_AUTO_RESOURCES); the request itself when none is."""
    unset = [job for job in request.jobs if not (job.resources.cpu or job.resources.memory_mb)]
    if not unset:
        return request
    marked = pb.SubmitRequest()
    marked.CopyFrom(request)
    for job in marked.jobs:
        if not (job.resources.cpu or job.resources.memory_mb):
            job.resources.auto = True
    return marked


def _recommended(job: AcceptedJob, history: History, memo: RecommendationMemo) -> AcceptedJob:
    if job.spec.task == pb.TASK_ANALYZE and not job.spec.resources.auto:
        return job  # nothing to learn: no system
    spec, recommendation = memo.recommend_job(job.spec, history=history)
    return job.with_spec(spec, recommendation)


@dataclass(frozen=True, slots=True)
class Submit:
    """One submit to handle: as it arrived, and from which entrance."""

    arrival: Arrival
    sequence: int | None = None
    """Its submit stream sequence (the id of a keyless submit); None for request-reply, which
    requires an idempotency key."""


@dataclass(slots=True)
class _Read:
    """A submit that decoded and has a request id (not validated yet)."""

    index: int
    request: pb.SubmitRequest
    request_id: str
    tenant: str
    key_required: bool
    rate_taken: bool


def _read(index: int, submit: Submit) -> _Read:
    """Decode ``submit`` and derive its request id; SpecError (a malformed payload, a missing
    or invalid key) otherwise."""
    tenant = submit.arrival.tenant
    key_required = submit.sequence is None
    request = decode_as(submit.arrival.data, tenant)
    validate_key(request.idempotency_key, required=key_required)
    key = request.idempotency_key
    if key:
        request_id = request_id_for_key(key, tenant)
    else:
        request_id = request_id_for_sequence(submit.sequence or 0, tenant)
    return _Read(index, request, request_id, tenant, key_required, submit.arrival.rate_taken)


def _fallback_id(submit: Submit) -> str:
    """The request id of a stream submit that does not decode (its sequence's); "" for
    request-reply, whose refusal then names no request."""
    if submit.sequence is None:
        return ""
    return request_id_for_sequence(submit.sequence, submit.arrival.tenant)


async def _one(handle: Callable[[Answer], Awaitable[None]]) -> pb.SubmitReply:
    """The outcome of a batch of one: its reply, or the exception that kept it from one."""
    outcomes: list[Outcome] = []

    async def keep(_index: int, outcome: Outcome) -> None:
        outcomes.append(outcome)

    await handle(keep)
    (outcome,) = outcomes
    if isinstance(outcome, Exception):
        raise outcome
    return outcome


async def _settled(work: Awaitable[pb.SubmitReply]) -> Outcome:
    """The reply ``work`` gives, or the exception it raised (for the caller to sort)."""
    try:
        return await work
    except Exception as error:
        return error


JOBS_LOG_FULL = SpecError(
    "",
    "mdq's jobs log is full (its size limit, MDQ_STORAGE_JOBS_BYTES): nothing was accepted; "
    "submit again once old history has aged out or an operator has raised the limit",
)
"""The answer to a request-reply submit whose claim and events the full jobs log refused (a
stream submit meets it as a NATS error and waits in its stream)."""


class SubmitHandler:
    """Turns submits into events; safe to call again with the same submit.

    One pipeline handles every submit, a single one being a batch of one (``handle``)."""

    def __init__(
        self,
        *,
        publisher: EventPublisher,
        registry: SubmitRegistry,
        gate: TenantGate | None = None,
        room: JobsLogRoom | None = None,
        history: Callable[[], History] | None = None,
        auto_resources: bool = False,
        limits: Callable[[str], RunawayLimits] | None = None,
        inputs: InputsCheck | None = None,
    ) -> None:
        self._publisher = publisher
        self._limits = limits
        """tenant ("" the operator) -> its runaway limits (docs/control.md); None: none."""
        self._inputs = inputs
        """Checks the jobs' input files against the submitter's bucket and their LAMMPS
        scripts (``services.intake.inputs``); None: a submit naming input files is refused."""
        self._auto_resources = auto_resources
        """A job that states neither cpu nor memory_mb is resources.auto (docs/requests.md)."""
        self._history = history
        """Measured usage the resource recommender learns from; None: recommend nothing (an
        ``auto`` job is then refused, naming resources.auto)."""
        self._registry = registry
        self._gate = gate
        """Tenants' policies (rate, classes, quotas); None: no tenant is limited."""
        self._room = room
        """How full the jobs log is; None: never refuse for room."""
        self._locks = OnePerKey()
        self._specs = SpecMemo(force_field_exists=force_field_exists)
        """The job specs accepted lately, normalized (``validate_submit``'s work once per
        kind of job)."""
        self._recommendations = RecommendationMemo()
        """The recommendations made lately from the history in hand."""

    async def on_api_submit(self, data: bytes, tenant: str = "") -> pb.SubmitReply:
        """A request-reply submit of ``tenant``: the idempotency key is required."""
        return await _one(lambda answer: self.handle([Submit(Arrival(data, tenant))], answer))

    async def on_api_submits(self, batch: Sequence[Arrival], answer: Answer) -> None:
        """Request-reply submits that arrived together (``handle``)."""
        await self.handle([Submit(arrival) for arrival in batch], answer)

    async def on_stream_submit(
        self, data: bytes, *, sequence: int, tenant: str = "", rate_taken: bool = False
    ) -> pb.SubmitReply:
        """A submit of ``tenant`` captured by a submit stream at ``sequence`` (its id when
        keyless); ``rate_taken``: read from the tenant's own stream at its rate, so never
        refused for it."""
        submit = Submit(Arrival(data, tenant, rate_taken), sequence)
        return await _one(lambda answer: self.handle([submit], answer))

    async def handle(self, batch: Sequence[Submit], answer: Answer) -> None:
        """Handle submits that arrived together: ``answer(index, outcome)`` is awaited for
        each as soon as its outcome is known (its reply, or the exception that kept it from
        one: the caller tells a NATS error from a bug).

        The steps, each done for the whole batch at once where it costs I/O: decode and derive
        the request ids; take each request id (one submit per request id at a time in this
        process: a submit whose id is in hand waits for it, then goes on as a batch of its
        own, without holding up the others); resolve the dependencies on earlier jobs;
        validate; check the tenants' policies; claim the request ids in the registry as one
        batch of writes; publish the events as one batch per position in their submits (so
        each submit's dependencies still come first). A refusal, and a submit whose key was
        claimed before (a retry, a replay, other content under a used key), takes its own
        slower path side by side with the rest."""
        held: list[_Read] = []
        aside: list[Awaitable[None]] = []
        for index, submit in enumerate(batch):
            try:
                read = _read(index, submit)
            except SpecError as error:
                aside.append(self._answer_refused(index, _fallback_id(submit), error, answer))
                continue
            except Exception as error:  # a bug: this submit's answer
                aside.append(answer(index, error))
                continue
            if self._locks.try_hold(read.request_id):
                held.append(read)
            else:
                aside.append(self._after_its_turn(read, answer))
        await asyncio.gather(self._accept(held, answer), *aside)

    async def _answer_refused(
        self, index: int, request_id: str, error: SpecError, answer: Answer
    ) -> None:
        """A submit refused before it had a request id to hold."""
        outcome = await _settled(
            self._refuse(request_id=request_id, idempotency_key="", error=error)
        )
        await answer(index, outcome)

    async def _after_its_turn(self, read: _Read, answer: Answer) -> None:
        """A submit whose request id another submit holds: once it has it, on its own."""
        await self._locks.acquire(read.request_id)
        await self._accept([read], answer)

    async def _accept(self, held: list[_Read], answer: Answer) -> None:
        """Validate, check and accept submits whose request ids are held; each is released
        once its submit is answered."""
        if not held:
            return
        refs = {read.index: external_refs(read.request) for read in held}
        naming = [read for read in held if refs[read.index]]  # most submits name none
        looked_up = await asyncio.gather(
            *(self._registry.resolve_all(refs[read.index], read.tenant) for read in naming),
            return_exceptions=True,
        )
        resolutions = dict(zip((read.index for read in naming), looked_up, strict=True))
        found = [resolutions.get(read.index, {}) for read in held]
        ready: list[_Ready] = []
        aside: list[Awaitable[None]] = []
        try:
            full = None if self._room is None else await self._room.refusal()
        except Exception as error:  # a NATS error: none of them can be accepted now
            for read in held:
                self._locks.release(read.request_id)
            await asyncio.gather(*(answer(read.index, error) for read in held))
            return
        for read, resolved in zip(held, found, strict=True):
            try:
                if isinstance(resolved, BaseException):
                    raise resolved
                if full is not None:
                    raise full  # a retry of an accepted submit still gets its reply
                too_fast = (
                    self._gate.rate_refusal(read.tenant)
                    if read.tenant and self._gate is not None and not read.rate_taken
                    else None
                )
                if too_fast is not None:
                    raise too_fast  # before validating: a flood costs its decoding
                accepted, reply, fingerprint = acceptance(
                    with_auto_resources(read.request) if self._auto_resources else read.request,
                    request_id=read.request_id,
                    resolved=resolved,
                    key_required=read.key_required,
                    history=self._history() if self._history is not None else None,
                    specs=self._specs,
                    recommendations=self._recommendations,
                )
                if self._limits is not None:
                    accepted = limited(read.request, accepted, read.tenant, self._limits)
                if read.tenant and self._gate is not None:
                    specs = [job.spec for job in accepted]
                    if (refused := await self._gate.refusal(read.tenant, specs)) is not None:
                        raise refused  # a retry of an accepted submit still gets its reply
                if any(job.spec.inputs for job in accepted):
                    await self._check_inputs(read, accepted)
            except SpecError as error:
                aside.append(self._answer_invalid(read, error, answer))
                continue
            except Exception as error:  # a NATS error, or a bug: this submit's answer
                self._locks.release(read.request_id)
                aside.append(answer(read.index, error))
                continue
            ready.append(
                _Ready(
                    read.index,
                    read.request,
                    read.request_id,
                    accepted,
                    reply,
                    fingerprint,
                    answered_now=read.key_required,
                )
            )
        await asyncio.gather(self._accept_together(ready, answer), *aside)

    async def _check_inputs(self, read: _Read, accepted: Sequence[AcceptedJob]) -> None:
        """SpecError unless every job's input files are in the submitter's bucket and its
        LAMMPS scripts pass (``services.intake.inputs``), named in submitted order."""
        if self._inputs is None:
            raise SpecError("jobs", "this intake reads no input files: submit jobs without inputs")
        specs = {job.name: job.spec for job in accepted}
        ordered = [specs[job.name] for job in read.request.jobs]
        if (refused := await self._inputs.refusal(read.tenant, ordered)) is not None:
            raise refused

    async def _answer_invalid(self, read: _Read, error: SpecError, answer: Answer) -> None:
        """A submit that does not validate (or its tenant may not submit): refused, unless
        its key was accepted before with the same content (a retry whose dependencies have
        changed since, say), which gets that answer."""
        try:
            outcome = await _settled(self._invalid(read, error))
        finally:
            self._locks.release(read.request_id)
        await answer(read.index, outcome)

    async def _invalid(self, read: _Read, error: SpecError) -> pb.SubmitReply:
        request, request_id = read.request, read.request_id
        key = request.idempotency_key
        claim = await self._registry.existing(request_id)
        if claim is None and isinstance(error, RateRefusal) and read.key_required:
            return refusal(request_id, error)  # answered, not recorded: a flood stores nothing
        if claim is None:
            return await self._refuse(
                request_id=request_id,
                idempotency_key=key,
                error=error,
                answer_unrecorded=read.key_required,  # request-reply: the client waits
            )
        content = content_of(request)
        if content.fingerprint is not None and claim.fingerprint == content.fingerprint:
            return claim.reply  # accepted before: that answer stands
        return await self._conflict(request, request_id, claim, content)

    async def _accept_together(self, ready: list[_Ready], answer: Answer) -> None:
        """Claim and publish prepared submits together, each claim first
        (``SubmitRegistry.accept``), releasing each request id once its submit is
        done; a submit whose key was claimed before, or whose jobs the log holds already,
        goes on alone."""
        if not ready:
            return
        known: list[_Ready] = []  # retries, most likely: their claims would refuse the write
        fresh: list[_Ready] = []
        for submit in ready:
            (known if self._registry.claimed_here(submit.request_id) else fresh).append(submit)
        ready = fresh
        results = await asyncio.gather(
            *(
                self._registry.accept(
                    request_id=submit.request_id,
                    reply=submit.reply,
                    fingerprint=submit.fingerprint,
                    events=self._events_of(submit),
                )
                for submit in ready
            ),
            return_exceptions=True,
        )
        outcomes: dict[int, Outcome] = {}
        seen: list[_Ready] = known
        reused: list[_Ready] = []
        for submit, result in zip(ready, results, strict=True):
            if result == ACCEPTED:
                outcomes[submit.index] = submit.reply
            elif result == SEEN:
                seen.append(submit)
            elif result == REUSED:
                reused.append(submit)
            elif is_stream_full(result) and submit.answered_now:
                outcomes[submit.index] = refusal(submit.request_id, JOBS_LOG_FULL)
            elif isinstance(result, Exception):  # a full log: a stream submit waits
                outcomes[submit.index] = result
            else:  # cancelled, or worse: raised once the others are answered
                outcomes[submit.index] = RuntimeError(f"accepting a submit failed: {result!r}")
        for submit in ready:
            if submit.index in outcomes:
                self._locks.release(submit.request_id)
        if accepted := sum(result == ACCEPTED for result in results):
            log.info("accepted %d submit(s) together", accepted)
        for index, outcome in outcomes.items():
            await answer(index, outcome)
        await asyncio.gather(
            *(self._answer_seen(submit, answer) for submit in seen),
            *(self._answer_reused(submit, answer) for submit in reused),
        )
        for result in results:
            if isinstance(result, BaseException) and not isinstance(result, Exception):
                raise result

    def _events_of(self, submit: _Ready) -> list[Outgoing]:
        """The ``submitted`` events of a submit's jobs, dependencies first, each refused if
        the log holds its job already."""
        return [
            self._publisher.outgoing(
                submitted_event(
                    self._publisher, job, request=submit.request, request_id=submit.request_id
                ),
                CREATE_ONLY,
            )
            for job in submit.accepted
        ]

    async def _answer_reused(self, submit: _Ready, answer: Answer) -> None:
        """A submit claimed anew whose first job the log already holds. Its ``submitted``
        event is younger than the duplicate window: the registry lost the claim (a bucket
        purged or restored from a backup) while the log kept the jobs, and the submit is
        completed and answered as accepted. Older: its key's claim expired, and it is refused;
        the refusal is what the key records now."""
        try:
            outcome = await _settled(self._reused(submit))
        finally:
            self._locks.release(submit.request_id)
        await answer(submit.index, outcome)

    async def _reused(self, submit: _Ready) -> pb.SubmitReply:
        request, request_id = submit.request, submit.request_id
        first = job_id(request_id, submit.accepted[0].name)
        if await self._registry.submitted_within_window(first):
            await self._registry.overwrite(
                request_id=request_id, reply=submit.reply, fingerprint=submit.fingerprint
            )
            await self._publish(request, request_id=request_id, accepted=submit.accepted)
            return submit.reply
        key = request.idempotency_key
        jobs = ", ".join(job_id(request_id, job.name) for job in submit.accepted)
        what = f"idempotency key {quoted(key)}" if key else f"request {request_id}"
        error = SpecError(
            "idempotency_key" if key else "",
            f"{what} was used by a submit older than intake's duplicate window "
            f"({self._registry.window_days:g} days), whose jobs the log still holds ({jobs}): "
            "a new submit needs a new key",
        )
        reply = await self._refuse(
            request_id=request_id,
            idempotency_key=key,
            error=error,
            variant="reused",
            answer_unrecorded=key != "",
        )
        await self._registry.overwrite(
            request_id=request_id, reply=reply, fingerprint=submit.fingerprint
        )
        return reply

    async def _answer_seen(self, submit: _Ready, answer: Answer) -> None:
        """A prepared submit whose key was claimed before: the recorded reply (retries and
        replays, rare), found while still holding its request id."""
        try:
            outcome = await _settled(self._seen_before(submit))
        finally:
            self._locks.release(submit.request_id)
        await answer(submit.index, outcome)

    async def _publish(
        self, request: pb.SubmitRequest, *, request_id: str, accepted: list[AcceptedJob]
    ) -> None:
        for job in accepted:  # one at a time: the log keeps dependencies first
            event = submitted_event(self._publisher, job, request=request, request_id=request_id)
            try:
                await self._publisher.publish(event, headers=CREATE_ONLY)
            except Exception as error:
                if not is_wrong_last_sequence(error):
                    raise
                # the log holds this job already (published before the crash): done

    async def _seen_before(self, submit: _Ready) -> pb.SubmitReply:
        """The answer to a submit whose request id is claimed: the recorded reply, after
        publishing this submit's events if the claim is its own and they are missing; a
        refusal if the claim is another content's. A claim gone since (it expired) is
        claimed anew, as a submit of its own."""
        request, request_id, accepted = submit.request, submit.request_id, submit.accepted
        claim = await self._registry.existing(request_id)
        if claim is None:
            result = await self._registry.accept(
                request_id=request_id,
                reply=submit.reply,
                fingerprint=submit.fingerprint,
                events=self._events_of(submit),
            )
            if result == ACCEPTED:
                return submit.reply
            if result == REUSED:
                return await self._reused(submit)
            if isinstance(result, Exception):
                raise result
            claim = await self._registry.existing(request_id)  # claimed meanwhile
            if claim is None:
                raise RuntimeError(f"the claim of {request_id} came and went")
        if claim.fingerprint != submit.fingerprint:
            return await self._conflict(request, request_id, claim, content_of(request))
        last = job_id(request_id, accepted[-1].name)
        if await self._registry.needs_events(claim, last):
            log.info("completing %s: its events were not all published", request_id)
            await self._publish(request, request_id=request_id, accepted=accepted)
        return claim.reply

    async def _conflict(
        self, request: pb.SubmitRequest, request_id: str, claim: Claim, content: Content
    ) -> pb.SubmitReply:
        """Refuse a submit whose key was used by an accepted submit of other content, saying
        what differs (from that submit's ``submitted`` events, where the log still has them)."""
        found = await self._registry.submitted(list(claim.reply.job_ids))
        specs = [body.spec if body is not None else None for body in found]
        submitters = {body.submitted_by for body in found if body is not None}
        earlier = Earlier(
            names=[job_name_of(job) for job in claim.reply.job_ids],
            specs=specs,
            submitted_by=submitters.pop() if len(submitters) == 1 else None,
        )
        differences = changes(earlier, content)
        key = request.idempotency_key
        what = "; ".join(differences) if differences else "the content differs"
        error = SpecError(
            "idempotency_key",
            f"{quoted(key)} was already used by a submit with other content ({what}): the "
            "same content under this key gets that submit's job ids, other content needs a "
            "new key",
        )
        variant = hashlib.sha256(request.SerializeToString(deterministic=True)).hexdigest()
        return await self._refuse(
            request_id=request_id, idempotency_key=key, error=error, variant=variant[:16]
        )

    async def refuse_unhandled(
        self, *, sequence: int, error: Exception, tenant: str = ""
    ) -> pb.SubmitReply:
        """Refuse a stream submit that failed in an unexpected way, so it is not retried forever."""
        reply = self.internal_error(error)
        return await self._refuse(
            request_id=request_id_for_sequence(sequence, tenant),
            idempotency_key="",
            error=SpecError(reply.error.field, reply.error.message),
        )

    @staticmethod
    def internal_error(error: Exception) -> pb.SubmitReply:
        """The answer to a submit that failed in an unexpected way (a bug, not the input)."""
        return refusal("", SpecError("", f"internal error in intake: {type(error).__name__}"))

    async def _refuse(
        self,
        *,
        request_id: str,
        idempotency_key: str,
        error: SpecError,
        variant: str = "",
        answer_unrecorded: bool = False,
    ) -> pb.SubmitReply:
        """Publish the ``rejected`` event of a refused submit and return its reply. When the
        jobs log has no room even for that event, a submit whose client waits for the answer
        (``answer_unrecorded``) gets it anyway; a stream submit gets the NATS error (retried)."""
        if request_id:
            try:
                await self._publisher.publish(
                    rejected_event(
                        self._publisher,
                        request_id=request_id,
                        idempotency_key=idempotency_key,
                        error=error,
                        variant=variant,
                    )
                )
            except Exception as failure:
                if not (answer_unrecorded and is_stream_full(failure)):
                    raise
                log.warning("refused %s without a rejected event: the jobs log is full", request_id)
        # one line a refusal, within the budget of its tenant's refusals (mdq.bus.runtime)
        log.info(
            "refused %s: %s",
            request_id or "a request",
            error,
            extra={BUDGET_KEY: tenant_of(request_id) if request_id else ""},
        )
        return refusal(request_id, error)


class OnePerKey:
    """Mutual exclusion per key: one holder at a time, the others wait in arrival order.

    ``async with locks.hold(key)``. A key nobody else holds costs one dict entry and no lock
    object (an ``asyncio.Lock`` made per submit would cost intake on every submit); a key is
    forgotten when its last holder leaves.
    """

    def __init__(self) -> None:
        self.waiting: dict[str, deque[asyncio.Future[None]]] = {}
        """key -> the turns of those waiting for it (present while someone holds it)."""

    def hold(self, key: str) -> _Held:
        return _Held(self, key)

    async def acquire(self, key: str) -> None:
        """Take the key, waiting for its holders before (in arrival order); ``release`` it
        after."""
        turns = self.waiting.get(key)
        if turns is None:
            self.waiting[key] = deque()
            return
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        turns.append(turn)
        try:
            await turn
        except BaseException:
            if turn.done() and not turn.cancelled():  # handed over as it was cancelled
                self.release(key)
            elif turn in turns:
                turns.remove(turn)
            raise

    def try_hold(self, key: str) -> bool:
        """Take the key if nobody holds it (True); never waits. ``release`` it after."""
        if key in self.waiting:
            return False
        self.waiting[key] = deque()
        return True

    def release(self, key: str) -> None:
        """Hand the key to the next waiter still waiting, or forget it."""
        turns = self.waiting[key]
        while turns:
            turn = turns.popleft()
            if not turn.done():  # a cancelled waiter's turn is done already
                turn.set_result(None)
                return
        del self.waiting[key]


class _Held:
    __slots__ = ("_key", "_locks")

    def __init__(self, locks: OnePerKey, key: str) -> None:
        self._locks, self._key = locks, key

    async def __aenter__(self) -> None:
        await self._locks.acquire(self._key)

    async def __aexit__(self, *_exc: object) -> None:
        self._locks.release(self._key)
