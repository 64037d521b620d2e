"""Job control: what cancel, hold, release, requeue, reprioritize and extend do to a job (pure).

Placement's leader answers a ``ControlRequest``; every decision is here, so the service only
reads, publishes and deletes pods: checking a request (``check_request``), its idempotency
(``control_id_for_key``, ``fingerprint``), who may control which jobs (``may_control``,
``Selector``) and what it does to one job (``decide``). Design: docs/control.md.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import cast

from google.protobuf.descriptor import Descriptor
from google.protobuf.message import DecodeError, Message

from mdq.contracts import pb
from mdq.core.documents import (
    MAX_DEPTH,
    Duplicated,
    duplicate_error,
    load_json,
    parse_document,
    printable,
)
from mdq.core.ids import REQUEST_ID_HEX, TENANT_SEPARATOR, tenant_of
from mdq.core.recovery import cancel_message
from mdq.core.spec import PRIORITY_CLASSES, SpecError
from mdq.core.state import IDLE_STATES, LIVE_STATES, JobState, JobView, Stop
from mdq.core.tenants import TENANT_PATTERN, JobIdError, check_job_id
from mdq.errors import InvalidInput

MAX_KEY_CHARS = 200
MAX_REASON_CHARS = 500
MAX_REQUESTED_BY_CHARS = 200
MAX_JOB_IDS = 10_000
MAX_LABELS = 32
MAX_EXTEND_STEPS = 10**10
"""The most steps one extend adds (the spec's own bound on a step target)."""
MAX_STEP_TARGET = 10**10
MAX_REQUEST_BYTES = 1024 * 1024

VERBS: dict[pb.ControlVerb, str] = {
    pb.CONTROL_CANCEL: "cancel",
    pb.CONTROL_HOLD: "hold",
    pb.CONTROL_RELEASE: "release",
    pb.CONTROL_REQUEUE: "requeue",
    pb.CONTROL_REPRIORITIZE: "reprioritize",
    pb.CONTROL_EXTEND: "extend",
}
"""Each verb's word (the CLI's command, the log's lines)."""
VERB_OF_WORD = {word: verb for verb, word in VERBS.items()}
EVENT_KINDS = (
    "cancel_requested",
    "cancelled",
    "held",
    "unheld",
    "requeue_requested",
    "reprioritized",
    "extended",
)
"""The events an ``Action`` may publish (placement publishes them)."""


class ControlRefused(InvalidInput):
    """A request refused as a whole; ``field`` is the path of the culprit ("" the message)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}" if field else message)
        self.field = field
        self.message = message

    def to_pb(self) -> pb.ControlError:
        return pb.ControlError(field=self.field, message=self.message)


# -- the request ---------------------------------------------------------------------------------
_REQUEST = cast(Descriptor, pb.ControlRequest.DESCRIPTOR)
_JSON_SCALAR = re.compile(rb"\s*(?:null|true|false|-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)\s*")
"""A JSON text that is one scalar: never a protobuf ControlRequest (``n``, ``t`` and ``f`` are
no field's first byte; a number is answered as the JSON it reads as)."""
REQUEST_ID_PATTERN = re.compile(
    rf"(?:{TENANT_PATTERN.pattern}{re.escape(TENANT_SEPARATOR)})?[0-9a-f]{{{REQUEST_ID_HEX}}}"
)
"""A submit's request id (fullmatch): the operator's ``<hex>``, a tenant's ``<tenant>.<hex>``."""


def decode_request(data: bytes) -> pb.ControlRequest:
    """A request as a client sent it: the protobuf JSON mapping (a JSON object, each key once,
    the verb by its name or number) or protobuf binary; ``ControlRefused`` naming the field
    for anything else."""
    if len(data) > MAX_REQUEST_BYTES:
        raise ControlRefused("", f"request is {len(data)} bytes, the limit is {MAX_REQUEST_BYTES}")
    request = pb.ControlRequest()
    if is_json(data):
        try:
            document = load_json(data or b"null", descriptor=_REQUEST)
        except SpecError as error:
            raise ControlRefused(error.field, error.message) from None
        except (ValueError, UnicodeDecodeError) as error:
            raise ControlRefused("", printable(f"malformed JSON: {error}")) from None
        if isinstance(document, Duplicated):
            twice = duplicate_error(document, _REQUEST)
            if twice is None:
                raise ControlRefused("", "a key given twice in one object: give it once")
            raise ControlRefused(twice.field, twice.message)
        if not isinstance(document, dict):
            raise ControlRefused(
                "", f"a control request must be a JSON object with a 'verb', got {_kind(document)}"
            )
        verb = document.get("verb")
        if isinstance(verb, bool | float):
            names = ", ".join(pb.ControlVerb.Name(v) for v in VERBS)
            raise ControlRefused(
                "verb", f"must be one of {names} (or its number), got {_kind(verb)}"
            )
        brackets = data.count(b"{") + data.count(b"[")
        try:
            parse_document(document, request, nested=brackets > MAX_DEPTH)
        except SpecError as error:
            raise ControlRefused(error.field, error.message) from None
        return request
    try:
        request.ParseFromString(data)
    except DecodeError as error:
        raise ControlRefused("", f"neither JSON nor a protobuf ControlRequest: {error}") from None
    return request


def _kind(value: object) -> str:
    """What a JSON value is, for a person: ``null``, ``the number 1.5``, ``a list``."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return f"the number {value!r}"
    if isinstance(value, str):
        return "a string"
    return "a list"


def is_json(data: bytes) -> bool:
    """Whether a client sent the JSON mapping (then it is answered in JSON): an object, a list,
    a string, a lone scalar (``null``) or nothing."""
    return (
        data.lstrip()[:1] in (b"{", b"[", b'"')
        or not data.strip()
        or _JSON_SCALAR.fullmatch(data) is not None
    )


def _printable_text(name: str, value: str, limit: int, *, required: bool = False) -> None:
    if required and not value:
        raise ControlRefused(name, "is required")
    if len(value) > limit:
        raise ControlRefused(name, f"is {len(value)} characters, at most {limit}")
    if not value.isprintable():
        raise ControlRefused(name, "must be printable (no control characters)")


def check_request(
    request: pb.ControlRequest, *, tenant: str, allow_high: bool = True
) -> pb.ControlRequest:
    """``request`` checked (``ControlRefused`` naming the field otherwise); ``allow_high``:
    whether the requester may use the ``high`` class (a tenant's policy)."""
    _printable_text("control_key", request.control_key, MAX_KEY_CHARS, required=True)
    _printable_text("reason", request.reason, MAX_REASON_CHARS)
    _printable_text("requested_by", request.requested_by, MAX_REQUESTED_BY_CHARS)
    verb = request.verb
    if verb not in VERBS:
        names = ", ".join(pb.ControlVerb.Name(v) for v in VERBS)
        raise ControlRefused("verb", f"must be one of {names}")
    chosen = [
        name
        for name, given in (
            ("job_ids", bool(request.job_ids)),
            ("request_id", bool(request.request_id)),
            ("labels", bool(request.labels)),
        )
        if given
    ]
    if len(chosen) != 1:
        raise ControlRefused(
            "",
            "name the jobs with exactly one of job_ids, request_id or labels"
            + (f" (got {', '.join(chosen)})" if chosen else ""),
        )
    if len(request.job_ids) > MAX_JOB_IDS:
        raise ControlRefused("job_ids", f"{len(request.job_ids)} ids, at most {MAX_JOB_IDS}")
    for index, job in enumerate(request.job_ids):
        _printable_text(f"job_ids[{index}]", job, 200, required=True)
    if request.request_id:
        _printable_text("request_id", request.request_id, 64)
    if len(request.labels) > MAX_LABELS:
        raise ControlRefused("labels", f"{len(request.labels)} labels, at most {MAX_LABELS}")
    for key, value in request.labels.items():
        _printable_text(f"labels[{key!r}]", key, 63, required=True)
        _printable_text(f"labels[{key!r}]", value, 63)
    if verb == pb.CONTROL_EXTEND:
        if not request.job_ids:
            raise ControlRefused(
                "job_ids", "extend names its jobs by id (it is for jobs that ended)"
            )
        if not 1 <= request.extend_steps <= MAX_EXTEND_STEPS:
            raise ControlRefused(
                "extend_steps", f"must be 1 to {MAX_EXTEND_STEPS:.0e}, got {request.extend_steps}"
            )
    elif request.extend_steps:
        raise ControlRefused("extend_steps", "is for CONTROL_EXTEND only")
    if verb == pb.CONTROL_REPRIORITIZE:
        if request.priority_class not in PRIORITY_CLASSES:
            raise ControlRefused("priority_class", f"must be one of {', '.join(PRIORITY_CLASSES)}")
        if request.priority_class == "high" and not allow_high:
            raise ControlRefused(
                "priority_class",
                f"tenant {tenant} may not use the high class (the class that preempts other "
                "work); use normal or low",
            )
    elif request.priority_class:
        raise ControlRefused("priority_class", "is for CONTROL_REPRIORITIZE only")
    return request


def check_names(request: pb.ControlRequest, *, tenant: str) -> pb.ControlRequest:
    """``request`` if the jobs it names are named well (``ControlRefused`` naming the field
    otherwise), for the operator and tenants alike: every job id is one intake could have made
    (``mdq.core.tenants.check_job_id``: never a subject wildcard, a space or two dots; another
    tenant's well-formed id is that job's ``CONTROL_FORBIDDEN``, not a refusal), and a request
    id is a submit's request id of the requester (a tenant's own: ``<tenant>.<hex>``). Run
    after ``check_request``, which bounds the number of ids."""
    for index, job in enumerate(request.job_ids):
        name = f"job_ids[{index}]"
        try:
            check_job_id(job, name)
        except JobIdError as error:
            raise ControlRefused(name, str(error).removeprefix(f"{name}: ")) from None
    given = request.request_id
    if given and not REQUEST_ID_PATTERN.fullmatch(given):
        raise ControlRefused(
            "request_id",
            printable(
                f"{given[:80]!r} is not a request id ('<12 hex digits>', or "
                "'<tenant>.<12 hex digits>')"
            ),
        )
    if given and tenant and tenant_of(given) != tenant:
        raise ControlRefused(
            "request_id",
            f"{given!r} is not a request of tenant {tenant} (its request ids are "
            f"'{tenant}.<12 hex digits>')",
        )
    return request


def control_id_for_key(control_key: str, tenant: str = "") -> str:
    """The id of a request: its key's, per tenant (two tenants' "k1" are two requests)."""
    seed = f"control:{tenant}:{control_key}"
    digest = hashlib.sha256(seed.encode()).hexdigest()[:REQUEST_ID_HEX]
    return f"{tenant}.{digest}" if tenant else digest


def fingerprint(request: pb.ControlRequest) -> str:
    """What makes two requests under one key the same request: everything they ask (the
    labels in key order, the ids as given)."""
    copy = pb.ControlRequest()
    copy.CopyFrom(request)
    return hashlib.sha256(copy.SerializeToString(deterministic=True)).hexdigest()


def may_control(tenant: str, job_id: str) -> bool:
    """Whether ``tenant`` ("" the operator) may control ``job_id``: its own jobs only."""
    return not tenant or tenant_of(job_id) == tenant


def origin_of(request: pb.ControlRequest, *, control_id: str, tenant: str) -> pb.ControlOrigin:
    """Who asked, and why, as the request's events carry it (``requester``)."""
    return pb.ControlOrigin(
        control_id=control_id,
        requested_by=requester(request.requested_by, tenant),
        tenant=tenant,
        reason=request.reason,
    )


def requester(requested_by: str, tenant: str) -> str:
    """Who asked, as the history says it. A tenant's request is ``tenant <name>``, the identity
    its subject proves (``tenant`` comes from the subject, never the payload), with what the
    client wrote in ``requested_by`` beside it in quotes (``tenant alice ('ann')``): a tenant
    cannot pass for the operator or another tenant. The operator's identities (``cli``, the
    console, ``admin``), which may control any job anyway, say who sits at them (``ann``,
    ``the console``); else ``the operator``."""
    if not tenant:
        return requested_by or "the operator"
    return f"tenant {tenant}" + (f" ({requested_by!r})" if requested_by else "")


# -- which jobs ----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Selector:
    """The jobs a request names (``job_ids``) or matches (a submit, labels), of one tenant."""

    tenant: str
    job_ids: tuple[str, ...] = ()
    request_id: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, request: pb.ControlRequest, tenant: str) -> Selector:
        return cls(
            tenant=tenant,
            job_ids=tuple(dict.fromkeys(request.job_ids)),
            request_id=request.request_id,
            labels=dict(request.labels),
        )

    @property
    def by_id(self) -> bool:
        return bool(self.job_ids)

    def matches(self, view: JobView) -> bool:
        """Whether a job the acting service holds is matched (a selector of ids matches those
        ids; another tenant's job never matches a request id or labels)."""
        if self.job_ids:
            return view.job_id in self.job_ids
        if not may_control(self.tenant, view.job_id):
            return False
        if self.request_id:
            return view.request_id == self.request_id
        labels = view.spec.labels
        return all(labels.get(key) == value for key, value in self.labels.items())


# -- what to do to one job -----------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Action:
    """What a request does to one job."""

    result: pb.ControlResult
    state: str
    """The job's state after it (as far as this action goes)."""
    message: str = ""
    kind: str = ""
    """The event to publish ("" none)."""
    body: Message | None = None
    attempt: int = 0
    """The event's (and the outcome's) attempt."""
    detail: str | None = None
    """The event id's detail (the control id, so another request's event is another fact)."""
    stop_pod: bool = False
    """Delete the job's current pod once the event is in the log."""

    def outcome(self, job_id: str) -> pb.ControlOutcome:
        return pb.ControlOutcome(
            job_id=job_id,
            result=self.result,
            state=self.state,
            attempt=self.attempt,
            message=self.message,
        )


@dataclass(frozen=True, slots=True)
class Limits:
    """What bounds an extend: the requester's limit on a job's step target (None: the
    spec's own bound)."""

    max_steps: int | None = None


def not_found(job_id: str) -> Action:
    return Action(pb.CONTROL_NOT_FOUND, "", f"no job {job_id}")


def forbidden(job_id: str, tenant: str) -> Action:
    return Action(pb.CONTROL_FORBIDDEN, "", f"job {job_id} is not tenant {tenant}'s")


def _not_applicable(view: JobView, why: str) -> Action:
    return Action(pb.CONTROL_NOT_APPLICABLE, view.state.value, why, attempt=view.attempt)


def _unchanged(view: JobView, why: str) -> Action:
    return Action(pb.CONTROL_UNCHANGED, view.state.value, why, attempt=view.attempt)


def _ended(view: JobView, what: str) -> Action:
    return _not_applicable(view, f"already {view.state.value}: nothing to {what}")


def _stopping(
    view: JobView,
    why: str,
    kind: str,
    body: Message,
    detail: str,
    *,
    stop_pod: bool,
    running: bool = True,
) -> Action:
    """``kind`` takes effect once the job's attempt stops at a checkpoint (``why`` says what
    it becomes then), or, its attempt ended (not ``running``), once recovery has decided."""
    message = f"stopping at a checkpoint; {why}" if running else f"its attempt ended; {why}"
    return Action(
        pb.CONTROL_STOPPING,
        view.state.value,
        message,
        kind,
        body,
        view.attempt,
        detail,
        stop_pod=stop_pod,
    )


def decide(
    verb: pb.ControlVerb,
    view: JobView,
    request: pb.ControlRequest,
    origin: pb.ControlOrigin,
    limits: Limits = Limits(),
) -> Action:
    """What ``verb`` does to the job ``view`` (its tenant checked already)."""
    detail = origin.control_id
    state = view.state
    if verb == pb.CONTROL_CANCEL:
        if state is JobState.CANCELLED:
            return _unchanged(view, "already CANCELLED")
        if state.terminal:
            return _ended(view, "cancel")
        if view.stop is Stop.CANCEL:
            return _unchanged(view, "already being cancelled")
        if state in IDLE_STATES:
            message = cancel_message(origin)
            body = pb.JobCancelled(origin=origin, message=message)
            return Action(
                pb.CONTROL_DONE,
                JobState.CANCELLED.value,
                message,
                "cancelled",
                body,
                view.attempt,
            )
        running = state in LIVE_STATES
        return _stopping(
            view,
            "CANCELLED once stopped" if running else "CANCELLED once recovery has decided",
            "cancel_requested",
            pb.CancelRequested(origin=origin),
            detail,
            stop_pod=running,
            running=running,
        )
    if verb == pb.CONTROL_HOLD:
        if state.terminal:
            return _ended(view, "hold")
        if view.hold:
            return _unchanged(view, "already held")
        if view.stop is Stop.CANCEL:
            return _not_applicable(view, "being cancelled")
        body_held = pb.JobHeld(origin=origin)
        if state in (JobState.WAITING, JobState.PENDING):
            return Action(
                pb.CONTROL_DONE, JobState.HELD.value, "", "held", body_held, view.attempt, detail
            )
        running = state in LIVE_STATES
        return _stopping(
            view,
            "HELD once stopped" if running else "HELD once recovery has requeued it",
            "held",
            body_held,
            detail,
            stop_pod=running and view.stop is Stop.NONE,
            running=running,
        )
    if verb == pb.CONTROL_RELEASE:
        if state.terminal:
            return _ended(view, "release")
        if not view.hold:
            return _not_applicable(view, f"not held ({state.value})")
        after = view.hold if state is JobState.HELD else state.value
        return Action(
            pb.CONTROL_DONE,
            after,
            "",
            "unheld",
            pb.JobUnheld(origin=origin),
            view.attempt,
            detail,
        )
    if verb == pb.CONTROL_REQUEUE:
        if state.terminal:
            return _ended(view, "requeue")
        if state not in LIVE_STATES:
            return _not_applicable(view, f"not running ({state.value}): nothing to requeue")
        if view.stop is Stop.REQUEUE:
            return _unchanged(view, "already being requeued")
        if view.stop is not Stop.NONE:
            return _not_applicable(view, f"already being stopped ({view.stop.value})")
        return _stopping(
            view,
            "PENDING again, as a new attempt, once stopped",
            "requeue_requested",
            pb.RequeueRequested(origin=origin),
            detail,
            stop_pod=True,
        )
    if verb == pb.CONTROL_REPRIORITIZE:
        if state.terminal:
            return _ended(view, "reprioritize")
        wanted = request.priority_class
        previous = view.spec.priority_class or "normal"
        if wanted == previous:
            return _unchanged(view, f"already {wanted}")
        return Action(
            pb.CONTROL_DONE,
            state.value,
            f"{previous} -> {wanted}",
            "reprioritized",
            pb.JobReprioritized(origin=origin, priority_class=wanted, previous=previous),
            view.attempt,
            detail,
        )
    if verb == pb.CONTROL_EXTEND:
        return _extend(view, request, origin, limits)
    raise ValueError(f"unknown verb {verb}")


def _extend(
    view: JobView, request: pb.ControlRequest, origin: pb.ControlOrigin, limits: Limits
) -> Action:
    if view.state is not JobState.SUCCEEDED:
        return _not_applicable(
            view, f"{view.state.value}, not SUCCEEDED: only a succeeded MD job is extended"
        )
    task = view.spec.task or pb.TASK_MD
    if task != pb.TASK_MD:
        return _not_applicable(
            view, f"a {pb.Task.Name(task)} job cannot be extended (only MD continues)"
        )
    checkpoint = view.latest_checkpoint
    if checkpoint is None:
        return _not_applicable(view, "it left no checkpoint to continue from")
    target = max(view.last_step, checkpoint.step) + request.extend_steps
    bound = MAX_STEP_TARGET if limits.max_steps is None else min(MAX_STEP_TARGET, limits.max_steps)
    if target > bound:
        return _not_applicable(
            view, f"the new step target {target} is above the limit of {bound} steps per job"
        )
    spec = pb.JobSpec()
    spec.CopyFrom(view.spec)
    spec.steps = target
    spec.ClearField("convergence")  # the extension runs to its target
    body = pb.JobExtended(
        origin=origin,
        added_steps=request.extend_steps,
        spec=spec,
        resume_from=checkpoint,
        request_id=view.request_id,
        depends_on_ids=list(view.depends_on_ids),
        resources=view.resources,
    )
    body.submitted_at.FromDatetime(view.submitted_at)
    attempt = view.attempt + 1
    note = (
        f"continues from step {checkpoint.step} to {target}"
        if checkpoint.step >= view.last_step
        else f"continues from its last checkpoint, step {checkpoint.step} (it ended at "
        f"{view.last_step}), to {target}"
    )
    return Action(pb.CONTROL_DONE, JobState.PENDING.value, note, "extended", body, attempt, None)


# -- the reply -----------------------------------------------------------------------------------
MAX_REPLY_BYTES = 768 * 1024
"""A reply's outcomes stop here (the rest are counted: ``ControlReply.omitted``), below the
bus's 1 MiB message."""


def reply_of(control_id: str, outcomes: list[pb.ControlOutcome]) -> pb.ControlReply:
    """The reply with ``outcomes`` (in job-id order), cut to ``MAX_REPLY_BYTES``."""
    reply = pb.ControlReply(control_id=control_id, matched=len(outcomes))
    counts: dict[str, int] = {}
    size = 0
    for outcome in sorted(outcomes, key=lambda o: o.job_id):
        name = pb.ControlResult.Name(outcome.result)
        counts[name] = counts.get(name, 0) + 1
        size += outcome.ByteSize() + 4
        if size > MAX_REPLY_BYTES:
            reply.omitted += 1
            continue
        reply.outcomes.append(outcome)
    reply.counts.update(counts)
    return reply


def fitted(
    reply: pb.ControlReply, size_of: Callable[[pb.ControlReply], int], limit: int
) -> pb.ControlReply:
    """``reply`` as it is if ``size_of`` it (its size in the encoding it is sent in: JSON
    takes about twice the bytes of protobuf) is at most ``limit``, else a copy with its last
    outcomes left out (counted in ``omitted``; ``counts`` still counts every job) until it is."""
    size = size_of(reply)
    if size <= limit:
        return reply
    cut = pb.ControlReply()
    cut.CopyFrom(reply)
    while size > limit and cut.outcomes:
        keep = min(len(cut.outcomes) - 1, int(len(cut.outcomes) * limit / size * 0.95))
        cut.omitted += len(cut.outcomes) - keep
        del cut.outcomes[keep:]
        size = size_of(cut)
    return cut


def refusal(control_id: str, error: ControlRefused) -> pb.ControlReply:
    return pb.ControlReply(control_id=control_id, error=error.to_pb())
