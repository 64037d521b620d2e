"""The simulator on tiny workloads whose outcome is worked out by hand (named cases)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import UTC, datetime

import pytest

from mdq.core.fairshare import Fairness, Held
from mdq.core.placement import NodeState, QueuedJob, plan
from mdq.sim.config import SimConfig, named
from mdq.sim.engine import Metrics, percentile, simulate
from mdq.sim.model import NodeOutage, SimJob, SimNode, Workload

# no pass grid and no pod start-up: the arithmetic below stays whole seconds
EXACT = SimConfig("exact", pass_interval_s=0.0, start_delay_s=0.0)


def job(name: str, **fields: object) -> SimJob:
    """A 1-core, 1 GiB job of 1000 steps at 10 steps/s (100 s), using 500 MiB and its core."""
    base = SimJob(
        job_id=name,
        arrival_s=0.0,
        cpu=1.0,
        memory_mb=1024,
        steps=1000,
        steps_per_s=10.0,
        peak_memory_mb=512.0,
        cores_used=1.0,
    )
    return replace(base, **fields)  # type: ignore[arg-type]


def node(name: str = "n1", cpu: float = 2.0, memory_mb: int = 4096, **fields: object) -> SimNode:
    return replace(SimNode(name, cpu, memory_mb), **fields)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Case:
    name: str
    nodes: tuple[SimNode, ...]
    jobs: tuple[SimJob, ...]
    expect: dict[str, float]
    config: SimConfig = EXACT
    outages: tuple[NodeOutage, ...] = ()


LOW_THEN_HIGH = (
    job("running"),
    job("low", arrival_s=1.0, priority_class="low"),
    job("high", arrival_s=2.0, priority_class="high"),
)
"""The only core taken, then a low job and, a second later, a high one: one queue for FIFO
and for the priority classes."""

CASES = [
    Case(
        "one job alone runs its steps at its rate",
        (node(),),
        (job("a"),),
        {"makespan_s": 100, "mean_wait_s": 0, "succeeded": 1, "utilisation": 0.5},
    ),
    Case(
        "three 1-core jobs on 2 cores: the third waits for the first to end",
        (node(),),
        (job("a"), job("b"), job("c")),
        {"makespan_s": 200, "mean_wait_s": 100 / 3, "p95_wait_s": 100, "utilisation": 0.75},
    ),
    Case(
        "memory binds before CPU: 3 GiB jobs, one at a time on 4 GiB",
        (node(cpu=8.0),),
        (job("a", memory_mb=3072), job("b", memory_mb=3072)),
        {"makespan_s": 200, "p95_wait_s": 100},
    ),
    Case(
        "the pass grid and pod start-up delay the start",
        (node(),),
        (job("a", arrival_s=1.0),),
        {"makespan_s": 5 + 2 + 100 - 1, "mean_wait_s": 4 + 2},
        SimConfig("grid", pass_interval_s=5.0, start_delay_s=2.0),
    ),
    Case(
        # peak 512 over a 400 MiB limit: memory rises from 256 at start to 512 at 30 s, crosses
        # 400 at 30 * (400/512 - 0.5) / 0.5 = 16.875 s (step 168); checkpoint 100; recovery
        # asks 600 MiB; the retry runs 900 steps from 16.875 s
        "an OOM kill is retried from the checkpoint with 1.5 times the memory",
        (node(),),
        (job("a", memory_mb=400, checkpoint_every_steps=100),),
        {"oom_kills": 1, "steps_lost": 68, "makespan_s": 16.875 + 90, "memory_slack": 88 / 600},
    ),
    Case(
        "a crash backs off 5 s and resumes from the checkpoint",
        (node(),),
        (job("a", checkpoint_every_steps=100, crash_at_steps=(550,)),),
        {"crashes": 1, "steps_lost": 50, "makespan_s": 55 + 5 + 50},
    ),
    Case(
        "without checkpoints a crash starts over",
        (node(),),
        (job("a", crash_at_steps=(550,)),),
        {"crashes": 1, "steps_lost": 550, "makespan_s": 55 + 5 + 100},
    ),
    Case(
        "crashes past max_retries fail the job and cancel its dependant",
        (node(),),
        (
            job("a", max_retries=1, crash_at_steps=(100, 200, 300)),
            job("b", depends_on=("a",)),
        ),
        {"crashes": 2, "failed": 1, "cancelled": 1, "succeeded": 0},
    ),
    Case(
        "a chain runs one after the other",
        (node(cpu=4.0),),
        (job("init"), job("run", depends_on=("init",)), job("analyze", depends_on=("run",))),
        {"makespan_s": 300, "mean_wait_s": 0, "succeeded": 3},
    ),
    Case(
        # node n1 is lost at 50 s (step 500, checkpoint 500): the retry goes to n2 at once
        "a lost node's job moves to another node from its checkpoint",
        (node("n1"), node("n2", cpu=1.0)),
        (job("a", checkpoint_every_steps=250),),
        {"node_losses": 1, "steps_lost": 0, "makespan_s": 100},
        EXACT,
        (NodeOutage("n1", 50.0, 1000.0),),
    ),
    Case(
        "a noisy neighbour slows the work on its node",
        (node(cpu=2.0, background_cpu=1.5),),
        (job("a"),),
        {"makespan_s": 125},  # 2.5 cores' demand on 2: 80 % of the speed
    ),
    Case(
        "a job allowed half the cores it uses runs at half its speed",
        (node(),),
        (job("a", cores_used=2.0),),
        {"makespan_s": 200, "cpu_slack": 0.0},
    ),
    Case(
        "a high-priority job preempts a low one, which resumes from its stop's checkpoint",
        (node(cpu=1.0),),
        (
            job("low", priority_class="low", checkpoint_every_steps=100),
            job("high", arrival_s=10.0, priority_class="high"),
        ),
        # low stops at 15 s (5 s grace, step 150, checkpointed), high runs 15..115 s, low's
        # retry resumes at 150 and runs 85 s more
        {"preemptions": 1, "steps_lost": 0, "makespan_s": 200, "succeeded": 2},
        SimConfig("priority", preemption=True, pass_interval_s=0.0, start_delay_s=0.0),
    ),
    Case(
        "FIFO takes arrival order whatever the class",
        (node(cpu=1.0),),
        LOW_THEN_HIGH,
        {"makespan_s": 300, "mean_wait_s": (0 + 99 + 198) / 3},
        SimConfig("fifo", priorities=False, pass_interval_s=0.0, start_delay_s=0.0),
    ),
    Case(
        "priority classes reorder the queue",
        (node(cpu=1.0),),
        LOW_THEN_HIGH,
        {"makespan_s": 300, "mean_wait_s": (0 + 199 + 98) / 3},
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_case(case: Case) -> None:
    metrics = simulate(Workload(case.nodes, case.jobs, case.outages), case.config)
    for key, expected in case.expect.items():
        assert getattr(metrics, key) == pytest.approx(expected, abs=1e-6), key


def test_start_order_is_recorded() -> None:
    metrics = simulate(
        Workload((node(cpu=1.0),), (job("a"), job("b", arrival_s=1.0), job("c", arrival_s=2.0))),
        EXACT,
    )
    assert [name for _, name in metrics.starts] == ["a", "b", "c"]


def test_learned_requests_pack_more_jobs_where_memory_binds() -> None:
    # 8 cores, 4 GiB: hand-set 2 GiB fits two jobs at once; learned, the physical estimate
    # for 50,000 atoms (104 + 195 MiB, +50 %: 452 MiB) and then p95 of the 300 MiB measured
    # (+20 %: 360 MiB) fit eight
    jobs = tuple(
        job(
            f"j{i}",
            arrival_s=float(i),
            memory_mb=2048,
            peak_memory_mb=300.0,
            kind="water",
            atoms=50_000,
        )
        for i in range(24)
    )
    workload = Workload((node(cpu=8.0, memory_mb=4096),), jobs)
    hand, learned = (simulate(workload, c) for c in named(["load-aware", "learned"]))
    assert learned.oom_kills == 0
    assert learned.makespan_s < 0.6 * hand.makespan_s
    assert learned.memory_slack < hand.memory_slack


def test_fair_share_splits_the_cluster_by_weight() -> None:
    # tenant a floods the queue first; b's jobs arrive a second later
    jobs = tuple(job(f"a.{i}", tenant="a") for i in range(40)) + tuple(
        job(f"b.{i}", tenant="b", arrival_s=1.0) for i in range(40)
    )
    workload = Workload((node(cpu=4.0, memory_mb=65536),), jobs)
    fifo, fair = (simulate(workload, c) for c in named(["fifo", "fair-share"]))
    assert fair.share_error_max < fifo.share_error_max
    assert fair.share_error_max < 0.1
    assert fifo.share_error_max > 0.3


def test_load_aware_avoids_the_noisy_node() -> None:
    quiet = tuple(node(f"q{i}", cpu=4.0) for i in range(3))
    noisy = (node("noisy", cpu=4.0, background_cpu=3.5),)
    jobs = tuple(job(f"j{i}", arrival_s=10.0 * i) for i in range(30))
    workload = Workload(noisy + quiet, jobs)
    aware, blind = (simulate(workload, c) for c in named(["load-aware", "binpack"]))
    # every job at full speed elsewhere: the last arrives at 290 s, starts 2 s later, runs 100 s
    assert aware.makespan_s == 392
    assert blind.makespan_s > aware.makespan_s


def test_plan_counts_fair_shares_of_the_capacity_it_is_told() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    free = NodeState("free", 4.0, 4096, True, 0.0, 0.0, reported_at=now)
    queue = [
        QueuedJob("a.1", 1.0, 256, 0, now, tenant="a"),
        QueuedJob("b.1", 1.0, 256, 0, now, tenant="b"),
    ]
    # a holds 2 cores of a 100-core cluster, b 1: b is furthest below its share and goes first
    fairness = Fairness(held={"a": Held(2.0, 0.0), "b": Held(1.0, 0.0)}, weight=lambda _: 1.0)
    first = plan([replace(free)], queue, now, fairness=fairness, capacity=(100.0, 1e6))
    assert [d.job_id for d in first] == ["b.1", "a.1"]


def test_configurations_are_named_with_overrides() -> None:
    config = named(["load-aware:target_load=0.7,sample_size=8"])[0]
    assert config.placement.target_load == 0.7
    assert config.placement.sample_size == 8
    with pytest.raises(ValueError, match="unknown 'nope'"):
        named(["nope"])
    with pytest.raises(ValueError, match="unknown placement tunable 'size'"):
        named(["fifo:size=1"])
    with pytest.raises(ValueError, match="target_load must be a number"):
        named(["fifo:target_load=x"])
    for value in ("inf", "nan", "-1"):  # inf was an OverflowError for a whole-number tunable
        with pytest.raises(
            ValueError, match=f"sample_size must be a finite number ≥ 0, not '{value}'"
        ):
            named([f"fifo:sample_size={value}"])
    with pytest.raises(ValueError, match="target_load must be a finite number ≥ 0, not 'nan'"):
        named(["fifo:target_load=nan"])
    with pytest.raises(ValueError, match=r"sample_size must be a whole number, not '2\.5'"):
        named(["fifo:sample_size=2.5"])
    with pytest.raises(ValueError, match="no key=value after ':'"):
        named(["fifo:"])  # it was taken as plain fifo under another name


def test_unknown_dependency_is_named() -> None:
    with pytest.raises(ValueError, match="job b: depends_on names unknown 'zz'"):
        simulate(Workload((node(),), (job("b", depends_on=("zz",)),)), EXACT)


def test_percentile_nearest_rank() -> None:
    assert percentile([], 0.95) == 0.0
    assert percentile([3.0, 1.0, 2.0], 0.5) == 2.0
    assert percentile([float(i) for i in range(1, 101)], 0.95) == 95.0


def test_summary_has_every_figure() -> None:
    metrics = Metrics(config="x")
    assert {"makespan_s", "p95_wait_s", "share_error_max", "steps_lost"} <= set(metrics.summary())
