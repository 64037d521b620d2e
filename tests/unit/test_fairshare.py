"""Fair share between tenants (weighted dominant-resource fairness), as tables of named cases:
the order ``FairQueue`` hands out, and what ``plan`` binds with it when more waits than fits."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from mdq.core.fairshare import (
    Fairness,
    FairQueue,
    Held,
    dominant_share,
    fair_shares,
    fairness_reason,
)
from mdq.core.placement import (
    NodeState,
    QueuedJob,
    RunningJob,
    Standing,
    plan,
    plan_fair_reclaims,
)
from tests.tables import named_cases

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


def job(job_id: str, tenant: str, cpu: float = 1, memory_mb: int = 1024) -> QueuedJob:
    return QueuedJob(
        job_id=job_id,
        cpu=cpu,
        memory_mb=memory_mb,
        priority=500,
        submitted_at=NOW,
        tenant=tenant,
    )


def node(name: str, cpu: float = 4, memory_mb: int = 16_384) -> NodeState:
    return NodeState(
        name=name,
        cpu_capacity=cpu,
        memory_capacity_mb=memory_mb,
        ready=True,
        cpu_load=0.0,
        memory_load=0.0,
        reported_at=NOW - timedelta(seconds=1),
    )


SHARE_CASES = [
    ("nothing held", Held(), 0.0),
    ("cpu dominates", Held(cpu=4, memory_mb=1024), 0.5),
    ("memory dominates", Held(cpu=1, memory_mb=8192), 0.5),
    ("all of it", Held(cpu=8, memory_mb=16_384), 1.0),
]


@named_cases(("held", "share"), SHARE_CASES)
def test_dominant_share(held: Held, share: float) -> None:
    assert dominant_share(held, 8, 16_384) == pytest.approx(share)


def test_no_capacity_is_no_share() -> None:
    assert dominant_share(Held(cpu=4, memory_mb=4096), 0, 0) == 0.0


# each case: queue (job id = tenant + number, in queue order), held now, weights, and the
# tenants of the first jobs handed out when every job is bound (charged) as it comes
ORDER_CASES: list[tuple[str, list[QueuedJob], dict[str, Held], dict[str, float], str]] = [
    (
        "one tenant keeps queue order",
        [job("a1", "a"), job("a2", "a"), job("a3", "a")],
        {},
        {},
        "aaa",
    ),
    (
        "equal weights alternate (ties by queue order)",
        [job("a1", "a"), job("a2", "a"), job("a3", "a"), job("b1", "b"), job("b2", "b")],
        {},
        {},
        "ababa",
    ),
    (
        "weight 2 gets two jobs for one",
        [*(job(f"a{i}", "a") for i in range(6)), *(job(f"b{i}", "b") for i in range(6))],
        {},
        {"b": 2.0},
        "abbabbabb",
    ),
    (
        "a tenant already holding much waits for the others",
        [job("a1", "a"), job("a2", "a"), job("b1", "b"), job("b2", "b"), job("b3", "b")],
        {"a": Held(cpu=4)},
        {},
        "bbba",
    ),
    (
        "dominant resource: big-memory jobs count by memory",
        [job("m1", "m", 1, 8192), job("m2", "m", 1, 8192), job("c1", "c"), job("c2", "c")],
        {},
        {},
        "mccm",
    ),
    (
        "the operator's jobs take part as a tenant of weight 1",
        [job("o1", ""), job("o2", ""), job("t1", "t"), job("t2", "t")],
        {},
        {},
        "-t-t",
    ),
]


@named_cases(("queue", "held", "weight", "expected"), ORDER_CASES)
def test_fair_order_when_every_job_is_bound(
    queue: list[QueuedJob],
    held: dict[str, Held],
    weight: dict[str, float],
    expected: str,
) -> None:
    fair = FairQueue(queue, Fairness(held, lambda tenant: weight.get(tenant, 1.0)), 8, 16_384)
    order = []
    for each in fair:
        order.append(each.tenant or "-")
        fair.charge(each)
    assert "".join(order[: len(expected)]) == expected
    assert sorted(j.job_id for j in queue) == sorted(  # every job exactly once
        j.job_id for j in FairQueue(queue, Fairness(held, lambda _: 1.0), 8, 16_384)
    )


def test_a_job_not_bound_charges_nothing() -> None:
    # a's first job fits nowhere (not charged): a is still the poorer tenant afterwards
    queue = [job("a1", "a"), job("a2", "a"), job("b1", "b"), job("b2", "b")]
    fair = FairQueue(queue, Fairness({"b": Held(cpu=1)}, lambda _: 1.0), 8, 16_384)
    order = []
    for each in fair:
        order.append(each.job_id)
        if each.job_id != "a1":
            fair.charge(each)
    assert order == ["a1", "a2", "b1", "b2"]


def test_held_mapping_is_not_changed() -> None:
    held = {"a": Held(cpu=1)}
    fair = FairQueue([job("a1", "a"), job("b1", "b")], Fairness(held, lambda _: 1.0), 8, 16_384)
    for each in fair:
        fair.charge(each)
    assert held == {"a": Held(cpu=1)}


PLAN_CASES = [
    (
        # 8 one-core slots, a flood from a (submitted first) and b: without fairness a takes
        # all 8; with it, 4 each
        "a flood does not starve a later tenant",
        [*(job(f"a{i}", "a") for i in range(10)), *(job(f"b{i}", "b") for i in range(10))],
        {},
        {},
        {"a": 4, "b": 4},
    ),
    (
        "weights 1:1:2 split 8 slots 2:2:4",
        [
            *(job(f"a{i}", "a") for i in range(10)),
            *(job(f"b{i}", "b") for i in range(10)),
            *(job(f"c{i}", "c") for i in range(10)),
        ],
        {},
        {"c": 2.0},
        {"a": 2, "b": 2, "c": 4},
    ),
    (
        "what a tenant already runs counts",
        [*(job(f"a{i}", "a") for i in range(10)), *(job(f"b{i}", "b") for i in range(10))],
        {"a": Held(cpu=2, memory_mb=2048)},
        {},
        {"a": 2, "b": 4},
    ),
    (
        "work-conserving: a tenant alone takes all the room",
        [*(job(f"a{i}", "a") for i in range(10)), job("b0", "b", cpu=16)],
        {},
        {},
        {"a": 8},
    ),
]


@named_cases(("queue", "held", "weight", "bound"), PLAN_CASES)
def test_plan_binds_fair_shares(
    queue: list[QueuedJob],
    held: dict[str, Held],
    weight: dict[str, float],
    bound: dict[str, int],
) -> None:
    free_cpu = 8 - sum(h.cpu for h in held.values())
    nodes = [node("n1", cpu=4), node("n2", cpu=4)]
    nodes[0] = replace(nodes[0], reserved_cpu=8 - free_cpu)  # what is held sits on n1
    fairness = Fairness(held=held, weight=lambda tenant: weight.get(tenant, 1.0))
    decisions = plan(nodes, queue, NOW, ordered=True, fairness=fairness)
    counts: dict[str, int] = {}
    for decision in decisions:
        tenant = decision.job_id[0]
        counts[tenant] = counts.get(tenant, 0) + 1
    assert counts == bound


def test_plan_without_fairness_keeps_queue_order() -> None:
    queue = [*(job(f"a{i}", "a") for i in range(10)), *(job(f"b{i}", "b") for i in range(10))]
    decisions = plan([node("n1"), node("n2")], queue, NOW, ordered=True)
    assert [d.job_id for d in decisions] == [f"a{i}" for i in range(8)]


FAIR_SHARE_CASES: list[tuple[str, dict[str, float], dict[str, float], dict[str, float]]] = [
    ("one tenant wanting more than all gets all", {"a": 3.0}, {}, {"a": 1.0}),
    ("one tenant wanting little gets what it wants", {"a": 0.2}, {}, {"a": 0.2}),
    ("two equal tenants, both flooding", {"a": 5.0, "b": 5.0}, {}, {"a": 0.5, "b": 0.5}),
    (
        "weights 1:1:2, all flooding",
        {"a": 9.0, "b": 9.0, "c": 9.0},
        {"c": 2.0},
        {"a": 0.25, "b": 0.25, "c": 0.5},
    ),
    (
        "what a small tenant leaves goes to the others by weight",
        {"a": 0.1, "b": 9.0, "c": 9.0},
        {"c": 2.0},
        {"a": 0.1, "b": 0.3, "c": 0.6},
    ),
    ("no demand, no share", {"a": 0.0, "b": 2.0}, {}, {"a": 0.0, "b": 1.0}),
    ("all satisfied", {"a": 0.2, "b": 0.3}, {}, {"a": 0.2, "b": 0.3}),
]


@named_cases(("demands", "weight", "expected"), FAIR_SHARE_CASES)
def test_fair_shares_water_fill_by_weight(
    demands: dict[str, float], weight: dict[str, float], expected: dict[str, float]
) -> None:
    shares = fair_shares(demands, lambda tenant: weight.get(tenant, 1.0))
    assert shares == pytest.approx(expected)


REASON_CASES = [
    ("below its fair share: nothing to say", "alice", 0.2, 0.5, ""),
    ("at it: nothing to say", "alice", 0.5, 0.5, ""),
    (
        "above it",
        "alice",
        0.75,
        0.25,
        "fair share: tenant alice holds 75% of the cluster, above its fair share of 25%, so "
        "its jobs go after those of tenants below theirs",
    ),
    (
        "the operator",
        "",
        0.6,
        0.5,
        "fair share: the operator holds 60% of the cluster, above its fair share of 50%, so "
        "its jobs go after those of tenants below theirs",
    ),
]


@named_cases(("tenant", "share", "fair", "reason"), REASON_CASES)
def test_fairness_reason(tenant: str, share: float, fair: float, reason: str) -> None:
    assert fairness_reason(tenant, share, fair) == reason


# -- reclaiming from over-share tenants ----------------------------------------------------------
def work(
    job_id: str,
    tenant: str,
    node_name: str = "n1",
    *,
    ran_s: float = 600,
    checkpoint_s_ago: float | None = None,
    cpu: float = 1,
) -> RunningJob:
    return RunningJob(
        job_id=job_id,
        node=node_name,
        cpu=cpu,
        memory_mb=1024,
        priority=500,
        started_at=NOW - timedelta(seconds=ran_s),
        tenant=tenant,
        checkpoint_at=None
        if checkpoint_s_ago is None
        else NOW - timedelta(seconds=checkpoint_s_ago),
    )


def full(name: str = "n1", cpu: float = 4) -> NodeState:
    return replace(node(name, cpu=cpu), reserved_cpu=cpu, reserved_memory_mb=int(cpu) * 1024)


# a 4-core node full of a's work (share 0.5 of 8 cores on two nodes, the other full of c's)
RECLAIM_CASES: list[
    tuple[
        str,
        list[RunningJob],
        dict[str, Standing],
        list[QueuedJob],
        list[tuple[str, tuple[str, ...]]],
    ]
] = [
    (
        "a newcomer below its share takes one job's room from the tenant above",
        [work(f"a{i}", "a") for i in range(4)] + [work(f"c{i}", "c", "n2") for i in range(4)],
        {"a": Standing(0.5, 0.25), "b": Standing(0.0, 0.25), "c": Standing(0.5, 0.5)},
        [job("b0", "b")],
        [("b0", ("a0",))],
    ),
    (
        "never below the victim's own fair share: two jobs for b, then a is at its due",
        [work(f"a{i}", "a") for i in range(4)] + [work(f"c{i}", "c", "n2") for i in range(4)],
        {"a": Standing(0.5, 0.25), "b": Standing(0.0, 0.25), "c": Standing(0.5, 0.5)},
        [job(f"b{i}", "b") for i in range(4)],
        [("b0", ("a0",)), ("b1", ("a1",))],
    ),
    (
        "the least work lost first: the most recent checkpoint",
        [
            work("a0", "a", checkpoint_s_ago=300),
            work("a1", "a"),
            work("a2", "a", checkpoint_s_ago=5),
            work("a3", "a", checkpoint_s_ago=60),
        ]
        + [work(f"c{i}", "c", "n2") for i in range(4)],
        {"a": Standing(0.5, 0.25), "b": Standing(0.0, 0.25), "c": Standing(0.5, 0.5)},
        [job("b0", "b")],
        [("b0", ("a2",))],
    ),
    (
        "never work in its first minutes",
        [work(f"a{i}", "a", ran_s=30) for i in range(4)]
        + [work(f"c{i}", "c", "n2") for i in range(4)],
        {"a": Standing(0.5, 0.25), "b": Standing(0.0, 0.25), "c": Standing(0.5, 0.5)},
        [job("b0", "b")],
        [],
    ),
    (
        "a tenant at its fair share reclaims nothing",
        [work(f"a{i}", "a") for i in range(4)] + [work(f"b{i}", "b", "n2") for i in range(4)],
        {"a": Standing(0.5, 0.5), "b": Standing(0.5, 0.5)},
        [job("b9", "b")],
        [],
    ),
    (
        "nobody above its share: nothing to take",
        [work(f"a{i}", "a") for i in range(4)] + [work(f"c{i}", "c", "n2") for i in range(4)],
        {"a": Standing(0.5, 0.5), "b": Standing(0.0, 0.0), "c": Standing(0.5, 0.5)},
        [job("b0", "b")],
        [],
    ),
    (
        "the most over-share tenant gives first",
        [work("a0", "a"), work("a1", "a"), work("c0", "c"), work("c1", "c")]
        + [work(f"c{i}", "c", "n2") for i in range(2, 6)],
        {"a": Standing(0.25, 0.2), "b": Standing(0.0, 0.2), "c": Standing(0.75, 0.6)},
        [job("b0", "b")],
        [("b0", ("c0",))],
    ),
]


@named_cases(("running", "standing", "waiting", "expected"), RECLAIM_CASES)
def test_fair_reclaims(
    running: list[RunningJob],
    standing: dict[str, Standing],
    waiting: list[QueuedJob],
    expected: list[tuple[str, tuple[str, ...]]],
) -> None:
    nodes = [full("n1"), full("n2")]
    reclaims = plan_fair_reclaims(nodes, waiting, running, standing, 8, 32_768, NOW)
    assert [(r.job_id, r.victims) for r in reclaims] == expected
    for reclaim in reclaims:
        assert reclaim.reason.startswith("fair share: tenant b is below its fair share")


GUARANTEE_CASES: list[
    tuple[str, dict[str, float], dict[str, float], dict[str, float], dict[str, float]]
] = [
    # name, demands, guaranteed, maximum, expected fair shares (equal weights)
    (
        "a guarantee above the weighted part is a floor",
        {"a": 9, "b": 9, "c": 9},
        {"a": 0.5},
        {},
        {"a": 0.5, "b": 0.25, "c": 0.25},
    ),
    (
        "a guarantee below it changes nothing",
        {"a": 9, "b": 9},
        {"a": 0.2},
        {},
        {"a": 0.5, "b": 0.5},
    ),
    (
        "a guarantee is only as much as is demanded",
        {"a": 0.1, "b": 9},
        {"a": 0.5},
        {},
        {"a": 0.1, "b": 0.9},
    ),
    (
        "a maximum caps the demand; the rest goes to the others",
        {"a": 9, "b": 9},
        {},
        {"a": 0.2},
        {"a": 0.2, "b": 0.8},
    ),
]


@named_cases(("demands", "guaranteed", "maximum", "expected"), GUARANTEE_CASES)
def test_fair_shares_with_guarantees_and_maximums(
    demands: dict[str, float],
    guaranteed: dict[str, float],
    maximum: dict[str, float],
    expected: dict[str, float],
) -> None:
    shares = fair_shares(
        demands,
        lambda _: 1.0,
        guaranteed=lambda tenant: guaranteed.get(tenant, 0.0),
        maximum=lambda tenant: maximum.get(tenant),
    )
    assert shares == pytest.approx(expected)


def test_a_tenant_below_its_guarantee_goes_first_whatever_its_weight() -> None:
    # a (weight 4) holds 1/8, b (weight 1) nothing: by weighted share a goes first, but a's
    # guarantee of 1/2 puts it ahead until it holds half
    queue = [job("b1", "b"), *(job(f"a{i}", "a") for i in range(5))]
    fairness = Fairness(
        {"a": Held(cpu=1)},
        lambda t: 4.0 if t == "a" else 1.0,
        guaranteed=lambda t: 0.5 if t == "a" else 0.0,
    )
    fair = FairQueue(queue, fairness, 8, 16_384)
    order = []
    for each in fair:
        order.append(each.job_id)
        fair.charge(each)
    assert order[:3] == ["a0", "a1", "a2"]


def test_plan_binds_no_job_over_its_tenants_maximum_share() -> None:
    # a may hold at most a quarter of the 8 cores: 2 jobs bind, the rest wait, b's still bind
    # (and with a alone in the queue the cap holds too)
    fairness = Fairness({}, lambda _: 1.0, maximum=lambda t: 0.25 if t == "a" else None)
    queue = [*(job(f"a{i}", "a") for i in range(6)), job("b0", "b")]
    decisions = plan([node("n1"), node("n2")], queue, NOW, ordered=True, fairness=fairness)
    assert sorted(d.job_id for d in decisions) == ["a0", "a1", "b0"]
    alone = plan([node("n1"), node("n2")], queue[:6], NOW, ordered=True, fairness=fairness)
    assert [d.job_id for d in alone] == ["a0", "a1"]
