"""Synthetic MD campaign workloads with documented distributions (docs/simulate.md, "The
generator"); seeded, so one seed is one workload.

A workload is a stream of *campaigns*: one tenant submits a burst of replicas of one system at
once, some of them as chains (init → run → analyze). Sizes, speeds and memory follow the
production core's own models: threads from the atom count (``threads_for``), peak memory from
the physical model (``physical_memory_mb``), and the hand-set requests a careful person writes
without history (the rule of bench/requests.py: memory a power of two at least four times the
physical peak, cores the threads).
"""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from mdq.core.recommend import physical_memory_mb, threads_for
from mdq.sim.model import NodeOutage, SimJob, SimNode, Workload

SYSTEMS = ("water_box", "protein_ligand", "membrane", "lennard_jones")
"""The system kinds campaigns draw from (each campaign one kind and one size)."""
STEPS_PER_S_PER_THREAD_AT_10K = 150.0
"""Steps per second of one CPU thread on a 10,000-atom system; speed scales as
threads / atoms (OpenMM's CPU platform, PME: docs/simulate.md)."""


@dataclass(frozen=True, slots=True)
class NodeClass:
    """Nodes alike: how many of the cluster's (a fraction) and their size."""

    fraction: float
    cpu: float
    memory_mb: int


DEFAULT_NODE_CLASSES = (
    NodeClass(0.6, 32.0, 131_072),
    NodeClass(0.3, 64.0, 262_144),
    NodeClass(0.1, 16.0, 65_536),
)


@dataclass(frozen=True, slots=True)
class GeneratorSpec:
    """Parameters of a synthetic workload (defaults: a mixed MD cluster)."""

    nodes: int = 100
    jobs: int = 10_000
    seed: int = 1
    node_classes: Sequence[NodeClass] = DEFAULT_NODE_CLASSES
    tenants: Mapping[str, float] = field(
        default_factory=lambda: {"alice": 0.5, "bob": 0.3, "carol": 0.2}
    )
    """Tenants and the share of campaigns each submits."""
    load: float = 1.2
    """Offered load: arrivals spread over the time the cluster's cores need at this load (above 1
    the queue grows while they arrive)."""
    campaign_mean: float = 20.0
    """Mean jobs per campaign (geometric); a campaign arrives as one burst."""
    chain_fraction: float = 0.3
    """Campaigns whose replicas are init → run → analyze chains."""
    atoms_min: int = 2_000
    atoms_max: int = 500_000
    """Atom counts are log-uniform between these."""
    run_median_s: float = 3_600.0
    run_sigma: float = 0.75
    """Run time alone (log-normal: median and sigma), clipped to 60 s .. 24 h."""
    memory_noise: float = 0.05
    """Sigma of the log-normal factor on each job's physical peak memory."""
    high_fraction: float = 0.1
    low_fraction: float = 0.2
    """Campaigns of the high and low priority class (the rest normal)."""
    checkpoint_every_s: float = 600.0
    """Checkpoint interval, in seconds of the job's own run."""
    crash_probability: float = 0.01
    """Jobs that crash once, at a uniformly drawn step."""
    node_failures_per_day: float = 0.0
    """Losses per node per day (Poisson); each node comes back after ``repair_s``."""
    repair_s: float = 1_800.0
    noisy_fraction: float = 0.0
    """Nodes with a noisy neighbour."""
    noisy_load: float = 0.6
    """Share of a noisy node's cores the neighbour keeps busy."""
    one_thread: bool = False
    """Every job one thread (the memory-bound mix of bench/simulate.py)."""


def hand_set_memory_mb(atoms: int, threads: int) -> int:
    """What a careful person requests without history: a power of two, at least four times the
    physical peak (the rule of bench/requests.py: 512 MiB below 5,000 atoms, 1024 up to
    30,000)."""
    return 1 << math.ceil(math.log2(4 * physical_memory_mb(atoms, threads)))


def _nodes(spec: GeneratorSpec, rng: random.Random) -> list[SimNode]:
    nodes: list[SimNode] = []
    total = sum(c.fraction for c in spec.node_classes)
    counts = [round(spec.nodes * c.fraction / total) for c in spec.node_classes]
    counts[0] += spec.nodes - sum(counts)
    noisy = set(rng.sample(range(spec.nodes), round(spec.noisy_fraction * spec.nodes)))
    for node_class, count in zip(spec.node_classes, counts, strict=True):
        for _ in range(count):
            index = len(nodes)
            background = node_class.cpu * spec.noisy_load if index in noisy else 0.0
            nodes.append(SimNode(f"n{index:05d}", node_class.cpu, node_class.memory_mb, background))
    return nodes


def _member(
    spec: GeneratorSpec,
    rng: random.Random,
    name: str,
    *,
    tenant: str,
    priority: str,
    atoms: int,
    kind: str,
    run_s: float,
    threads: int,
) -> SimJob:
    rate = STEPS_PER_S_PER_THREAD_AT_10K * threads * 10_000 / atoms
    steps = max(1, round(run_s * rate))
    physical = physical_memory_mb(atoms, threads)
    crash = (
        (rng.randrange(1, steps + 1),)
        if steps > 1 and rng.random() < spec.crash_probability
        else ()
    )
    return SimJob(
        job_id=name,
        arrival_s=0.0,
        cpu=float(threads),
        memory_mb=hand_set_memory_mb(atoms, threads),
        steps=steps,
        steps_per_s=rate,
        peak_memory_mb=physical * rng.lognormvariate(0.0, spec.memory_noise),
        cores_used=float(threads),
        tenant=tenant,
        priority_class=priority,
        checkpoint_every_steps=max(1, round(spec.checkpoint_every_s * rate)),
        crash_at_steps=crash,
        kind=kind,
        atoms=atoms,
    )


def generate(spec: GeneratorSpec) -> Workload:
    """The workload ``spec`` describes (the same for the same seed)."""
    if spec.nodes < 1 or spec.jobs < 1:
        raise ValueError("generator: nodes and jobs must be at least 1")
    if spec.load <= 0:
        raise ValueError("generator: load must be above 0")
    rng = random.Random(spec.seed)
    nodes = _nodes(spec, rng)
    tenants, shares = list(spec.tenants), list(spec.tenants.values())
    jobs: list[SimJob] = []
    campaigns: list[list[int]] = []
    number = 0
    while len(jobs) < spec.jobs:
        number += 1
        tenant = rng.choices(tenants, shares)[0]
        draw = rng.random()
        priority = (
            "high"
            if draw < spec.high_fraction
            else "low"
            if draw < spec.high_fraction + spec.low_fraction
            else "normal"
        )
        atoms = round(math.exp(rng.uniform(math.log(spec.atoms_min), math.log(spec.atoms_max))))
        threads = 1 if spec.one_thread else threads_for(atoms)
        system = rng.choice(SYSTEMS)
        kind = f"{system}-{atoms}"
        size = 1 + int(math.log(1 - rng.random()) / math.log(1 - 1 / spec.campaign_mean))
        run_s = min(
            172_800.0, max(60.0, rng.lognormvariate(math.log(spec.run_median_s), spec.run_sigma))
        )
        chained = rng.random() < spec.chain_fraction
        members: list[int] = []
        prefix = f"{tenant}.c{number}"
        for replica in range(size):
            if len(jobs) >= spec.jobs:
                break

            make = functools.partial(
                _member, spec, rng, tenant=tenant, priority=priority, atoms=atoms, threads=threads
            )
            name = f"{prefix}-{replica}"
            if chained and len(jobs) + 3 <= spec.jobs:
                init = make(f"{name}-init", kind=f"{kind}-init", run_s=min(120.0, run_s))
                run = replace(
                    make(f"{name}-run", kind=kind, run_s=run_s), depends_on=(init.job_id,)
                )
                analyze = make(f"{name}-analyze", kind=f"{kind}-analyze", run_s=min(300.0, run_s))
                analyze = replace(analyze, depends_on=(run.job_id,))
                members.extend(range(len(jobs), len(jobs) + 3))
                jobs.extend((init, run, analyze))
            else:
                members.append(len(jobs))
                jobs.append(make(name, kind=kind, run_s=run_s))
        campaigns.append(members)
    # campaigns arrive as a Poisson process over the span the cores need at the offered load
    work = sum(job.cpu * job.duration_s for job in jobs)
    span = work / (sum(node.cpu for node in nodes) * spec.load)
    t = 0.0
    rate = len(campaigns) / span if span > 0 else 1.0
    for members in campaigns:
        for index in members:
            jobs[index] = replace(jobs[index], arrival_s=round(t, 3))
        t += rng.expovariate(rate)
    outages: list[NodeOutage] = []
    if spec.node_failures_per_day > 0:
        horizon = span + max(job.duration_s for job in jobs)  # while work may still run
        per_s = spec.node_failures_per_day / 86_400.0
        for node in nodes:
            at = rng.expovariate(per_s)
            while at < horizon:
                outages.append(NodeOutage(node.name, round(at, 3), spec.repair_s))
                at += spec.repair_s + rng.expovariate(per_s)
    return Workload(
        nodes=tuple(nodes),
        jobs=tuple(jobs),
        outages=tuple(outages),
        name=f"generated (seed {spec.seed})",
        notes={
            "source": "generator",
            "seed": str(spec.seed),
            "campaigns": str(len(campaigns)),
            "arrival_span_s": f"{span:.0f}",
        },
    )
