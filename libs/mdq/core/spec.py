"""Validation and defaults of a submit (pure).

A submit is refused as a whole with the first problem found, named by its field path
("jobs[1].resources.memory_mb"), so the client can fix it. An accepted submit comes back with
every default filled in, which is what the log records: replaying it never depends on the
defaults of a later mdq version.
"""

from __future__ import annotations

import math
import re
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Protocol

from google.protobuf.descriptor import EnumDescriptor

from mdq.contracts import pb
from mdq.core.clusters import selector_error
from mdq.core.ids import job_id
from mdq.core.lammps_script import check_variables
from mdq.core.text import first_nul
from mdq.errors import InvalidInput

NAME_PATTERN = re.compile(r"^[a-z][a-z0-9-]{0,39}$")
PRIORITY_CLASSES: dict[str, int] = {"high": 1000, "normal": 500, "low": 100}
MAX_WALL_S = 1e8
"""The most wall time a job may ask for (``max_wall_s``), about three years."""
MAX_DISK_MB = 1 << 30
"""The most disk a job may ask for (``max_disk_mb``, MiB): a PiB."""
MAX_JOBS_PER_SUBMIT = 500
MAX_KEY_LENGTH = 200
MAX_LABELS = 32
MAX_LABEL_LENGTH = 63
MAX_DEPENDENCIES = 100

# -- systems and engine settings ---------------------------------------------------------------
WATER_BOX_MAX_CUTOFF_NM = 1.0
CUTOFF_MARGIN_NM = 0.05
"""A default cutoff stays this far below half the box edge."""
CUTOFF_RANGE_NM = (0.1, 5.0)
ARGON_SIGMA_NM = 0.3405
ARGON_EPSILON_KJ_MOL = 0.996
ARGON_MASS_DALTON = 39.948
LJ_REDUCED_DENSITY = 0.8442
"""Default density of a Lennard-Jones fluid, in reduced units (rho sigma^3): the classic
benchmark state point near the triple point."""
LJ_CUTOFF_SIGMAS = 2.5
LJ_DEFAULT_ATOMS = 1000
DEFAULT_FORCE_FIELDS = ("amber14-all.xml", "amber14/tip3p.xml")
WATER_MODELS = ("tip3p", "spce", "tip4pew", "tip5p", "swm4ndp")
MAX_PDB_CONTENT_CHARS = 65_536
"""Inline structures travel in the job spec (and the runner's environment): keep them small;
larger ones go in a file under the data folder."""
MAX_PATH_CHARS = 1024
MAX_FORCE_FIELDS = 16
FORCE_FIELD_PATTERN = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_./-]{0,199}\.xml$")
PLATFORMS = {"cpu": "CPU", "cuda": "CUDA", "opencl": "OpenCL", "reference": "Reference"}
MAX_INPUTS = 64
MAX_INPUT_NAME_CHARS = 255
MAX_INPUT_BYTES = 1 << 40
"""A sanity bound on an input file's size; the real limit is its tenant's bucket."""
INPUT_NAME_PATTERN = re.compile(r"^[A-Za-z0-9._+/-]+$")
SHA256_PATTERN = re.compile(r"^[0-9a-f]{64}$")
RESERVED_INPUT_FOLDERS = ("deps",)
"""Folders of the working folder that are mdq's: ``deps/`` holds the dependencies' outputs."""
OPENMM_ONLY = (
    "temperature_k",
    "timestep_fs",
    "friction_per_ps",
    "integrator",
    "nonbonded_method",
    "cutoff_nm",
    "platform",
    "seed",
    "trajectory_interval_steps",
    "trajectory_format",
)
"""JobSpec fields of OpenMM's physics: a LAMMPS script sets these itself."""
DEFAULT_BAROSTAT_FREQUENCY = 25
PERIODIC_METHODS = (pb.NONBONDED_PME, pb.NONBONDED_CUTOFF_PERIODIC)

RANGES: dict[str, tuple[float, float]] = {
    "mdq.v1.JobSpec.temperature_k": (1.0, 5000.0),
    "mdq.v1.JobSpec.timestep_fs": (0.1, 5.0),
    "mdq.v1.JobSpec.friction_per_ps": (0.01, 100.0),
    "mdq.v1.JobSpec.steps": (1, 1e10),
    # at least min(10, steps): a job of a few steps may report every step
    "mdq.v1.JobSpec.report_interval_steps": (1, 1e7),
    # at least the report interval
    "mdq.v1.JobSpec.checkpoint_interval_steps": (1, 1e9),
    "mdq.v1.JobSpec.max_retries": (0, 20),
    "mdq.v1.JobSpec.checkpoint_interval_s": (1.0, 1e6),
    "mdq.v1.JobSpec.max_wall_s": (1.0, MAX_WALL_S),
    "mdq.v1.JobSpec.max_disk_mb": (1, MAX_DISK_MB),
    "mdq.v1.JobSpec.trajectory_interval_steps": (1, 1e9),
    "mdq.v1.JobSpec.cutoff_nm": CUTOFF_RANGE_NM,
    "mdq.v1.Convergence.tolerance_kj_mol": (0.0, 1e9),
    "mdq.v1.Convergence.reports": (1, 1000),
    "mdq.v1.Resources.cpu": (0.1, 256),
    "mdq.v1.Resources.memory_mb": (64, 1_048_576),
    "mdq.v1.Barostat.pressure_bar": (0.0, 1e5),
    "mdq.v1.Barostat.frequency_steps": (1, 10_000),
    "mdq.v1.WaterBox.box_nm": (1.2, 10.0),
    "mdq.v1.LennardJonesFluid.atoms": (2, 1_000_000),
    "mdq.v1.LennardJonesFluid.sigma_nm": (0.05, 2.0),
    "mdq.v1.LennardJonesFluid.epsilon_kj_mol": (0.001, 100.0),
    "mdq.v1.LennardJonesFluid.mass_dalton": (0.5, 1000.0),
    "mdq.v1.LennardJonesFluid.density_atoms_nm3": (0.01, 1000.0),
    "mdq.v1.LennardJonesFluid.cutoff_nm": CUTOFF_RANGE_NM,
    "mdq.v1.Structure.padding_nm": (0.0, 10.0),
}
"""The allowed range of each numeric field of a job (by its full protobuf name), where it is
fixed: the checks below use these, and a value the decoder cannot even read as a number says
this range (``mdq.core.documents``). 0 (or leaving a field out) means its default where it
has one."""


class SpecError(InvalidInput):
    """A submit that cannot be accepted; ``field`` is the path of the culprit."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}" if field else message)
        self.field = field
        self.message = message


@dataclass(frozen=True, slots=True)
class AcceptedJob:
    """One validated job of a submit, with its dependencies resolved to job ids."""

    name: str
    spec: pb.JobSpec
    depends_on_names: tuple[str, ...]
    depends_on_ids: tuple[str, ...]
    recommended: pb.ResourceRecommendation | None = None
    """What the resource recommender chose for it (intake; mdq.core.recommend)."""

    def with_spec(
        self, spec: pb.JobSpec, recommended: pb.ResourceRecommendation | None = None
    ) -> AcceptedJob:
        """This job with ``spec`` (and ``recommended``, when given) instead of its own:
        ``dataclasses.replace`` costs several times as much, once or twice per job."""
        return AcceptedJob(
            self.name,
            spec,
            self.depends_on_names,
            self.depends_on_ids,
            recommended if recommended is not None else self.recommended,
        )


DEFAULT_STEPS = {pb.TASK_MD: 10_000, pb.TASK_MINIMIZE: 500, pb.TASK_ANALYZE: 1}


_V1 = "mdq.v1."
_JOB = {
    name[len(f"{_V1}JobSpec.") :]: bounds
    for name, bounds in RANGES.items()
    if name.startswith(f"{_V1}JobSpec.")
}
_FLUID = {
    name[len(f"{_V1}LennardJonesFluid.") :]: bounds
    for name, bounds in RANGES.items()
    if name.startswith(f"{_V1}LennardJonesFluid.")
}

_TASKS = frozenset(pb.Task.values())
_INTEGRATORS = frozenset(pb.Integrator.values())
_NONBONDED_METHODS = frozenset(pb.NonbondedMethod.values())
_TRAJECTORY_FORMATS = frozenset(pb.TrajectoryFormat.values())


_ENUMS = {"integrator": "Integrator", "trajectory_format": "TrajectoryFormat"}
"""The enum type of each field checked by ``_enum_value``."""


class _Enum(Protocol):
    @property
    def DESCRIPTOR(self) -> EnumDescriptor: ...  # the generated name


def enum_choices(enum: _Enum | EnumDescriptor) -> str:
    """The names a client may give a field of this enum type, comma separated: every value
    but 0, the unset one (leaving the field out means its default)."""
    descriptor = enum if isinstance(enum, EnumDescriptor) else enum.DESCRIPTOR
    return ", ".join(value.name for value in descriptor.values if value.number != 0)


def _bound(value: float) -> str:
    return f"{value:.0f}" if float(value).is_integer() else f"{value:g}"


def _check_range(path: str, name: str, value: float, low: float, high: float) -> None:
    """SpecError on ``{path}.{name}`` unless ``low <= value <= high``; the field path is only
    built when it is reported (this runs for most fields of every job)."""
    if not math.isfinite(value) or not low <= value <= high:
        raise SpecError(
            f"{path}.{name}", f"must be between {_bound(low)} and {_bound(high)}, got {value!r}"
        )


def _default(value: float, default: float) -> float:
    return default if value == 0 else value


def validate_key(idempotency_key: str, *, required: bool) -> None:
    """Check the idempotency key of a submit."""
    if not idempotency_key:
        if required:
            raise SpecError("idempotency_key", "is required on request-reply submits")
        return
    if len(idempotency_key) > MAX_KEY_LENGTH or not idempotency_key.isprintable():
        raise SpecError("idempotency_key", f"must be 1 to {MAX_KEY_LENGTH} printable characters")


ForceFieldCheck = Callable[[str], bool]
"""Whether a force-field name is a file in a trusted folder (``mdq.forcefields``); the core
itself does no I/O, so the caller passes it in."""


def normalize_job(
    spec: pb.JobSpec, path: str, *, force_field_exists: ForceFieldCheck | None = None
) -> pb.JobSpec:
    """Return a copy of ``spec`` with defaults filled in; raise SpecError naming the bad field.
    With ``force_field_exists``, each force-field name must also pass it. Normalizing a
    normalized spec returns it unchanged (placement and the runner validate it again)."""
    job = pb.JobSpec()
    job.CopyFrom(spec)
    if not NAME_PATTERN.fullmatch(job.name):
        raise SpecError(
            f"{path}.name",
            "must be 1 to 40 lowercase letters, digits or '-', starting with a letter",
        )
    if job.task not in _TASKS:
        raise SpecError(f"{path}.task", f"must be one of {enum_choices(pb.Task)}, got {job.task}")
    if job.task == pb.TASK_UNSPECIFIED:
        job.task = pb.TASK_MD
    _normalize_inputs(job, path)
    if job.task != pb.TASK_ANALYZE and job.system.WhichOneof("kind") == "lammps":
        _normalize_lammps(job, path)
    else:
        _normalize_engine(job, path)
        if job.task != pb.TASK_ANALYZE:
            _normalize_system(job, path, force_field_exists)
        job.temperature_k = temperature_k = _default(job.temperature_k, 300.0)
        _check_range(path, "temperature_k", temperature_k, *_JOB["temperature_k"])
        job.timestep_fs = timestep_fs = _default(job.timestep_fs, 2.0)
        _check_range(path, "timestep_fs", timestep_fs, *_JOB["timestep_fs"])
        job.friction_per_ps = friction_per_ps = _default(job.friction_per_ps, 1.0)
        _check_range(path, "friction_per_ps", friction_per_ps, *_JOB["friction_per_ps"])
    job.steps = steps = int(_default(job.steps, DEFAULT_STEPS[job.task]))
    _check_range(path, "steps", steps, *_JOB["steps"])
    report = job.report_interval_steps
    if report == 0:
        job.report_interval_steps = report = max(1, min(500, steps))
    else:
        # a default below 10 (fewer steps than that) must pass again when re-validated
        low, high = _JOB["report_interval_steps"]
        _check_range(path, "report_interval_steps", report, max(low, min(10, steps)), high)
    if job.checkpoint_interval_steps == 0:
        job.checkpoint_interval_steps = max(report, min(5000, steps))
    else:
        low, high = _JOB["checkpoint_interval_steps"]
        checkpoint = job.checkpoint_interval_steps
        _check_range(path, "checkpoint_interval_steps", checkpoint, max(low, report), high)
    conv = job.convergence
    tolerance = conv.tolerance_kj_mol
    _check_range(
        path,
        "convergence.tolerance_kj_mol",
        tolerance,
        *RANGES[f"{_V1}Convergence.tolerance_kj_mol"],
    )
    if conv.tolerance_kj_mol > 0:
        conv.reports = int(_default(conv.reports, 3))
        _check_range(
            path, "convergence.reports", conv.reports, *RANGES[f"{_V1}Convergence.reports"]
        )
    resources = job.resources
    # resources.auto: what is left unset stays 0 here, for intake to choose
    # (mdq.core.recommend.apply_recommendation) before the job is recorded
    if not (resources.auto and resources.cpu == 0):
        resources.cpu = cpu = _default(resources.cpu, 1.0)
        _check_range(path, "resources.cpu", cpu, *RANGES[f"{_V1}Resources.cpu"])
    if not (resources.auto and resources.memory_mb == 0):
        resources.memory_mb = memory_mb = int(_default(resources.memory_mb, 1024))
        _check_range(path, "resources.memory_mb", memory_mb, *RANGES[f"{_V1}Resources.memory_mb"])
    job.priority_class = job.priority_class or "normal"
    if job.priority_class not in PRIORITY_CLASSES:
        raise SpecError(f"{path}.priority_class", f"must be one of {', '.join(PRIORITY_CLASSES)}")
    if not job.HasField("max_retries"):
        job.max_retries = 3
    _check_range(path, "max_retries", job.max_retries, *_JOB["max_retries"])
    if len(job.labels) > MAX_LABELS:
        raise SpecError(f"{path}.labels", f"at most {MAX_LABELS} labels")
    for key, value in job.labels.items():
        if not key or len(key) > MAX_LABEL_LENGTH or len(value) > MAX_LABEL_LENGTH:
            raise SpecError(
                f"{path}.labels[{key!r}]", f"keys and values are 1 to {MAX_LABEL_LENGTH} chars"
            )
    if (problem := selector_error(job.clusters)) is not None:
        raise SpecError(f"{path}.clusters.{problem[0]}", problem[1])
    if len(job.depends_on) > MAX_DEPENDENCIES:
        raise SpecError(f"{path}.depends_on", f"at most {MAX_DEPENDENCIES} dependencies")
    for index, ref in enumerate(job.depends_on):
        if not ref or len(ref) > MAX_KEY_LENGTH or not ref.isprintable():
            raise SpecError(f"{path}.depends_on[{index}]", "must be a job name, id or key")
    if job.task == pb.TASK_ANALYZE and not job.depends_on:
        raise SpecError(f"{path}.depends_on", "an analyze job needs the jobs it analyzes")
    return job


SPEC_MEMO_ENTRIES = 1024
"""The most specs a ``SpecMemo`` remembers (the least recently used goes first)."""
SPEC_MEMO_MAX_BYTES = 4096
"""A spec whose serialized form is longer than this many bytes is not remembered (an inline
structure, say): the memo's memory stays within a few MiB."""
_NAME_TAG = b"\x0a"
"""The wire tag of ``JobSpec.name`` (field 1, length-delimited)."""


def _memo_key(spec: pb.JobSpec) -> bytes | None:
    """The spec's deterministic serialization less its name; None when it is not remembered
    (too long, a name too long to be valid, or the name is not the leading record, which the
    serializer's field order makes it). Without the name the key still determines the rest of
    the spec exactly."""
    data = spec.SerializeToString(deterministic=True)
    name = spec.name.encode()
    if len(data) > SPEC_MEMO_MAX_BYTES or len(name) >= 0x80:  # a valid name's length: 1 byte
        return None
    head = _NAME_TAG + bytes((len(name),)) + name
    return data[len(head) :] if data.startswith(head) else None


class SpecMemo:
    """``normalize_job`` that remembers the specs it accepted (pure; a bounded LRU).

    A spec is remembered by its serialized bytes less its name: ``normalize_job`` reads the
    name only to check it, so a spec that equals an accepted one but for its name is accepted
    with the same defaults (its own name checked). A refused spec is not remembered (each
    refusal names its own field). ``force_field_exists`` must answer the same for a name as
    long as the memo lives (``services.intake.handlers.force_field_exists`` reads its folders
    once per process)."""

    __slots__ = ("_force_field_exists", "_known", "_size")

    def __init__(
        self, *, force_field_exists: ForceFieldCheck | None = None, size: int = SPEC_MEMO_ENTRIES
    ) -> None:
        self._force_field_exists = force_field_exists
        self._size = size
        self._known: OrderedDict[bytes, pb.JobSpec] = OrderedDict()
        """key -> the normalized spec of the first spec accepted under it."""

    def __len__(self) -> int:
        return len(self._known)

    def _normalized(self, spec: pb.JobSpec, path: str) -> pb.JobSpec:
        """The remembered normalized spec under ``spec``'s key (never to be changed: callers
        copy it), or one normalized now."""
        key = _memo_key(spec)
        if key is not None:
            known = self._known.get(key)
            if known is not None:
                if not NAME_PATTERN.fullmatch(spec.name):
                    normalize_job(spec, path)  # raises the name's SpecError
                self._known.move_to_end(key)
                return known
        job = normalize_job(spec, path, force_field_exists=self._force_field_exists)
        if key is not None:
            self._known[key] = job
            if len(self._known) > self._size:
                self._known.popitem(last=False)
        return job

    def normalize(self, spec: pb.JobSpec, path: str) -> pb.JobSpec:
        """``normalize_job(spec, path, force_field_exists=...)``: a new message each call."""
        job = pb.JobSpec()
        job.CopyFrom(self._normalized(spec, path))
        job.name = spec.name
        return job

    def check(self, spec: pb.JobSpec, path: str) -> None:
        """SpecError if ``normalize_job`` would refuse ``spec``."""
        self._normalized(spec, path)


def _enum_value(path: str, name: str, value: int, values: frozenset[int], default: int) -> int:
    """``value`` of a generated enum, its default when unset; SpecError on ``{path}.{name}``
    when it is not one of the enum's ``values``."""
    if value not in values:
        choices = enum_choices(getattr(pb, _ENUMS[name]))
        raise SpecError(f"{path}.{name}", f"must be one of {choices}, got {value}")
    return default if value == 0 else value


def _normalize_engine(job: pb.JobSpec, path: str) -> None:
    """Integrator, barostat, platform, checkpoint time and trajectory: defaults and ranges."""
    job.integrator = _enum_value(  # type: ignore[assignment]
        path, "integrator", job.integrator, _INTEGRATORS, pb.INTEGRATOR_LANGEVIN_MIDDLE
    )
    if job.nonbonded_method not in _NONBONDED_METHODS:
        choices = enum_choices(pb.NonbondedMethod)
        raise SpecError(
            f"{path}.nonbonded_method", f"must be one of {choices}, got {job.nonbonded_method}"
        )
    barostat = job.barostat
    pressure = barostat.pressure_bar
    _check_range(path, "barostat.pressure_bar", pressure, *RANGES[f"{_V1}Barostat.pressure_bar"])
    if barostat.pressure_bar > 0:
        if job.integrator == pb.INTEGRATOR_VERLET:
            raise SpecError(
                f"{path}.barostat.pressure_bar",
                "a barostat needs a thermostat: use a Langevin or Nose-Hoover integrator",
            )
        barostat.frequency_steps = int(
            _default(barostat.frequency_steps, DEFAULT_BAROSTAT_FREQUENCY)
        )
        frequency = barostat.frequency_steps
        _check_range(
            path, "barostat.frequency_steps", frequency, *RANGES[f"{_V1}Barostat.frequency_steps"]
        )
    elif barostat.frequency_steps:
        raise SpecError(f"{path}.barostat.pressure_bar", "is needed with frequency_steps (NPT)")
    platform = PLATFORMS.get((job.platform or "CPU").lower())
    if platform is None:
        raise SpecError(f"{path}.platform", f"must be one of {', '.join(PLATFORMS.values())}")
    job.platform = platform
    if job.checkpoint_interval_s != 0:
        seconds = job.checkpoint_interval_s
        _check_range(path, "checkpoint_interval_s", seconds, *_JOB["checkpoint_interval_s"])
    if job.max_wall_s != 0:  # 0: the tenant's limit (intake fills it in)
        _check_range(path, "max_wall_s", job.max_wall_s, *_JOB["max_wall_s"])
    if job.max_disk_mb != 0:
        _check_range(path, "max_disk_mb", job.max_disk_mb, *_JOB["max_disk_mb"])
    if job.trajectory_interval_steps != 0:
        every = job.trajectory_interval_steps
        _check_range(path, "trajectory_interval_steps", every, *_JOB["trajectory_interval_steps"])
        job.trajectory_format = _enum_value(  # type: ignore[assignment]
            path, "trajectory_format", job.trajectory_format, _TRAJECTORY_FORMATS, pb.TRAJECTORY_DCD
        )
    elif job.trajectory_format != pb.TRAJECTORY_FORMAT_UNSPECIFIED:
        raise SpecError(
            f"{path}.trajectory_interval_steps", "set it to write a trajectory in that format"
        )


def _check_cutoff(path: str, name: str, cutoff_nm: float, box_nm: float | None) -> None:
    _check_range(path, name, cutoff_nm, *CUTOFF_RANGE_NM)
    if box_nm is not None and cutoff_nm >= box_nm / 2:
        raise SpecError(
            f"{path}.{name}",
            f"must be below half the box edge ({box_nm:.4g} nm), got {cutoff_nm!r}",
        )


def _normalize_system(
    job: pb.JobSpec, path: str, force_field_exists: ForceFieldCheck | None
) -> None:
    """The system and its nonbonded method and cutoff: defaults, ranges, consistency."""
    system = job.system
    if not job.HasField("system") or system.WhichOneof("kind") is None:
        system.water_box.box_nm = 2.0
    kind = system.WhichOneof("kind")
    if kind == "water_box":
        box = system.water_box
        box.box_nm = box_nm = _default(box.box_nm, 2.0)
        _check_range(path, "system.water_box.box_nm", box_nm, *RANGES[f"{_V1}WaterBox.box_nm"])
        job.nonbonded_method = method = job.nonbonded_method or pb.NONBONDED_PME
        if method not in PERIODIC_METHODS:
            raise SpecError(
                f"{path}.nonbonded_method", "a water box is periodic: PME or CUTOFF_PERIODIC"
            )
        default_cutoff = min(WATER_BOX_MAX_CUTOFF_NM, box_nm / 2 - CUTOFF_MARGIN_NM)
        job.cutoff_nm = cutoff_nm = _default(job.cutoff_nm, default_cutoff)
        _check_cutoff(path, "cutoff_nm", cutoff_nm, box_nm)
    elif kind == "lennard_jones":
        _normalize_lennard_jones(job, path)
    elif kind == "structure":
        _normalize_structure(job, path, force_field_exists)
    elif kind == "openmm_xml":
        _normalize_openmm_xml(job, path)


def _normalize_inputs(job: pb.JobSpec, path: str) -> None:
    """The job's own input files: names that stay in its working folder, unique; the sha256
    and size of each (``mdq submit`` fills them in from the files)."""
    if len(job.inputs) > MAX_INPUTS:
        raise SpecError(f"{path}.inputs", f"at most {MAX_INPUTS} input files")
    seen: set[str] = set()
    for index, each in enumerate(job.inputs):
        here = f"{path}.inputs[{index}]"
        name = each.name
        parts = name.split("/")
        if (
            not name
            or len(name) > MAX_INPUT_NAME_CHARS
            or not INPUT_NAME_PATTERN.fullmatch(name)
            or any(part in ("", ".", "..") for part in parts)
        ):
            raise SpecError(
                f"{here}.name",
                f"must be a relative path of 1 to {MAX_INPUT_NAME_CHARS} letters, digits, '.', "
                f"'_', '-', '+' and '/', without '..', '.' or empty parts, got {name!r}",
            )
        if parts[0] in RESERVED_INPUT_FOLDERS and len(parts) > 1:
            raise SpecError(
                f"{here}.name",
                f"{parts[0]}/ is mdq's (the dependencies' outputs): name the file elsewhere",
            )
        if name in seen:
            raise SpecError(f"{here}.name", f"duplicate input file {name!r}")
        seen.add(name)
        if not SHA256_PATTERN.fullmatch(each.sha256):
            raise SpecError(
                f"{here}.sha256",
                "must be the file's sha256, 64 lowercase hex digits (mdq submit fills it in "
                "and uploads the file)",
            )
        _check_range(here, "size_bytes", each.size_bytes, 0, MAX_INPUT_BYTES)


def _input_named(job: pb.JobSpec, field: str, name: str, *, what: str) -> None:
    """SpecError on ``field`` unless ``name`` is one of the job's input files."""
    if not name:
        raise SpecError(field, f"must name the input file that is {what} (one of inputs)")
    if name not in {each.name for each in job.inputs}:
        raise SpecError(field, f"{name!r} is not one of the job's inputs: list it under inputs")


def _normalize_lammps(job: pb.JobSpec, path: str) -> None:
    """A LAMMPS job: its script is one of its inputs, its variables are safe, and OpenMM's
    physics fields are unset (the script sets them)."""
    here = f"{path}.system.lammps"
    lammps = job.system.lammps
    _input_named(job, f"{here}.script", lammps.script, what="the LAMMPS script")
    problem = check_variables(dict(lammps.variables))
    if problem is not None:
        name, why = problem
        field = f"{here}.variables[{name!r}]" if name else f"{here}.variables"
        raise SpecError(field, why)
    for name in OPENMM_ONLY:
        if getattr(job, name):
            raise SpecError(
                f"{path}.{name}",
                "is an OpenMM setting; a LAMMPS job sets its physics in its script "
                "(system.lammps.variables pass values to it)",
            )
    if job.HasField("barostat"):
        raise SpecError(
            f"{path}.barostat", "is an OpenMM setting; a LAMMPS job sets its fixes in its script"
        )
    if job.checkpoint_interval_s != 0:
        _check_range(path, "checkpoint_interval_s", job.checkpoint_interval_s, 1.0, 1e6)


def _normalize_openmm_xml(job: pb.JobSpec, path: str) -> None:
    """A serialized System and State: both are input files; the System holds its own
    nonbonded settings."""
    here = f"{path}.system.openmm_xml"
    source = job.system.openmm_xml
    _input_named(job, f"{here}.system_xml", source.system_xml, what="the System XML")
    _input_named(job, f"{here}.state_xml", source.state_xml, what="the State XML")
    for name in ("nonbonded_method", "cutoff_nm"):
        if getattr(job, name):
            raise SpecError(
                f"{path}.{name}", "is set by the serialized System's own forces, not the spec"
            )


def lennard_jones_box_nm(fluid: pb.LennardJonesFluid) -> float:
    """Edge of the cubic box of a (normalised) Lennard-Jones fluid, nm."""
    return float((fluid.atoms / fluid.density_atoms_nm3) ** (1.0 / 3.0))


def _normalize_lennard_jones(job: pb.JobSpec, path: str) -> None:
    fluid = job.system.lennard_jones
    here = f"{path}.system.lennard_jones"
    fluid.atoms = int(_default(fluid.atoms, LJ_DEFAULT_ATOMS))
    _check_range(here, "atoms", fluid.atoms, *_FLUID["atoms"])
    fluid.sigma_nm = _default(fluid.sigma_nm, ARGON_SIGMA_NM)
    _check_range(here, "sigma_nm", fluid.sigma_nm, *_FLUID["sigma_nm"])
    fluid.epsilon_kj_mol = _default(fluid.epsilon_kj_mol, ARGON_EPSILON_KJ_MOL)
    _check_range(here, "epsilon_kj_mol", fluid.epsilon_kj_mol, *_FLUID["epsilon_kj_mol"])
    fluid.mass_dalton = _default(fluid.mass_dalton, ARGON_MASS_DALTON)
    _check_range(here, "mass_dalton", fluid.mass_dalton, *_FLUID["mass_dalton"])
    fluid.density_atoms_nm3 = _default(
        fluid.density_atoms_nm3, LJ_REDUCED_DENSITY / fluid.sigma_nm**3
    )
    _check_range(here, "density_atoms_nm3", fluid.density_atoms_nm3, *_FLUID["density_atoms_nm3"])
    job.nonbonded_method = job.nonbonded_method or pb.NONBONDED_CUTOFF_PERIODIC
    if job.nonbonded_method != pb.NONBONDED_CUTOFF_PERIODIC:
        raise SpecError(
            f"{path}.nonbonded_method",
            "a Lennard-Jones fluid is periodic and uncharged: only NONBONDED_CUTOFF_PERIODIC",
        )
    if fluid.cutoff_nm and job.cutoff_nm and fluid.cutoff_nm != job.cutoff_nm:
        raise SpecError(
            f"{here}.cutoff_nm",
            f"differs from {path}.cutoff_nm ({job.cutoff_nm!r}): set one of them",
        )
    # a cutoff is reported on the fluid, unless only the job's own cutoff_nm was set
    owner = here if fluid.cutoff_nm or not job.cutoff_nm else path
    cutoff = fluid.cutoff_nm or job.cutoff_nm or LJ_CUTOFF_SIGMAS * fluid.sigma_nm
    box_nm = lennard_jones_box_nm(fluid)
    if not (fluid.cutoff_nm or job.cutoff_nm) and cutoff >= box_nm / 2:
        raise SpecError(
            f"{here}.atoms",
            f"the box of {fluid.atoms} atoms is {box_nm:.4g} nm wide, less than twice the "
            f"cutoff ({cutoff:.4g} nm): use more atoms",
        )
    _check_cutoff(owner, "cutoff_nm", cutoff, box_nm)
    fluid.cutoff_nm = job.cutoff_nm = cutoff


def _check_relative_path(field: str, value: str, *, what: str) -> PurePosixPath:
    """A relative path without '..' (so it cannot leave the folder it is resolved in)."""
    if not value or len(value) > MAX_PATH_CHARS or not value.isprintable():
        raise SpecError(field, f"must be a {what} of 1 to {MAX_PATH_CHARS} printable characters")
    relative = PurePosixPath(value)
    if value.startswith(("/", "\\", "~")) or re.match(r"^[A-Za-z]:", value):
        raise SpecError(field, f"must be relative (to the data folder), got {value!r}")
    if ".." in relative.parts or "\\" in value:
        raise SpecError(field, f"must not contain '..' or '\\', got {value!r}")
    return relative


def _normalize_structure(
    job: pb.JobSpec, path: str, force_field_exists: ForceFieldCheck | None
) -> None:
    structure = job.system.structure
    here = f"{path}.system.structure"
    source = structure.WhichOneof("source")
    if source is None:
        raise SpecError(here, "needs pdb_path or pdb_content")
    if source == "pdb_path":
        _check_relative_path(f"{here}.pdb_path", structure.pdb_path, what="path")
    else:
        content = structure.pdb_content
        if len(content) > MAX_PDB_CONTENT_CHARS:
            raise SpecError(
                f"{here}.pdb_content",
                f"at most {MAX_PDB_CONTENT_CHARS} characters inline, got {len(content)}: put "
                "larger structures in a file under the data folder and use pdb_path",
            )
        if not content.lstrip().startswith("data_") and not re.search(
            r"^(ATOM  |HETATM)", content, re.MULTILINE
        ):
            raise SpecError(
                f"{here}.pdb_content",
                "is neither PDB (no ATOM/HETATM records) nor PDBx (does not start with data_)",
            )
    if not structure.force_fields:
        structure.force_fields.extend(DEFAULT_FORCE_FIELDS)
    if len(structure.force_fields) > MAX_FORCE_FIELDS:
        raise SpecError(f"{here}.force_fields", f"at most {MAX_FORCE_FIELDS} force fields")
    for index, name in enumerate(structure.force_fields):
        field = f"{here}.force_fields[{index}]"
        _check_relative_path(field, name, what="force field file name")
        if not FORCE_FIELD_PATTERN.fullmatch(name):
            raise SpecError(
                field, f"must name a force field file shipped with OpenMM (*.xml), got {name!r}"
            )
        if "." in name.split("/")[:-1]:
            raise SpecError(field, f"must not contain '.' folders, got {name!r}")
        if force_field_exists is not None and not force_field_exists(name):
            raise SpecError(
                field,
                f"{name!r} is not a force field shipped with OpenMM nor in the operator's "
                "force-field folder (MDQ_FORCEFIELD_DIR); files in the working or data folder "
                "are never loaded",
            )
    _check_range(here, "padding_nm", structure.padding_nm, *RANGES[f"{_V1}Structure.padding_nm"])
    structure.water_model = structure.water_model or "tip3p"
    if structure.water_model not in WATER_MODELS:
        raise SpecError(f"{here}.water_model", f"must be one of {', '.join(WATER_MODELS)}")
    if structure.padding_nm > 0:
        job.nonbonded_method = job.nonbonded_method or pb.NONBONDED_PME
        if job.nonbonded_method not in PERIODIC_METHODS:
            raise SpecError(
                f"{path}.nonbonded_method",
                "a solvated structure is periodic: PME or CUTOFF_PERIODIC",
            )
    job.cutoff_nm = _default(job.cutoff_nm, WATER_BOX_MAX_CUTOFF_NM)
    _check_cutoff(path, "cutoff_nm", job.cutoff_nm, None)


def find_cycle(edges: Mapping[str, Sequence[str]]) -> list[str] | None:
    """Return one dependency cycle (as a list of names) in ``edges``, or None."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in edges.get(node, ()):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and nxt in edges and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for start in edges:
        if start not in state and (found := visit(start)):
            return found
    return None


def validate_submit(
    request: pb.SubmitRequest,
    *,
    request_id: str,
    resolve_external: Callable[[str], str | None],
    key_required: bool = False,
    force_field_exists: ForceFieldCheck | None = None,
    specs: SpecMemo | None = None,
) -> list[AcceptedJob]:
    """Validate a whole submit; return its jobs in an order where dependencies come first.

    ``resolve_external`` maps a dependency that is not a name in this submit (a job id, or the
    idempotency key of an earlier single-job submit) to a job id, or None if unknown. With
    ``specs``, each job is normalized by it (its own force-field check applies, not
    ``force_field_exists``).
    """
    validate_key(request.idempotency_key, required=key_required)
    if (field := first_nul(request)) is not None:  # PostgreSQL could not store it
        raise SpecError(field, "must not contain NUL characters")
    if len(request.submitted_by) > MAX_KEY_LENGTH:
        raise SpecError("submitted_by", f"at most {MAX_KEY_LENGTH} characters")
    if not 1 <= len(request.jobs) <= MAX_JOBS_PER_SUBMIT:
        raise SpecError("jobs", f"a submit holds 1 to {MAX_JOBS_PER_SUBMIT} jobs")
    normalized: dict[str, pb.JobSpec] = {}
    for index, raw in enumerate(request.jobs):
        path = f"jobs[{index}]"
        if specs is not None:
            job = specs.normalize(raw, path)
        else:
            job = normalize_job(raw, path, force_field_exists=force_field_exists)
        if job.name in normalized:
            raise SpecError(f"jobs[{index}].name", f"duplicate name {job.name!r}")
        normalized[job.name] = job
    if not any(job.depends_on for job in normalized.values()):  # most submits: in their order
        return [AcceptedJob(name, job, (), ()) for name, job in normalized.items()]
    internal: dict[str, list[str]] = {}
    external: dict[str, list[str]] = {}
    for index, (name, job) in enumerate(normalized.items()):
        internal[name], external[name] = [], []
        for dep_index, ref in enumerate(job.depends_on):
            if ref in normalized:
                internal[name].append(ref)
                continue
            resolved = resolve_external(ref)
            if resolved is None:
                raise SpecError(
                    f"jobs[{index}].depends_on[{dep_index}]", f"unknown dependency {ref!r}"
                )
            external[name].append(resolved)
    cycle = find_cycle(internal) if any(internal.values()) else None
    if cycle:
        first = list(normalized).index(cycle[0])
        raise SpecError(f"jobs[{first}].depends_on", f"dependency cycle: {' -> '.join(cycle)}")
    ordered: list[AcceptedJob] = []
    done: set[str] = set()

    def emit(name: str) -> None:
        if name in done:
            return
        for dep in internal[name]:
            emit(dep)
        done.add(name)
        ids = [job_id(request_id, dep) for dep in internal[name]] + external[name]
        ordered.append(
            AcceptedJob(
                name=name,
                spec=normalized[name],
                depends_on_names=tuple(internal[name]),
                depends_on_ids=tuple(dict.fromkeys(ids)),
            )
        )

    for name in normalized:
        emit(name)
    return ordered
