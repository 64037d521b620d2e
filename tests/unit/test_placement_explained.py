"""What an explanation shows is what the decision used (``NodeScore.cpu_load`` and
``memory_load``, docs/placement.md "What mdq explain shows"): a node filtered for load shows a
load above the limit it was filtered for, one filtered for room more than its capacity, and a
scored node the utilisation its score was computed from. A Hypothesis property over random
nodes and queues, a named case (the node shown idle yet filtered for load), and the table
``mdq explain`` prints. Pure."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from mdq.cli.explain import SCALE_NOTE, bound_table
from mdq.contracts import pb
from mdq.core.placement import (
    NO_CPU,
    NO_MEMORY,
    OVERLOADED,
    NodeScore,
    NodeState,
    PlacementConfig,
    QueuedJob,
    explain_waiting,
    load_score,
    plan,
)

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
CONFIG = PlacementConfig()


def check(score: NodeScore, config: PlacementConfig) -> None:
    """The figures of one node's verdict against the rule that gave it."""
    higher = max(score.cpu_load, score.memory_load)
    if score.filtered == OVERLOADED:
        assert higher > config.hard_load_threshold, score
    elif score.filtered == NO_CPU:
        assert score.cpu_load > 1.0, score
    elif score.filtered == NO_MEMORY:
        assert score.memory_load > 1.0, score
    elif not score.filtered:
        assert 0.0 <= score.cpu_load <= 1.0 and 0.0 <= score.memory_load <= 1.0, score
        # no clusters and target 0: the score is the load term, the balance term and, on a
        # node loaded above overload_threshold, the penalty: from the figures shown
        base = load_score(higher, config.target_load) - config.balance_weight * abs(
            score.cpu_load - score.memory_load
        )
        assert any(
            abs(score.score - (base - penalty)) < 1e-2 for penalty in (0.0, config.overload_penalty)
        ), (score, base)


nodes = st.lists(
    st.builds(
        lambda index, cpu, memory, cpu_load, memory_load, reserved, inflight, ready, stale: (
            NodeState(
                name=f"n{index}",
                cpu_capacity=cpu,
                memory_capacity_mb=memory,
                ready=ready,
                cpu_load=cpu_load,
                memory_load=memory_load,
                reported_at=NOW - timedelta(seconds=60 if stale else 1),
                reserved_cpu=cpu * reserved,
                reserved_memory_mb=int(memory * reserved),
                inflight_cpu=cpu * inflight,
                inflight_memory_mb=int(memory * inflight),
            )
        ),
        index=st.integers(0, 10_000),
        cpu=st.sampled_from([1.0, 2.0, 8.0, 64.0]),
        memory=st.sampled_from([1024, 4096, 65_536]),
        cpu_load=st.floats(0.0, 1.2),
        memory_load=st.floats(0.0, 1.2),
        reserved=st.floats(0.0, 1.2),
        inflight=st.floats(0.0, 0.6),
        ready=st.booleans(),
        stale=st.booleans(),
    ),
    min_size=1,
    max_size=8,
    unique_by=lambda node: node.name,
)
jobs = st.lists(
    st.builds(
        lambda index, cpu, memory: QueuedJob(
            job_id=f"j{index}", cpu=cpu, memory_mb=memory, priority=500, submitted_at=NOW
        ),
        index=st.integers(0, 10_000),
        cpu=st.sampled_from([0.1, 0.5, 1.0, 4.0, 16.0]),
        memory=st.sampled_from([64, 512, 2048, 32_768]),
    ),
    min_size=1,
    max_size=6,
    unique_by=lambda job: job.job_id,
)


@settings(max_examples=300, deadline=None, database=None)
@given(nodes=nodes, queue=jobs)
def test_every_verdict_shows_the_figures_it_was_made_on(
    nodes: list[NodeState], queue: list[QueuedJob]
) -> None:
    for decision in plan(nodes, queue, NOW, CONFIG):
        for score in decision.scores:
            check(score, CONFIG)
    for job in queue:
        for score in explain_waiting(nodes, job, NOW, CONFIG).scores:
            check(score, CONFIG)


def busy_but_quiet() -> list[NodeState]:
    """A node whose last report says idle, with jobs bound there since: 120 % of its CPU is
    on its way (the herd guard's in-flight load), and an idle node beside it."""
    base = dict(
        cpu_capacity=2.0,
        memory_capacity_mb=4096,
        ready=True,
        cpu_load=0.0,
        memory_load=0.0,
        reported_at=NOW - timedelta(seconds=1),
    )
    return [
        NodeState(name="busy", inflight_cpu=2.4, reserved_cpu=2.0, **base),  # type: ignore[arg-type]
        NodeState(name="idle", **base),  # type: ignore[arg-type]
    ]


def test_a_node_filtered_for_load_shows_the_load_it_was_filtered_for() -> None:
    job = QueuedJob(job_id="j", cpu=0.5, memory_mb=512, priority=500, submitted_at=NOW)
    [decision] = plan(busy_but_quiet(), [job], NOW, CONFIG)
    shown = {score.node: score for score in decision.scores}
    assert decision.node == "idle"
    assert (shown["busy"].filtered, shown["busy"].cpu_load) == (OVERLOADED, 1.2)
    assert (shown["idle"].cpu_load, shown["idle"].memory_load) == (0.25, 0.125)  # with the job


def test_mdq_explain_prints_those_figures() -> None:
    job = QueuedJob(job_id="j", cpu=0.5, memory_mb=512, priority=500, submitted_at=NOW)
    [decision] = plan(busy_but_quiet(), [job], NOW, CONFIG)
    event = pb.Event(job_id="j", attempt=1)
    event.bound.node = decision.node
    for score in decision.scores:
        event.bound.candidates.add(
            node=score.node,
            score=score.score,
            filtered=score.filtered,
            cpu_load=score.cpu_load,
            memory_load=score.memory_load,
        )
    console = Console(width=160, record=True)
    console.print(bound_table(event))
    text = console.export_text()
    rows = [line for line in text.splitlines() if "%" in line]
    busy = next(line for line in rows if "busy" in line)
    shown = [float(share) for share in re.findall(r"([\d.]+)%", busy)]
    assert shown[0] > 100 * CONFIG.hard_load_threshold, busy
    assert "filtered: load above hard threshold" in busy
    idle = next(line for line in rows if "idle" in line)
    assert re.search(r"\b25%.*12\.5%.*chosen", idle), idle
    assert "from about -70 to 135" in SCALE_NOTE
