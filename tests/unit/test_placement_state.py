"""Placement's state (``PlacementState``): the fold, reservations, in-flight bindings, tenant
usage, the queue, chains, pruning and the snapshot, as tables of named event histories."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import fields
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from google.protobuf.message import Message

from mdq.contracts import pb
from mdq.core.clusters import Selector, cluster_of
from mdq.core.events import make_event
from mdq.core.node_health import NodeHealthPolicy
from mdq.core.placement import PlacementConfig, Preemption, plan
from mdq.core.placement_state import PlacementState
from mdq.core.state import AttemptRecord, JobState, JobView, Stop
from mdq.core.timestamps import set_timestamp
from tests.tables import named_cases

T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
SETTLE_S = 10.0

Step = Callable[[PlacementState], object]
"""One thing that happens to the state: a job event from the log, a load report, a binding."""


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def ev(kind: str, body: Message, job: str, attempt: int = 1, t: float = 0) -> Step:
    event = make_event(kind, body, job_id=job, attempt=attempt, producer="test", at=at(t))

    def step(state: PlacementState) -> object:
        return state.apply(state.book.last_sequence + 1, event)

    return step


def sub(
    job: str,
    *,
    cpu: float = 1,
    memory_mb: int = 1024,
    deps: tuple[str, ...] = (),
    priority: str = "normal",
    t: float = 0,
) -> Step:
    spec = pb.JobSpec(name=job.rsplit("-", 1)[-1], priority_class=priority)
    spec.resources.cpu, spec.resources.memory_mb = cpu, memory_mb
    body = pb.JobSubmitted(spec=spec, request_id=job.rsplit("-", 1)[0], depends_on_ids=deps)
    return ev("submitted", body, job, 0, t)


def bound(job: str, node: str, attempt: int = 1, t: float = 0, note: bool = True) -> Step:
    """The job's ``bound`` from the log; ``note``: and the service counts it in flight."""
    folded = ev("bound", pb.JobBound(node=node, pod_name=f"mdq-{job}-{attempt}"), job, attempt, t)

    def step(state: PlacementState) -> object:
        result = folded(state)
        if note and result is not None:
            state.note_binding(state.book.jobs[job], at(t))
        return result

    return step


def started(job: str, attempt: int = 1, t: float = 0) -> Step:
    return ev("started", pb.JobStarted(), job, attempt, t)


def succeeded(job: str, attempt: int = 1, t: float = 0) -> Step:
    return ev("succeeded", pb.JobSucceeded(final_step=100), job, attempt, t)


def crashed(
    job: str, node: str = "n1", attempt: int = 1, t: float = 0, reason: int = pb.FAILURE_CRASHED
) -> Step:
    body = pb.AttemptFailed(reason=reason, node=node)  # type: ignore[arg-type]
    return ev("attempt_failed", body, job, attempt, t)


def requeued(
    job: str,
    attempt: int = 2,
    *,
    cpu: float = 0,
    avoid: tuple[str, ...] = (),
    not_before: float | None = None,
    t: float = 0,
) -> Step:
    body = pb.JobRequeued(avoid_nodes=avoid)
    if cpu:
        body.resources.cpu, body.resources.memory_mb = cpu, 1024
    if not_before is not None:
        set_timestamp(body.not_before, at(not_before))
    return ev("requeued", body, job, attempt, t)


def failed(job: str, t: float = 0) -> Step:
    return ev("failed", pb.JobFailed(reason=pb.FAILURE_RETRIES_EXHAUSTED), job, 1, t)


def released(job: str) -> Step:
    return ev("released", pb.JobReleased(), job, 0)


def load(
    node: str,
    t: float = 0,
    *,
    cpu: float = 8,
    memory_mb: int = 16_384,
    labels: dict[str, str] | None = None,
) -> Step:
    """A load report of ``node`` ("<cluster>/<node>" for a node of a named cluster, whose
    ``labels`` come with it)."""
    body = pb.NodeLoad(
        node=node,
        cpu_capacity=cpu,
        memory_capacity_mb=memory_mb,
        ready=True,
        cpu_load=0.25,
        cluster=cluster_of(node),
        cluster_labels=labels or {},
    )
    return lambda state: state.apply_load(body, at(t))


def prune(state: PlacementState) -> object:
    return state.prune()


def fold(steps: list[Step], **options: Any) -> PlacementState:
    state = PlacementState(PlacementConfig(), load_settle_s=SETTLE_S, **options)
    for step in steps:
        step(state)
    return state


def observe(state: PlacementState) -> dict[str, Any]:
    """What the decisions see: job states, per-node reservations and in-flight load and
    readiness, per-tenant usage."""
    nodes = state.node_states()
    return {
        "states": {job: view.state for job, view in state.book.jobs.items()},
        "reserved": {n.name: (n.reserved_cpu, n.reserved_memory_mb) for n in nodes},
        "inflight": {n.name: (n.inflight_cpu, n.inflight_memory_mb) for n in nodes},
        "ready": {n.name: n.ready for n in nodes},
        "capacity": {n.name: n.cpu_capacity for n in nodes},
        "usage": {tenant: state.tenant_usage(tenant) for tenant in state.tenants()},
    }


NODES = [load("n1"), load("n2")]
IDLE = {"n1": (0.0, 0), "n2": (0.0, 0)}

# (name, history, what is expected of ``observe``: only the keys given are compared)
FOLD_CASES: list[tuple[str, list[Step], dict[str, Any]]] = [
    (
        "submitted is pending and holds nothing",
        [*NODES, sub("r-a")],
        {"states": {"r-a": JobState.PENDING}, "reserved": IDLE, "inflight": IDLE},
    ),
    (
        "with dependencies it waits",
        [*NODES, sub("r-x"), sub("r-a", deps=("r-x",))],
        {"states": {"r-x": JobState.PENDING, "r-a": JobState.WAITING}},
    ),
    (
        "bound holds its requests on its node at once, and counts in flight",
        [*NODES, sub("r-a", cpu=2, memory_mb=2048), bound("r-a", "n1")],
        {
            "states": {"r-a": JobState.BOUND},
            "reserved": {"n1": (2.0, 2048), "n2": (0.0, 0)},
            "inflight": {"n1": (2.0, 2048), "n2": (0.0, 0)},
        },
    ),
    (
        "a bound nobody noted holds room but is not in flight",
        [*NODES, sub("r-a", cpu=2), bound("r-a", "n1", note=False)],
        {"reserved": {"n1": (2.0, 1024), "n2": (0.0, 0)}, "inflight": IDLE},
    ),
    (
        "started keeps holding",
        [*NODES, sub("r-a", cpu=2), bound("r-a", "n1"), started("r-a", t=1)],
        {"states": {"r-a": JobState.RUNNING}, "reserved": {"n1": (2.0, 1024), "n2": (0.0, 0)}},
    ),
    (
        "two jobs on one node add up",
        [*NODES, sub("r-a", cpu=2), sub("r-b", cpu=3), bound("r-a", "n1"), bound("r-b", "n1")],
        {"reserved": {"n1": (5.0, 2048), "n2": (0.0, 0)}, "inflight": {"n1": (5.0, 2048)}},
    ),
    (
        "succeeded frees its room and its in-flight load",
        [*NODES, sub("r-a", cpu=2), bound("r-a", "n1"), started("r-a"), succeeded("r-a")],
        {"states": {"r-a": JobState.SUCCEEDED}, "reserved": IDLE, "inflight": IDLE},
    ),
    (
        "a failed attempt frees its room while it awaits recovery",
        [*NODES, sub("r-a", cpu=2), bound("r-a", "n1"), crashed("r-a")],
        {"states": {"r-a": JobState.RECOVERING}, "reserved": IDLE, "inflight": IDLE},
    ),
    (
        "requeued with other resources, bound elsewhere, holds the new ones there",
        [
            *NODES,
            sub("r-a", cpu=2),
            bound("r-a", "n1"),
            crashed("r-a"),
            requeued("r-a", cpu=4),
            bound("r-a", "n2", attempt=2),
        ],
        {
            "states": {"r-a": JobState.BOUND},
            "reserved": {"n1": (0.0, 0), "n2": (4.0, 1024)},
            "inflight": {"n1": (0.0, 0), "n2": (4.0, 1024)},
        },
    ),
    (
        "an event of an old attempt changes nothing",
        [
            *NODES,
            sub("r-a", cpu=2),
            bound("r-a", "n1"),
            crashed("r-a"),
            requeued("r-a"),
            bound("r-a", "n2", attempt=2),
            succeeded("r-a", attempt=1),
        ],
        {"states": {"r-a": JobState.BOUND}, "reserved": {"n1": (0.0, 0), "n2": (2.0, 1024)}},
    ),
    (
        "a load report load_settle_s after the binding settles it; the room stays held",
        [*NODES, sub("r-a", cpu=2), bound("r-a", "n1", t=1), load("n1", t=1 + SETTLE_S)],
        {"reserved": {"n1": (2.0, 1024), "n2": (0.0, 0)}, "inflight": IDLE},
    ),
    (
        "a load report sooner than load_settle_s may not show it: still in flight",
        [*NODES, sub("r-a", cpu=2), bound("r-a", "n1", t=1), load("n1", t=SETTLE_S)],
        {"inflight": {"n1": (2.0, 1024), "n2": (0.0, 0)}},
    ),
    (
        "a report settles only the bindings old enough",
        [
            *NODES,
            sub("r-a", cpu=2),
            sub("r-b", cpu=3),
            bound("r-a", "n1", t=1),
            bound("r-b", "n1", t=5),
            load("n1", t=12),
        ],
        {"reserved": {"n1": (5.0, 2048)}, "inflight": {"n1": (3.0, 1024)}},
    ),
    (
        "a report older than the known one is ignored",
        [*NODES, load("n1", t=30, cpu=16), load("n1", t=25, cpu=4)],
        {"capacity": {"n1": 16.0, "n2": 8.0}},
    ),
    (
        "a job lost with its node makes the node's last report not ready",
        [*NODES, sub("r-a"), bound("r-a", "n1"), crashed("r-a", t=2, reason=pb.FAILURE_NODE_LOST)],
        {"ready": {"n1": False, "n2": True}},
    ),
    (
        "until the node reports again",
        [
            *NODES,
            sub("r-a"),
            bound("r-a", "n1"),
            crashed("r-a", t=2, reason=pb.FAILURE_NODE_LOST),
            load("n1", t=3),
        ],
        {"ready": {"n1": True, "n2": True}},
    ),
    (
        "a crash is not a lost node",
        [*NODES, sub("r-a"), bound("r-a", "n1"), crashed("r-a", t=2)],
        {"ready": {"n1": True, "n2": True}},
    ),
    (
        "a tenant's waiting, pending and recovering jobs are queued",
        [
            sub("alice.1-x"),
            sub("alice.1-a", deps=("alice.1-x",)),
            sub("alice.1-b", cpu=2),
            bound("alice.1-b", "n1"),
            crashed("alice.1-b"),
        ],
        {"usage": {"alice": (3, 0.0)}},
    ),
    (
        "a tenant's bound and running jobs count their CPU",
        [
            *NODES,
            sub("alice.1-a", cpu=2),
            sub("alice.1-b", cpu=1.5),
            sub("bob.2-a", cpu=4),
            bound("alice.1-a", "n1"),
            bound("alice.1-b", "n2"),
            started("alice.1-b"),
        ],
        {"usage": {"alice": (0, 3.5), "bob": (1, 0.0)}},
    ),
    (
        "a tenant's ended jobs count nowhere, yet the tenant is still known",
        [*NODES, sub("alice.1-a", cpu=2), bound("alice.1-a", "n1"), succeeded("alice.1-a")],
        {"usage": {"alice": (0, 0.0)}},
    ),
    (
        "the operator's jobs belong to no tenant",
        [*NODES, sub("r-a"), bound("r-a", "n1")],
        {"usage": {}},
    ),
]


@named_cases(("history", "expected"), FOLD_CASES)
def test_fold(history: list[Step], expected: dict[str, Any]) -> None:
    seen = observe(fold(history))
    for key, value in expected.items():
        if isinstance(value, dict) and key in ("reserved", "inflight", "ready"):
            assert {name: seen[key][name] for name in value} == value, key
        else:
            assert seen[key] == value, key


@pytest.mark.parametrize(
    "history", [case[1] for case in FOLD_CASES], ids=[case[0] for case in FOLD_CASES]
)
@pytest.mark.parametrize("cordons", [(), ("n1",)], ids=["no cordon", "n1 cordoned"])
@pytest.mark.parametrize(
    ("binds", "scribble"),
    [(False, False), (True, False), (True, True)],
    ids=["untouched", "plan", "plan and make room"],
)
def test_the_copies_lent_to_a_pass_are_the_nodes_as_they_are_now(
    history: list[Step], cordons: tuple[str, ...], binds: bool, scribble: bool
) -> None:
    """After every step of every fold history, what a pass is lent equals fresh copies, though
    the pass before may have bound jobs on its copies (``binds``: ``plan``) and changed every
    copy's room (``scribble``: as the preemption plans do)."""
    state = PlacementState(PlacementConfig(), load_settle_s=SETTLE_S)
    for number, step in enumerate(history):
        step(state)
        # the failure cordons come and go between passes
        cordoned = cordons if number % 2 else ()
        lent = state.pass_nodes(cordoned)
        assert lent == state.node_states(cordoned), number
        if binds:
            plan(lent, state.queue(at(1)), at(1), ordered=True)
        if scribble:
            for node in lent:
                node.reserved_cpu += 0.5
                node.reserved_memory_mb += 512
    assert state.pass_nodes() == state.node_states()


def test_a_binding_noted_after_its_event_is_lent_in_flight() -> None:
    state = fold([*NODES, sub("r-a", cpu=2), bound("r-a", "n1", note=False)])
    assert {node.name: node.inflight_cpu for node in state.pass_nodes()} == {"n1": 0, "n2": 0}
    state.note_binding(state.book.jobs["r-a"], at(1))
    assert {node.name: node.inflight_cpu for node in state.pass_nodes()} == {"n1": 2, "n2": 0}


def test_a_node_lost_with_its_job_is_lent_as_not_ready_until_it_reports_again() -> None:
    state = fold([*NODES, sub("r-a"), bound("r-a", "n1")])
    assert {node.name: node.ready for node in state.pass_nodes()} == {"n1": True, "n2": True}
    crashed("r-a", t=1, reason=pb.FAILURE_NODE_LOST)(state)
    assert {node.name: node.ready for node in state.pass_nodes()} == {"n1": False, "n2": True}
    load("n1", t=2)(state)
    assert {node.name: node.ready for node in state.pass_nodes()} == {"n1": True, "n2": True}


# (name, history, seconds after T0, the queue's jobs in order, their nominated nodes)
QUEUE_CASES: list[tuple[str, list[Step], float, list[str], list[str]]] = [
    ("empty", [], 0, [], []),
    ("oldest first", [sub("r-b", t=1), sub("r-a", t=2)], 5, ["r-b", "r-a"], ["", ""]),
    (
        "higher class first",
        [sub("r-a", t=0), sub("r-b", priority="high", t=1), sub("r-c", priority="low", t=0)],
        5,
        ["r-b", "r-a", "r-c"],
        ["", "", ""],
    ),
    (
        "a low job 41 minutes older outranks a normal one (aging: 10 points a minute)",
        [sub("r-new", t=41 * 60), sub("r-old", priority="low", t=0)],
        41 * 60,
        ["r-old", "r-new"],
        ["", ""],
    ),
    (
        "only PENDING jobs: waiting, bound and recovering are not queued",
        [
            sub("r-x"),
            sub("r-a", deps=("r-x",)),
            sub("r-b"),
            bound("r-b", "n1"),
            sub("r-c"),
            bound("r-c", "n1"),
            crashed("r-c"),
        ],
        0,
        ["r-x"],
        [""],
    ),
    (
        "a released job is queued",
        [sub("r-x"), sub("r-a", deps=("r-x",), t=-5), released("r-a")],
        0,
        ["r-a", "r-x"],
        ["", ""],
    ),
    (
        "a requeued job waits for its backoff",
        [sub("r-a"), bound("r-a", "n1"), crashed("r-a"), requeued("r-a", not_before=60)],
        30,
        [],
        [],
    ),
    (
        "and is queued once it is over",
        [sub("r-a"), bound("r-a", "n1"), crashed("r-a"), requeued("r-a", not_before=60)],
        60,
        ["r-a"],
        [""],
    ),
]


@named_cases(("history", "seconds", "order", "nominated"), QUEUE_CASES)
def test_queue(history: list[Step], seconds: float, order: list[str], nominated: list[str]) -> None:
    queue = fold(history).queue(at(seconds))
    assert [job.job_id for job in queue] == order
    assert [job.nominated_node for job in queue] == nominated


def test_queued_job_carries_its_requests_avoid_list_and_tenant() -> None:
    state = fold(
        [
            sub("alice.1-a", cpu=2),
            bound("alice.1-a", "n1"),
            crashed("alice.1-a"),
            requeued("alice.1-a", cpu=3, avoid=("n1",)),
        ]
    )
    [job] = state.queue(T0)
    assert (job.cpu, job.avoid_nodes, job.tenant) == (3.0, frozenset({"n1"}), "alice")


# (name, seconds after the nomination's start the queue is asked, nominated node in the queue)
NOMINATION_CASES = [
    ("held while the nomination lasts", 60, "n2"),
    ("dropped once it lapsed", 121, ""),
]


@named_cases(("seconds", "node"), NOMINATION_CASES)
def test_nominations(seconds: float, node: str) -> None:
    state = fold([*NODES, sub("r-v", priority="low"), bound("r-v", "n2"), started("r-v")])
    fold_more(state, [sub("r-p", priority="high")])
    assert [work.job_id for work in state.running_work()] == ["r-v"]
    state.nominate(Preemption("r-p", "n2", ("r-v",), "test"), until=at(120))
    assert state.nominated("r-p")
    assert state.running_work() == [], "a victim being stopped is no victim again"
    [job] = state.queue(at(seconds))
    assert job.nominated_node == node
    assert state.nominated("r-p") is bool(node)


def test_a_bound_nominee_holds_no_nomination() -> None:
    state = fold([*NODES, sub("r-p", priority="high")])
    state.nominate(Preemption("r-p", "n2", (), "test"), until=at(120))
    fold_more(state, [bound("r-p", "n2")])
    assert not state.nominated("r-p")


def fold_more(state: PlacementState, steps: list[Step]) -> None:
    for step in steps:
        step(state)


# (name, history, fail on dependency failure, verdict for r-a: None waits, () released)
CHAIN_CASES: list[tuple[str, list[Step], bool, tuple[str, ...] | None]] = [
    ("dependency pending: wait", [sub("r-x"), sub("r-a", deps=("r-x",))], True, None),
    (
        "dependency succeeded: release",
        [sub("r-x"), sub("r-a", deps=("r-x",)), bound("r-x", "n1"), succeeded("r-x")],
        True,
        (),
    ),
    (
        "one of two succeeded: wait",
        [
            sub("r-x"),
            sub("r-y"),
            sub("r-a", deps=("r-x", "r-y")),
            bound("r-x", "n1"),
            succeeded("r-x"),
        ],
        True,
        None,
    ),
    (
        "dependency failed: fail, naming it",
        [sub("r-x"), sub("r-a", deps=("r-x",)), failed("r-x")],
        True,
        ("r-x",),
    ),
    (
        "dependency failed, without fail-on-dependency-failure: release",
        [sub("r-x"), sub("r-a", deps=("r-x",)), failed("r-x")],
        False,
        (),
    ),
    (
        "a failed one and a pending one, without fail-on-dependency-failure: wait",
        [sub("r-x"), sub("r-y"), sub("r-a", deps=("r-x", "r-y")), failed("r-x")],
        False,
        None,
    ),
    ("unknown dependency: wait", [sub("r-a", deps=("r-nope",))], True, None),
    (
        "dependency succeeded and was pruned: its final state still releases",
        [sub("r-x"), bound("r-x", "n1"), succeeded("r-x"), prune, sub("r-a", deps=("r-x",))],
        True,
        (),
    ),
    (
        "dependency failed and was pruned: still fails the chain",
        [sub("r-x"), failed("r-x"), prune, sub("r-a", deps=("r-x",))],
        True,
        ("r-x",),
    ),
]


@named_cases(("history", "fail_on", "verdict"), CHAIN_CASES)
def test_dependency_verdict(
    history: list[Step], fail_on: bool, verdict: tuple[str, ...] | None
) -> None:
    state = fold(history, fail_on_dependency_failure=fail_on)
    assert state.dependency_verdict(state.book.jobs["r-a"]) == verdict


def test_fence_follows_the_last_bound() -> None:
    state = fold([sub("r-a"), bound("r-a", "n1"), crashed("r-a"), requeued("r-a")])
    assert state.fence_sequence("r-a") == 2
    assert state.fence_sequence("r-b") == 0
    state.note_bound_sequence("r-a", 9)
    assert state.fence_sequence("r-a") == 9


def test_own_binding_is_folded_at_once_and_its_echo_changes_nothing() -> None:
    state = fold([*NODES, sub("r-a", cpu=2)])
    event = make_event(
        "bound", pb.JobBound(node="n1"), job_id="r-a", attempt=1, producer="test", at=T0
    )
    view = state.book.jobs["r-a"]
    assert state.apply_to(view, event)
    state.note_binding(view, at(0))
    assert state.inflight("n1") == {"r-a": (at(0), 2.0, 1024)}
    assert state.apply(5, event) is None, "the echo"
    assert observe(state)["reserved"]["n1"] == (2.0, 1024)


def test_crashes_on_one_node_make_it_suspect() -> None:
    policy = NodeHealthPolicy(failures_to_cordon=2)
    history = [sub("r-a"), bound("r-a", "n1"), sub("r-b"), bound("r-b", "n1")]
    state = fold(history, health_policy=policy)
    first = crashed("r-a", t=1)(state)
    second = crashed("r-b", t=2)(state)
    assert (getattr(first, "suspect", None), getattr(second, "suspect", None)) == (False, True)
    assert [s.node for s in state.health.suspects(at(3))] == ["n1"]


# (name, history, jobs forgotten by the last prune, jobs still held)
PRUNE_CASES: list[tuple[str, list[Step], int, set[str]]] = [
    (
        "nothing ended: nothing forgotten",
        [sub("r-a"), sub("r-b"), bound("r-b", "n1")],
        0,
        {"r-a", "r-b"},
    ),
    (
        "succeeded and failed jobs are forgotten",
        [sub("r-a"), sub("r-b"), sub("r-c"), bound("r-a", "n1"), succeeded("r-a"), failed("r-b")],
        2,
        {"r-c"},
    ),
    (
        "a job recovering is not ended",
        [sub("r-a"), bound("r-a", "n1"), crashed("r-a")],
        0,
        {"r-a"},
    ),
    (
        "a prune forgets only what ended since the last one",
        [sub("r-a"), failed("r-a"), prune, sub("r-b"), failed("r-b")],
        1,
        set(),
    ),
]


@named_cases(("history", "forgotten", "held"), PRUNE_CASES)
def test_prune(history: list[Step], forgotten: int, held: set[str]) -> None:
    state = fold(history)
    before = observe(state)
    assert state.prune() == forgotten
    assert set(state.book.jobs) == held
    after = observe(state)
    for key in ("reserved", "inflight", "usage"):
        assert after[key] == before[key], key
    sizes = state.sizes()
    assert sizes["jobs"] == sizes["indexed"] == len(held)
    assert sizes["ended_since_prune"] == 0


def test_pruned_jobs_leave_no_trace_but_their_final_state() -> None:
    history = [*NODES, sub("alice.1-a", cpu=2), bound("alice.1-a", "n1"), started("alice.1-a")]
    state = fold(history)
    fold_more(state, [succeeded("alice.1-a"), prune])
    assert state.sizes() | {"ended": 0} == {
        "jobs": 0,
        "indexed": 0,
        "holding": 0,
        "inflight": 0,
        "queued_jobs": 0,
        "fences": 0,
        "nominations": 0,
        "terminating": 0,
        "ended": 0,
        "learned": 0,
        "missing": 0,
        "ended_since_prune": 0,
        "stopping": 0,
        "orphan_pods": 0,
    }
    assert state.final_state("alice.1-a") is JobState.SUCCEEDED
    assert state.tenants() == ["alice"]


def test_a_pruned_job_accepts_no_event_not_even_a_new_submit() -> None:
    state = fold([sub("r-a"), failed("r-a"), prune])
    last = state.book.last_sequence
    assert sub("r-a")(state) is None
    assert bound("r-a", "n1")(state) is None
    assert "r-a" not in state.book.jobs
    assert state.fence_sequence("r-a") == 0
    assert state.book.last_sequence == last + 2, "the log still moves on"


def test_memory_does_not_grow_with_ended_jobs() -> None:
    state = fold(NODES)
    for index in range(200):
        job = f"r-{index}"
        fold_more(state, [sub(job), bound(job, "n1"), started(job), succeeded(job)])
        if index % 10 == 9:
            state.prune()
    sizes = state.sizes()
    assert [key for key, size in sizes.items() if size and key != "ended"] == []
    assert sizes["ended"] == 200  # the compact record: a job id and a final state each
    bounded = fold(NODES, ended_memory=50)
    for index in range(200):
        job = f"r-{index}"
        fold_more(bounded, [sub(job), bound(job, "n1"), started(job), succeeded(job)])
        bounded.prune()
    assert bounded.sizes()["ended"] == 50, "and no more than ended_memory of them"


def test_only_the_newest_ended_jobs_are_remembered() -> None:
    state = fold(NODES, ended_memory=3)
    for index in range(10):
        job = f"r-{index}"
        fold_more(state, [sub(job), bound(job, "n1"), started(job), succeeded(job)])
        state.prune()
    assert state.sizes()["ended"] == 3
    assert [state.final_state(f"r-{i}") for i in (7, 8, 9)] == [JobState.SUCCEEDED] * 3
    assert state.take_unknown_dependencies() == [], "asking about a remembered job files nothing"


def test_a_forgotten_dependency_is_looked_up_once_and_then_releases_its_job() -> None:
    state = fold([sub("r-x"), bound("r-x", "n1"), succeeded("r-x"), prune], ended_memory=0)
    fold_more(state, [sub("r-a", deps=("r-x",))])
    view = state.book.jobs["r-a"]
    assert state.dependency_verdict(view) is None, "unknown: it waits"
    assert state.take_unknown_dependencies() == ["r-x"]
    assert state.dependency_verdict(view) is None
    assert state.take_unknown_dependencies() == [], "handed out once until answered"
    state.learn_final("r-x", JobState.SUCCEEDED)
    assert state.dependency_verdict(view) == ()
    state.prune()
    assert state.sizes()["learned"] == 1, "kept while r-a waits"
    fold_more(state, [released("r-a")])
    state.prune()
    assert state.sizes()["learned"] == 0, "dropped once nothing waits for it"


def test_a_forgotten_dependency_that_failed_fails_its_job() -> None:
    state = fold([sub("r-x"), failed("r-x"), prune], ended_memory=0)
    fold_more(state, [sub("r-a", deps=("r-x",))])
    view = state.book.jobs["r-a"]
    assert state.dependency_verdict(view) is None
    assert state.take_unknown_dependencies() == ["r-x"]
    state.learn_final("r-x", JobState.FAILED)
    assert state.dependency_verdict(view) == ("r-x",)


def test_a_dependency_the_log_lacks_keeps_its_job_waiting_and_is_not_asked_again() -> None:
    state = fold([sub("r-a", deps=("r-gone",))])
    view = state.book.jobs["r-a"]
    assert state.dependency_verdict(view) is None
    assert state.take_unknown_dependencies() == ["r-gone"]
    state.learn_missing("r-gone")
    assert state.dependency_verdict(view) is None and state.is_missing("r-gone")
    assert state.take_unknown_dependencies() == []


def test_a_failed_look_up_is_asked_again() -> None:
    state = fold([sub("r-a", deps=("r-x",))])
    state.dependency_verdict(state.book.jobs["r-a"])
    assert state.take_unknown_dependencies() == ["r-x"]
    state.ask_again("r-x")
    assert state.take_unknown_dependencies() == ["r-x"]


def test_the_snapshot_keeps_the_newest_ended_jobs_in_order() -> None:
    state = fold(NODES, ended_memory=2)
    for job in ("r-a", "r-b", "r-c"):
        fold_more(state, [sub(job), failed(job)])
        state.prune()
    content = json.loads(json.dumps(state.snapshot()))
    assert content["ended"] == [["r-b", "FAILED"], ["r-c", "FAILED"]]
    restored = PlacementState.from_snapshot(content, ended_memory=1)
    assert restored.snapshot()["ended"] == [["r-c", "FAILED"]]


# -- snapshot ------------------------------------------------------------------------------------
SNAPSHOT_CASES: list[tuple[str, list[Step]]] = [
    ("empty", []),
    ("nodes only", NODES),
    (
        "jobs in every state, in flight, tenants, a lost node, a suspect node, a pruned job",
        [
            *NODES,
            load("n3", t=1),
            sub("alice.1-x"),
            sub("alice.1-w", deps=("alice.1-x",)),
            sub("r-p", priority="high"),
            sub("r-b", cpu=2),
            bound("r-b", "n1", t=1),
            sub("r-r", cpu=1.5),
            bound("r-r", "n2", t=1),
            started("r-r", t=2),
            sub("r-c"),
            bound("r-c", "n3"),
            crashed("r-c", "n3", t=3, reason=pb.FAILURE_NODE_LOST),
            requeued("r-c", avoid=("n3",), not_before=30, t=4),
            sub("r-s"),
            bound("r-s", "n1"),
            succeeded("r-s"),
            prune,
            sub("r-f"),
            failed("r-f"),
            *[
                step
                for i in range(2)
                for step in (sub(f"r-k{i}"), bound(f"r-k{i}", "n2"), crashed(f"r-k{i}", "n2", t=i))
            ],
        ],
    ),
]


SNAPSHOT_CASES.append(
    (
        "two named clusters, a chain whose dependency ended on one of them",
        [
            load("hpc/n1", labels={"site": "centre"}),
            load("hpc/n2", labels={"site": "centre"}),
            load("dept/n1", labels={"site": "campus"}),
            sub("r-a"),
            bound("r-a", "hpc/n2"),
            started("r-a"),
            sub("r-b", deps=("r-a",)),
            succeeded("r-a"),
            prune,
            released("r-b"),
        ],
    )
)


@named_cases(("history",), SNAPSHOT_CASES)
def test_snapshot_round_trip(history: list[Step]) -> None:
    policy = NodeHealthPolicy(failures_to_cordon=2)
    state = fold(history, health_policy=policy)
    snapshot = state.snapshot()
    text = json.dumps(snapshot)
    restored = PlacementState.from_snapshot(
        json.loads(text), PlacementConfig(), load_settle_s=SETTLE_S, health_policy=policy
    )
    assert restored.snapshot() == snapshot
    assert observe(restored) == observe(state)
    assert restored.queue(at(60)) == state.queue(at(60))
    assert restored.sizes() == state.sizes()
    assert restored.book.last_sequence == state.book.last_sequence
    assert restored.health.suspects(at(3)) == state.health.suspects(at(3))
    for job in state.book.jobs:
        assert restored.fence_sequence(job) == state.fence_sequence(job)
    # and it goes on folding as the original does
    more = [sub("r-z", cpu=1), bound("r-z", "n1", t=5), load("n1", t=5 + SETTLE_S), prune]
    fold_more(state, more)
    fold_more(restored, more)
    assert restored.snapshot() == state.snapshot()


def test_a_snapshot_of_another_layout_is_refused() -> None:
    snapshot = fold(NODES).snapshot() | {"version": 0}
    with pytest.raises(ValueError, match="version"):
        PlacementState.from_snapshot(snapshot)


def test_a_view_round_trips_every_field() -> None:
    view = JobView(
        job_id="r-a",
        spec=pb.JobSpec(name="a", steps=7),
        request_id="r",
        depends_on_ids=("r-x",),
        submitted_at=T0,
        state=JobState.RUNNING,
        attempt=2,
        node="n1",
        pod_name="mdq-r-a-2",
        last_step=40,
        last_progress_at=at(5),
        last_potential=-1.5,
        done_reason="why",
        latest_checkpoint=pb.Checkpoint(step=30),
        resume_from=pb.Checkpoint(step=20),
        resources=pb.Resources(cpu=2, memory_mb=4096),
        avoid_nodes=("n2",),
        not_before=at(1),
        final_reason="r",
        final_message="m",
        attempts={
            1: AttemptRecord(
                attempt=1,
                node="n2",
                pod_name="p",
                resumed_from_step=0,
                started_at=at(0),
                ended_at=at(1),
                failure=pb.AttemptFailed(reason=pb.FAILURE_CRASHED),
                steps_lost=3,
                pod_phase=pb.POD_FAILED,
                started_logged=True,
            ),
            2: AttemptRecord(attempt=2),
        },
        hold="PENDING",
        stop=Stop.HOLD,
        stop_origin=pb.ControlOrigin(control_id="c1", requested_by="ann", reason="why"),
        stop_message="m",
    )
    data = json.loads(json.dumps(view.to_dict()))
    assert set(data) == {f.name for f in fields(JobView)}, "a field left out of the snapshot"
    assert set(data["attempts"][0]) == {f.name for f in fields(AttemptRecord)}
    assert JobView.from_dict(data) == view


def test_shares_report_running_share_and_fair_share_per_tenant() -> None:
    # 8 cores: alice runs 2 of her 6 one-core jobs, bob waits with 6, carol (weight 2) with 1;
    # the operator runs one job of 4 GiB
    steps: list[Step] = [load("n1", cpu=8, memory_mb=16_384)]
    steps += [sub(f"alice.1-a{i}") for i in range(6)] + [bound("alice.1-a0", "n1")]
    steps += [bound("alice.1-a1", "n1")]
    steps += [sub(f"bob.1-b{i}") for i in range(6)] + [sub("carol.1-c0")]
    steps += [sub("1-op", memory_mb=4096), bound("1-op", "n1")]
    state = fold(steps)
    weights = {"carol": 2.0}
    report = state.shares(at(1), lambda tenant: weights.get(tenant, 1.0))
    assert set(report) == {"alice", "bob", "carol", ""}
    alice, bob, carol, operator = report["alice"], report["bob"], report["carol"], report[""]
    assert (alice.running_jobs, alice.running.cpu, alice.share) == (2, 2.0, 0.25)
    assert (bob.running_jobs, bob.share) == (0, 0.0)
    assert operator.share == 0.25  # its memory dominates: 4 of 16 GiB
    # demands: alice 6/8, bob 6/8, carol 1/8, operator 1/4: carol and the operator are
    # satisfied, alice and bob split the other 5/8
    assert carol.fair_share == pytest.approx(0.125) and carol.weight == 2.0
    assert operator.fair_share == pytest.approx(0.25)
    assert alice.fair_share == pytest.approx(0.3125) == bob.fair_share


CLUSTER_NODES = [
    load("hpc/n1", labels={"site": "centre"}),
    load("dept/n1", labels={"site": "campus"}),
]


def test_nodes_of_named_clusters_carry_their_cluster_and_one_shared_label_set() -> None:
    state = fold([*CLUSTER_NODES, load("hpc/n2", labels={"site": "centre"})])
    nodes = {node.name: node for node in state.node_states()}
    assert nodes["hpc/n1"].cluster == "hpc"
    assert nodes["hpc/n1"].cluster_labels == {"site": "centre"}
    assert nodes["hpc/n1"].cluster_labels is nodes["hpc/n2"].cluster_labels
    assert nodes["dept/n1"].cluster_labels == {"site": "campus"}
    # a cluster relabelled: its next reports carry the new labels
    fold_more(state, [load("hpc/n1", t=1, labels={"site": "centre", "gpu": "true"})])
    assert state.nodes["hpc/n1"].cluster_labels == {"site": "centre", "gpu": "true"}


LOCALITY_CASES = [
    (
        "a dependency still known: where it ran",
        [*CLUSTER_NODES, sub("r-a"), bound("r-a", "hpc/n1"), sub("r-b", deps=("r-a",))],
        ("hpc",),
    ),
    (
        "a dependency pruned: where it ended is remembered",
        [
            *CLUSTER_NODES,
            sub("r-a"),
            bound("r-a", "dept/n1"),
            started("r-a"),
            sub("r-b", deps=("r-a",)),
            succeeded("r-a"),
            prune,
            released("r-b"),
        ],
        ("dept",),
    ),
    (
        "a dependency read back from the log: not known",
        [*CLUSTER_NODES, sub("r-b", deps=("r-gone",))],
        ("",),
    ),
    (
        "one unnamed cluster: no locality at all",
        [load("n1"), sub("r-a"), bound("r-a", "n1"), sub("r-b", deps=("r-a",))],
        (),
    ),
]


@pytest.mark.parametrize(("name", "history", "expected"), LOCALITY_CASES)
def test_a_chain_job_knows_where_its_dependencies_outputs_are(
    name: str, history: list[Step], expected: tuple[str, ...]
) -> None:
    state = fold(history)
    view = state.book.jobs["r-b"]
    assert state._queued_job(view).data_clusters == expected


def test_a_queued_job_carries_its_cluster_selector() -> None:
    spec_step = sub("r-a")
    state = fold([*CLUSTER_NODES, spec_step])
    view = state.book.jobs["r-a"]
    assert state._queued_job(view).clusters == Selector()
    view.spec.clusters.require["site"] = "centre"
    fresh = fold([*CLUSTER_NODES])
    event = make_event(
        "submitted",
        pb.JobSubmitted(spec=view.spec, request_id="r"),
        job_id="r-c",
        attempt=0,
        producer="test",
        at=at(0),
    )
    fresh.apply(1, event)
    queued = fresh._queued_job(fresh.book.jobs["r-c"])
    assert queued.clusters.require == frozenset({("site", "centre")})


def test_a_snapshot_from_before_clusters_loads_into_the_unnamed_cluster() -> None:
    snapshot = fold([*NODES, sub("r-a"), bound("r-a", "n1"), succeeded("r-a"), prune]).snapshot()
    for node in snapshot["nodes"]:
        del node["cluster"], node["cluster_labels"]
    restored = PlacementState.from_snapshot(snapshot, load_settle_s=SETTLE_S)
    assert {node.cluster for node in restored.node_states()} == {""}
    assert restored.final_state("r-a") is JobState.SUCCEEDED


def troubled(node: str, problem: str, t: float = 0) -> Step:
    """A load report of ``node`` naming ``problem`` ("" for none)."""
    body = pb.NodeLoad(node=node, cpu_capacity=8, memory_capacity_mb=16_384, ready=True)
    body.problem = problem
    return lambda state: state.apply_load(body, at(t))


PROBLEM_CASES = [
    ("no reports", [], False),
    ("reports without a problem", NODES, False),
    ("a report names one", [*NODES, troubled("n2", "disk full")], True),
    ("a later report clears it", [troubled("n2", "disk full", 1), troubled("n2", "", 2)], False),
    ("an older report is ignored", [troubled("n2", "", 2), troubled("n2", "disk full", 1)], False),
    ("another node's clears nothing", [troubled("n1", "x", 1), troubled("n2", "", 2)], True),
]


@named_cases(("history", "expected"), PROBLEM_CASES)
def test_node_problems_follow_the_latest_reports(history: list[Step], expected: bool) -> None:
    state = fold(history)
    assert state.has_node_problems() is expected
    assert state.has_node_problems() is any(node.problem for node in state.nodes.values())
    restored = PlacementState.from_snapshot(json.loads(json.dumps(state.snapshot())))
    assert restored.has_node_problems() is expected
