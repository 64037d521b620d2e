"""Node health: when failures of different jobs make a node suspect, and how many suspects the
budget lets placement cordon, as tables of named cases."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from mdq.contracts import pb
from mdq.core.node_health import NodeCapacity, NodeHealth, NodeHealthPolicy
from tests.tables import named_cases

T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
CRASH, LOST, NODE_LOST, EVICTED, OOM, UNSTABLE = (
    pb.FAILURE_CRASHED,
    pb.FAILURE_LOST,
    pb.FAILURE_NODE_LOST,
    pb.FAILURE_EVICTED,
    pb.FAILURE_OOM_KILLED,
    pb.FAILURE_UNSTABLE,
)

FULL = "data disk full (ENOSPC): No space left on device"
"""A node's problem, as its agent reports it."""

Failure = tuple[int, str, str, int]
"""(seconds after T0, node, job, reason)."""


def crashes(node: str, start: int, count: int = 3, reason: int = CRASH) -> list[Failure]:
    """``count`` distinct jobs failing on ``node``, 10 s apart from ``start``."""
    return [(start + 10 * i, node, f"{node}-{start}-{i}", reason) for i in range(count)]


def fold(failures: list[Failure], policy: NodeHealthPolicy | None = None) -> NodeHealth:
    health = NodeHealth(policy=policy or NodeHealthPolicy())
    for seconds, where, job, reason in failures:
        health.record(node=where, job_id=job, reason=reason, at=T0 + timedelta(seconds=seconds))  # type: ignore[arg-type]
    return health


# (name, failures, node asked, seconds after T0, suspect)
SUSPICION_CASES = [
    ("three jobs crash on one node", crashes("n1", 0), "n1", 30, True),
    ("the verdict lapses", crashes("n1", 0), "n1", 20 + 301, False),
    (
        "one job crashing three times is the job",
        [(0, "n1", "a", CRASH), (10, "n1", "a", CRASH), (20, "n1", "a", CRASH)],
        "n1",
        30,
        False,
    ),
    (
        "failures spread over nodes",
        [(0, "n1", "a", CRASH), (10, "n2", "b", CRASH), (20, "n1", "c", CRASH)],
        "n1",
        30,
        False,
    ),
    (
        "old failures fall out of the window",
        [(0, "n1", "a", CRASH), (10, "n1", "b", CRASH), (700, "n1", "c", CRASH)],
        "n1",
        710,
        False,
    ),
    (
        "OOM and NaN are the jobs' fault",
        [(0, "n1", "a", OOM), (10, "n1", "b", UNSTABLE), (20, "n1", "c", CRASH)],
        "n1",
        30,
        False,
    ),
    ("other nodes are unaffected", crashes("n1", 0), "n2", 30, False),
    (
        "node lost (agent or node gone) is infrastructure",
        crashes("n1", 0, 5, NODE_LOST),
        "n1",
        50,
        False,
    ),
    ("silence (lost) is the control plane's view", crashes("n1", 0, 5, LOST), "n1", 50, False),
    ("evictions are the operator's or preemption's", crashes("n1", 0, 5, EVICTED), "n1", 50, False),
    (
        "infrastructure failures do not add up with a crash",
        [(0, "n1", "a", NODE_LOST), (10, "n1", "b", LOST), (20, "n1", "c", CRASH)],
        "n1",
        30,
        False,
    ),
]


@named_cases(("failures", "node", "at", "suspect"), SUSPICION_CASES)
def test_suspicion(failures: list[Failure], node: str, at: int, suspect: bool) -> None:
    health = fold(failures)
    suspects = {s.node for s in health.suspects(T0 + timedelta(seconds=at))}
    assert (node in suspects) is suspect


def equal(*names: str, cpu: float = 4.0) -> list[NodeCapacity]:
    return [NodeCapacity(name=name, cpu=cpu, ready=True) for name in names]


# (name, nodes, failures, seconds after T0, cordoned, held back in severity order)
BUDGET_CASES: list[tuple[str, list[NodeCapacity], list[Failure], int, set[str], list[str]]] = [
    (
        "one suspect of three nodes is cordoned",
        equal("n1", "n2", "n3"),
        crashes("n1", 0),
        30,
        {"n1"},
        [],
    ),
    (
        "two nodes both suspect: one is cordoned, the most recent",
        equal("n1", "n2"),
        crashes("n1", 0) + crashes("n2", 5),
        30,
        {"n2"},
        ["n1"],
    ),
    (
        "two nodes both suspect: more failures come before recency",
        equal("n1", "n2"),
        crashes("n1", 0, 6) + crashes("n2", 100),
        130,
        {"n1"},
        ["n2"],
    ),
    (
        "the agent kill on two nodes: node-lost failures cordon nothing",
        equal("n1", "n2"),
        crashes("n1", 0, 4, NODE_LOST)
        + crashes("n2", 0, 4, NODE_LOST)
        + crashes("n1", 50, 4, LOST),
        90,
        set(),
        [],
    ),
    (
        "three equal nodes all suspect: a third of the capacity is one node",
        equal("n1", "n2", "n3"),
        crashes("n1", 0) + crashes("n2", 1) + crashes("n3", 2),
        30,
        {"n3"},
        ["n2", "n1"],
    ),
    (
        "six equal nodes, three suspect: two are cordoned",
        equal("n1", "n2", "n3", "n4", "n5", "n6"),
        crashes("n1", 0) + crashes("n2", 1) + crashes("n3", 2),
        30,
        {"n3", "n2"},
        ["n1"],
    ),
    (
        "capacity-weighted: the big worst node is held back, two small ones cordoned",
        [NodeCapacity("big", 8.0, True), *equal("s1", "s2", "s3", cpu=2.0)],
        crashes("big", 0, 6) + crashes("s1", 100) + crashes("s2", 101),
        130,
        {"s1", "s2"},
        ["big"],
    ),
    (
        "capacity-weighted: a node of half the capacity may be the one node out",
        [NodeCapacity("big", 6.0, True), *equal("s1", "s2", "s3", cpu=2.0)],
        crashes("big", 0, 6) + crashes("s1", 100),
        130,
        {"big"},
        ["s1"],
    ),
    (
        "an operator-cordoned node counts against the budget",
        [*equal("n1", "n2"), NodeCapacity("n3", 4.0, True, cordoned=True)],
        crashes("n1", 0),
        30,
        set(),
        ["n1"],
    ),
    (
        "an operator-cordoned node within a larger budget leaves room",
        [*equal("n1", "n2", "n3", "n4", "n5"), NodeCapacity("n6", 4.0, True, cordoned=True)],
        crashes("n1", 0) + crashes("n2", 5),
        30,
        {"n2"},
        ["n1"],
    ),
    (
        "last schedulable node: the other is not ready",
        [*equal("n1"), NodeCapacity("n2", 4.0, ready=False)],
        crashes("n1", 0),
        30,
        set(),
        ["n1"],
    ),
    (
        "last schedulable node: the other is cordoned by an operator",
        [*equal("n1"), NodeCapacity("n2", 4.0, True, cordoned=True)],
        crashes("n1", 0),
        30,
        set(),
        ["n1"],
    ),
    ("a single node is never cordoned", equal("n1"), crashes("n1", 0), 30, set(), ["n1"]),
    (
        "unready nodes take no part: neither cordoned nor held back",
        [*equal("n1", "n2", "n3"), NodeCapacity("n4", 4.0, ready=False)],
        crashes("n4", 0) + crashes("n1", 5),
        30,
        {"n1"},
        [],
    ),
    (
        "cordon lapse: the next suspect in line takes the place",
        equal("n1", "n2"),
        crashes("n1", 0, 6) + crashes("n2", 60),
        360,
        {"n2"},
        [],
    ),
    (
        "cordon lapse: every verdict over, nothing is cordoned",
        equal("n1", "n2"),
        crashes("n1", 0, 6) + crashes("n2", 60),
        400,
        set(),
        [],
    ),
    (
        "a node whose data disk is full is cordoned while it says so",
        [*equal("n1", "n2"), NodeCapacity("n3", 4.0, True, problem=FULL)],
        [],
        30,
        {"n3"},
        [],
    ),
    (
        "a node that reports no problem any more takes work at once",
        equal("n1", "n2", "n3"),
        [],
        30,
        set(),
        [],
    ),
    (
        "a shared disk full on both of two nodes: one node stays open",
        [NodeCapacity("n1", 4.0, True, problem=FULL), NodeCapacity("n2", 4.0, True, problem=FULL)],
        [],
        30,
        {"n1"},
        ["n2"],
    ),
    (
        "every node of three failing: one cordoned, never all",
        [NodeCapacity(f"n{i}", 4.0, True, problem=FULL) for i in (1, 2, 3)],
        [],
        30,
        {"n1"},
        ["n2", "n3"],
    ),
    (
        "a failing disk comes before a node where jobs crashed",
        [*equal("n1", "n2"), NodeCapacity("n3", 4.0, True, problem=FULL)],
        crashes("n1", 0, 6),
        30,
        {"n3"},
        ["n1"],
    ),
    (
        "a problem on a node that is not ready takes no part",
        [*equal("n1", "n2"), NodeCapacity("n3", 4.0, ready=False, problem=FULL)],
        [],
        30,
        set(),
        [],
    ),
    (
        "the last schedulable node is never cordoned for its problem",
        [NodeCapacity("n1", 4.0, True, problem=FULL), NodeCapacity("n2", 4.0, True, cordoned=True)],
        [],
        30,
        set(),
        ["n1"],
    ),
]


@named_cases(("nodes", "failures", "at", "cordoned", "held_back"), BUDGET_CASES)
def test_budget(
    nodes: list[NodeCapacity],
    failures: list[Failure],
    at: int,
    cordoned: set[str],
    held_back: list[str],
) -> None:
    cordons = fold(failures).cordons(T0 + timedelta(seconds=at), nodes)
    assert set(cordons.cordoned) == cordoned
    for node in nodes:
        if node.name in cordons.cordoned:
            assert cordons.cordoned[node.name].problem == node.problem
    assert [s.node for s in cordons.held_back] == held_back
    ready = sum(n.cpu for n in nodes if n.ready)
    out = sum(n.cpu for n in nodes if n.ready and (n.cordoned or n.name in cordons.cordoned))
    assert len(cordons.cordoned) <= 1 or out <= ready / 3 + 1e-9, "the budget holds"
    assert any(n.ready and not n.cordoned and n.name not in cordons.cordoned for n in nodes) or (
        not cordons.cordoned
    ), "never the last schedulable node"


def test_renewal_adds_to_the_severity_and_extends_the_verdict() -> None:
    health = fold(crashes("n1", 0, 6))
    [suspicion] = health.suspects(T0 + timedelta(seconds=60))
    assert suspicion.failures == 6
    assert suspicion.since == T0 + timedelta(seconds=20)
    assert suspicion.until == T0 + timedelta(seconds=50 + 300)


def test_disabled_policy_never_cordons() -> None:
    health = fold(crashes("n1", 0, 6), NodeHealthPolicy(failures_to_cordon=0))
    assert health.suspects(T0 + timedelta(seconds=60)) == []
    assert health.cordons(T0 + timedelta(seconds=60), equal("n1", "n2", "n3")).cordoned == {}


def test_a_zero_fraction_still_lets_one_node_go() -> None:
    """The one-node exception is what keeps a small cluster able to fence off its bad node."""
    policy = NodeHealthPolicy(max_cordoned_fraction=0.0)
    cordons = fold(crashes("n1", 0) + crashes("n2", 5), policy).cordons(
        T0 + timedelta(seconds=30), equal("n1", "n2", "n3", "n4")
    )
    assert set(cordons.cordoned) == {"n2"}
    assert [s.node for s in cordons.held_back] == ["n1"]
