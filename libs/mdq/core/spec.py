"""Validation and defaults of a submit (pure).

A submit is refused as a whole with the first problem found, named by its field path
("jobs[1].resources.memory_mb"), so the client can fix it. An accepted submit comes back with
every default filled in, which is what the log records: replaying it never depends on the
defaults of a later mdq version.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from mdq.contracts import pb
from mdq.core.ids import job_id

NAME_PATTERN = re.compile(r"^[a-z][a-z0-9-]{0,39}$")
PRIORITY_CLASSES: dict[str, int] = {"high": 1000, "normal": 500, "low": 100}
MAX_JOBS_PER_SUBMIT = 500
MAX_KEY_LENGTH = 200
MAX_LABELS = 32
MAX_LABEL_LENGTH = 63
MAX_DEPENDENCIES = 100


class SpecError(ValueError):
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


DEFAULT_STEPS = {pb.TASK_MD: 10_000, pb.TASK_MINIMIZE: 500, pb.TASK_ANALYZE: 1}


def _bound(value: float) -> str:
    return f"{value:.0f}" if float(value).is_integer() else f"{value:g}"


def _check_range(field: str, value: float, low: float, high: float) -> None:
    if not math.isfinite(value) or not low <= value <= high:
        raise SpecError(field, f"must be between {_bound(low)} and {_bound(high)}, got {value!r}")


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


def normalize_job(spec: pb.JobSpec, path: str) -> pb.JobSpec:
    """Return a copy of ``spec`` with defaults filled in; raise SpecError naming the bad field."""
    job = pb.JobSpec()
    job.CopyFrom(spec)
    if not NAME_PATTERN.fullmatch(job.name):
        raise SpecError(
            f"{path}.name",
            "must be 1 to 40 lowercase letters, digits or '-', starting with a letter",
        )
    if job.task not in pb.Task.values():
        raise SpecError(f"{path}.task", f"unknown task {job.task}")
    if job.task == pb.TASK_UNSPECIFIED:
        job.task = pb.TASK_MD
    if job.task != pb.TASK_ANALYZE:
        if not job.HasField("system") or job.system.WhichOneof("kind") is None:
            job.system.water_box.box_nm = 2.0
        box = job.system.water_box
        box.box_nm = _default(box.box_nm, 2.0)
        _check_range(f"{path}.system.water_box.box_nm", box.box_nm, 1.2, 10.0)
    job.temperature_k = _default(job.temperature_k, 300.0)
    _check_range(f"{path}.temperature_k", job.temperature_k, 1.0, 5000.0)
    job.timestep_fs = _default(job.timestep_fs, 2.0)
    _check_range(f"{path}.timestep_fs", job.timestep_fs, 0.1, 5.0)
    job.friction_per_ps = _default(job.friction_per_ps, 1.0)
    _check_range(f"{path}.friction_per_ps", job.friction_per_ps, 0.01, 100.0)
    job.steps = int(_default(job.steps, DEFAULT_STEPS[job.task]))
    _check_range(f"{path}.steps", job.steps, 1, 1e10)
    if job.report_interval_steps == 0:
        job.report_interval_steps = max(1, min(500, job.steps))
    else:
        _check_range(f"{path}.report_interval_steps", job.report_interval_steps, 10, 1e7)
    if job.checkpoint_interval_steps == 0:
        job.checkpoint_interval_steps = max(job.report_interval_steps, min(5000, job.steps))
    else:
        _check_range(
            f"{path}.checkpoint_interval_steps",
            job.checkpoint_interval_steps,
            job.report_interval_steps,
            1e9,
        )
    conv = job.convergence
    _check_range(f"{path}.convergence.tolerance_kj_mol", conv.tolerance_kj_mol, 0.0, 1e9)
    if conv.tolerance_kj_mol > 0:
        conv.reports = int(_default(conv.reports, 3))
        _check_range(f"{path}.convergence.reports", conv.reports, 1, 1000)
    job.resources.cpu = _default(job.resources.cpu, 1.0)
    _check_range(f"{path}.resources.cpu", job.resources.cpu, 0.1, 256)
    job.resources.memory_mb = int(_default(job.resources.memory_mb, 1024))
    _check_range(f"{path}.resources.memory_mb", job.resources.memory_mb, 64, 1_048_576)
    job.priority_class = job.priority_class or "normal"
    if job.priority_class not in PRIORITY_CLASSES:
        raise SpecError(f"{path}.priority_class", f"must be one of {', '.join(PRIORITY_CLASSES)}")
    if not job.HasField("max_retries"):
        job.max_retries = 3
    _check_range(f"{path}.max_retries", job.max_retries, 0, 20)
    if len(job.labels) > MAX_LABELS:
        raise SpecError(f"{path}.labels", f"at most {MAX_LABELS} labels")
    for key, value in job.labels.items():
        if not key or len(key) > MAX_LABEL_LENGTH or len(value) > MAX_LABEL_LENGTH:
            raise SpecError(
                f"{path}.labels[{key!r}]", f"keys and values are 1 to {MAX_LABEL_LENGTH} chars"
            )
    if len(job.depends_on) > MAX_DEPENDENCIES:
        raise SpecError(f"{path}.depends_on", f"at most {MAX_DEPENDENCIES} dependencies")
    for index, ref in enumerate(job.depends_on):
        if not ref or len(ref) > MAX_KEY_LENGTH or not ref.isprintable():
            raise SpecError(f"{path}.depends_on[{index}]", "must be a job name, id or key")
    if job.task == pb.TASK_ANALYZE and not job.depends_on:
        raise SpecError(f"{path}.depends_on", "an analyze job needs the jobs it analyzes")
    return job


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
) -> list[AcceptedJob]:
    """Validate a whole submit; return its jobs in an order where dependencies come first.

    ``resolve_external`` maps a dependency that is not a name in this submit (a job id, or the
    idempotency key of an earlier single-job submit) to a job id, or None if unknown.
    """
    validate_key(request.idempotency_key, required=key_required)
    if len(request.submitted_by) > MAX_KEY_LENGTH:
        raise SpecError("submitted_by", f"at most {MAX_KEY_LENGTH} characters")
    if not 1 <= len(request.jobs) <= MAX_JOBS_PER_SUBMIT:
        raise SpecError("jobs", f"a submit holds 1 to {MAX_JOBS_PER_SUBMIT} jobs")
    normalized: dict[str, pb.JobSpec] = {}
    for index, raw in enumerate(request.jobs):
        job = normalize_job(raw, f"jobs[{index}]")
        if job.name in normalized:
            raise SpecError(f"jobs[{index}].name", f"duplicate name {job.name!r}")
        normalized[job.name] = job
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
    cycle = find_cycle(internal)
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
