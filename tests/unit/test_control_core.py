"""Job control's pure core: the fold of its events, what each verb does to a job in each
state, recovery's decision for a stopped attempt, and the checks of a request — tables of
named cases (docs/control.md)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from google.protobuf.message import Message

from mdq.contracts import pb
from mdq.core.control import (
    EVENT_KINDS,
    VERBS,
    ControlRefused,
    Limits,
    Selector,
    check_request,
    control_id_for_key,
    decide,
    decode_request,
    fingerprint,
    may_control,
    reply_of,
)
from mdq.core.events import make_event
from mdq.core.exit_codes import RunnerExit
from mdq.core.recovery import Cancel, GiveUp, Requeue, classify_stopped
from mdq.core.recovery import decide as recovery_decides
from mdq.core.state import JobBook, JobState, JobView, Stop
from tests.tables import named_cases

NOW = datetime(2026, 12, 10, 12, 0, tzinfo=UTC)
ORIGIN = pb.ControlOrigin(control_id="c1", requested_by="ann", reason="typo")


def ev(kind: str, body: Message, attempt: int, job: str = "r-a", at: datetime = NOW) -> pb.Event:
    return make_event(kind, body, job_id=job, attempt=attempt, producer="test", at=at)


SPEC = pb.JobSpec(name="a", steps=1000, priority_class="normal", max_retries=3)
SUBMIT = ev("submitted", pb.JobSubmitted(spec=SPEC, request_id="r"), 0)
SUBMIT_WAITING = ev(
    "submitted", pb.JobSubmitted(spec=SPEC, request_id="r", depends_on_ids=["r-x"]), 0
)
BOUND1 = ev("bound", pb.JobBound(node="n1", pod_name="mdq-r-a-1"), 1)
STARTED1 = ev("started", pb.JobStarted(node="n1"), 1)
CHECKPOINT1 = ev("checkpoint", pb.Checkpoint(step=600, path="c"), 1)
STOPPED1 = ev(
    "attempt_failed",
    pb.AttemptFailed(reason=pb.FAILURE_STOPPED, node="n1", last_step=650),
    1,
)
CRASHED1 = ev("attempt_failed", pb.AttemptFailed(reason=pb.FAILURE_CRASHED, node="n1"), 1)
REQUEUED2 = ev("requeued", pb.JobRequeued(resume_from=pb.Checkpoint(step=600)), 2)
SUCCEEDED1 = ev("succeeded", pb.JobSucceeded(final_step=1000), 1)
CANCEL_REQ = ev("cancel_requested", pb.CancelRequested(origin=ORIGIN), 1)
CANCELLED = ev("cancelled", pb.JobCancelled(origin=ORIGIN, message="cancelled by ann"), 1)
HELD = ev("held", pb.JobHeld(origin=ORIGIN), 1)
UNHELD = ev("unheld", pb.JobUnheld(origin=ORIGIN), 1)
REQUEUE_REQ = ev("requeue_requested", pb.RequeueRequested(origin=ORIGIN), 1)
LIMIT = ev("limit_exceeded", pb.LimitExceeded(limit="max_wall_s", message="ran 61 s"), 1)
LOWER = ev("reprioritized", pb.JobReprioritized(priority_class="low", previous="normal"), 1)
EXTENDED2 = ev(
    "extended",
    pb.JobExtended(
        added_steps=500,
        spec=pb.JobSpec(name="a", steps=1500),
        resume_from=pb.Checkpoint(step=1000),
        request_id="r",
        resources=pb.Resources(cpu=2, memory_mb=512),
    ),
    2,
)

FOLD_CASES: list[tuple[str, list[pb.Event], JobState, int, Stop, str]] = [
    # name, history, state, attempt, stop, hold
    ("a pending job is cancelled at once", [SUBMIT, CANCELLED], JobState.CANCELLED, 1,
     Stop.NONE, ""),
    ("a waiting job is held", [SUBMIT_WAITING, HELD], JobState.HELD, 1, Stop.NONE, "WAITING"),
    ("a released wait goes back to waiting", [SUBMIT_WAITING, HELD, UNHELD], JobState.WAITING, 1,
     Stop.NONE, ""),
    ("a held job is not released by its dependencies",
     [SUBMIT_WAITING, HELD, ev("released", pb.JobReleased(), 0)], JobState.HELD, 1, Stop.NONE,
     "WAITING"),
    ("a running job asked to cancel is stopping", [SUBMIT, BOUND1, STARTED1, CANCEL_REQ],
     JobState.RUNNING, 1, Stop.CANCEL, ""),
    ("a stopped cancel ends cancelled",
     [SUBMIT, BOUND1, STARTED1, CANCEL_REQ, STOPPED1, CANCELLED], JobState.CANCELLED, 1,
     Stop.CANCEL, ""),
    ("success before the stop wins", [SUBMIT, BOUND1, STARTED1, CANCEL_REQ, SUCCEEDED1,
     CANCELLED], JobState.SUCCEEDED, 1, Stop.CANCEL, ""),
    ("a cancel outlives a requeue that raced it",
     [SUBMIT, BOUND1, STARTED1, CRASHED1, CANCEL_REQ, REQUEUED2], JobState.PENDING, 2,
     Stop.CANCEL, ""),
    ("a held running job is requeued held",
     [SUBMIT, BOUND1, STARTED1, HELD, STOPPED1, REQUEUED2], JobState.HELD, 2, Stop.NONE,
     "PENDING"),
    ("a release before the stop ends makes the requeue pending",
     [SUBMIT, BOUND1, STARTED1, HELD, UNHELD, STOPPED1, REQUEUED2], JobState.PENDING, 2,
     Stop.NONE, ""),
    ("a hold while recovering holds the requeue", [SUBMIT, BOUND1, CRASHED1, HELD, REQUEUED2],
     JobState.HELD, 2, Stop.NONE, "PENDING"),
    ("a requeue request stops the running attempt", [SUBMIT, BOUND1, STARTED1, REQUEUE_REQ],
     JobState.RUNNING, 1, Stop.REQUEUE, ""),
    ("a requeue request of an old attempt is fenced",
     [SUBMIT, BOUND1, CRASHED1, REQUEUED2, ev("bound", pb.JobBound(node="n2"), 2), REQUEUE_REQ],
     JobState.BOUND, 2, Stop.NONE, ""),
    ("a requeue of a pending job changes nothing", [SUBMIT, REQUEUE_REQ], JobState.PENDING, 1,
     Stop.NONE, ""),
    ("a limit stops the attempt", [SUBMIT, BOUND1, STARTED1, LIMIT], JobState.RUNNING, 1,
     Stop.LIMIT, ""),
    ("a limit does not override a cancel", [SUBMIT, BOUND1, STARTED1, CANCEL_REQ, LIMIT],
     JobState.RUNNING, 1, Stop.CANCEL, ""),
    ("a cancelled job accepts nothing but stays cancelled",
     [SUBMIT, CANCELLED, BOUND1, SUCCEEDED1, EXTENDED2], JobState.CANCELLED, 1, Stop.NONE, ""),
    ("a succeeded job is extended as attempt 2",
     [SUBMIT, BOUND1, STARTED1, SUCCEEDED1, EXTENDED2], JobState.PENDING, 2, Stop.NONE, ""),
    ("a failed job is not extended",
     [SUBMIT, BOUND1, CRASHED1, ev("failed", pb.JobFailed(), 1), EXTENDED2], JobState.FAILED, 1,
     Stop.NONE, ""),
]  # fmt: skip


@named_cases(("history", "state", "attempt", "stop", "hold"), FOLD_CASES)
def test_fold(
    history: list[pb.Event], state: JobState, attempt: int, stop: Stop, hold: str
) -> None:
    book = JobBook()
    for event in history:
        book.apply(0, event)
    view = book.jobs["r-a"]
    assert (view.state, view.attempt, view.stop, view.hold) == (state, attempt, stop, hold)


def test_reprioritize_changes_the_class_and_the_priority() -> None:
    book = JobBook()
    for event in (SUBMIT, LOWER, LOWER):
        book.apply(0, event)
    view = book.jobs["r-a"]
    assert (view.spec.priority_class, view.priority) == ("low", 100)


def test_an_extension_is_the_same_to_a_fold_that_forgot_the_job() -> None:
    remembering = JobBook()
    for event in (SUBMIT, BOUND1, STARTED1, SUCCEEDED1, EXTENDED2):
        remembering.apply(0, event)
    forgetting = JobBook()
    forgetting.apply(0, EXTENDED2)
    kept, rebuilt = remembering.jobs["r-a"], forgetting.jobs["r-a"]
    # the same but for the attempts before the extension, which only the first remembers
    kept.attempts = {n: a for n, a in kept.attempts.items() if n >= kept.since_attempt}
    assert kept.to_dict() | {"submitted_at": None} == rebuilt.to_dict() | {"submitted_at": None}
    assert (rebuilt.spec.steps, rebuilt.resume_from, rebuilt.resources.cpu) == (
        1500,
        pb.Checkpoint(step=1000),
        2,
    )


def test_wall_time_sums_the_attempts_since_the_extension() -> None:
    book = JobBook()
    for event in (
        SUBMIT,
        BOUND1,
        ev("started", pb.JobStarted(), 1, at=NOW),
        ev(
            "attempt_failed",
            pb.AttemptFailed(reason=pb.FAILURE_EVICTED),
            1,
            at=NOW + timedelta(seconds=30),
        ),
        ev("requeued", pb.JobRequeued(), 2),
        ev("bound", pb.JobBound(node="n2"), 2),
        ev("started", pb.JobStarted(), 2, at=NOW + timedelta(seconds=40)),
    ):
        book.apply(0, event)
    view = book.jobs["r-a"]
    assert view.ran_s(NOW + timedelta(seconds=60)) == pytest.approx(50.0)


# -- what each verb does ----------------------------------------------------------------------
def view_of(*history: pb.Event) -> JobView:
    book = JobBook()
    for event in history:
        book.apply(0, event)
    return book.jobs["r-a"]


PENDING = (SUBMIT,)
WAITING = (SUBMIT_WAITING,)
HELD_VIEW = (SUBMIT, HELD)
RUNNING = (SUBMIT, BOUND1, STARTED1)
BOUND = (SUBMIT, BOUND1)
RECOVERING = (SUBMIT, BOUND1, STARTED1, CRASHED1)
CANCELLING = (SUBMIT, BOUND1, STARTED1, CANCEL_REQ)
SUCCEEDED = (SUBMIT, BOUND1, STARTED1, CHECKPOINT1, SUCCEEDED1)
CANCELLED_VIEW = (SUBMIT, CANCELLED)

DONE, STOPPING, UNCHANGED, NA = (
    pb.CONTROL_DONE,
    pb.CONTROL_STOPPING,
    pb.CONTROL_UNCHANGED,
    pb.CONTROL_NOT_APPLICABLE,
)
DECIDE_CASES: list[tuple[str, pb.ControlVerb, tuple[pb.Event, ...], int, str, bool]] = [
    # name, verb, history, result, event kind, pod deleted
    ("cancel pending", pb.CONTROL_CANCEL, PENDING, DONE, "cancelled", False),
    ("cancel waiting", pb.CONTROL_CANCEL, WAITING, DONE, "cancelled", False),
    ("cancel held", pb.CONTROL_CANCEL, HELD_VIEW, DONE, "cancelled", False),
    ("cancel bound", pb.CONTROL_CANCEL, BOUND, STOPPING, "cancel_requested", True),
    ("cancel running", pb.CONTROL_CANCEL, RUNNING, STOPPING, "cancel_requested", True),
    ("cancel recovering", pb.CONTROL_CANCEL, RECOVERING, STOPPING, "cancel_requested", False),
    ("cancel twice", pb.CONTROL_CANCEL, CANCELLING, UNCHANGED, "", False),
    ("cancel cancelled", pb.CONTROL_CANCEL, CANCELLED_VIEW, UNCHANGED, "", False),
    ("cancel succeeded", pb.CONTROL_CANCEL, SUCCEEDED, NA, "", False),
    ("hold pending", pb.CONTROL_HOLD, PENDING, DONE, "held", False),
    ("hold running", pb.CONTROL_HOLD, RUNNING, STOPPING, "held", True),
    ("hold recovering", pb.CONTROL_HOLD, RECOVERING, STOPPING, "held", False),
    ("hold held", pb.CONTROL_HOLD, HELD_VIEW, UNCHANGED, "", False),
    ("hold a job being cancelled", pb.CONTROL_HOLD, CANCELLING, NA, "", False),
    ("hold succeeded", pb.CONTROL_HOLD, SUCCEEDED, NA, "", False),
    ("release held", pb.CONTROL_RELEASE, HELD_VIEW, DONE, "unheld", False),
    ("release pending", pb.CONTROL_RELEASE, PENDING, NA, "", False),
    ("requeue running", pb.CONTROL_REQUEUE, RUNNING, STOPPING, "requeue_requested", True),
    ("requeue pending", pb.CONTROL_REQUEUE, PENDING, NA, "", False),
    ("requeue a job being cancelled", pb.CONTROL_REQUEUE, CANCELLING, NA, "", False),
    ("reprioritize pending", pb.CONTROL_REPRIORITIZE, PENDING, DONE, "reprioritized", False),
    ("reprioritize running", pb.CONTROL_REPRIORITIZE, RUNNING, DONE, "reprioritized", False),
    ("reprioritize succeeded", pb.CONTROL_REPRIORITIZE, SUCCEEDED, NA, "", False),
    ("extend succeeded", pb.CONTROL_EXTEND, SUCCEEDED, DONE, "extended", False),
    ("extend running", pb.CONTROL_EXTEND, RUNNING, NA, "", False),
    ("extend cancelled", pb.CONTROL_EXTEND, CANCELLED_VIEW, NA, "", False),
]


@named_cases(("verb", "history", "result", "kind", "stop_pod"), DECIDE_CASES)
def test_decide(
    verb: pb.ControlVerb, history: tuple[pb.Event, ...], result: int, kind: str, stop_pod: bool
) -> None:
    request = pb.ControlRequest(verb=verb, priority_class="low", extend_steps=500)
    action = decide(verb, view_of(*history), request, ORIGIN)
    assert (action.result, action.kind, action.stop_pod) == (result, kind, stop_pod)
    assert not kind or kind in EVENT_KINDS
    if action.result != DONE:
        return
    # the event does to the job what the answer says it did
    view = view_of(*history)
    assert action.body is not None
    view.apply(ev(kind, action.body, action.attempt))
    assert view.state.value == action.state


def test_extend_continues_from_the_final_checkpoint_to_the_new_target() -> None:
    request = pb.ControlRequest(verb=pb.CONTROL_EXTEND, extend_steps=500)
    view = view_of(*SUCCEEDED)  # ended at 1000, last checkpoint at 600
    action = decide(pb.CONTROL_EXTEND, view, request, ORIGIN)
    assert isinstance(action.body, pb.JobExtended)
    assert (action.attempt, action.body.spec.steps, action.body.resume_from.step) == (2, 1500, 600)
    assert "step 600" in action.message and "1000" in action.message
    limited = decide(pb.CONTROL_EXTEND, view, request, ORIGIN, Limits(max_steps=1200))
    assert limited.result == NA and "limit of 1200 steps" in limited.message


def test_extend_of_a_minimisation_says_why_not() -> None:
    minimize = ev(
        "submitted",
        pb.JobSubmitted(spec=pb.JobSpec(name="a", task=pb.TASK_MINIMIZE), request_id="r"),
        0,
    )
    view = view_of(minimize, BOUND1, STARTED1, CHECKPOINT1, SUCCEEDED1)
    action = decide(pb.CONTROL_EXTEND, view, pb.ControlRequest(extend_steps=5), ORIGIN)
    assert action.result == NA and "TASK_MINIMIZE" in action.message


# -- recovery's decision for a stopped attempt ---------------------------------------------------
RECOVERY_CASES: list[tuple[str, tuple[pb.Event, ...], type, JobState]] = [
    ("a stopped cancel is cancelled", (*CANCELLING, STOPPED1), Cancel, JobState.CANCELLED),
    ("a cancel during a backoff's recovery is cancelled", (*RECOVERING, CANCEL_REQ), Cancel,
     JobState.CANCELLED),
    ("a stopped hold is requeued held", (*RUNNING, CHECKPOINT1, HELD, STOPPED1), Requeue,
     JobState.HELD),
    ("a stopped requeue is requeued", (*RUNNING, CHECKPOINT1, REQUEUE_REQ, STOPPED1), Requeue,
     JobState.PENDING),
    ("a stopped limit fails for good", (*RUNNING, LIMIT, STOPPED1), GiveUp, JobState.FAILED),
]  # fmt: skip


@named_cases(("history", "decision", "after"), RECOVERY_CASES)
def test_recovery_decides_a_stop_by_its_request(
    history: tuple[pb.Event, ...], decision: type, after: JobState
) -> None:
    view = view_of(*history)
    decided = recovery_decides(view, now=NOW)
    assert isinstance(decided, decision)
    if isinstance(decided, Cancel):
        event = ev("cancelled", pb.JobCancelled(origin=decided.origin), 1)
    elif isinstance(decided, GiveUp):
        assert decided.reason == pb.FAILURE_LIMIT_EXCEEDED
        assert "ran 61 s" in decided.message
        event = ev("failed", pb.JobFailed(reason=decided.reason), 1)
    else:
        assert isinstance(decided, Requeue)
        assert (decided.delay_s, decided.resume_from) == (0.0, pb.Checkpoint(step=600, path="c"))
        event = ev("requeued", pb.JobRequeued(), decided.attempt)
    view.apply(event)
    assert view.state is after


def test_stops_never_count_against_retries_or_make_a_crash_loop() -> None:
    history: list[pb.Event] = [SUBMIT]
    for attempt in range(1, 30):  # far more than max_retries and max_disruptions
        history += [
            ev("bound", pb.JobBound(node="n1"), attempt),
            ev("requeue_requested", pb.RequeueRequested(), attempt),
            ev("attempt_failed", pb.AttemptFailed(reason=pb.FAILURE_STOPPED), attempt),
        ]
        view = view_of(*history)
        decided = recovery_decides(view, now=NOW)
        assert isinstance(decided, Requeue), attempt
        history.append(ev("requeued", pb.JobRequeued(), attempt + 1))


STOPPED_CLASSES = [
    ("preempted while stopping", "Error", 5, True, pb.FAILURE_STOPPED),
    ("deleted before it ran", "Deleted", 0, True, pb.FAILURE_STOPPED),
    ("a container ended by the stop's SIGTERM", "Error", 143, True, pb.FAILURE_STOPPED),
    ("killed after the grace period", "Error", 137, True, pb.FAILURE_STOPPED),
    ("SIGTERMed with no stop asked", "Error", 143, False, pb.FAILURE_CRASHED),
    ("preempted, no stop asked", "Error", 5, False, pb.FAILURE_EVICTED),
    ("OOM while stopping stays OOM", "OOMKilled", 137, True, pb.FAILURE_OOM_KILLED),
    ("blew up while stopping", "Error", 4, True, pb.FAILURE_UNSTABLE),
    ("over its disk limit", "Error", RunnerExit.LIMIT_EXCEEDED, False, pb.FAILURE_LIMIT_EXCEEDED),
]


@named_cases(("reason", "code", "stopping", "expected"), STOPPED_CLASSES)
def test_classify_stopped(reason: str, code: int, stopping: bool, expected: int) -> None:
    assert classify_stopped(pod_reason=reason, exit_code=code, stopping=stopping) == expected


# -- the request ----------------------------------------------------------------------------------
def req(**fields: object) -> pb.ControlRequest:
    return pb.ControlRequest(control_key="k", **fields)  # type: ignore[arg-type]


REFUSED = [
    ("no key", pb.ControlRequest(verb=pb.CONTROL_CANCEL, job_ids=["x"]), "control_key"),
    ("no verb", req(job_ids=["x"]), "verb"),
    ("no jobs", req(verb=pb.CONTROL_CANCEL), ""),
    ("two selectors", req(verb=pb.CONTROL_CANCEL, job_ids=["x"], request_id="r"), ""),
    ("empty id", req(verb=pb.CONTROL_CANCEL, job_ids=[""]), "job_ids[0]"),
    ("a label key too long", req(verb=pb.CONTROL_HOLD, labels={"k" * 64: "v"}),
     f"labels[{'k' * 64!r}]"),
    ("a control character", req(verb=pb.CONTROL_CANCEL, job_ids=["x"], reason="a\x00b"), "reason"),
    ("no class", req(verb=pb.CONTROL_REPRIORITIZE, job_ids=["x"]), "priority_class"),
    ("class on cancel", req(verb=pb.CONTROL_CANCEL, job_ids=["x"], priority_class="low"),
     "priority_class"),
    ("steps on hold", req(verb=pb.CONTROL_HOLD, job_ids=["x"], extend_steps=5), "extend_steps"),
    ("extend by label", req(verb=pb.CONTROL_EXTEND, labels={"a": "b"}, extend_steps=5),
     "job_ids"),
    ("extend nothing", req(verb=pb.CONTROL_EXTEND, job_ids=["x"]), "extend_steps"),
    ("too many ids", req(verb=pb.CONTROL_CANCEL, job_ids=["x"] * 10_001), "job_ids"),
]  # fmt: skip


@named_cases(("request_", "field"), REFUSED)
def test_check_request_names_the_field(request_: pb.ControlRequest, field: str) -> None:
    with pytest.raises(ControlRefused) as refused:
        check_request(request_, tenant="")
    assert refused.value.field == field


def test_a_tenant_without_allow_high_may_not_raise_to_high() -> None:
    request = req(verb=pb.CONTROL_REPRIORITIZE, job_ids=["alice.x"], priority_class="high")
    with pytest.raises(ControlRefused) as refused:
        check_request(request, tenant="alice", allow_high=False)
    assert refused.value.field == "priority_class" and "alice" in refused.value.message
    assert check_request(request, tenant="alice", allow_high=True) is request


DECODE_CASES = [
    ("unknown field", b'{"control_key": "k", "verb": "CONTROL_CANCEL", "force": true}', "force"),
    ("wrong type", b'{"control_key": "k", "job_ids": "x"}', "job_ids"),
    ("a label of the wrong type", b'{"control_key": "k", "labels": {"a": 1}}', "labels['a']"),
    ("not an object", b"[1]", ""),
    ("not JSON", b"{oops", ""),
    ("not protobuf", b"\xff\xff\xff", ""),
]


@named_cases(("data", "field"), DECODE_CASES)
def test_decode_names_the_field(data: bytes, field: str) -> None:
    with pytest.raises(ControlRefused) as refused:
        decode_request(data)
    assert refused.value.field == field


def test_ids_and_fingerprints() -> None:
    assert control_id_for_key("k1") != control_id_for_key("k1", "alice")
    assert control_id_for_key("k1", "alice").startswith("alice.")
    one = req(verb=pb.CONTROL_HOLD, labels={"a": "1", "b": "2"})
    two = req(verb=pb.CONTROL_HOLD, labels={"b": "2", "a": "1"})
    assert fingerprint(one) == fingerprint(two)
    assert fingerprint(one) != fingerprint(req(verb=pb.CONTROL_CANCEL, labels={"a": "1"}))
    assert set(VERBS.values()) == {"cancel", "hold", "release", "requeue", "reprioritize", "extend"}


AUTHORITY = [
    ("the operator, anyone's", "", "alice.123-a", True),
    ("the operator, its own", "", "123-a", True),
    ("a tenant, its own", "alice", "alice.123-a", True),
    ("a tenant, another's", "alice", "bob.123-a", False),
    ("a tenant, the operator's", "alice", "123-a", False),
    ("a tenant named like a prefix", "ali", "alice.123-a", False),
]


@named_cases(("tenant", "job", "allowed"), AUTHORITY)
def test_may_control(tenant: str, job: str, allowed: bool) -> None:
    assert may_control(tenant, job) is allowed


def test_selectors_match_the_tenants_own_jobs() -> None:
    def labelled(job: str, **labels: str) -> JobView:
        spec = pb.JobSpec(name="a", labels=labels)
        request_id = job.rpartition("-")[0]
        return JobView.from_submitted(
            make_event(
                "submitted",
                pb.JobSubmitted(spec=spec, request_id=request_id),
                job_id=job,
                attempt=0,
                producer="intake",
                at=NOW,
            )
        )

    mine = labelled("alice.1-a", campaign="x", temp="300")
    theirs = labelled("bob.1-a", campaign="x")
    by_labels = Selector(tenant="alice", labels={"campaign": "x"})
    assert (by_labels.matches(mine), by_labels.matches(theirs)) == (True, False)
    assert not Selector(tenant="alice", labels={"campaign": "y"}).matches(mine)
    assert Selector(tenant="", labels={"campaign": "x"}).matches(theirs)
    assert Selector(tenant="alice", request_id="alice.1").matches(mine)
    assert not Selector(tenant="alice", request_id="bob.1").matches(theirs)


def test_a_big_reply_is_cut_and_counted() -> None:
    outcomes = [
        pb.ControlOutcome(job_id=f"{i:012x}-job-{i}", result=pb.CONTROL_DONE, state="CANCELLED")
        for i in range(40_000)
    ]
    reply = reply_of("c", outcomes)
    assert reply.matched == 40_000
    assert reply.ByteSize() < 1024 * 1024
    assert len(reply.outcomes) + reply.omitted == 40_000 and reply.omitted > 0
    assert dict(reply.counts) == {"CONTROL_DONE": 40_000}
