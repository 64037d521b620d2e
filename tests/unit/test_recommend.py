"""The resource recommender (mdq.core.recommend), as tables of named cases."""

from __future__ import annotations

from dataclasses import replace

import pytest

from mdq.contracts import pb
from mdq.core.recommend import (
    Confidence,
    CostFingerprint,
    UsageGroup,
    UsageHistory,
    UsageSample,
    bucket_atoms,
    bucket_of,
    estimate_atoms,
    fingerprint_of,
    physical_memory_mb,
    quantile,
    recommend,
    recommend_for_spec,
    threads_for,
)
from mdq.core.spec import normalize_job
from tests.helpers import with_fields
from tests.tables import named_cases


def water(box_nm: float = 3.0, **fields: object) -> pb.JobSpec:
    spec = pb.JobSpec(name="w", system=pb.System(water_box=pb.WaterBox(box_nm=box_nm)))
    return normalize_job(with_fields(spec, fields), "jobs[0]")


WATER = fingerprint_of(water())


def used(
    peak: float,
    cores: float = 0.9,
    *,
    fingerprint: CostFingerprint = WATER,
    limit: float = 1024,
    cpu_limit: float = 1.0,
    oom: bool = False,
) -> UsageSample:
    return UsageSample(
        fingerprint=fingerprint,
        peak_memory_mb=0.0 if oom else peak,
        mean_cores=cores,
        memory_limit_mb=limit,
        cpu_limit=cpu_limit,
        oom_killed=oom,
    )


QUANTILE_CASES = [
    ("one value", [5.0], 0.95, 5.0),
    ("median of two", [1.0, 3.0], 0.5, 2.0),
    ("p95 of 0..100 interpolates", [float(v) for v in range(101)], 0.95, 95.0),
    ("order does not matter", [3.0, 1.0, 2.0], 1.0, 3.0),
]


@named_cases(("values", "q", "expected"), QUANTILE_CASES)
def test_quantile(values: list[float], q: float, expected: float) -> None:
    assert quantile(values, q) == pytest.approx(expected)


def test_quantile_of_nothing_is_an_error() -> None:
    with pytest.raises(ValueError, match="no values"):
        quantile([], 0.5)


ATOM_CASES = [
    ("3 nm water box", water(3.0), 2662),
    ("2 nm water box", water(2.0), 789),
    (
        "Lennard-Jones fluid: its atoms",
        normalize_job(
            pb.JobSpec(name="l", system=pb.System(lennard_jones=pb.LennardJonesFluid(atoms=4000))),
            "jobs[0]",
        ),
        4000,
    ),
    (
        "inline structure: its ATOM and HETATM records",
        pb.JobSpec(
            name="s",
            system=pb.System(structure=pb.Structure(pdb_content="ATOM 1\nATOM 2\nHETATM 3\nEND\n")),
        ),
        3,
    ),
    (
        "structure in a file: unknown",
        pb.JobSpec(name="s", system=pb.System(structure=pb.Structure(pdb_path="inputs/a.pdb"))),
        0,
    ),
]


@named_cases(("spec", "expected"), ATOM_CASES)
def test_estimate_atoms(spec: pb.JobSpec, expected: int) -> None:
    assert estimate_atoms(spec) == expected


def test_atom_buckets_group_near_counts_and_separate_far_ones() -> None:
    assert bucket_of(2600) == bucket_of(2700)
    assert bucket_of(2600) != bucket_of(6000)
    assert bucket_of(0) == -1
    assert abs(bucket_atoms(bucket_of(2661)) - 2661) / 2661 < 0.25


FINGERPRINT_CASES = [
    ("same spec, same fingerprint", water(), water(), True),
    ("another temperature costs the same", water(), water(temperature_k=350.0), True),
    ("a bigger box differs", water(), water(5.0), False),
    ("another integrator differs", water(), water(integrator=pb.INTEGRATOR_VERLET), False),
    ("a trajectory differs", water(), water(trajectory_interval_steps=100), False),
    ("more threads differ", water(), water(resources=pb.Resources(cpu=2)), False),
    ("another platform differs", water(), water(platform="Reference"), False),
]


@named_cases(("left", "right", "same"), FINGERPRINT_CASES)
def test_fingerprint(left: pb.JobSpec, right: pb.JobSpec, same: bool) -> None:
    assert (fingerprint_of(left) == fingerprint_of(right)) is same


def test_fingerprint_describes_itself() -> None:
    assert WATER.describe(2661) == "water_box ~2.7k atoms"
    assert WATER.describe() == "water_box ~2.2k atoms"  # the middle of its bucket


OTHER = fingerprint_of(water(6.0))
VERLET = fingerprint_of(water(integrator=pb.INTEGRATOR_VERLET))

# name, history, expected memory_mb, expected cpu, confidence, words in the evidence
RECOMMEND_CASES: list[tuple[str, list[UsageSample], int, float, Confidence, str]] = [
    (
        "no history: physical estimate, wide margin",
        [],
        172,  # (104 + 2.662 * 3.9) * 1.5 = 171.6 -> 172
        1.0,
        Confidence.LOW,
        "no history: physical estimate",
    ),
    (
        "too few runs: still the physical estimate",
        [used(100.0), used(100.0)],
        172,
        1.0,
        Confidence.LOW,
        "no history",
    ),
    (
        "three runs: p95 of peaks + 20 %",
        [used(100.0), used(110.0), used(120.0)],
        144,  # p95 = 119 -> 142.8 -> 144
        0.9,
        Confidence.MEDIUM,
        "p95 of 3 runs of water_box ~2.7k atoms, +20 % memory",
    ),
    (
        "ten runs: +10 % and high confidence",
        [used(200.0 + i) for i in range(10)],
        232,  # p95 = 208.55 -> 229.4 -> 232
        0.9,
        Confidence.HIGH,
        "p95 of 10 runs",
    ),
    (
        "other fingerprints are ignored",
        [used(100.0), used(100.0), used(100.0), *[used(900.0, fingerprint=OTHER)] * 5],
        120,
        0.9,
        Confidence.MEDIUM,
        "p95 of 3 runs",
    ),
    (
        "too few exact: the coarse key (another integrator) counts",
        [used(300.0, fingerprint=VERLET)] * 4,
        360,
        0.9,
        Confidence.MEDIUM,
        "any intervals and integrator",
    ),
    (
        "an OOM-killed limit is a lower bound",
        [used(100.0), used(100.0), used(100.0), used(0, limit=400, oom=True)],
        500,  # 400 * 1.25
        0.9,
        Confidence.MEDIUM,
        "OOM-killed at",
    ),
    (
        "an OOM kill raises even the physical estimate",
        [used(0, limit=256, oom=True)],
        320,
        1.0,
        Confidence.LOW,
        "OOM-killed at",
    ),
    (
        "cores from measured use, rounded up to a tenth",
        [
            used(100.0, 0.42, cpu_limit=4),
            used(100.0, 0.44, cpu_limit=4),
            used(100.0, 0.43, cpu_limit=4),
        ],
        120,
        0.5,
        Confidence.MEDIUM,
        "cores used",
    ),
    (
        "cores never above the threads (helper threads lift the mean over one)",
        [used(100.0, 1.04), used(100.0, 1.06), used(100.0, 1.05)],
        120,
        1.0,
        Confidence.MEDIUM,
        "cores used",
    ),
    (
        "a throttled attempt keeps its allowance",
        [
            used(100.0, 0.5, cpu_limit=2),
            used(100.0, 0.5, cpu_limit=2),
            used(100.0, 1.99, cpu_limit=2),
        ],
        120,
        2.0,
        Confidence.MEDIUM,
        "throttled",
    ),
]


@named_cases(("history", "memory_mb", "cpu", "confidence", "evidence"), RECOMMEND_CASES)
@pytest.mark.parametrize("indexed", [False, True], ids=["samples", "indexed history"])
def test_recommend(
    history: list[UsageSample],
    memory_mb: int,
    cpu: float,
    confidence: Confidence,
    evidence: str,
    indexed: bool,
) -> None:
    """Each case, from the samples as a list and from the same samples as an indexed
    ``UsageHistory`` (what the history read gives): the same recommendation."""
    given = UsageHistory.of(history) if indexed else history
    recommendation = recommend(WATER, atoms=2662, history=given)
    assert (recommendation.memory_mb, recommendation.cpu) == (memory_mb, cpu)
    assert recommendation.confidence is confidence
    assert evidence in recommendation.evidence


def test_a_grouped_history_recommends_from_its_own_kind_of_job_only() -> None:
    """Groups of other fingerprints (other sizes, other integrators) are not read for a job
    with enough exact samples; with too few, the coarse key gathers the groups that share it;
    the samples of a group are its columns, in order."""
    ours = UsageGroup(WATER, 1.0, [100.0, 110.0, 120.0], [0.9, 0.9, 0.9], [512.0] * 3, [False] * 3)
    verlet = UsageGroup(VERLET, 1.0, [900.0] * 4, [0.9] * 4, [2048.0] * 4, [False] * 4)
    other_size = replace(WATER, atom_bucket=WATER.atom_bucket + 3)
    big = UsageGroup(other_size, 1.0, [5000.0] * 9, [0.9] * 9, [8192.0] * 9, [False] * 9)
    history = UsageHistory([ours, verlet, big])
    flat = ours.samples() + verlet.samples() + big.samples()
    assert len(history) == 16 and history.samples() == flat
    exact = recommend(WATER, atoms=2662, history=history)
    assert exact == recommend(WATER, atoms=2662, history=flat)
    assert exact.samples == 3 and "any intervals" not in exact.evidence
    few = UsageHistory(
        [
            replace(
                ours,
                peak_memory_mb=[100.0],
                mean_cores=[0.9],
                memory_limit_mb=[512.0],
                oom_killed=[False],
            ),
            verlet,
            big,
        ]
    )
    widened = recommend(WATER, atoms=2662, history=few)
    assert widened.samples == 5 and "any intervals" in widened.evidence


PHYSICAL_CASES = [
    # name, atoms, threads, pme, peak measured here (getrusage; bare OpenMM + 32 MiB of runner)
    ("water box 3 nm", 2661, 1, True, 81.4 + 32),
    ("water box 5 nm", 12255, 1, True, 118.3 + 32),
    ("water box 6 nm", 21384, 1, True, 156.8 + 32),
    ("LJ fluid 8k", 8000, 1, False, 72.1 + 32),
    ("LJ fluid 64k", 64000, 1, False, 196.8 + 32),
]


@named_cases(("atoms", "threads", "pme", "measured"), PHYSICAL_CASES)
def test_physical_model_fits_the_measurements_within_15_percent(
    atoms: int, threads: int, pme: bool, measured: float
) -> None:
    assert physical_memory_mb(atoms, threads, pme=pme) == pytest.approx(measured, rel=0.15)


def test_physical_model_grows_with_atoms_and_threads() -> None:
    assert physical_memory_mb(100_000, 1) > physical_memory_mb(1000, 1)
    assert physical_memory_mb(1000, 4) > physical_memory_mb(1000, 1)


THREAD_CASES = [("small", 800, 1), ("medium", 50_000, 2), ("large", 200_000, 4)]


@named_cases(("atoms", "threads"), THREAD_CASES)
def test_threads_for(atoms: int, threads: int) -> None:
    assert threads_for(atoms) == threads


def test_recommend_for_spec_uses_the_requested_threads() -> None:
    spec = water(6.0)
    two = recommend_for_spec(spec, history=[], threads=2)
    assert two.cpu == 2.0
    assert recommend_for_spec(spec, history=[]).cpu == 1.0
    assert two.as_resources() == pb.Resources(cpu=2.0, memory_mb=two.memory_mb)
