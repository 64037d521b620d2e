"""The job state machine: fold a job's events into what is known about it (pure).

Every reader of a job's state (placement, recovery, the watcher, ``mdq replay``, the SDK) folds
the same log with ``JobView.apply``, so they agree. Fencing and job control's stops
(``JobView.stop``, sticky until a terminal event) are folded here. Design:
docs/architecture.md, "The job state machine"; docs/control.md.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any, TypeVar

from mdq.contracts import pb
from mdq.core.spec import PRIORITY_CLASSES
from mdq.core.timestamps import EPOCH, to_datetime


class JobState(StrEnum):
    """Where a job is in its life (see the prose at the top of proto/mdq/v1/mdq.proto)."""

    WAITING = "WAITING"
    PENDING = "PENDING"
    BOUND = "BOUND"
    RUNNING = "RUNNING"
    RECOVERING = "RECOVERING"
    HELD = "HELD"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_STATES


TERMINAL_STATES = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})
LIVE_STATES = frozenset({JobState.BOUND, JobState.RUNNING})
"""States of a job whose attempt has a pod: stopping it means deleting the pod."""
IDLE_STATES = frozenset({JobState.WAITING, JobState.PENDING, JobState.HELD})
"""States of a job with no attempt under way (nothing to stop, nothing to decide)."""

ATTEMPT_EVENTS = frozenset(
    {
        "bound",
        "started",
        "succeeded",
        "attempt_failed",
        "progress",
        "checkpoint",
        "pod",
        "fetched",
        "requeue_requested",
        "limit_exceeded",
    }
)
TIMED_EVENTS = frozenset(
    {"started", "progress", "succeeded", "attempt_failed", "failed", "cancelled", "extended"}
)
"""Events whose time ``JobView.apply`` records."""


class Stop(StrEnum):
    """Why a job's attempt is being stopped (``JobView.stop``)."""

    NONE = ""
    CANCEL = "cancel"
    """A cancel: the job ends CANCELLED (sticky until the job ends)."""
    HOLD = "hold"
    """A hold: the job is requeued HELD."""
    REQUEUE = "requeue"
    """A requeue: the job is requeued at once."""
    LIMIT = "limit"
    """A runaway limit: the job ends FAILED (FAILURE_LIMIT_EXCEEDED)."""


def event_time(event: pb.Event) -> datetime:
    """The envelope's time as an aware datetime."""
    return to_datetime(event.time)


# -- plain (JSON-able) forms, for snapshots of a service's state ----------------------------------
Message = TypeVar(
    "Message", pb.JobSpec, pb.Checkpoint, pb.Resources, pb.AttemptFailed, pb.ControlOrigin
)


def message_text(
    message: pb.JobSpec | pb.Checkpoint | pb.Resources | pb.AttemptFailed | pb.ControlOrigin,
) -> str:
    """A message as base64 of its (deterministic) wire format."""
    return base64.b64encode(message.SerializeToString(deterministic=True)).decode("ascii")


def message_from_text(kind: type[Message], text: str) -> Message:
    """The message ``message_text`` wrote."""
    message = kind()
    message.ParseFromString(base64.b64decode(text))
    return message


def time_text(at: datetime | None) -> str | None:
    """An aware datetime as ISO 8601 (``None`` stays ``None``)."""
    return None if at is None else at.isoformat()


def time_from_text(text: str | None) -> datetime | None:
    """The datetime ``time_text`` wrote."""
    return None if text is None else datetime.fromisoformat(text)


@dataclass(slots=True)
class AttemptRecord:
    """What happened to one attempt."""

    attempt: int
    node: str = ""
    pod_name: str = ""
    resumed_from_step: int = 0
    started_at: datetime | None = None
    ended_at: datetime | None = None
    failure: pb.AttemptFailed | None = None
    steps_lost: int = 0
    copy_lag_steps: int = 0
    """Of ``steps_lost``, the steps between the latest checkpoint and the copy the next
    attempt resumed from (after a cluster loss)."""
    resumed_from_copy: bool = False
    """This attempt's runner resumed from the shared store's copy of a checkpoint (its
    ``fetched`` event: the job's folder lacked the file), not from the file itself."""
    pod_phase: int = 0
    """Last reported phase of the attempt's pod (pb.PodPhase); terminal means fenced."""
    started_logged: bool = False
    """The log holds this attempt's ``started`` event (whether or not it moved the state: a
    first progress report folded earlier may have started the attempt already)."""

    @property
    def pod_terminated(self) -> bool:
        return self.pod_phase in (pb.POD_SUCCEEDED, pb.POD_FAILED)

    def to_dict(self) -> dict[str, Any]:
        """Every field as JSON-able values (``from_dict`` reads it back)."""
        return {
            "attempt": self.attempt,
            "node": self.node,
            "pod_name": self.pod_name,
            "resumed_from_step": self.resumed_from_step,
            "started_at": time_text(self.started_at),
            "ended_at": time_text(self.ended_at),
            "failure": None if self.failure is None else message_text(self.failure),
            "steps_lost": self.steps_lost,
            "copy_lag_steps": self.copy_lag_steps,
            "resumed_from_copy": self.resumed_from_copy,
            "pod_phase": self.pod_phase,
            "started_logged": self.started_logged,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AttemptRecord:
        failure = data["failure"]
        return cls(
            attempt=int(data["attempt"]),
            node=data["node"],
            pod_name=data["pod_name"],
            resumed_from_step=int(data["resumed_from_step"]),
            started_at=time_from_text(data["started_at"]),
            ended_at=time_from_text(data["ended_at"]),
            failure=None if failure is None else message_from_text(pb.AttemptFailed, failure),
            steps_lost=int(data["steps_lost"]),
            copy_lag_steps=int(data["copy_lag_steps"]),
            resumed_from_copy=bool(data["resumed_from_copy"]),
            pod_phase=int(data["pod_phase"]),
            started_logged=bool(data["started_logged"]),
        )


@dataclass(slots=True)
class JobView:
    """Everything the log says about one job."""

    job_id: str
    spec: pb.JobSpec
    request_id: str
    depends_on_ids: tuple[str, ...]
    submitted_at: datetime
    state: JobState
    attempt: int = 1
    node: str = ""
    pod_name: str = ""
    last_step: int = 0
    last_progress_at: datetime | None = None
    last_potential: float | None = None
    done_reason: str = ""
    latest_checkpoint: pb.Checkpoint | None = None
    checkpoint_at: datetime | None = None
    """When ``latest_checkpoint`` was reported (what a preemption would lose is the work since)."""
    latest_copy: pb.Checkpoint | None = None
    """The newest checkpoint copied to the store every cluster shares (``copied`` events of
    any attempt: each is a state of this job's own run), its ``copy_slot`` set."""
    resume_from: pb.Checkpoint | None = None
    resources: pb.Resources = field(default_factory=pb.Resources)
    avoid_nodes: tuple[str, ...] = ()
    not_before: datetime | None = None
    final_reason: str = ""
    final_message: str = ""
    attempts: dict[int, AttemptRecord] = field(default_factory=dict)
    hold: str = ""
    """"" when not held; else the state a release returns the job to (WAITING or PENDING). Set
    as soon as a hold is folded, also while the job's attempt is still being stopped."""
    stop: Stop = Stop.NONE
    """Why the job's attempt is being stopped (job control, a runaway limit)."""
    stop_origin: pb.ControlOrigin | None = None
    """Who asked for ``stop``, and why (None for a limit)."""
    stop_message: str = ""
    """For people: the limit crossed, for a ``Stop.LIMIT``."""
    since_attempt: int = 1
    """The first attempt of the run in force: 1, or the attempt an extend began. Its wall time
    (``ran_s``) and its failures count from there; earlier attempts are history."""

    @classmethod
    def from_submitted(cls, event: pb.Event) -> JobView:
        """A new view from a job's ``submitted`` event."""
        body = event.submitted
        view = cls(
            job_id=event.job_id,
            spec=body.spec,
            request_id=body.request_id,
            depends_on_ids=tuple(body.depends_on_ids),
            submitted_at=event_time(event),
            state=JobState.WAITING if body.depends_on_ids else JobState.PENDING,
        )
        view.resources.CopyFrom(body.spec.resources)
        view.attempts[1] = AttemptRecord(attempt=1)
        return view

    @classmethod
    def from_extended(cls, event: pb.Event) -> JobView:
        """A view from a job's ``extended`` event, for a fold that forgot the ended job: what
        the extended job needs from here on (its earlier attempts are history)."""
        body = event.extended
        resume = pb.Checkpoint()
        resume.CopyFrom(body.resume_from)
        view = cls(
            job_id=event.job_id,
            spec=body.spec,
            request_id=body.request_id,
            depends_on_ids=tuple(body.depends_on_ids),
            submitted_at=to_datetime(body.submitted_at),
            state=JobState.PENDING,
            attempt=event.attempt,
            last_step=resume.step,
            latest_checkpoint=resume if body.HasField("resume_from") else None,
            resume_from=resume if body.HasField("resume_from") else None,
        )
        view.resources.CopyFrom(body.resources)
        view.attempts[event.attempt] = AttemptRecord(
            attempt=event.attempt, resumed_from_step=view.last_step
        )
        view.since_attempt = event.attempt
        return view

    def to_dict(self) -> dict[str, Any]:
        """Every field as JSON-able values: messages as base64 of their wire format, times as
        ISO 8601 (``from_dict`` reads it back)."""
        checkpoint, resume, copy = self.latest_checkpoint, self.resume_from, self.latest_copy
        return {
            "job_id": self.job_id,
            "spec": message_text(self.spec),
            "request_id": self.request_id,
            "depends_on_ids": list(self.depends_on_ids),
            "submitted_at": time_text(self.submitted_at),
            "state": self.state.value,
            "attempt": self.attempt,
            "node": self.node,
            "pod_name": self.pod_name,
            "last_step": self.last_step,
            "last_progress_at": time_text(self.last_progress_at),
            "last_potential": self.last_potential,
            "done_reason": self.done_reason,
            "latest_checkpoint": None if checkpoint is None else message_text(checkpoint),
            "checkpoint_at": time_text(self.checkpoint_at),
            "latest_copy": None if copy is None else message_text(copy),
            "resume_from": None if resume is None else message_text(resume),
            "resources": message_text(self.resources),
            "avoid_nodes": list(self.avoid_nodes),
            "not_before": time_text(self.not_before),
            "final_reason": self.final_reason,
            "final_message": self.final_message,
            "attempts": [record.to_dict() for record in self.attempts.values()],
            "hold": self.hold,
            "stop": self.stop.value,
            "stop_origin": None if self.stop_origin is None else message_text(self.stop_origin),
            "stop_message": self.stop_message,
            "since_attempt": self.since_attempt,
        }

    def control_dict(self) -> dict[str, Any]:
        """The job-control part of the view (hold, stop) as JSON-able values, {} when there is
        none (``apply_control_dict`` reads it back; the projection stores it as a column)."""
        out: dict[str, Any] = {}
        if self.hold:
            out["hold"] = self.hold
        if self.stop:
            out["stop"] = self.stop.value
        if self.stop_origin is not None:
            out["stop_origin"] = message_text(self.stop_origin)
        if self.stop_message:
            out["stop_message"] = self.stop_message
        return out

    def apply_control_dict(self, data: dict[str, Any]) -> None:
        """Take the job-control part ``control_dict`` wrote (missing keys: none)."""
        self.hold = str(data.get("hold", ""))
        self.stop = Stop(data.get("stop", ""))
        origin = data.get("stop_origin")
        self.stop_origin = None if not origin else message_from_text(pb.ControlOrigin, origin)
        self.stop_message = str(data.get("stop_message", ""))
        self.since_attempt = int(data.get("since_attempt", 1))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JobView:
        """The view ``to_dict`` wrote."""
        checkpoint, resume = data["latest_checkpoint"], data["resume_from"]
        submitted_at = time_from_text(data["submitted_at"])
        assert submitted_at is not None
        records = [AttemptRecord.from_dict(record) for record in data["attempts"]]
        potential = data["last_potential"]
        view = cls(
            job_id=data["job_id"],
            spec=message_from_text(pb.JobSpec, data["spec"]),
            request_id=data["request_id"],
            depends_on_ids=tuple(data["depends_on_ids"]),
            submitted_at=submitted_at,
            state=JobState(data["state"]),
            attempt=int(data["attempt"]),
            node=data["node"],
            pod_name=data["pod_name"],
            last_step=int(data["last_step"]),
            last_progress_at=time_from_text(data["last_progress_at"]),
            last_potential=None if potential is None else float(potential),
            done_reason=data["done_reason"],
            latest_checkpoint=None
            if checkpoint is None
            else message_from_text(pb.Checkpoint, checkpoint),
            checkpoint_at=time_from_text(data["checkpoint_at"]),
            latest_copy=None
            if data["latest_copy"] is None
            else message_from_text(pb.Checkpoint, data["latest_copy"]),
            resume_from=None if resume is None else message_from_text(pb.Checkpoint, resume),
            resources=message_from_text(pb.Resources, data["resources"]),
            avoid_nodes=tuple(data["avoid_nodes"]),
            not_before=time_from_text(data["not_before"]),
            final_reason=data["final_reason"],
            final_message=data["final_message"],
            attempts={record.attempt: record for record in records},
        )
        view.apply_control_dict(data)
        return view

    @property
    def priority(self) -> int:
        """Numeric priority of the job's class (higher runs first)."""
        return PRIORITY_CLASSES.get(self.spec.priority_class, PRIORITY_CLASSES["normal"])

    @property
    def current(self) -> AttemptRecord:
        record = self.attempts.get(self.attempt)
        if record is None:
            record = self.attempts[self.attempt] = AttemptRecord(attempt=self.attempt)
        return record

    def apply(self, event: pb.Event) -> bool:
        """Fold one event in; return False if it was ignored (stale, duplicate, terminal)."""
        kind = event.WhichOneof("body")
        if self.state.terminal:
            return kind == "extended" and self._extend(event)
        if kind in ATTEMPT_EVENTS and event.attempt != self.attempt:
            return False
        at = event_time(event) if kind in TIMED_EVENTS else EPOCH  # only these read it
        match kind:
            case "released":
                if self.state is not JobState.WAITING:
                    return False
                self.state = JobState.PENDING
            case "bound":
                if self.state is not JobState.PENDING:
                    return False
                self.state = JobState.BOUND
                self.node, self.pod_name = event.bound.node, event.bound.pod_name
                self.current.node, self.current.pod_name = self.node, self.pod_name
            case "started":
                self.current.started_logged = True
                started_at = self.current.started_at
                if self.state is JobState.RUNNING and started_at is not None and at < started_at:
                    # The attempt's first report was folded before this event (the progress
                    # and job streams are read independently): the attempt started here.
                    self.current.started_at = at
                    return True
                if self.state not in (JobState.BOUND, JobState.PENDING):
                    return False
                self.state = JobState.RUNNING
                self.current.started_at = at
                self.last_progress_at = at
            case "progress":
                body = event.progress
                if body.step < self.last_step and self.last_progress_at is not None:
                    return False
                if self.current.ended_at is not None:
                    return False  # the runner went on after its attempt ended: fenced
                self.last_step = body.step
                self.last_potential = body.potential_kj_mol
                self.last_progress_at = at
                self.done_reason = body.done_reason or self.done_reason
                if self.state is JobState.BOUND:
                    self.state = JobState.RUNNING
                    self.current.started_at = self.current.started_at or at
            case "checkpoint":
                if self.latest_checkpoint and event.checkpoint.step <= self.latest_checkpoint.step:
                    return False
                self.latest_checkpoint = event.checkpoint
                self.checkpoint_at = at
            case "fetched":
                # the runner resumed from the shared store's copy (its folder lacked the file)
                if self.current.resumed_from_copy or self.current.ended_at is not None:
                    return False
                self.current.resumed_from_copy = True
                self.current.resumed_from_step = event.fetched.checkpoint.step
            case "copied":
                copied = event.copied.checkpoint
                if not copied.copy_slot:
                    return False
                if self.latest_copy and copied.step <= self.latest_copy.step:
                    return False
                self.latest_copy = copied
            case "succeeded":
                if self.state not in (JobState.BOUND, JobState.RUNNING):
                    return False
                self.state = JobState.SUCCEEDED
                self.last_step = max(self.last_step, event.succeeded.final_step)
                self.done_reason = event.succeeded.reason
                self.current.ended_at = at
            case "attempt_failed":
                if self.state not in (JobState.PENDING, JobState.BOUND, JobState.RUNNING):
                    return False
                self.state = JobState.RECOVERING
                self.current.failure = event.attempt_failed
                self.current.ended_at = at
                # the furthest step known, whether its report or the failure came first
                self.last_step = max(self.last_step, event.attempt_failed.last_step)
            case "requeued":
                if self.state is not JobState.RECOVERING or event.attempt != self.attempt + 1:
                    return False
                requeue = event.requeued
                self.current.steps_lost = requeue.steps_lost
                self.current.copy_lag_steps = requeue.copy_lag_steps
                self.attempt = event.attempt
                self.state = JobState.HELD if self.hold else JobState.PENDING
                if self.stop is not Stop.CANCEL:  # a cancel stays until the job ends
                    self.stop, self.stop_origin, self.stop_message = Stop.NONE, None, ""
                self.node = self.pod_name = ""
                self.resume_from = requeue.resume_from if requeue.HasField("resume_from") else None
                self.last_step = self.resume_from.step if self.resume_from else 0
                self.last_progress_at = None
                self.last_potential = None  # the new attempt has reported nothing yet
                if requeue.HasField("resources"):
                    self.resources.CopyFrom(requeue.resources)
                self.avoid_nodes = tuple(requeue.avoid_nodes)
                self.not_before = (
                    to_datetime(requeue.not_before) if requeue.HasField("not_before") else None
                )
                self.current.resumed_from_step = self.last_step
            case "failed":
                self.state = JobState.FAILED
                self.final_reason = pb.FailureReason.Name(event.failed.reason)
                self.final_message = event.failed.message
                self.current.ended_at = self.current.ended_at or at
            case "pod":
                self.current.pod_phase = event.pod.phase
            case "cancel_requested":
                if self.stop is Stop.CANCEL:
                    return False
                self.stop, self.stop_origin = Stop.CANCEL, event.cancel_requested.origin
                self.stop_message = ""
            case "cancelled":
                self.state = JobState.CANCELLED
                self.final_reason = JobState.CANCELLED.value
                self.final_message = event.cancelled.message
                self.current.ended_at = self.current.ended_at or at
            case "held":
                if self.hold:
                    return False
                if self.state in (JobState.WAITING, JobState.PENDING):
                    self.hold, self.state = self.state.value, JobState.HELD
                else:  # stopped first (bound, running), or decided first (recovering)
                    self.hold = JobState.PENDING.value
                    if self.state in LIVE_STATES and self.stop is Stop.NONE:
                        self.stop, self.stop_origin = Stop.HOLD, event.held.origin
            case "unheld":
                if not self.hold:
                    return False
                if self.state is JobState.HELD:
                    self.state = JobState(self.hold)
                self.hold = ""
            case "requeue_requested":
                if self.state not in LIVE_STATES or self.stop is not Stop.NONE:
                    return False
                self.stop, self.stop_origin = Stop.REQUEUE, event.requeue_requested.origin
            case "limit_exceeded":
                if self.state not in LIVE_STATES or self.stop in (Stop.CANCEL, Stop.LIMIT):
                    return False
                self.stop, self.stop_origin = Stop.LIMIT, None
                self.stop_message = event.limit_exceeded.message
            case "reprioritized":
                priority = event.reprioritized.priority_class
                if priority == self.spec.priority_class:
                    return False
                spec = pb.JobSpec()  # a copy: the spec may be a message others hold
                spec.CopyFrom(self.spec)
                spec.priority_class = priority
                self.spec = spec
            case _:
                return False
        return True

    def _extend(self, event: pb.Event) -> bool:
        """Fold an ``extended`` into an ended job: a SUCCEEDED one is PENDING again, as the new
        attempt (its earlier attempts stay as they were)."""
        if self.state is not JobState.SUCCEEDED or event.attempt <= self.attempt:
            return False
        fresh = JobView.from_extended(event)
        self.spec = fresh.spec
        self.state = JobState.PENDING
        self.attempt = fresh.attempt
        self.node = self.pod_name = ""
        self.last_step = fresh.last_step
        self.last_progress_at = None
        self.last_potential = None
        self.done_reason = ""
        self.latest_checkpoint = fresh.latest_checkpoint
        self.resume_from = fresh.resume_from
        self.resources.CopyFrom(fresh.resources)
        self.avoid_nodes = ()
        self.not_before = None
        self.final_reason = self.final_message = ""
        self.hold, self.stop, self.stop_origin, self.stop_message = "", Stop.NONE, None, ""
        # the extension runs on its own (its wall time, its retries): the attempts before it
        # are history, as they are to a fold that knows the job from ``from_extended`` alone
        self.attempts[fresh.attempt] = fresh.attempts[fresh.attempt]
        self.since_attempt = fresh.attempt
        return True

    def run_attempts(self) -> list[AttemptRecord]:
        """The attempts of the run in force (since the job was submitted or extended)."""
        return [
            record
            for number, record in sorted(self.attempts.items())
            if number >= self.since_attempt
        ]

    def ran_s(self, now: datetime) -> float:
        """Seconds the job's attempts since it was submitted (or extended) ran, the current
        one until ``now``: what ``JobSpec.max_wall_s`` bounds."""
        total = 0.0
        for record in self.run_attempts():
            if record.started_at is not None:
                ended = record.ended_at or now
                total += max(0.0, (ended - record.started_at).total_seconds())
        return total


class JobBook:
    """Views of many jobs, folded from the log in order."""

    def __init__(self) -> None:
        self.jobs: dict[str, JobView] = {}
        self.last_sequence = 0

    def apply(self, sequence: int, event: pb.Event) -> JobView | None:
        """Fold one event; return the view it changed, or None if it changed nothing."""
        if sequence and sequence <= self.last_sequence:
            return None
        self.last_sequence = max(self.last_sequence, sequence)
        kind = event.WhichOneof("body")
        if kind == "submitted":
            if event.job_id in self.jobs:
                return None
            view = JobView.from_submitted(event)
            self.jobs[event.job_id] = view
            return view
        existing = self.jobs.get(event.job_id)
        if existing is None and kind == "extended":  # an ended job this book forgot
            view = JobView.from_extended(event)
            self.jobs[event.job_id] = view
            return view
        if existing is None or not existing.apply(event):
            return None
        return existing


def attempt_lives(
    attempt: int, *, last_bound: int | None, last_failed: int | None, last_ended: int | None
) -> bool:
    """Whether ``attempt`` of a job is its live attempt (its runner gets and renews NATS
    credentials, ``mdq.bus.security.runner_creds``), from the jobs log: the attempt of the job's
    last ``bound`` event (None: never bound), of its last ``attempt_failed`` event and of its
    last ending event (``succeeded`` or ``failed``; None: none). Live: bound last, and neither
    failed nor ended since: a job extended after it succeeded runs a later attempt, which
    its earlier end does not touch."""
    if last_bound != attempt:
        return False
    return all(other is None or other < attempt for other in (last_failed, last_ended))
