"""Placement core: filters, scores, queue order and the herd guard, as tables of named cases."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from mdq.core.placement import (
    EXPLAIN_WAITING_LIMIT,
    NodeState,
    PlacementConfig,
    QueuedJob,
    explain_waiting,
    job_filter,
    load_score,
    node_filter,
    order_queue,
    plan,
    score_node,
)
from tests.tables import named_cases

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
CONFIG = PlacementConfig()


def node(name: str = "n1", **changes: object) -> NodeState:
    base = NodeState(
        name=name,
        cpu_capacity=8,
        memory_capacity_mb=16_384,
        ready=True,
        cpu_load=0.1,
        memory_load=0.1,
        reported_at=NOW - timedelta(seconds=1),
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def job(job_id: str = "j", **changes: object) -> QueuedJob:
    base = QueuedJob(job_id=job_id, cpu=1, memory_mb=1024, priority=500, submitted_at=NOW)
    return replace(base, **changes)  # type: ignore[arg-type]


FILTER_CASES = [
    ("ready idle node is a candidate", node(), job(), ""),
    ("not ready", node(ready=False), job(), "not ready"),
    (
        "silent load report",
        node(reported_at=NOW - timedelta(minutes=5)),
        job(),
        "load report too old",
    ),
    (
        "on the avoid-list",
        node(),
        job(avoid_nodes=frozenset({"n1"})),
        "avoided after a failure there",
    ),
    ("cpu request too big", node(), job(cpu=9), "insufficient cpu"),
    ("cpu reserved by others", node(reserved_cpu=7.5), job(cpu=1), "insufficient cpu"),
    ("memory request too big", node(), job(memory_mb=20_000), "insufficient memory"),
    ("memory reserved by others", node(reserved_memory_mb=16_000), job(), "insufficient memory"),
    ("exact fit is allowed", node(reserved_cpu=7), job(cpu=1), ""),
]


@named_cases(("the_node", "the_job", "filtered"), FILTER_CASES)
def test_filters(the_node: NodeState, the_job: QueuedJob, filtered: str) -> None:
    assert score_node(the_node, the_job, NOW, CONFIG).filtered == filtered


TIMEOUT = timedelta(seconds=CONFIG.load_timeout_s)
ODD = PlacementConfig(load_timeout_s=0.1234567)
"""A timeout that is not a whole number of microseconds."""
NODE_FILTER_CASES = [
    ("healthy", node(), CONFIG, ""),
    ("not ready", node(ready=False), CONFIG, "not ready"),
    ("cordoned", node(cordoned=True), CONFIG, "cordoned"),
    (
        "cordoned for a problem",
        node(cordoned=True, problem="disk full"),
        CONFIG,
        "cordoned: disk full",
    ),
    ("report exactly the timeout old", node(reported_at=NOW - TIMEOUT), CONFIG, ""),
    (
        "report a microsecond older than the timeout",
        node(reported_at=NOW - TIMEOUT - timedelta(microseconds=1)),
        CONFIG,
        "load report too old",
    ),
    ("odd timeout, just inside", node(reported_at=NOW - timedelta(microseconds=123456)), ODD, ""),
    (
        "odd timeout, just outside",
        node(reported_at=NOW - timedelta(microseconds=123457)),
        ODD,
        "load report too old",
    ),
    ("load at the hard threshold", node(cpu_load=0.95), CONFIG, ""),
    ("cpu load above the hard threshold", node(cpu_load=0.96), CONFIG, "load above hard threshold"),
    (
        "memory load above the hard threshold",
        node(memory_load=0.96),
        CONFIG,
        "load above hard threshold",
    ),
    (
        "in-flight bindings above the hard threshold",
        node(cpu_load=0.5, inflight_cpu=4),
        CONFIG,
        "load above hard threshold",
    ),
    ("no cpu capacity", node(cpu_capacity=0), CONFIG, "load above hard threshold"),
    ("no memory capacity", node(memory_capacity_mb=0), CONFIG, "load above hard threshold"),
]


@pytest.mark.parametrize("size", [1, 40], ids=["full scan", "ranked heap"])
@named_cases(("the_node", "config", "filtered"), NODE_FILTER_CASES)
def test_plan_filters_nodes_as_node_filter_does(
    the_node: NodeState, config: PlacementConfig, filtered: str, size: int
) -> None:
    """plan checks the node-wide filters itself, once per pass: it must agree with
    node_filter on every case, on a small cluster and on one large enough for the heap."""
    assert node_filter(the_node, NOW, config) == filtered
    others = [node(f"busy{i}", cpu_load=0.7, reported_at=NOW) for i in range(size)]
    decision = plan([the_node, *others], [job()], NOW, config)[0]
    assert decision.filtered_counts == ({filtered: 1} if filtered else {})
    if filtered:
        assert decision.node != "n1"
        assert ("n1", filtered) in [(score.node, score.filtered) for score in decision.scores]


SCORE_ORDER_CASES = [
    ("less loaded wins", node("a", cpu_load=0.2), node("b", cpu_load=0.6)),
    ("less reserved wins (herd guard)", node("a", reserved_cpu=1), node("b", reserved_cpu=5)),
    ("above 80% cpu is penalised", node("a", cpu_load=0.5), node("b", cpu_load=0.85)),
    ("above 80% memory is penalised", node("a", memory_load=0.5), node("b", memory_load=0.81)),
    (
        "balanced beats lopsided",
        node("a", cpu_load=0.4, memory_load=0.4),
        node("b", cpu_load=0.05, memory_load=0.45),
    ),
]


@named_cases(("better", "worse"), SCORE_ORDER_CASES)
def test_scores_prefer(better: NodeState, worse: NodeState) -> None:
    assert (
        score_node(better, job(), NOW, CONFIG).score > score_node(worse, job(), NOW, CONFIG).score
    )
    assert plan([worse, better], [job()], NOW, CONFIG)[0].node == better.name


def test_overload_penalty_is_the_configured_amount() -> None:
    calm = score_node(node(cpu_load=0.79), job(), NOW, CONFIG)
    hot = score_node(node(cpu_load=0.81), job(), NOW, CONFIG)
    assert calm.score - hot.score == pytest.approx(CONFIG.overload_penalty + 2.0, abs=0.5)


QUEUE_CASES = [
    ("high before normal", [job("n", priority=500), job("h", priority=1000)], ["h", "n"]),
    (
        "older first within a class",
        [job("new", submitted_at=NOW), job("old", submitted_at=NOW - timedelta(seconds=5))],
        ["old", "new"],
    ),
    (
        "aging lets a long-waiting low job pass a fresh normal one",
        [
            job("normal", priority=500),
            job("low", priority=100, submitted_at=NOW - timedelta(hours=1)),
        ],
        ["low", "normal"],
    ),
]


@named_cases(("queue", "expected"), QUEUE_CASES)
def test_queue_order(queue: list[QueuedJob], expected: list[str]) -> None:
    assert [j.job_id for j in order_queue(queue, NOW, CONFIG)] == expected


def test_burst_spreads_over_equal_idle_nodes() -> None:
    nodes = [node(f"n{i}", cpu_capacity=64, memory_capacity_mb=1_000_000) for i in range(4)]
    decisions = plan(nodes, [job(f"j{i}") for i in range(200)], NOW, CONFIG)
    per_node = {n.name: sum(d.node == n.name for d in decisions) for n in nodes}
    assert len(decisions) == 200
    assert max(per_node.values()) - min(per_node.values()) <= 1, per_node


def test_plan_stops_at_capacity_and_keeps_the_rest_pending() -> None:
    decisions = plan([node(cpu_capacity=2)], [job(f"j{i}") for i in range(5)], NOW, CONFIG)
    assert len(decisions) == 2


def test_avoid_list_is_a_preference_when_nothing_else_fits() -> None:
    decisions = plan([node("only")], [job(avoid_nodes=frozenset({"only"}))], NOW, CONFIG)
    assert [d.node for d in decisions] == ["only"]


def test_decision_explains_every_node() -> None:
    decisions = plan([node("a"), node("b", ready=False)], [job()], NOW, CONFIG)
    scores = {s.node: s for s in decisions[0].scores}
    assert scores["a"].filtered == "" and scores["a"].score > 0
    assert scores["b"].filtered == "not ready"


# -- round 2: cordon, hard threshold, target load, herd guard at scale, explain, preemption ----
from mdq.core.placement import (  # noqa: E402
    CORDONED,
    OVERLOADED,
    RunningJob,
    plan_preemptions,
    queue_key,
)

MORE_FILTER_CASES = [
    ("cordoned", node(cordoned=True), job(), CORDONED),
    ("live cpu above the hard threshold", node(cpu_load=0.97), job(), OVERLOADED),
    ("live memory above the hard threshold", node(memory_load=0.96), job(), OVERLOADED),
    (
        "in-flight bindings push the expected load above the hard threshold",
        node(cpu_load=0.5, inflight_cpu=4),
        job(),
        OVERLOADED,
    ),
    ("just under the hard threshold is a candidate", node(cpu_load=0.94), job(), ""),
]


@named_cases(("the_node", "the_job", "filtered"), MORE_FILTER_CASES)
def test_more_filters(the_node: NodeState, the_job: QueuedJob, filtered: str) -> None:
    assert score_node(the_node, the_job, NOW, CONFIG).filtered == filtered


def test_hard_threshold_is_configurable() -> None:
    lenient = PlacementConfig(hard_load_threshold=0.99)
    assert score_node(node(cpu_load=0.97), job(), NOW, lenient).filtered == ""


LOAD_SCORE_CASES = [
    ("spread: idle is best", 0.0, 0.0, 100.0),
    ("spread: half loaded", 0.5, 0.0, 50.0),
    ("packing: the target itself is best", 0.5, 0.5, 100.0),
    ("packing: idle scores the target", 0.0, 0.4, 40.0),
    ("packing: halfway to the target", 0.2, 0.4, 70.0),
    ("packing: above the target falls to 0 at full", 1.0, 0.5, 0.0),
    ("packing: just above the target scores below idle", 0.55, 0.5, 45.0),
]


@named_cases(("utilisation", "target", "expected"), LOAD_SCORE_CASES)
def test_load_score(utilisation: float, target: float, expected: float) -> None:
    assert load_score(utilisation, target) == pytest.approx(expected)


def test_target_load_packs_up_to_the_target_then_moves_on() -> None:
    packing = PlacementConfig(target_load=0.5, balance_weight=0)
    nodes = [
        node(f"n{i}", cpu_capacity=8, memory_capacity_mb=1_000_000, cpu_load=0, memory_load=0)
        for i in range(3)
    ]
    decisions = plan(nodes, [job(f"j{i}") for i in range(8)], NOW, packing)
    per_node = [sum(d.node == n.name for d in decisions) for n in nodes]
    # fill one node to its 50% target (4 of 8 cores), then the next; never a herd beyond it
    assert per_node == [4, 4, 0], per_node


def test_inflight_bindings_count_before_the_load_report_shows_them() -> None:
    # both report idle; "a" just received 4 cores' worth of jobs that its load cannot show yet
    just_bound = node("a", cpu_load=0, inflight_cpu=4, reserved_cpu=4)
    idle = node("b", cpu_load=0)
    assert plan([just_bound, idle], [job()], NOW, CONFIG)[0].node == "b"


@pytest.mark.parametrize("node_count", [4, 100, 1000])
def test_burst_of_200_spreads_at_every_cluster_size(node_count: int) -> None:
    nodes = [
        node(f"n{i:04d}", cpu_capacity=64, memory_capacity_mb=1_000_000, cpu_load=0, memory_load=0)
        for i in range(node_count)
    ]
    decisions = plan(nodes, [job(f"j{i}") for i in range(200)], NOW, CONFIG)
    per_node = [sum(d.node == n.name for d in decisions) for n in nodes]
    assert len(decisions) == 200
    assert max(per_node) - min(per_node) <= 1, per_node
    assert max(per_node) == -(-200 // node_count)


def test_large_cluster_decision_explains_with_counts() -> None:
    nodes = [node(f"n{i:03d}", cpu_load=0.1 + (i % 10) / 100) for i in range(100)]
    nodes += [node(f"down{i}", ready=False) for i in range(30)]
    nodes += [node(f"cord{i}", cordoned=True) for i in range(2)]
    decision = plan(nodes, [job()], NOW, CONFIG)[0]
    scored = [s for s in decision.scores if not s.filtered]
    assert len(scored) == CONFIG.sample_size
    assert decision.node == max(scored, key=lambda s: s.score).node
    assert decision.nodes_total == 132
    assert decision.filtered_counts == {"not ready": 30, "cordoned": 2}
    assert decision.not_examined == 100 - CONFIG.sample_size
    # the least loaded nodes (i % 10 == 0) are the ones scored
    assert all(int(s.node[1:]) % 10 == 0 for s in scored)


def test_large_cluster_falls_back_to_a_full_scan_for_an_odd_fit() -> None:
    nodes = [node(f"n{i:03d}", cpu_capacity=2, cpu_load=0) for i in range(99)]
    nodes.append(node("big", cpu_capacity=64, cpu_load=0.5))
    decision = plan(nodes, [job(cpu=16)], NOW, CONFIG)[0]
    assert decision.node == "big"
    assert decision.filtered_counts == {"insufficient cpu": 99}


def test_jobs_dominating_one_that_fit_nowhere_are_skipped() -> None:
    nodes = [node(f"n{i:03d}", cpu_capacity=4) for i in range(50)]
    queue = [job("huge", cpu=8)] + [job(f"bigger{i}", cpu=9 + i) for i in range(20)]
    queue.append(job("small", cpu=1))
    assert [d.job_id for d in plan(nodes, queue, NOW, CONFIG)] == ["small"]


def test_queue_key_matches_effective_priority_order() -> None:
    jobs = [
        job(f"j{i}", priority=p, submitted_at=NOW - timedelta(minutes=m))
        for i, (p, m) in enumerate([(100, 0), (500, 1), (1000, 2), (100, 100), (500, 30)])
    ]
    from mdq.core.placement import effective_priority

    by_key = sorted(jobs, key=lambda j: queue_key(j, CONFIG))
    by_priority = sorted(jobs, key=lambda j: -effective_priority(j, NOW, CONFIG))
    assert [j.job_id for j in by_key] == [j.job_id for j in by_priority]


def test_nominated_room_is_held_for_the_preemptor() -> None:
    the_node = node("only", cpu_capacity=2)
    queue = [
        job("early-normal", priority=500, submitted_at=NOW - timedelta(minutes=90)),
        job("preemptor", priority=1000, nominated_node="only", cpu=2),
    ]
    decisions = plan([the_node], queue, NOW, CONFIG)
    # the early job outranks the preemptor by aging but cannot take the held room
    assert [d.job_id for d in decisions] == ["preemptor"]


def running_job(job_id: str, node_name: str, priority: int, **changes: object) -> RunningJob:
    base = RunningJob(job_id=job_id, node=node_name, cpu=2, memory_mb=1024, priority=priority)
    return replace(base, **changes)  # type: ignore[arg-type]


PREEMPTION_CASES = [
    (
        "high preempts low on a full node",
        [node("a", cpu_capacity=2, reserved_cpu=2)],
        [running_job("low1", "a", 100)],
        job("hi", priority=1000, cpu=2),
        [("hi", "a", ("low1",))],
    ),
    (
        "equal class never preempts",
        [node("a", cpu_capacity=2, reserved_cpu=2)],
        [running_job("n1", "a", 500)],
        job("n2", priority=500, cpu=2),
        [],
    ),
    (
        "the node needing fewer victims wins",
        [node("a", cpu_capacity=4, reserved_cpu=4), node("b", cpu_capacity=4, reserved_cpu=4)],
        [
            running_job("a1", "a", 100, cpu=1),
            running_job("a2", "a", 100, cpu=1),
            running_job("a3", "a", 100, cpu=2),
            running_job("b1", "b", 100, cpu=4),
        ],
        job("hi", priority=1000, cpu=4),
        [("hi", "b", ("b1",))],
    ),
    (
        "lower class victims before higher ones",
        [node("a", cpu_capacity=4, reserved_cpu=4), node("b", cpu_capacity=4, reserved_cpu=4)],
        [running_job("normal", "a", 500, cpu=4), running_job("low", "b", 100, cpu=4)],
        job("hi", priority=1000, cpu=4),
        [("hi", "b", ("low",))],
    ),
    (
        "most recently started victim first",
        [node("a", cpu_capacity=4, reserved_cpu=4)],
        [
            running_job("old", "a", 100, started_at=NOW - timedelta(hours=2)),
            running_job("new", "a", 100, started_at=NOW - timedelta(minutes=1)),
        ],
        job("hi", priority=1000, cpu=2),
        [("hi", "a", ("new",))],
    ),
    (
        "not on an avoided or unready node",
        [node("a", cpu_capacity=2, reserved_cpu=2), node("b", ready=False, reserved_cpu=8)],
        [running_job("low-a", "a", 100), running_job("low-b", "b", 100, cpu=8)],
        job("hi", priority=1000, cpu=2, avoid_nodes=frozenset({"a"})),
        [],
    ),
    (
        "too big for any node even empty: nothing preempted",
        [node("a", cpu_capacity=2, reserved_cpu=2)],
        [running_job("low", "a", 100)],
        job("hi", priority=1000, cpu=4),
        [],
    ),
]


@named_cases(("nodes", "running", "preemptor", "expected"), PREEMPTION_CASES)
def test_preemption(
    nodes: list[NodeState],
    running: list[RunningJob],
    preemptor: QueuedJob,
    expected: list[tuple[str, str, tuple[str, ...]]],
) -> None:
    preemptions = plan_preemptions(nodes, [preemptor], running, NOW, CONFIG)
    assert [(p.job_id, p.node, p.victims) for p in preemptions] == expected


def test_two_preemptors_never_count_the_same_freed_room() -> None:
    nodes = [node("a", cpu_capacity=4, reserved_cpu=4)]
    running = [running_job("low1", "a", 100), running_job("low2", "a", 100)]
    queue = [job("hi1", priority=1000, cpu=2), job("hi2", priority=1000, cpu=2)]
    preemptions = plan_preemptions(nodes, queue, running, NOW, CONFIG)
    victims = [v for p in preemptions for v in p.victims]
    assert sorted(victims) == ["low1", "low2"] and len(set(victims)) == 2


def _fresh_scores(nodes: list[NodeState], the_job: QueuedJob) -> dict[str, tuple[float, str]]:
    """Every node's score for ``the_job`` as ``plan`` computes it: node-wide filters were
    checked once when the plan began (none applies here), the avoid-list is honoured unless
    nothing else fits."""
    config = replace(CONFIG, hard_load_threshold=float("inf"))
    honour = not the_job.avoid_nodes or any(
        not score_node(n, the_job, NOW, config).filtered for n in nodes
    )
    return {
        n.name: (s.score, s.filtered)
        for n in nodes
        for s in [score_node(n, the_job, NOW, config, honour_avoid=honour)]
    }


RESCORING_CASES = {
    "a campaign of identical replicas": [job(f"r{i}") for i in range(40)],
    "two shapes interleaved": [
        job(f"s{i}", cpu=1 + i % 2, memory_mb=1024 * (1 + i % 2)) for i in range(40)
    ],
    "avoid-lists among replicas": [
        job(f"a{i}", avoid_nodes=frozenset({f"n{i % 4}"}) if i % 3 == 0 else frozenset())
        for i in range(40)
    ],
    "until the cluster is full": [job(f"f{i}", cpu=3, memory_mb=2048) for i in range(20)],
}


@pytest.mark.parametrize("queue", RESCORING_CASES.values(), ids=RESCORING_CASES.keys())
def test_each_decision_scores_as_a_fresh_full_scan_would(queue: list[QueuedJob]) -> None:
    """plan reuses the scan of an earlier job of the same shape and rescores only the nodes
    bound since: every decision's scores must equal scoring every node afresh at that point."""
    nodes = [node(f"n{i}", cpu_load=0.05 * i, memory_load=0.03 * i) for i in range(6)]
    mirror = [replace(n) for n in nodes]
    decisions = {d.job_id: d for d in plan(nodes, queue, NOW, CONFIG, ordered=True)}

    assert decisions
    for the_job in queue:
        decision = decisions.get(the_job.job_id)
        if decision is None:
            continue
        expected = _fresh_scores(mirror, the_job)
        assert {s.node: (s.score, s.filtered) for s in decision.scores} == expected
        chosen = next(n for n in mirror if n.name == decision.node)
        chosen.reserved_cpu += the_job.cpu
        chosen.reserved_memory_mb += the_job.memory_mb
        chosen.inflight_cpu += the_job.cpu
        chosen.inflight_memory_mb += the_job.memory_mb


def _heap_choice(
    mirror: list[NodeState], eligible: list[int], the_job: QueuedJob, config: PlacementConfig
) -> str:
    """The node the heap path of ``plan`` must choose, worked out from scratch: the eligible
    nodes (filtered when the plan began) in rank order (the load score of their share now,
    then their place in the list); among the first ``max_examined``, the first
    ``sample_size`` that fit; the best score of those (then the earlier node). None fitting
    there: the best of every node that fits."""
    ranked = sorted(
        eligible,
        key=lambda i: (
            -load_score(max(mirror[i].cpu_share(), mirror[i].memory_share()), config.target_load),
            i,
        ),
    )
    fitting = [i for i in ranked[: config.max_examined] if not job_filter(mirror[i], the_job)]
    chosen = fitting[: config.sample_size] or [
        i for i in ranked if not job_filter(mirror[i], the_job)
    ]
    best = max(chosen, key=lambda i: (score_node(mirror[i], the_job, NOW, config).score, -i))
    return mirror[best].name


HEAP_CASES = {
    "spreading over nodes of mixed loads, two shapes": (
        CONFIG,
        [node(f"n{i:02d}", cpu_load=(i % 7) / 10, memory_load=(i % 5) / 10) for i in range(60)],
        [job(f"j{i}", cpu=1 + i % 2, memory_mb=1024 * (1 + i % 2)) for i in range(150)],
    ),
    "packing to a target: a bound node ranks higher than before": (
        replace(CONFIG, target_load=0.5),
        [
            node(f"n{i:02d}", cpu_capacity=16, cpu_load=(i % 4) / 20, memory_load=0)
            for i in range(40)
        ],
        [job(f"j{i}") for i in range(120)],
    ),
    "nodes filling up: full nodes are examined and passed over": (
        CONFIG,
        [node(f"n{i:02d}", cpu_capacity=4, cpu_load=0, memory_load=0) for i in range(40)],
        [job(f"j{i}", cpu=1 + i % 3) for i in range(90)],
    ),
    "one big node among small ones: a full scan when none sampled fits": (
        CONFIG,
        [node(f"n{i:02d}", cpu_capacity=2, cpu_load=0) for i in range(40)]
        + [node("big", cpu_capacity=64, cpu_load=0.5)],
        [job(f"j{i}", cpu=1 if i % 4 else 8) for i in range(60)],
    ),
}


@pytest.mark.parametrize(("config", "nodes", "queue"), HEAP_CASES.values(), ids=HEAP_CASES.keys())
def test_each_large_cluster_decision_is_the_best_ranked_sample(
    config: PlacementConfig, nodes: list[NodeState], queue: list[QueuedJob]
) -> None:
    """On a cluster larger than ``full_scan_nodes``, plan keeps the nodes in a heap by rank and
    keeps the ones a decision examined but did not bind aside for the next one: whatever it
    keeps where, each decision must be the one worked out from scratch (``_heap_choice``)."""
    mirror = [replace(n) for n in nodes]
    eligible = [i for i, n in enumerate(mirror) if not node_filter(n, NOW, config)]
    assert len(eligible) > config.full_scan_nodes
    decisions = plan(nodes, queue, NOW, config, ordered=True)
    assert len(decisions) > len(eligible)  # nodes are chosen more than once
    by_job = {d.job_id: d for d in decisions}
    for the_job in queue:
        decision = by_job.get(the_job.job_id)
        if decision is None:
            assert all(job_filter(mirror[i], the_job) for i in eligible)
            continue
        assert decision.node == _heap_choice(mirror, eligible, the_job, config), the_job.job_id
        chosen = next(n for n in mirror if n.name == decision.node)
        chosen.reserved_cpu += the_job.cpu
        chosen.reserved_memory_mb += the_job.memory_mb
        chosen.inflight_cpu += the_job.cpu
        chosen.inflight_memory_mb += the_job.memory_mb


WAITING_CASES = [
    ("no node reported yet", [], job(), "no node has reported its load yet", []),
    (
        "every node cordoned",
        [node("n1", cordoned=True), node("n2", cordoned=True)],
        job(),
        "0/2 nodes are available: 2 cordoned",
        ["n1", "n2"],
    ),
    (
        "reasons counted per kind, alphabetically",
        [node("n1", cordoned=True), node("n2", reserved_cpu=8), node("n3", ready=False)],
        job(),
        "0/3 nodes are available: 1 cordoned, 1 insufficient cpu, 1 not ready",
        ["n1", "n2", "n3"],
    ),
    (
        "the avoid-list is not a reason (plan drops it when nothing else fits)",
        [node("n1", reserved_cpu=8), node("n2")],
        job(avoid_nodes=frozenset({"n2"})),
        "1/2 nodes are available: 1 insufficient cpu; the job waits behind jobs ranked before "
        "it or room held for another",
        ["n2", "n1"],
    ),
    (
        "candidates come first, best score first",
        [node("busy", cpu_load=0.6), node("idle", cpu_load=0.0), node("off", ready=False)],
        job(),
        "2/3 nodes are available: 1 not ready; the job waits behind jobs ranked before it or "
        "room held for another",
        ["idle", "busy", "off"],
    ),
]


@named_cases(("nodes", "the_job", "summary", "order"), WAITING_CASES)
def test_explain_waiting(
    nodes: list[NodeState], the_job: QueuedJob, summary: str, order: list[str]
) -> None:
    waiting = explain_waiting(nodes, the_job, NOW, CONFIG)
    assert waiting.summary == summary
    assert [score.node for score in waiting.scores] == order
    assert waiting.nodes_total == len(nodes)
    assert sum(waiting.filtered_counts.values()) == sum(1 for s in waiting.scores if s.filtered)


def test_explain_waiting_names_a_bounded_number_of_nodes_and_counts_the_rest() -> None:
    nodes = [node(f"n{i:03d}", cordoned=True) for i in range(EXPLAIN_WAITING_LIMIT + 10)]
    waiting = explain_waiting(nodes, job(), NOW, CONFIG)
    assert len(waiting.scores) == EXPLAIN_WAITING_LIMIT
    assert waiting.filtered_counts == {"cordoned": EXPLAIN_WAITING_LIMIT + 10}
    assert waiting.summary == f"0/{EXPLAIN_WAITING_LIMIT + 10} nodes are available: " + (
        f"{EXPLAIN_WAITING_LIMIT + 10} cordoned"
    )
