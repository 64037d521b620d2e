"""Workloads for the simulator: the generator's distributions and the SWF reader and writer
(with the sample trace shipped in tests/data/sample.swf)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import pytest

from mdq.core.recommend import physical_memory_mb
from mdq.sim.config import named
from mdq.sim.engine import simulate
from mdq.sim.generator import GeneratorSpec, NodeClass, generate, hand_set_memory_mb
from mdq.sim.swf import SwfError, SwfOptions, parse_swf, read_swf, write_swf

SAMPLE = Path(__file__).parent.parent / "data" / "sample.swf"


def test_generator_is_seeded() -> None:
    spec = GeneratorSpec(nodes=10, jobs=200, seed=3)
    assert generate(spec) == generate(spec)
    assert generate(spec).jobs != generate(GeneratorSpec(nodes=10, jobs=200, seed=4)).jobs


def test_generator_follows_its_distributions() -> None:
    workload = generate(GeneratorSpec(nodes=50, jobs=3000, seed=1, crash_probability=0.05))
    jobs = workload.jobs
    assert len(jobs) == 3000
    assert len(workload.nodes) == 50
    # node classes: 60 % of 32 cores, 30 % of 64, 10 % of 16
    assert sorted({node.cpu for node in workload.nodes}) == [16.0, 32.0, 64.0]
    assert sum(node.cpu == 32.0 for node in workload.nodes) == 30
    # chains: every dependency is an earlier job of the same campaign, init -> run -> analyze
    ids = {job.job_id: job for job in jobs}
    chained = [job for job in jobs if job.depends_on]
    assert chained
    for job in chained:
        (dep,) = job.depends_on
        assert ids[dep].arrival_s == job.arrival_s
        assert job.job_id.rsplit("-", 1)[0] == dep.rsplit("-", 1)[0]
    # sizes log-uniform in [2e3, 5e5], one per campaign
    atoms = sorted(job.atoms for job in jobs)
    assert atoms[0] >= 2_000 and atoms[-1] <= 500_000
    # requests: the hand-set rule, at least twice the peak memory, never below it
    for job in jobs:
        assert job.memory_mb == hand_set_memory_mb(job.atoms, int(job.cpu))
        assert job.memory_mb >= 2 * job.peak_memory_mb
    # about 5 % crash once
    crashing = sum(1 for job in jobs if job.crash_at_steps)
    assert 0.02 < crashing / len(jobs) < 0.08
    tenants = {job.tenant for job in jobs}
    assert tenants == {"alice", "bob", "carol"}


def test_hand_set_rule_matches_bench_requests() -> None:
    # 512 MiB below 5,000 atoms, 1024 up to 30,000 (docs/requests.md, "Measured")
    assert hand_set_memory_mb(2_661, 1) == 512
    assert hand_set_memory_mb(4_999, 1) == 512
    assert hand_set_memory_mb(21_384, 1) == 1024
    assert hand_set_memory_mb(30_000, 1) == 1024
    assert 4 * physical_memory_mb(60_000, 1) <= hand_set_memory_mb(60_000, 1)


def test_generator_outages_and_noisy_nodes() -> None:
    workload = generate(
        GeneratorSpec(
            nodes=20,
            jobs=500,
            seed=2,
            node_classes=(NodeClass(1.0, 16.0, 65_536),),
            node_failures_per_day=10.0,
            noisy_fraction=0.25,
        )
    )
    assert sum(node.background_cpu > 0 for node in workload.nodes) == 5
    assert workload.outages
    metrics = simulate(workload, named(["load-aware"])[0])
    assert metrics.node_losses > 0
    assert metrics.succeeded + metrics.failed + metrics.cancelled == 500


@pytest.mark.parametrize(
    "spec, message",
    [
        (GeneratorSpec(nodes=0), "nodes and jobs must be at least 1"),
        (GeneratorSpec(load=0.0), "load must be above 0"),
    ],
    ids=["no nodes", "no load"],
)
def test_generator_refuses(spec: GeneratorSpec, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        generate(spec)


def test_sample_trace_reads_and_simulates() -> None:
    workload = read_swf(SAMPLE)
    assert len(workload.nodes) == 16  # the header's MaxNodes
    assert len(workload.jobs) == 300
    assert workload.jobs[0].arrival_s == 0.0
    failed = [job for job in workload.jobs if job.max_retries == 0]
    assert len(failed) == 3
    assert any(job.depends_on for job in workload.jobs)
    metrics = simulate(workload, named(["fifo"])[0])
    assert metrics.failed == 3  # the trace's failed jobs fail, once, for good
    assert metrics.succeeded + metrics.failed + metrics.cancelled == 300


@dataclass(frozen=True)
class Line:
    name: str
    text: str
    expect: dict[str, object]


SWF_LINES = [
    Line(
        "requested processors and memory per processor",
        "1 10 5 100 4 80 262144 4 200 524288 1 7 1 -1 1 1 -1 -1",
        # 4 processors x 512 MiB; used 256 MiB each; 80 s CPU of 100 s per processor: 3.2
        {
            "cpu": 4.0,
            "memory_mb": 2048,
            "peak_memory_mb": 1024.0,
            "cores_used": 3.2,
            "tenant": "u7",
        },
    ),
    Line(
        "unknown requests fall back to allocated processors and 2 GiB each",
        "1 0 -1 100 2 -1 -1 -1 -1 -1 1 3 1 -1 1 1 -1 -1",
        {"cpu": 2.0, "memory_mb": 4096, "peak_memory_mb": 2048.0, "cores_used": 2.0},
    ),
    Line(
        "wider than a node: one whole node",
        "1 0 -1 100 128 -1 -1 128 -1 -1 1 3 1 -1 1 1 -1 -1",
        {"cpu": 32.0},
    ),
    Line(
        "a failed job crashes at its end, never retried",
        "1 0 -1 100 1 -1 -1 1 -1 -1 0 3 1 -1 1 1 -1 -1",
        {"crash_at_steps": (999,), "max_retries": 0, "steps": 1000},
    ),
]


@pytest.mark.parametrize("line", SWF_LINES, ids=[line.name for line in SWF_LINES])
def test_swf_fields(line: Line) -> None:
    workload = parse_swf(["; MaxNodes: 4", line.text])
    (job,) = workload.jobs
    for key, value in line.expect.items():
        assert getattr(job, key) == pytest.approx(value), key


@pytest.mark.parametrize(
    "lines, message",
    [
        (["; MaxNodes: 1", "1 0 -1 100"], "line 2: 4 fields, SWF has 18"),
        (["1 0 -1 x 1 -1 -1 1 -1 -1 1 3 1 -1 1 1 -1 -1"], "line 1: field 4 is not a number"),
        (["1 0 -1 100 -1 -1 -1 -1 -1 -1 1 3 1 -1 1 1 -1 -1"], "no processor count"),
        (["1 0 -1 100 1 -1 -1 1 -1 -1 1 3 1 -1 1 1 -1 -1"], "neither MaxNodes nor MaxProcs"),
    ],
    ids=["short line", "not a number", "no processors", "no cluster size"],
)
def test_swf_errors_name_the_line(lines: list[str], message: str) -> None:
    with pytest.raises(SwfError, match=message):
        parse_swf(lines)


def test_swf_cancelled_and_empty_jobs_are_skipped() -> None:
    workload = parse_swf(
        [
            "; MaxProcs: 64",
            "1 0 -1 0 1 -1 -1 1 -1 -1 1 3 1 -1 1 1 -1 -1",
            "2 0 -1 50 1 -1 -1 1 -1 -1 5 3 1 -1 1 1 -1 -1",
            "3 5 -1 50 1 -1 -1 1 -1 -1 1 3 1 -1 1 1 2 -1",
        ]
    )
    assert [job.job_id for job in workload.jobs] == ["swf-3"]
    assert workload.jobs[0].depends_on == ()  # its predecessor is not in the workload
    assert workload.jobs[0].arrival_s == 0.0
    assert len(workload.nodes) == 2  # 64 processors / 32 per node
    assert workload.notes["skipped_cancelled_or_empty"] == "2"


def test_swf_round_trip(tmp_path: Path) -> None:
    workload = generate(GeneratorSpec(nodes=4, jobs=50, seed=5, crash_probability=0.0))
    path = tmp_path / "trace.swf"
    write_swf(workload, path)
    again = read_swf(path, SwfOptions(node_cpu=64.0))
    assert len(again.jobs) == 50
    for before, after in zip(workload.jobs, again.jobs, strict=True):
        assert after.cpu == max(1, round(before.cpu))
        assert after.duration_s == pytest.approx(round(before.duration_s), abs=0.1)
        assert after.peak_memory_mb == pytest.approx(before.peak_memory_mb, rel=0.01)
        assert math.isclose(
            after.arrival_s, round(before.arrival_s) - round(workload.jobs[0].arrival_s)
        )
        assert bool(after.depends_on) == bool(before.depends_on)
