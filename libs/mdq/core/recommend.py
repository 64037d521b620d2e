"""Resource requests learned from history: what a job will need, from what similar jobs used.

``recommend`` gives a job's ``resources`` from the measured usage of earlier attempts of jobs
with the same cost fingerprint (``CostFingerprint``; the coarse key when too few share the
whole one), and says how sure it is; ``physical_estimate`` when there is no history (pure: the
callers hand it the history they read). The fingerprint, the quantiles and margins, and the
physical model: docs/requests.md.
"""

from __future__ import annotations

import hashlib
import math
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum

from mdq.contracts import pb
from mdq.core.engines import LAMMPS, OPENMM, engine_of

ATOM_BUCKET_RATIO = 1.5
"""Atom counts within this ratio of each other share a bucket (log-spaced buckets)."""
MIN_SAMPLES = 3
"""Fewest measured attempts a history-based recommendation is made from."""
MANY_SAMPLES = 10
"""From this many measured attempts on, the confidence is high and the margin smallest."""
MEMORY_QUANTILE = 0.95
"""The quantile of peak memory a recommendation covers."""
CPU_QUANTILE = 0.9
"""The quantile of mean cores used a CPU recommendation covers."""
OOM_FLOOR_FACTOR = 1.25
"""A fingerprint's OOM-killed limit times this is the least memory recommended for it."""
THROTTLED_FRACTION = 0.95
"""An attempt whose mean cores reached this fraction of its allowance was CPU-throttled."""
PHYSICAL_MARGIN = 0.5
"""Margin on the physical estimate: it is a fit to one machine, not to this job's history."""
MEMORY_STEP_MB = 4
"""Memory recommendations are rounded up to a multiple of this many MiB."""
MIN_MEMORY_MB = 64
MAX_MEMORY_MB = 1_048_576
MIN_CPU = 0.1
MAX_CPU = 256.0

# The physical model (docs/requests.md, "The physical model"): peak RSS of a runner in MiB =
# base + atoms / 1000 * per-kiloatom (+ MB_PER_THREAD per CPU thread beyond one), the two
# figures by nonbonded method (PME's reciprocal-space grid costs more per atom than a cutoff).
# Fitted to peaks measured with getrusage around bench/bare_openmm.py (OpenMM 8.6.1, CPU
# platform, this project's recipes) plus the runner's own imports (nats-py, protobuf,
# prometheus: +32 MiB over bare OpenMM).
PME_BASE_MB = 104.0
"""A runner's peak with a tiny PME system (water box, solvated structure)."""
PME_MB_PER_KILOATOM = 3.9
"""PME: peak memory per thousand atoms (water boxes of 774 to 21,384 atoms)."""
CUTOFF_BASE_MB = 90.0
"""A runner's peak with a tiny cutoff system (Lennard-Jones fluid)."""
CUTOFF_MB_PER_KILOATOM = 2.2
"""Cutoff methods: peak memory per thousand atoms (Lennard-Jones fluids of 1,000 to 64,000)."""
LAMMPS_BASE_MB = 124.0
"""A LAMMPS runner's peak with a small system (the examples' 500-atom copper and
Lennard-Jones boxes: the lammps and mpich libraries, no OpenMM); a LAMMPS job's atom count is
in its script, unknown to the spec, so this base is its whole physical estimate."""
MB_PER_THREAD = 1.0
"""Extra peak memory per CPU thread beyond the first (1 and 2 threads measured the same)."""
WATER_ATOMS_PER_NM3 = 98.6
"""Atoms per nm³ of the runner's TIP3P water box (3 nm is 2,661 atoms)."""


NO_SYSTEM = "none"
"""The system kind of an analysis job's fingerprint: it simulates nothing."""


class Confidence(StrEnum):
    """How much a recommendation rests on."""

    HIGH = "high"
    """At least MANY_SAMPLES measured attempts of the same fingerprint."""
    MEDIUM = "medium"
    """MIN_SAMPLES or more measured attempts, of the same or the coarse fingerprint."""
    LOW = "low"
    """No usable history: the physical estimate with a wide margin."""


@dataclass(frozen=True, slots=True)
class CostFingerprint:
    """What drives the cost of an MD job; jobs with equal fingerprints cost about the same."""

    system_kind: str
    """``water_box``, ``lennard_jones``, ``structure`` (or ``NO_SYSTEM`` for analysis)."""
    atom_bucket: int
    """round(log(atoms) / log(ATOM_BUCKET_RATIO)); -1 when the atom count is unknown."""
    nonbonded_method: int
    """pb.NonbondedMethod."""
    cutoff_nm: float
    """The cutoff, rounded to 0.05 nm."""
    barostat: bool
    """Whether a Monte Carlo barostat runs (NPT)."""
    integrator: int
    """pb.Integrator."""
    platform: str
    """The OpenMM platform, upper case."""
    threads: int
    """CPU threads (ceil of the CPU request)."""
    trajectory_interval_steps: int
    """0 when no trajectory is written."""
    checkpoint_interval_steps: int
    """Steps between checkpoints."""
    engine: str = OPENMM
    """The engine that runs the job (``mdq.core.engines``)."""
    inputs: str = ""
    """A digest of the job's input files' sha256s ("" without input files): the same script
    and data files, or the same structure file."""
    variables: str = ""
    """A digest of a LAMMPS job's variables ("" without)."""

    def coarse(self) -> CostFingerprint:
        """The same fingerprint without what moves memory least (intervals, integrator, a
        LAMMPS script's variables)."""
        return replace(
            self,
            integrator=0,
            trajectory_interval_steps=0,
            checkpoint_interval_steps=0,
            variables="",
        )

    def describe(self, atoms: int = 0) -> str:
        """For people: ``water_box ~2.6k atoms`` (``atoms``: the job's own count, else the
        bucket's middle); ``analysis jobs`` (no system); ``structure, size unknown``."""
        if self.system_kind == NO_SYSTEM:
            return "analysis jobs"
        if self.atom_bucket < 0:
            return f"{self.system_kind}, size unknown"
        count = atoms if atoms > 0 else bucket_atoms(self.atom_bucket)
        return f"{self.system_kind} ~{_short_count(count)} atoms"


@dataclass(frozen=True, slots=True)
class UsageSample:
    """What one past attempt used, with what it was allowed and how it ended."""

    fingerprint: CostFingerprint
    peak_memory_mb: float
    """Peak resident memory of the attempt's process tree (0 when unmeasured, e.g. OOM)."""
    mean_cores: float
    """CPU seconds / wall seconds (0 when unmeasured)."""
    memory_limit_mb: float
    """The memory the attempt was allowed (what an OOM kill teaches; 0 where not read: the
    history read hands over the limits of OOM-killed attempts only)."""
    cpu_limit: float
    """The cores the attempt was allowed."""
    oom_killed: bool = False
    """The attempt was killed for exceeding memory_limit_mb."""


@dataclass(frozen=True, slots=True)
class UsageGroup:
    """The past attempts of one fingerprint at one CPU allowance, as columns (what the history
    read hands over: one group per kind of job rather than one object per attempt)."""

    fingerprint: CostFingerprint
    cpu_limit: float
    peak_memory_mb: Sequence[float]
    mean_cores: Sequence[float]
    memory_limit_mb: Sequence[float]
    oom_killed: Sequence[bool]

    def samples(self) -> list[UsageSample]:
        """The group's attempts, one ``UsageSample`` each."""
        return [
            UsageSample(self.fingerprint, peak, cores, limit, self.cpu_limit, oom)
            for peak, cores, limit, oom in zip(
                self.peak_memory_mb,
                self.mean_cores,
                self.memory_limit_mb,
                self.oom_killed,
                strict=True,
            )
        ]


class UsageHistory:
    """Past attempts indexed by fingerprint (and, from the first look-up by coarse fingerprint,
    by that too), so that a recommendation reads only the attempts of its own kind of job
    however long the history; each group's attempts become ``UsageSample`` objects the first
    time they are asked for."""

    __slots__ = ("_by_coarse", "_by_fingerprint", "_groups", "_samples")

    def __init__(self, groups: Sequence[UsageGroup]) -> None:
        self._groups = list(groups)
        self._by_fingerprint: dict[CostFingerprint, list[UsageGroup]] = {}
        for group in self._groups:
            self._by_fingerprint.setdefault(group.fingerprint, []).append(group)
        self._by_coarse: dict[CostFingerprint, list[UsageGroup]] | None = None
        self._samples: dict[int, list[UsageSample]] = {}

    @classmethod
    def of(cls, samples: Sequence[UsageSample]) -> UsageHistory:
        """The history of single samples (tests, the simulator)."""
        return cls(
            [
                UsageGroup(
                    usage.fingerprint,
                    usage.cpu_limit,
                    (usage.peak_memory_mb,),
                    (usage.mean_cores,),
                    (usage.memory_limit_mb,),
                    (usage.oom_killed,),
                )
                for usage in samples
            ]
        )

    def __len__(self) -> int:
        return sum(len(group.oom_killed) for group in self._groups)

    def groups(self) -> list[UsageGroup]:
        return list(self._groups)

    def samples(self) -> list[UsageSample]:
        """Every attempt of the history, one ``UsageSample`` each."""
        return self._of(self._groups)

    def exact(self, fingerprint: CostFingerprint) -> list[UsageSample]:
        """The attempts of exactly ``fingerprint``."""
        return self._of(self._by_fingerprint.get(fingerprint, ()))

    def similar(self, coarse: CostFingerprint) -> list[UsageSample]:
        """The attempts whose coarse fingerprint is ``coarse``."""
        if self._by_coarse is None:
            self._by_coarse = {}
            for fingerprint, groups in self._by_fingerprint.items():
                self._by_coarse.setdefault(fingerprint.coarse(), []).extend(groups)
        return self._of(self._by_coarse.get(coarse, ()))

    def _of(self, groups: Sequence[UsageGroup]) -> list[UsageSample]:
        found: list[UsageSample] = []
        for group in groups:
            samples = self._samples.get(id(group))
            if samples is None:
                samples = self._samples[id(group)] = group.samples()
            found.extend(samples)
        return found


History = UsageHistory | Sequence[UsageSample]
"""What a recommendation learns from: an indexed history, or plain samples (scanned)."""


@dataclass(frozen=True, slots=True)
class Recommendation:
    """Recommended resources for one job, and why."""

    memory_mb: int
    cpu: float
    confidence: Confidence
    samples: int
    """Measured attempts it rests on (0 for the physical estimate)."""
    evidence: str
    """For people and the ``submitted`` event, e.g.
    ``p95 of 37 runs of water_box ~2.7k atoms, +15 % memory; p90 of cores used``."""

    def as_resources(self) -> pb.Resources:
        return pb.Resources(cpu=self.cpu, memory_mb=self.memory_mb)


def bucket_of(atoms: int) -> int:
    """The atom-count bucket of ``atoms`` (-1 when unknown)."""
    if atoms <= 0:
        return -1
    return round(math.log(atoms) / math.log(ATOM_BUCKET_RATIO))


def bucket_atoms(bucket: int) -> int:
    """The atom count a bucket stands for."""
    return round(ATOM_BUCKET_RATIO**bucket)


def _short_count(count: int) -> str:
    if count >= 1_000_000:
        return f"{count / 1_000_000:.1f}M"
    if count >= 1000:
        return f"{count / 1000:.1f}k"
    return str(count)


def estimate_atoms(spec: pb.JobSpec) -> int:
    """The atom count of a normalized spec's system; 0 when it cannot be told from the spec
    (a structure in a file; a solvated structure is counted without its water)."""
    kind = spec.system.WhichOneof("kind")
    if kind == "water_box":
        return round(WATER_ATOMS_PER_NM3 * spec.system.water_box.box_nm**3)
    if kind == "lennard_jones":
        return int(spec.system.lennard_jones.atoms)
    if kind == "structure" and spec.system.structure.WhichOneof("source") == "pdb_content":
        lines = spec.system.structure.pdb_content.splitlines()
        return sum(1 for line in lines if line.startswith(("ATOM", "HETATM")))
    return 0


def threads_for(atoms: int) -> int:
    """CPU threads for a job without a stated CPU request: one thread up to 20,000 atoms (the
    most MD per core-hour: OpenMM's CPU platform scales poorly below ~10,000 atoms per thread),
    2 up to 100,000, 4 above."""
    if atoms < 20_000:
        return 1
    if atoms < 100_000:
        return 2
    return 4


def _digest(parts: Sequence[str]) -> str:
    """A short digest of ``parts`` ("" for none)."""
    if not parts:
        return ""
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def fingerprint_of(spec: pb.JobSpec, *, threads: int | None = None) -> CostFingerprint:
    """The cost fingerprint of a normalized spec; ``threads`` overrides ceil(resources.cpu)."""
    kind = spec.system.WhichOneof("kind") if spec.task != pb.TASK_ANALYZE else None
    variables = spec.system.lammps.variables if kind == "lammps" else {}
    return CostFingerprint(
        system_kind=kind or NO_SYSTEM,
        atom_bucket=bucket_of(estimate_atoms(spec)) if kind else -1,
        nonbonded_method=int(spec.nonbonded_method),
        cutoff_nm=round(round(spec.cutoff_nm / 0.05) * 0.05, 2),
        barostat=spec.barostat.pressure_bar > 0,
        integrator=int(spec.integrator),
        platform=(spec.platform or "CPU").upper(),
        threads=threads if threads is not None else max(1, math.ceil(spec.resources.cpu)),
        trajectory_interval_steps=int(spec.trajectory_interval_steps),
        checkpoint_interval_steps=int(spec.checkpoint_interval_steps),
        engine=engine_of(spec) if kind else "none",
        inputs=_digest(sorted(f"{each.name}={each.sha256}" for each in spec.inputs)),
        variables=_digest(sorted(f"{name}={value}" for name, value in variables.items())),
    )


def quantile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile of ``values`` (linear interpolation between closest ranks)."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("quantile of no values")
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def memory_margin(samples: int) -> float:
    """The margin over the peak quantile: 10 % from MANY_SAMPLES on, 20 % below (an MD job's
    peak is nearly the same every run: its arrays are sized by the system)."""
    return 0.10 if samples >= MANY_SAMPLES else 0.20


def _round_memory(memory_mb: float) -> int:
    rounded = math.ceil(memory_mb / MEMORY_STEP_MB) * MEMORY_STEP_MB
    return int(min(MAX_MEMORY_MB, max(MIN_MEMORY_MB, rounded)))


def _round_cpu(cpu: float) -> float:
    return min(MAX_CPU, max(MIN_CPU, math.ceil(round(cpu * 10, 6)) / 10))


def physical_memory_mb(atoms: int, threads: int, *, pme: bool = True) -> float:
    """The physical model's peak resident memory of a runner, in MiB (before the margin)."""
    base, per_kiloatom = (
        (PME_BASE_MB, PME_MB_PER_KILOATOM) if pme else (CUTOFF_BASE_MB, CUTOFF_MB_PER_KILOATOM)
    )
    return base + max(0, atoms) * per_kiloatom / 1000 + MB_PER_THREAD * (threads - 1)


def physical_estimate(
    fingerprint: CostFingerprint, *, atoms: int, cpu_asked: float = 0.0
) -> Recommendation:
    """A recommendation without history: the physical model plus PHYSICAL_MARGIN; the CPU is
    the fingerprint's threads, or the CPU the job asked for when that is less (nothing says
    it needs more)."""
    pme = fingerprint.nonbonded_method in (pb.NONBONDED_PME, pb.NONBONDED_METHOD_UNSPECIFIED)
    peak = physical_memory_mb(atoms, fingerprint.threads, pme=pme)
    if fingerprint.engine == LAMMPS:
        peak = LAMMPS_BASE_MB + MB_PER_THREAD * (fingerprint.threads - 1)
    memory = peak * (1 + PHYSICAL_MARGIN)
    if fingerprint.system_kind == NO_SYSTEM:
        what = "an analysis job"
    else:
        size = f"~{_short_count(atoms)} atoms" if atoms > 0 else "size unknown"
        what = f"{fingerprint.system_kind}, {size}"
    threads = "1 thread" if fingerprint.threads == 1 else f"{fingerprint.threads} threads"
    return Recommendation(
        memory_mb=_round_memory(memory),
        cpu=_cpu_at_most(float(fingerprint.threads), cpu_asked),
        confidence=Confidence.LOW,
        samples=0,
        evidence=(
            f"no history: physical estimate for {what}, {threads}, "
            f"+{PHYSICAL_MARGIN * 100:.0f} % memory"
        ),
    )


def _cpu_at_most(cpu: float, cpu_asked: float) -> float:
    """``cpu``, but not above what the job asked for (when it asked): a job's CPU use fills
    the cores it is given, so history at a larger allowance is no evidence it needs more."""
    return min(cpu, cpu_asked) if cpu_asked > 0 else cpu


def _matching(history: History, fingerprint: CostFingerprint) -> tuple[list[UsageSample], str]:
    if isinstance(history, UsageHistory):
        exact = history.exact(fingerprint)
    else:
        exact = [usage for usage in history if usage.fingerprint == fingerprint]
    if sum(1 for usage in exact if _measured(usage)) >= MIN_SAMPLES:
        return exact, ""
    coarse = fingerprint.coarse()
    if isinstance(history, UsageHistory):
        similar = history.similar(coarse)
    else:
        similar = [usage for usage in history if usage.fingerprint.coarse() == coarse]
    return similar, " (any intervals and integrator)"


def _measured(usage: UsageSample) -> bool:
    return not usage.oom_killed and usage.peak_memory_mb > 0


def recommend(
    fingerprint: CostFingerprint,
    *,
    atoms: int,
    history: History,
    cpu_asked: float = 0.0,
) -> Recommendation:
    """Recommend memory and CPU for a job of ``fingerprint`` from ``history`` (any attempts;
    those of other fingerprints are ignored). ``cpu_asked``: the cores the job asked for (0:
    none), which the CPU recommended never exceeds (a fraction of a core included: a job
    asking 0.5 runs one thread, like one asking 1, but is given half of it)."""
    matching, widened = _matching(history, fingerprint)
    measured = [usage for usage in matching if _measured(usage)]
    oom_limits = [usage.memory_limit_mb for usage in matching if usage.oom_killed]
    floor = max(oom_limits, default=0.0) * OOM_FLOOR_FACTOR
    if len(measured) < MIN_SAMPLES:
        estimate = physical_estimate(fingerprint, atoms=atoms, cpu_asked=cpu_asked)
        if floor <= estimate.memory_mb:
            return estimate
        return replace(
            estimate,
            memory_mb=_round_memory(floor),
            evidence=f"{estimate.evidence}; raised to {OOM_FLOOR_FACTOR:g} times the "
            f"{max(oom_limits):.0f} MiB an attempt was OOM-killed at",
        )
    count = len(measured)
    margin = memory_margin(count)
    peak = quantile([usage.peak_memory_mb for usage in measured], MEMORY_QUANTILE)
    memory = peak * (1 + margin)
    percent = round(MEMORY_QUANTILE * 100)
    evidence = (
        f"p{percent} of {count} runs of {fingerprint.describe(atoms)}{widened}, "
        f"+{margin * 100:.0f} % memory"
    )
    if floor > memory:
        memory = floor
        evidence += (
            f"; raised to {OOM_FLOOR_FACTOR:g} times the {max(oom_limits):.0f} MiB an attempt was "
            "OOM-killed at"
        )
    cores = quantile([usage.mean_cores for usage in measured], CPU_QUANTILE)
    throttled = [
        usage.cpu_limit
        for usage in measured
        if usage.cpu_limit > 0 and usage.mean_cores >= THROTTLED_FRACTION * usage.cpu_limit
    ]
    # never more than the fingerprint's threads: ceil(cpu) sets the threads, and OpenMM's
    # helper threads (and Python's) can lift the mean a little above them
    cpu = min(_round_cpu(cores), float(fingerprint.threads))
    evidence += f"; p{round(CPU_QUANTILE * 100)} of cores used"
    if throttled and max(throttled) > cpu:
        cpu = _round_cpu(max(throttled))
        evidence += ", kept at the allowance a throttled attempt used in full"
    if cpu_asked > 0 and cpu > cpu_asked:
        cpu = cpu_asked
        evidence += f", at most the {cpu_asked:g} asked for"
    return Recommendation(
        memory_mb=_round_memory(memory),
        cpu=cpu,
        confidence=Confidence.HIGH if count >= MANY_SAMPLES and not widened else Confidence.MEDIUM,
        samples=count,
        evidence=evidence,
    )


def recommend_for_spec(
    spec: pb.JobSpec, *, history: History, threads: int | None = None
) -> Recommendation:
    """:func:`recommend` for a normalized spec. ``threads`` defaults to the spec's CPU request;
    an ``auto`` job passes :func:`threads_for` of its atom count."""
    atoms = estimate_atoms(spec)
    fingerprint = fingerprint_of(spec, threads=threads)
    # the cores it asked for, unless told to recommend for other threads than they give
    asked = spec.resources.cpu if fingerprint.threads == math.ceil(spec.resources.cpu) else 0.0
    return recommend(fingerprint, atoms=atoms, history=history, cpu_asked=asked)


def auto_threads(spec: pb.JobSpec) -> int | None:
    """The threads an ``auto`` job is recommended for: its stated CPU request's, or, with the
    CPU left to intake, :func:`threads_for` its atom count; None for a job that is not auto."""
    if not spec.resources.auto:
        return None
    if spec.resources.cpu > 0:
        return max(1, math.ceil(spec.resources.cpu))
    return threads_for(estimate_atoms(spec))


def apply_recommendation(spec: pb.JobSpec, recommendation: Recommendation) -> pb.JobSpec:
    """A copy of a normalized spec with what ``resources.auto`` left unset filled in from
    ``recommendation`` (a stated value is kept); a spec that is not auto is returned as is."""
    filled = pb.JobSpec()
    filled.CopyFrom(spec)
    if spec.resources.auto:
        if filled.resources.cpu == 0:
            filled.resources.cpu = recommendation.cpu
        if filled.resources.memory_mb == 0:
            filled.resources.memory_mb = recommendation.memory_mb
    return filled


def recommendation_message(
    recommendation: Recommendation, *, applied: bool
) -> pb.ResourceRecommendation:
    """The recommendation as the ``submitted`` event records it."""
    return pb.ResourceRecommendation(
        memory_mb=recommendation.memory_mb,
        cpu=recommendation.cpu,
        confidence=str(recommendation.confidence),
        samples=recommendation.samples,
        evidence=recommendation.evidence,
        applied=applied,
    )


def recommend_job(
    spec: pb.JobSpec, *, history: History
) -> tuple[pb.JobSpec, pb.ResourceRecommendation]:
    """Intake's step: the spec with an ``auto`` job's resources filled in, and the
    recommendation to record with it (for a job that states its resources: what history would
    have chosen, for the same threads)."""
    recommendation = recommend_for_spec(spec, history=history, threads=auto_threads(spec))
    return _recommended_job(spec, recommendation)


def _recommended_job(
    spec: pb.JobSpec, recommendation: Recommendation
) -> tuple[pb.JobSpec, pb.ResourceRecommendation]:
    """``recommend_job``'s answer from its recommendation: an ``auto`` spec filled in (a
    copy), another one as itself."""
    resources = spec.resources
    applied = resources.auto and (resources.cpu == 0 or resources.memory_mb == 0)
    filled = apply_recommendation(spec, recommendation) if resources.auto else spec
    return filled, recommendation_message(recommendation, applied=applied)


RECOMMENDATION_MEMO_ENTRIES = 1024
"""The most recommendations a ``RecommendationMemo`` remembers (least recently used first out)."""


def recommendation_key(spec: pb.JobSpec) -> Hashable:
    """Everything of a normalized spec that ``recommend_job``'s recommendation depends on
    (``fingerprint_of``, ``estimate_atoms``, ``auto_threads``, the CPU asked and whether it is
    applied): two specs with equal keys get the same recommendation from the same history.
    tests/unit/test_recommend_memo.py changes every other field and checks that the recommendation
    does not move."""
    return (
        spec.task,
        spec.system.SerializeToString(deterministic=True),
        spec.resources.SerializeToString(deterministic=True),
        spec.nonbonded_method,
        spec.cutoff_nm,
        spec.barostat.pressure_bar,
        spec.integrator,
        spec.platform,
        spec.trajectory_interval_steps,
        spec.checkpoint_interval_steps,
        tuple([(each.name, each.sha256) for each in spec.inputs]) if spec.inputs else (),
    )


class RecommendationMemo:
    """``recommend_job`` that remembers its recommendations for one history (pure; a bounded
    LRU by ``recommendation_key``): a spec of a kind of job seen lately costs a look-up. Given
    another history object, it forgets everything; a history must not change in place (a
    ``UsageHistory`` does not: intake reads a new one)."""

    __slots__ = ("_history", "_known", "_size")

    def __init__(self, size: int = RECOMMENDATION_MEMO_ENTRIES) -> None:
        self._size = size
        self._history: History | None = None
        self._known: OrderedDict[Hashable, Recommendation] = OrderedDict()

    def __len__(self) -> int:
        return len(self._known)

    def recommendation(self, spec: pb.JobSpec, history: History) -> Recommendation:
        """``recommend_for_spec(spec, history=history, threads=auto_threads(spec))``."""
        if history is not self._history:
            self._known.clear()
            self._history = history
        key = recommendation_key(spec)
        known = self._known.get(key)
        if known is not None:
            self._known.move_to_end(key)
            return known
        known = self._known[key] = recommend_for_spec(
            spec, history=history, threads=auto_threads(spec)
        )
        if len(self._known) > self._size:
            self._known.popitem(last=False)
        return known

    def recommend_job(
        self, spec: pb.JobSpec, *, history: History
    ) -> tuple[pb.JobSpec, pb.ResourceRecommendation]:
        """``recommend_job(spec, history=history)``, remembered."""
        return _recommended_job(spec, self.recommendation(spec, history))
