"""Intake's handling of one submit: decode -> validate -> claim -> publish.

The same steps serve both entrances, the submit stream (fire-and-forget, durable while intake is
down) and request-reply (a client waiting for its job ids); only the request id and whether the
idempotency key is required differ.

Crash-safe order of an accepted submit
--------------------------------------
1. Validate (resolving dependencies through the registry).
2. Claim ``req.<request_id>`` in the registry with the reply, in one round trip that fails if
   the request id is known (a KV create).
3. Publish one ``submitted`` event per job, dependencies first, each with its deterministic id
   ``submitted:<job_id>:0`` as Nats-Msg-Id.
4. Only then ack the stream message, or send the reply.

If the claim exists, the submit was seen before: the answer is the recorded reply, and nothing
new starts (a different submit under the same key gets the first one's job ids). If the
recorded jobs are this submit's and the last of their events is missing from the log, the
earlier attempt died between steps 2 and 3: the events are published now (JetStream drops the
ones already there, by their ids); see ``SubmitRegistry.needs_events``. A crash (or a NATS
error) anywhere before step 4 leaves the submit unacknowledged (the stream redelivers it) or
unanswered (the client retries with the same key), and the retry takes exactly that path. So
no reply ever names a job whose event is not in the log (DESIGN invariant 4), and a key is
checked and recorded with one registry round trip instead of a lookup and a write.

Refused submits
---------------
A refused submit publishes only a ``rejected`` event (to ``subjects.rejected(request_id)``, with
event id ``rejected:-:0:<request_id>``) and is not remembered: it changed nothing, so its key
stays free for a corrected submit. A submit that fails validation under a key that was
accepted before gets the recorded reply instead (a retry whose dependencies have changed, say).
A request-reply submit whose request id is unknown (malformed
payload, missing or invalid key) is answered with the error and publishes nothing, since there
is no request to name. The stream message of a refused submit is acked like any other: a bad
submit is never redelivered.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass

from mdq.bus.codec import decode_submit, encode, to_json
from mdq.bus.publisher import EventPublisher
from mdq.contracts import pb
from mdq.core.ids import job_id, request_id_for_key, request_id_for_sequence
from mdq.core.spec import AcceptedJob, SpecError, validate_key, validate_submit
from services.intake.registry import JOB_ID_PATTERN, SubmitRegistry

log = logging.getLogger(__name__)

JSON_CONTENT_TYPE = "application/json"
PROTOBUF_CONTENT_TYPE = "application/x-protobuf"


def is_json(data: bytes) -> bool:
    """Whether a client sent the JSON mapping (the same test as ``mdq.bus.codec``)."""
    return data.lstrip()[:1] in (b"{", b"[", b'"') or not data.strip()


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


def refusal(request_id: str, error: SpecError) -> pb.SubmitReply:
    return pb.SubmitReply(
        request_id=request_id,
        error=pb.SubmitError(field=error.field, message=error.message),
    )


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
    return event


def rejected_event(
    publisher: EventPublisher, *, request_id: str, idempotency_key: str, error: SpecError
) -> pb.Event:
    body = pb.JobRejected(
        request_id=request_id,
        idempotency_key=idempotency_key,
        error=pb.SubmitError(field=error.field, message=error.message),
    )
    return publisher.event("rejected", body, job_id="", attempt=0, detail=request_id)


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


def acceptance(
    request: pb.SubmitRequest,
    *,
    request_id: str,
    resolved: Mapping[str, str],
    key_required: bool,
) -> tuple[list[AcceptedJob], pb.SubmitReply]:
    """The jobs of a submit in publishing order and the reply that names them; SpecError if
    it cannot be accepted (``resolved``: its dependencies on earlier jobs, as job ids)."""
    accepted = validate_submit(
        request, request_id=request_id, resolve_external=resolved.get, key_required=key_required
    )
    check_job_ids(request, request_id=request_id)
    reply = pb.SubmitReply(
        request_id=request_id, job_ids=[job_id(request_id, job.name) for job in request.jobs]
    )
    return accepted, reply


def _prepare(index: int, data: bytes) -> _Ready | None:
    """The submit ready to be claimed, or None when it needs the one-by-one path (it is
    refused, or names jobs of earlier submits)."""
    try:
        request = decode_submit(data)
        validate_key(request.idempotency_key, required=True)
        if external_refs(request):
            return None
        request_id = request_id_for_key(request.idempotency_key)
        accepted, reply = acceptance(request, request_id=request_id, resolved={}, key_required=True)
    except SpecError:
        return None
    return _Ready(index, request, request_id, accepted, reply)


async def _settled(work: Awaitable[pb.SubmitReply]) -> Outcome:
    """The reply ``work`` gives, or the exception it raised (for the caller to sort)."""
    try:
        return await work
    except Exception as error:
        return error


class SubmitHandler:
    """Turns submits into events; safe to call again with the same submit."""

    def __init__(self, *, publisher: EventPublisher, registry: SubmitRegistry) -> None:
        self._publisher = publisher
        self._registry = registry
        self._locks = OnePerKey()

    async def on_api_submit(self, data: bytes) -> pb.SubmitReply:
        """A request-reply submit: the idempotency key is required."""
        return await self._handle(data, sequence=None)

    async def on_api_submits(self, batch: Sequence[bytes], answer: Answer) -> None:
        """Request-reply submits that arrived together: ``answer(index, outcome)`` is awaited
        for each as soon as its outcome is known (its reply, or the exception that kept it
        from one: the caller tells a NATS error from a bug).

        A submit that passes every check needing no I/O (it decodes, validates, names no
        earlier job, and its request id is not in hand here) is handled with the others like
        it: their claims go out as one batch of registry writes, then their events as one batch
        per position in their submits (so each submit's dependencies still come first), with no
        task, lock or timer per submit. Every other submit (a refusal, a dependency to resolve,
        a request id already in hand, a key seen before) takes the one-by-one path, side by
        side, and does not hold up the others' answers. The outcome of each is what
        ``on_api_submit`` would give."""
        ready: list[_Ready] = []
        one_by_one: list[Awaitable[None]] = []
        for index, data in enumerate(batch):
            prepared = _prepare(index, data)
            if prepared is not None and self._locks.try_hold(prepared.request_id):
                ready.append(prepared)
            else:
                one_by_one.append(self._answer_one(index, data, answer))
        await asyncio.gather(self._accept_together(ready, answer), *one_by_one)

    async def _answer_one(self, index: int, data: bytes, answer: Answer) -> None:
        await answer(index, await _settled(self.on_api_submit(data)))

    async def _accept_together(self, ready: list[_Ready], answer: Answer) -> None:
        """Claim and publish prepared submits as batches, releasing each request id once its
        submit is done; a submit whose key was claimed before goes on alone."""
        if not ready:
            return
        outcomes: dict[int, Outcome] = {}
        seen: list[_Ready] = []
        try:
            claims = await self._registry.claim_many(
                [(submit.request_id, submit.reply) for submit in ready]
            )
            publishing: list[_Ready] = []
            for submit, claimed in zip(ready, claims, strict=True):
                if isinstance(claimed, Exception):
                    outcomes[submit.index] = claimed
                else:
                    (publishing if claimed else seen).append(submit)
            depth = max((len(submit.accepted) for submit in publishing), default=0)
            for position in range(depth):  # a submit's dependencies are published first
                round_ = [
                    submit
                    for submit in publishing
                    if position < len(submit.accepted) and submit.index not in outcomes
                ]
                results = await self._publisher.publish_each(
                    [
                        (
                            submitted_event(
                                self._publisher,
                                submit.accepted[position],
                                request=submit.request,
                                request_id=submit.request_id,
                            ),
                            None,
                        )
                        for submit in round_
                    ]
                )
                for submit, result in zip(round_, results, strict=True):
                    if isinstance(result, Exception):
                        outcomes[submit.index] = result
            for submit in publishing:
                outcomes.setdefault(submit.index, submit.reply)
            if publishing:
                log.info("accepted %d submit(s) together", len(publishing))
        except Exception as error:  # the connection, say: all left fail
            seen.clear()
            for submit in ready:
                outcomes.setdefault(submit.index, error)
        finally:
            for submit in ready:
                if submit.index in outcomes:
                    self._locks.release(submit.request_id)
        for index, outcome in outcomes.items():
            await answer(index, outcome)
        await asyncio.gather(*(self._answer_seen(submit, answer) for submit in seen))

    async def _answer_seen(self, submit: _Ready, answer: Answer) -> None:
        """A prepared submit whose key was claimed before: the recorded reply (retries and
        replays, rare), found while still holding its request id."""
        try:
            outcome = await _settled(
                self._seen_before(submit.request, submit.request_id, submit.accepted, submit.reply)
            )
        finally:
            self._locks.release(submit.request_id)
        await answer(submit.index, outcome)

    async def on_stream_submit(self, data: bytes, *, sequence: int) -> pb.SubmitReply:
        """A submit captured by the submit stream at ``sequence`` (its id when keyless)."""
        return await self._handle(data, sequence=sequence)

    async def _handle(self, data: bytes, *, sequence: int | None) -> pb.SubmitReply:
        fallback_id = request_id_for_sequence(sequence) if sequence is not None else ""
        try:
            request = decode_submit(data)
            validate_key(request.idempotency_key, required=sequence is None)
        except SpecError as error:
            return await self._refuse(request_id=fallback_id, idempotency_key="", error=error)
        key = request.idempotency_key
        request_id = request_id_for_key(key) if key else fallback_id
        async with self._exclusive(request_id):
            try:
                accepted, reply = acceptance(
                    request,
                    request_id=request_id,
                    resolved=await self._registry.resolve_all(external_refs(request)),
                    key_required=sequence is None,
                )
            except SpecError as error:
                known = await self._registry.reply_for(request_id)
                if known is not None:  # accepted before: that answer stands
                    return known
                return await self._refuse(request_id=request_id, idempotency_key=key, error=error)
            if not await self._registry.claim(request_id=request_id, reply=reply):
                return await self._seen_before(request, request_id, accepted, reply)
            await self._publish(request, request_id=request_id, accepted=accepted)
            log.info("accepted %s: %d job(s)", request_id, len(accepted))
            return reply

    async def _publish(
        self, request: pb.SubmitRequest, *, request_id: str, accepted: list[AcceptedJob]
    ) -> None:
        for job in accepted:  # one at a time: the log keeps dependencies first
            event = submitted_event(self._publisher, job, request=request, request_id=request_id)
            await self._publisher.publish(event)

    async def _seen_before(
        self,
        request: pb.SubmitRequest,
        request_id: str,
        accepted: list[AcceptedJob],
        reply: pb.SubmitReply,
    ) -> pb.SubmitReply:
        """The answer to a submit whose request id is claimed: the recorded reply, after
        publishing this submit's events if the claim is its own and they are missing."""
        claim = await self._registry.existing(request_id)
        if claim is None:  # the record was deleted since the claim failed: claim it anew
            await self._registry.overwrite(request_id=request_id, reply=reply)
            await self._publish(request, request_id=request_id, accepted=accepted)
            return reply
        if list(claim.reply.job_ids) != list(reply.job_ids):
            return claim.reply  # another submit under the same key came first
        last = job_id(request_id, accepted[-1].name)
        if await self._registry.needs_events(claim, last):
            log.info("completing %s: its events were not all published", request_id)
            await self._publish(request, request_id=request_id, accepted=accepted)
        return claim.reply

    async def refuse_unhandled(self, *, sequence: int, error: Exception) -> pb.SubmitReply:
        """Refuse a stream submit that failed in an unexpected way, so it is not retried forever."""
        reply = self.internal_error(error)
        return await self._refuse(
            request_id=request_id_for_sequence(sequence),
            idempotency_key="",
            error=SpecError(reply.error.field, reply.error.message),
        )

    @staticmethod
    def internal_error(error: Exception) -> pb.SubmitReply:
        """The answer to a submit that failed in an unexpected way (a bug, not the input)."""
        return refusal("", SpecError("", f"internal error in intake: {type(error).__name__}"))

    async def _refuse(
        self, *, request_id: str, idempotency_key: str, error: SpecError
    ) -> pb.SubmitReply:
        if request_id:
            await self._publisher.publish(
                rejected_event(
                    self._publisher,
                    request_id=request_id,
                    idempotency_key=idempotency_key,
                    error=error,
                )
            )
        log.info("refused %s: %s", request_id or "a request", error)
        return refusal(request_id, error)

    def _exclusive(self, request_id: str) -> _Held:
        """One submit per request id at a time in this process (stream and request-reply)."""
        return self._locks.hold(request_id)


class OnePerKey:
    """Mutual exclusion per key: one holder at a time, the others wait in arrival order.

    ``async with locks.hold(key)``. A key nobody else holds costs one dict entry and no lock
    object (an ``asyncio.Lock`` per submit was a measurable part of intake's CPU); a key is
    forgotten when its last holder leaves.
    """

    def __init__(self) -> None:
        self.waiting: dict[str, deque[asyncio.Future[None]]] = {}
        """key -> the turns of those waiting for it (present while someone holds it)."""

    def hold(self, key: str) -> _Held:
        return _Held(self, key)

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
        turns = self._locks.waiting.get(self._key)
        if turns is None:
            self._locks.waiting[self._key] = deque()
            return
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        turns.append(turn)
        try:
            await turn
        except BaseException:
            if turn.done() and not turn.cancelled():  # handed over as it was cancelled
                self._locks.release(self._key)
            elif turn in turns:
                turns.remove(turn)
            raise

    async def __aexit__(self, *_exc: object) -> None:
        self._locks.release(self._key)
