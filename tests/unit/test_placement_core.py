"""Placement core: filters, scores, queue order and the herd guard, as tables of named cases."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from mdq.core.placement import NodeState, PlacementConfig, QueuedJob, order_queue, plan, score_node

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


@pytest.mark.parametrize(
    ("name", "the_node", "the_job", "filtered"), FILTER_CASES, ids=[c[0] for c in FILTER_CASES]
)
def test_filters(name: str, the_node: NodeState, the_job: QueuedJob, filtered: str) -> None:
    assert score_node(the_node, the_job, NOW, CONFIG).filtered == filtered


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


@pytest.mark.parametrize(
    ("name", "better", "worse"), SCORE_ORDER_CASES, ids=[c[0] for c in SCORE_ORDER_CASES]
)
def test_scores_prefer(name: str, better: NodeState, worse: NodeState) -> None:
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


@pytest.mark.parametrize(
    ("name", "queue", "expected"), QUEUE_CASES, ids=[c[0] for c in QUEUE_CASES]
)
def test_queue_order(name: str, queue: list[QueuedJob], expected: list[str]) -> None:
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
