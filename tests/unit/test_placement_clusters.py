"""Placement across execution clusters: names, selectors, cluster terms,
and the per-cluster explanation, as tables of named cases."""

from __future__ import annotations

import pytest

from mdq.contracts import pb
from mdq.core.clusters import (
    Reachability,
    Selector,
    cluster_of,
    local_name,
    locality,
    qualified,
    selector_error,
    valid_cluster_name,
)
from mdq.core.placement import (
    CLUSTER_MISMATCH,
    NodeState,
    PlacementConfig,
    QueuedJob,
    RunningJob,
    cluster_load_penalties,
    explain_waiting,
    plan,
    plan_preemptions,
)
from tests.unit.test_placement_core import CONFIG, NOW, job
from tests.unit.test_placement_core import node as unclustered_node

LABELS = {
    "dept": {"site": "campus", "tier": "shared"},
    "hpc": {"site": "centre", "fabric": "infiniband"},
    "cloud": {"site": "cloud", "spot": "true"},
}


def node(cluster: str, name: str = "n1", **changes: object) -> NodeState:
    """A node as the placement core's tables make one (``node``), of ``cluster``: its name
    qualified by the cluster's, the cluster's labels with it."""
    return unclustered_node(
        qualified(cluster, name), cluster=cluster, cluster_labels=LABELS.get(cluster, {}), **changes
    )


def selector(
    require: dict[str, str] | None = None, prefer: dict[str, str] | None = None
) -> Selector:
    return Selector.of(pb.ClusterSelector(require=require or {}, prefer=prefer or {}))


NAME_CASES = [
    ("a qualified name", "hpc", "node-7", "hpc/node-7"),
    ("the unnamed cluster keeps bare names", "", "local-1", "local-1"),
    ("a Kubernetes node name with dots", "cloud", "ip-10-0-1-2.ec2.internal", None),
]


@pytest.mark.parametrize(("name", "cluster", "node_name", "expected"), NAME_CASES)
def test_node_names_round_trip(
    name: str, cluster: str, node_name: str, expected: str | None
) -> None:
    full = qualified(cluster, node_name)
    if expected is not None:
        assert full == expected
    assert cluster_of(full) == cluster
    assert local_name(full) == node_name


CLUSTER_NAME_CASES = [
    ("short dns label", "hpc", True),
    ("digits and dashes", "site-2", True),
    ("empty", "", False),
    ("a slash would split node names", "a/b", False),
    ("a dot would split subjects", "a.b", False),
    ("upper case", "HPC", False),
    ("leading dash", "-hpc", False),
    ("too long", "c" * 33, False),
]


@pytest.mark.parametrize(("name", "cluster", "valid"), CLUSTER_NAME_CASES)
def test_cluster_names(name: str, cluster: str, valid: bool) -> None:
    assert valid_cluster_name(cluster) is valid


SELECTOR_ERROR_CASES = [
    ("fine", pb.ClusterSelector(require={"site": "centre"}, prefer={"gpu": "true"}), None),
    ("empty value", pb.ClusterSelector(require={"site": ""}), "require['site']"),
    ("space in key", pb.ClusterSelector(prefer={"my site": "x"}), "prefer['my site']"),
    (
        "too many",
        pb.ClusterSelector(require={f"k{i}": "v" for i in range(17)}),
        "require",
    ),
]


@pytest.mark.parametrize(("name", "the_selector", "field"), SELECTOR_ERROR_CASES)
def test_selector_errors_name_the_field(
    name: str, the_selector: pb.ClusterSelector, field: str | None
) -> None:
    error = selector_error(the_selector)
    assert (error[0] if error else None) == field


FILTER_CASES = [
    ("no selector: any cluster", node("hpc"), job(), ""),
    (
        "required label present",
        node("hpc"),
        job(clusters=selector(require={"site": "centre"})),
        "",
    ),
    (
        "required label with another value",
        node("dept"),
        job(clusters=selector(require={"site": "centre"})),
        CLUSTER_MISMATCH,
    ),
    (
        "one of two required labels missing",
        node("hpc"),
        job(clusters=selector(require={"site": "centre", "gpu": "true"})),
        CLUSTER_MISMATCH,
    ),
    (
        "a preference never filters",
        node("dept"),
        job(clusters=selector(prefer={"site": "centre"})),
        "",
    ),
    (
        "the unnamed cluster has no labels to match",
        node(""),
        job(clusters=selector(require={"site": "centre"})),
        CLUSTER_MISMATCH,
    ),
]


@pytest.mark.parametrize(("name", "the_node", "the_job", "filtered"), FILTER_CASES)
def test_cluster_filters(name: str, the_node: NodeState, the_job: QueuedJob, filtered: str) -> None:
    decisions = plan([the_node], [the_job], NOW, CONFIG)
    if filtered:
        assert decisions == []
        waiting = explain_waiting([the_node], the_job, NOW, CONFIG)
        assert waiting.filtered_counts == {filtered: 1}
    else:
        assert [d.node for d in decisions] == [the_node.name]


CHOICE_CASES = [
    (
        "required labels pick the only matching cluster",
        [node("dept"), node("hpc", cpu_load=0.6), node("cloud")],
        job(clusters=selector(require={"fabric": "infiniband"})),
        "hpc/n1",
    ),
    (
        "a preferred cluster wins over an equally loaded one",
        [node("dept"), node("cloud")],
        job(clusters=selector(prefer={"spot": "true"})),
        "cloud/n1",
    ),
    (
        "a preference outweighs a little load, not a lot",
        [node("dept", cpu_load=0.1), node("cloud", cpu_load=0.2)],
        job(clusters=selector(prefer={"spot": "true"})),
        "cloud/n1",
    ),
    (
        "a much busier preferred cluster loses",
        [node("dept", cpu_load=0.05), node("cloud", cpu_load=0.7)],
        job(clusters=selector(prefer={"spot": "true"})),
        "dept/n1",
    ),
    (
        "half the preferred labels count half",
        [node("dept", cpu_load=0.1), node("hpc", cpu_load=0.15)],
        job(clusters=selector(prefer={"site": "centre", "gpu": "true"})),
        "hpc/n1",
    ),
    (
        "a chain's job goes where its dependency's outputs are",
        [node("dept"), node("hpc")],
        job(data_clusters=("hpc",)),
        "hpc/n1",
    ),
    (
        "locality is pro rata over the dependencies",
        [node("dept", cpu_load=0.1), node("hpc", cpu_load=0.1)],
        job(data_clusters=("dept", "dept", "hpc")),
        "dept/n1",
    ),
    (
        "an unknown dependency cluster gives no bonus",
        [node("dept", cpu_load=0.1), node("hpc", cpu_load=0.3)],
        job(data_clusters=("",)),
        "dept/n1",
    ),
    (
        "the busier cluster's node loses a tie",
        [
            node("dept", "a", reserved_cpu=6),
            node("dept", "b", cpu_load=0.3),
            node("hpc", "a", cpu_load=0.3),
        ],
        job(),
        "hpc/a",
    ),
]


@pytest.mark.parametrize(("name", "nodes", "the_job", "chosen"), CHOICE_CASES)
def test_cluster_terms_choose(
    name: str, nodes: list[NodeState], the_job: QueuedJob, chosen: str
) -> None:
    decisions = plan(nodes, [the_job], NOW, CONFIG)
    assert [d.node for d in decisions] == [chosen]


def test_cluster_terms_off_leave_node_scores_alone() -> None:
    """With the weights at zero, a multi-cluster decision is the single-cluster one."""
    off = PlacementConfig(cluster_preference_weight=0, locality_weight=0, cluster_load_weight=0)
    nodes = [node("dept", cpu_load=0.1), node("cloud", cpu_load=0.2)]
    wants = job(clusters=selector(prefer={"spot": "true"}), data_clusters=("cloud",))
    assert plan(nodes, [wants], NOW, off)[0].node == "dept/n1"
    assert plan(nodes, [wants], NOW, CONFIG)[0].node == "cloud/n1"


def test_cluster_load_penalty_only_with_several_clusters() -> None:
    one = [node("dept", "a", reserved_cpu=4), node("dept", "b")]
    assert cluster_load_penalties(one, CONFIG) == {}
    two = [*one, node("hpc", "a")]
    penalties = cluster_load_penalties(two, CONFIG)
    assert penalties["dept"] == pytest.approx((0.25, CONFIG.cluster_load_weight * 0.25))
    assert penalties["hpc"] == (0.0, 0.0)


def test_locality_fraction() -> None:
    assert locality((), "hpc") == 0.0
    assert locality(("hpc", "dept"), "hpc") == 0.5


def test_decision_explains_every_cluster() -> None:
    nodes = [
        node("dept", "a"),
        node("dept", "b", ready=False),
        node("hpc", "a", cpu_load=0.5),
        node("cloud", "a", reserved_cpu=8),
    ]
    [decision] = plan(nodes, [job(clusters=selector(require={"site": "centre"}))], NOW, CONFIG)
    assert decision.node == "hpc/a"
    by_cluster = {summary.cluster: summary for summary in decision.clusters}
    assert decision.clusters[0].cluster == "hpc"  # best first
    assert by_cluster["hpc"].best_node == "hpc/a" and by_cluster["hpc"].candidates == 1
    assert by_cluster["dept"].best_node == ""
    assert by_cluster["dept"].filtered_counts == {CLUSTER_MISMATCH: 1, "not ready": 1}
    assert by_cluster["cloud"].filtered_counts == {CLUSTER_MISMATCH: 1}
    assert by_cluster["cloud"].cpu_reserved == 1.0


def test_one_unnamed_cluster_has_no_cluster_explanation() -> None:
    [decision] = plan([node("", "a"), node("", "b")], [job()], NOW, CONFIG)
    assert decision.clusters == ()


def test_waiting_explains_every_cluster() -> None:
    nodes = [node("dept"), node("cloud")]
    waiting = explain_waiting(nodes, job(clusters=selector(require={"fabric": "x"})), NOW)
    assert {s.cluster: s.filtered_counts for s in waiting.clusters} == {
        "dept": {CLUSTER_MISMATCH: 1},
        "cloud": {CLUSTER_MISMATCH: 1},
    }


def test_a_large_multi_cluster_plan_honours_requirements_and_preferences() -> None:
    """Past ``full_scan_nodes`` the heap samples the best-ranked nodes: a required cluster
    ranked low is still found, and a preference is weighed over every node, not only over
    the best-ranked sample (which here is all campus)."""
    nodes = [node("dept", f"n{i}", cpu_load=0.05) for i in range(200)] + [
        node("hpc", f"n{i}", cpu_load=0.15) for i in range(200)
    ]
    required = job("r", clusters=selector(require={"site": "centre"}))
    preferred = job("p", clusters=selector(prefer={"site": "centre"}))
    plain = job("q")
    decisions = {d.job_id: d.node for d in plan(nodes, [required, preferred, plain], NOW, CONFIG)}
    assert cluster_of(decisions["r"]) == "hpc"
    assert cluster_of(decisions["p"]) == "hpc"  # 20 points of preference against 10 of load
    assert cluster_of(decisions["q"]) == "dept"
    replicas = [job(f"c{i}", clusters=selector(require={"site": "centre"})) for i in range(50)]
    placed = plan(nodes, replicas, NOW, CONFIG)
    assert len(placed) == 50 and {cluster_of(d.node) for d in placed} == {"hpc"}


def test_a_job_that_fits_nowhere_on_its_clusters_does_not_hold_back_others() -> None:
    """A job too big for the clusters it requires says nothing about a job of the same size
    that may go anywhere (the planner's "fit nowhere" shortcut must not skip it)."""
    nodes = [node("dept", reserved_cpu=0), node("hpc", reserved_cpu=6)]
    big_on_hpc = job("a", cpu=4, clusters=selector(require={"site": "centre"}))
    big_anywhere = job("b", cpu=4)
    assert [d.job_id for d in plan(nodes, [big_on_hpc, big_anywhere], NOW, CONFIG)] == ["b"]


def test_preemption_only_on_admitted_clusters() -> None:
    nodes = [node("dept", reserved_cpu=8), node("hpc", reserved_cpu=8)]
    running = [
        RunningJob("low-dept", "dept/n1", cpu=8, memory_mb=1024, priority=100),
        RunningJob("low-hpc", "hpc/n1", cpu=8, memory_mb=1024, priority=100),
    ]
    urgent = job("urgent", cpu=4, priority=1000, clusters=selector(require={"site": "centre"}))
    [preemption] = plan_preemptions(nodes, [urgent], running, NOW, CONFIG)
    assert preemption.node == "hpc/n1" and preemption.victims == ("low-hpc",)


REACHABILITY_CASES = [
    # (name, [(verb, at seconds)], lost after the last step, [steps returning True])
    ("answering all along", [("answered", 0), ("answered", 50), ("answered", 100)], False, []),
    ("silent less than the limit", [("answered", 0), ("silent", 59)], False, []),
    (
        "silent for the limit: lost, once",
        [("answered", 0), ("silent", 60), ("silent", 90)],
        True,
        [1],
    ),
    (
        "silent from the start counts from the first silence",
        [("silent", 10), ("silent", 69)],
        False,
        [],
    ),
    (
        "back after a loss: fence it",
        [("answered", 0), ("silent", 61), ("answered", 70)],
        True,
        [1, 2],
    ),
    (
        "an answer in between resets the clock",
        [("answered", 0), ("silent", 40), ("answered", 50), ("silent", 100)],
        False,
        [],
    ),
]


@pytest.mark.parametrize(("name", "steps", "lost", "signals"), REACHABILITY_CASES)
def test_a_cluster_is_lost_after_its_silence_and_fenced_when_it_answers(
    name: str, steps: list[tuple[str, float]], lost: bool, signals: list[int]
) -> None:
    reach = Reachability(lost_after_s=60)
    said = [i for i, (verb, now) in enumerate(steps) if getattr(reach, verb)("c", now)]
    assert said == signals
    assert ("c" in reach.lost) is lost
    reach.fenced("c")
    assert "c" not in reach.lost
