"""The nodes lent to a pass and their ranking kept between passes (``PlacementState.pass_nodes``,
``NodeRanking``): a plan over them decides exactly what a plan over fresh copies decides, pass
after pass, as reports, bindings, endings, cordons and time change the cluster. Each named
history is a seeded sequence of such changes."""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest
from google.protobuf.message import Message

from mdq.contracts import pb
from mdq.core.events import make_event
from mdq.core.placement import NodeRanking, PlacementConfig, plan
from mdq.core.placement_state import PlacementState
from mdq.core.state import JobState

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


@dataclass(frozen=True)
class History:
    """How a seeded history changes the cluster between passes."""

    nodes: int
    config: PlacementConfig = PlacementConfig()
    clusters: tuple[str, ...] = ("",)
    """The clusters the nodes are spread over ("" the unnamed one)."""
    reports_per_pass: int = 2
    """At most this many random nodes report between passes (the others' reports age)."""
    pass_every_s: float = 0.05
    cordons: bool = False
    """Whether failure cordons come and go."""
    unready: float = 0.05
    """The share of reports that say the node is not ready."""


HISTORIES = {
    "a small cluster, every node scored": History(nodes=12),
    "a large cluster, spreading": History(nodes=200),
    "a large cluster, packing to a target": History(
        nodes=200, config=PlacementConfig(target_load=0.7)
    ),
    "named clusters with their load penalties": History(
        nodes=120, clusters=("east", "west", "north")
    ),
    "reports go stale between passes": History(
        nodes=80, config=PlacementConfig(load_timeout_s=2.0), reports_per_pass=5
    ),
    "a load timeout of no whole microseconds": History(
        nodes=60, config=PlacementConfig(load_timeout_s=1.0000001)
    ),
    "failure cordons come and go": History(nodes=100, cordons=True),
}


def report(
    state: PlacementState, history: History, rng: random.Random, node: int, at: datetime
) -> None:
    cluster = history.clusters[node % len(history.clusters)]
    name = f"{cluster}/n{node:03d}" if cluster else f"n{node:03d}"
    load = pb.NodeLoad(
        node=name,
        cpu_capacity=16,
        memory_capacity_mb=65_536,
        ready=rng.random() >= history.unready,
        cpu_load=rng.random(),
        memory_load=rng.random() * 0.8,
        cluster=cluster,
    )
    state.apply_load(load, at)


def event(
    state: PlacementState, kind: str, body: Message, job: str, attempt: int, at: datetime
) -> None:
    folded = make_event(kind, body, job_id=job, attempt=attempt, producer="test", at=at)
    state.apply(state.book.last_sequence + 1, folded)


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("history", list(HISTORIES.values()), ids=list(HISTORIES))
def test_a_plan_over_the_lent_nodes_decides_what_one_over_fresh_copies_does(
    history: History, seed: int
) -> None:
    rng = random.Random(seed)
    state = PlacementState(history.config, load_settle_s=3.0)
    now = T0
    for node in range(history.nodes):
        report(state, history, rng, node, now)
    submitted = bound = 0
    for number in range(120):
        now += timedelta(seconds=history.pass_every_s)
        for _ in range(rng.randrange(history.reports_per_pass + 1)):
            report(state, history, rng, rng.randrange(history.nodes), now)
        for _ in range(rng.randrange(4)):
            spec = pb.JobSpec(name="j")
            spec.resources.cpu, spec.resources.memory_mb = rng.choice([1, 2, 4, 8]), 2048
            job = f"r{submitted}-j"
            submitted += 1
            event(state, "submitted", pb.JobSubmitted(spec=spec, request_id=job[:-2]), job, 0, now)
        holding = sorted(state.views(JobState.BOUND), key=lambda view: view.job_id)
        for view in rng.sample(holding, k=min(len(holding), rng.randrange(3))):
            event(state, "succeeded", pb.JobSucceeded(final_step=1), view.job_id, 1, now)
        cordons = (
            {f"n{rng.randrange(history.nodes):03d}" for _ in range(3)} if history.cordons else ()
        )
        queue = state.queue(now)
        fresh = state.node_states(cordons)
        expected = plan(fresh, queue, now, history.config, ordered=True)
        lent = state.pass_nodes(cordons)
        decisions = plan(lent, queue, now, history.config, ordered=True, ranking=state.ranking)
        assert decisions == expected, f"pass {number}"
        assert lent == fresh, f"pass {number}: the lent nodes after the plan"
        for decision in decisions:  # the bindings go to the log, as placement's do
            body = pb.JobBound(node=decision.node, pod_name=f"mdq-{decision.job_id}-1")
            event(state, "bound", body, decision.job_id, 1, now)
            state.note_binding(state.book.jobs[decision.job_id], now)
            bound += 1
    assert bound > 20  # the history bound jobs pass after pass


def test_a_ranking_serves_only_the_list_it_lent_and_only_once() -> None:
    state = PlacementState(PlacementConfig(), load_settle_s=3.0)
    rng = random.Random(0)
    for node in range(40):
        report(state, History(nodes=40, unready=0.0), rng, node, T0)
    lent = state.pass_nodes()
    ranking: NodeRanking = state.ranking
    config = PlacementConfig()
    assert ranking.take(list(lent), T0, config) is None  # another list
    assert ranking.take(lent, T0, config) is not None
    assert ranking.take(lent, T0, config) is None  # a plan changed the nodes it took


def test_a_clock_set_back_sorts_the_nodes_out_again() -> None:
    """A node whose report was stale at the last pass is fresh again when the wall clock was
    set back since: the next plan sees it eligible, as one over fresh copies does."""
    config = PlacementConfig(load_timeout_s=2.0)
    state = PlacementState(config, load_settle_s=3.0)
    history = History(nodes=40, unready=0.0)
    rng = random.Random(0)
    for node in range(1, 40):
        report(state, history, rng, node, T0)
    report(state, history, rng, 0, T0 - timedelta(seconds=1.5))
    spec = pb.JobSpec(name="j")
    spec.resources.cpu, spec.resources.memory_mb = 1, 1024
    event(state, "submitted", pb.JobSubmitted(spec=spec, request_id="r"), "r-j", 0, T0)
    for now in (T0 + timedelta(seconds=1), T0):  # n000 stale, then fresh again
        queue = state.queue(now)
        expected = plan(state.node_states(), queue, now, config, ordered=True)
        decisions = plan(
            state.pass_nodes(), queue, now, config, ordered=True, ranking=state.ranking
        )
        assert decisions == expected, now
    assert "load report too old" not in decisions[0].filtered_counts
