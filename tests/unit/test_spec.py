"""Tables of named cases for submit validation (``mdq.core.spec``): defaults, ranges, names,
dependencies, cycles and ordering. Pure: no bus, no database."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import pytest

from mdq.contracts import pb
from mdq.core.ids import job_id
from mdq.core.spec import (
    MAX_JOBS_PER_SUBMIT,
    MAX_KEY_LENGTH,
    MAX_LABELS,
    SpecError,
    find_cycle,
    normalize_job,
    validate_submit,
)
from tests.helpers import attribute, lj

RID = "0123456789ab"
KNOWN_EXTERNAL = {
    "feedfacecafe-eq": "feedfacecafe-eq",  # a job id known to intake
    "earlier-key": "beefbeefbeef-prep",  # the key of an earlier single-job submit
}


def job(name: str = "a", **fields: object) -> pb.JobSpec:
    return pb.JobSpec(name=name, **fields)  # type: ignore[arg-type]


def submit(*jobs: pb.JobSpec, key: str = "k", submitted_by: str = "") -> pb.SubmitRequest:
    return pb.SubmitRequest(idempotency_key=key, jobs=jobs, submitted_by=submitted_by)


def resolve(ref: str) -> str | None:
    return KNOWN_EXTERNAL.get(ref)


def field_error(action: Callable[[], object]) -> SpecError:
    with pytest.raises(SpecError) as caught:
        action()
    return caught.value


# -- defaults --------------------------------------------------------------------------------

# (spec, {attribute path: expected value after normalisation})
DEFAULT_CASES = [
    pytest.param(
        job(),
        {
            "task": pb.TASK_MD,
            "system.water_box.box_nm": 2.0,
            "temperature_k": 300.0,
            "timestep_fs": 2.0,
            "friction_per_ps": 1.0,
            "steps": 10_000,
            "report_interval_steps": 500,
            "checkpoint_interval_steps": 5000,
            "resources.cpu": 1.0,
            "resources.memory_mb": 1024,
            "priority_class": "normal",
            "max_retries": 3,
            "convergence.reports": 0,
        },
        id="md-all-defaults",
    ),
    pytest.param(
        job(task=pb.TASK_MINIMIZE),
        {"steps": 500, "report_interval_steps": 500, "checkpoint_interval_steps": 500},
        id="minimize-defaults",
    ),
    pytest.param(
        job(steps=120),
        {"report_interval_steps": 120, "checkpoint_interval_steps": 120},
        id="short-run-intervals-capped-by-steps",
    ),
    pytest.param(
        job(steps=100_000, report_interval_steps=1000),
        {"checkpoint_interval_steps": 5000},
        id="checkpoint-default-keeps-explicit-report",
    ),
    pytest.param(
        job(steps=100_000, report_interval_steps=8000),
        {"checkpoint_interval_steps": 8000},
        id="checkpoint-default-never-below-report",
    ),
    pytest.param(
        job(convergence=pb.Convergence(tolerance_kj_mol=0.5)),
        {"convergence.tolerance_kj_mol": 0.5, "convergence.reports": 3},
        id="convergence-reports-default",
    ),
    pytest.param(job(max_retries=0), {"max_retries": 0}, id="explicit-zero-retries-kept"),
    pytest.param(
        job(
            task=pb.TASK_MD,
            system=pb.System(water_box=pb.WaterBox(box_nm=3.1)),
            temperature_k=350,
            timestep_fs=1,
            friction_per_ps=2,
            steps=2000,
            report_interval_steps=100,
            checkpoint_interval_steps=1000,
            resources=pb.Resources(cpu=2.5, memory_mb=2048),
            priority_class="high",
            max_retries=5,
        ),
        {
            "system.water_box.box_nm": 3.1,
            "temperature_k": 350.0,
            "timestep_fs": 1.0,
            "friction_per_ps": 2.0,
            "steps": 2000,
            "report_interval_steps": 100,
            "checkpoint_interval_steps": 1000,
            "resources.cpu": 2.5,
            "resources.memory_mb": 2048,
            "priority_class": "high",
            "max_retries": 5,
        },
        id="explicit-values-kept",
    ),
    pytest.param(
        job(task=pb.TASK_ANALYZE, depends_on=["md"]),
        {"task": pb.TASK_ANALYZE, "steps": 1, "report_interval_steps": 1},
        id="analyze-defaults",
    ),
]


@pytest.mark.parametrize(("spec", "expected"), DEFAULT_CASES)
def test_normalize_fills_defaults(spec: pb.JobSpec, expected: dict[str, object]) -> None:
    normalized = normalize_job(spec, "jobs[0]")
    actual = {path: attribute(normalized, path) for path in expected}
    assert actual == expected


def test_normalize_leaves_the_input_untouched() -> None:
    spec = job()
    normalize_job(spec, "jobs[0]")
    assert spec == job()


def test_analyze_gets_no_system() -> None:
    normalized = normalize_job(job(task=pb.TASK_ANALYZE, depends_on=["md"]), "jobs[0]")
    assert not normalized.HasField("system")


def test_normalize_is_idempotent() -> None:
    once = normalize_job(job(steps=3000, convergence=pb.Convergence(tolerance_kj_mol=1)), "j")
    assert normalize_job(once, "j") == once


# -- one bad field each: the error names it ----------------------------------------------------

TEN_TIB_IN_MIB = 10 * 1024 * 1024

# (spec, expected field path); the spec is always validated as jobs[2]
RANGE_CASES = [
    pytest.param(job("../etc"), "jobs[2].name", id="name-path-like"),
    pytest.param(job(""), "jobs[2].name", id="name-empty"),
    pytest.param(job("Upper"), "jobs[2].name", id="name-uppercase"),
    pytest.param(job("1abc"), "jobs[2].name", id="name-starts-with-digit"),
    pytest.param(job("a" * 41), "jobs[2].name", id="name-too-long"),
    pytest.param(job("a b"), "jobs[2].name", id="name-with-space"),
    pytest.param(job("a.b"), "jobs[2].name", id="name-with-dot"),
    pytest.param(job(task=99), "jobs[2].task", id="task-unknown"),
    pytest.param(
        job(system=pb.System(water_box=pb.WaterBox(box_nm=0.5))),
        "jobs[2].system.water_box.box_nm",
        id="box-too-small",
    ),
    pytest.param(
        job(system=pb.System(water_box=pb.WaterBox(box_nm=11))),
        "jobs[2].system.water_box.box_nm",
        id="box-too-big",
    ),
    pytest.param(job(temperature_k=0.5), "jobs[2].temperature_k", id="temperature-too-low"),
    pytest.param(job(temperature_k=6000), "jobs[2].temperature_k", id="temperature-too-high"),
    pytest.param(job(temperature_k=-300), "jobs[2].temperature_k", id="temperature-negative"),
    pytest.param(job(timestep_fs=0.01), "jobs[2].timestep_fs", id="timestep-too-small"),
    pytest.param(job(timestep_fs=10), "jobs[2].timestep_fs", id="timestep-too-big"),
    pytest.param(job(friction_per_ps=1000), "jobs[2].friction_per_ps", id="friction-too-big"),
    pytest.param(job(steps=-1), "jobs[2].steps", id="steps-negative"),
    pytest.param(job(steps=10**10 + 1), "jobs[2].steps", id="steps-too-many"),
    pytest.param(
        job(report_interval_steps=5), "jobs[2].report_interval_steps", id="report-too-often"
    ),
    pytest.param(
        job(report_interval_steps=10**8), "jobs[2].report_interval_steps", id="report-too-rare"
    ),
    pytest.param(
        job(report_interval_steps=1000, checkpoint_interval_steps=500),
        "jobs[2].checkpoint_interval_steps",
        id="checkpoint-below-report",
    ),
    pytest.param(
        job(convergence=pb.Convergence(tolerance_kj_mol=-1)),
        "jobs[2].convergence.tolerance_kj_mol",
        id="tolerance-negative",
    ),
    pytest.param(
        job(convergence=pb.Convergence(tolerance_kj_mol=1, reports=5000)),
        "jobs[2].convergence.reports",
        id="convergence-reports-too-many",
    ),
    pytest.param(
        job(resources=pb.Resources(cpu=0.01)), "jobs[2].resources.cpu", id="cpu-too-small"
    ),
    pytest.param(job(resources=pb.Resources(cpu=1000)), "jobs[2].resources.cpu", id="cpu-too-many"),
    pytest.param(job(resources=pb.Resources(cpu=math.nan)), "jobs[2].resources.cpu", id="cpu-nan"),
    pytest.param(
        job(resources=pb.Resources(cpu=math.inf)), "jobs[2].resources.cpu", id="cpu-infinite"
    ),
    pytest.param(
        job(resources=pb.Resources(memory_mb=TEN_TIB_IN_MIB)),
        "jobs[2].resources.memory_mb",
        id="memory-10-tib",
    ),
    pytest.param(
        job(resources=pb.Resources(memory_mb=32)),
        "jobs[2].resources.memory_mb",
        id="memory-too-small",
    ),
    pytest.param(job(priority_class="urgent"), "jobs[2].priority_class", id="priority-unknown"),
    pytest.param(job(max_retries=21), "jobs[2].max_retries", id="retries-too-many"),
    pytest.param(job(max_retries=-1), "jobs[2].max_retries", id="retries-negative"),
    pytest.param(
        job(labels={f"k{i}": "v" for i in range(MAX_LABELS + 1)}),
        "jobs[2].labels",
        id="labels-too-many",
    ),
    pytest.param(job(labels={"k" * 64: "v"}), f"jobs[2].labels[{'k' * 64!r}]", id="label-key-long"),
    pytest.param(job(labels={"k": "v" * 64}), "jobs[2].labels['k']", id="label-value-long"),
    pytest.param(
        job(clusters=pb.ClusterSelector(require={"site": ""})),
        "jobs[2].clusters.require['site']",
        id="cluster-require-empty-value",
    ),
    pytest.param(
        job(clusters=pb.ClusterSelector(prefer={"gpu type": "a100"})),
        "jobs[2].clusters.prefer['gpu type']",
        id="cluster-prefer-bad-key",
    ),
    pytest.param(
        job(clusters=pb.ClusterSelector(require={f"k{i}": "v" for i in range(17)})),
        "jobs[2].clusters.require",
        id="cluster-require-too-many",
    ),
    pytest.param(
        job(clusters=pb.ClusterSelector(require={"site\x00": "x"})),
        "jobs[2].clusters.require['site\\x00']",
        id="cluster-require-nul-key",
    ),
    pytest.param(job(depends_on=["md", ""]), "jobs[2].depends_on[1]", id="dependency-empty"),
    pytest.param(
        job(depends_on=["x" * (MAX_KEY_LENGTH + 1)]),
        "jobs[2].depends_on[0]",
        id="dependency-too-long",
    ),
    pytest.param(
        job(depends_on=["bad\x00ref"]), "jobs[2].depends_on[0]", id="dependency-unprintable"
    ),
    pytest.param(job(task=pb.TASK_ANALYZE), "jobs[2].depends_on", id="analyze-without-inputs"),
]


@pytest.mark.parametrize(("spec", "field"), RANGE_CASES)
def test_normalize_names_the_bad_field(spec: pb.JobSpec, field: str) -> None:
    error = field_error(lambda: normalize_job(spec, "jobs[2]"))
    assert error.field == field
    assert error.message
    assert str(error).startswith(field)


@pytest.mark.parametrize(("spec", "field"), RANGE_CASES)
def test_submit_with_one_bad_job_is_refused_whole(spec: pb.JobSpec, field: str) -> None:
    """The bad job sits third in the submit; its index shows in the path."""
    request = submit(job("md"), job("other"), spec)
    error = field_error(lambda: validate_submit(request, request_id=RID, resolve_external=resolve))
    assert error.field == field


# (spec, expected field, expected message): the whole error, word for word; validated as jobs[2]
MESSAGE_CASES = [
    pytest.param(
        job(temperature_k=6000),
        "jobs[2].temperature_k",
        "must be between 1 and 5000, got 6000.0",
        id="range",
    ),
    pytest.param(
        job(resources=pb.Resources(cpu=math.nan)),
        "jobs[2].resources.cpu",
        "must be between 0.1 and 256, got nan",
        id="range-in-a-sub-message",
    ),
    pytest.param(
        job(report_interval_steps=1000, checkpoint_interval_steps=500),
        "jobs[2].checkpoint_interval_steps",
        "must be between 1000 and 1000000000, got 500",
        id="range-bounded-by-another-field",
    ),
    pytest.param(
        job(convergence=pb.Convergence(tolerance_kj_mol=1, reports=5000)),
        "jobs[2].convergence.reports",
        "must be between 1 and 1000, got 5000",
        id="range-of-a-default-only-when-enabled",
    ),
    pytest.param(
        job(integrator=99),
        "jobs[2].integrator",
        "must be one of INTEGRATOR_LANGEVIN_MIDDLE, INTEGRATOR_LANGEVIN, INTEGRATOR_VERLET, "
        "INTEGRATOR_NOSE_HOOVER, got 99",
        id="enum",
    ),
    pytest.param(
        job(nonbonded_method=99),
        "jobs[2].nonbonded_method",
        "must be one of NONBONDED_PME, NONBONDED_CUTOFF_PERIODIC, NONBONDED_CUTOFF_NON_PERIODIC, "
        "NONBONDED_NO_CUTOFF, got 99",
        id="enum-method",
    ),
    pytest.param(
        job(trajectory_interval_steps=100, trajectory_format=7),
        "jobs[2].trajectory_format",
        "must be one of TRAJECTORY_DCD, TRAJECTORY_XTC, got 7",
        id="enum-trajectory",
    ),
    pytest.param(
        job(barostat=pb.Barostat(pressure_bar=1, frequency_steps=100_000)),
        "jobs[2].barostat.frequency_steps",
        "must be between 1 and 10000, got 100000",
        id="barostat-frequency",
    ),
    pytest.param(
        job(nonbonded_method=pb.NONBONDED_NO_CUTOFF),
        "jobs[2].nonbonded_method",
        "a water box is periodic: PME or CUTOFF_PERIODIC",
        id="water-box-method",
    ),
    pytest.param(
        job(system=pb.System(water_box=pb.WaterBox(box_nm=2)), cutoff_nm=1.2),
        "jobs[2].cutoff_nm",
        "must be below half the box edge (2 nm), got 1.2",
        id="water-box-cutoff",
    ),
    pytest.param(
        job(system=lj(atoms=1_000_001)),
        "jobs[2].system.lennard_jones.atoms",
        "must be between 2 and 1000000, got 1000001",
        id="lennard-jones-range",
    ),
    pytest.param(
        job(system=lj(atoms=200), cutoff_nm=1.5),
        "jobs[2].cutoff_nm",
        "must be below half the box edge (2.107 nm), got 1.5",
        id="lennard-jones-cutoff-of-the-job",
    ),
    pytest.param(
        job(system=lj(cutoff_nm=2.0)),
        "jobs[2].system.lennard_jones.cutoff_nm",
        "must be below half the box edge (3.603 nm), got 2.0",
        id="lennard-jones-cutoff-of-the-fluid",
    ),
    pytest.param(
        job(system=pb.System(structure=pb.Structure(pdb_path="a.pdb", padding_nm=11))),
        "jobs[2].system.structure.padding_nm",
        "must be between 0 and 10, got 11.0",
        id="structure-range",
    ),
    pytest.param(
        job(system=pb.System(structure=pb.Structure(pdb_path="a.pdb")), cutoff_nm=6),
        "jobs[2].cutoff_nm",
        "must be between 0.1 and 5, got 6.0",
        id="structure-cutoff",
    ),
]


@pytest.mark.parametrize(("spec", "field", "message"), MESSAGE_CASES)
def test_errors_read_the_same(spec: pb.JobSpec, field: str, message: str) -> None:
    """Field paths are only built when a check fails: the error still names the whole path."""
    error = field_error(lambda: normalize_job(spec, "jobs[2]"))
    assert (error.field, error.message, str(error)) == (field, message, f"{field}: {message}")


# -- whole-submit checks -----------------------------------------------------------------------

SUBMIT_ERROR_CASES = [
    pytest.param(submit(job(), key=""), True, "idempotency_key", id="key-required"),
    pytest.param(
        submit(job(), key="k" * (MAX_KEY_LENGTH + 1)), False, "idempotency_key", id="key-too-long"
    ),
    pytest.param(submit(job(), key="tab\tkey"), False, "idempotency_key", id="key-unprintable"),
    pytest.param(
        submit(job(), submitted_by="x" * (MAX_KEY_LENGTH + 1)),
        False,
        "submitted_by",
        id="submitter-too-long",
    ),
    pytest.param(submit(), False, "jobs", id="no-jobs"),
    pytest.param(
        submit(*(job(f"j{i}") for i in range(MAX_JOBS_PER_SUBMIT + 1))),
        False,
        "jobs",
        id="too-many-jobs",
    ),
    pytest.param(submit(job("a"), job("b"), job("a")), False, "jobs[2].name", id="duplicate-name"),
    pytest.param(
        submit(job("a"), job("b", depends_on=["a", "nope"])),
        False,
        "jobs[1].depends_on[1]",
        id="unknown-dependency",
    ),
    pytest.param(
        submit(job("a", depends_on=["0123456789ab-zzz"])),
        False,
        "jobs[0].depends_on[0]",
        id="unknown-job-id",
    ),
    pytest.param(
        submit(job("a", depends_on=["b"]), job("b", depends_on=["a"])),
        False,
        "jobs[0].depends_on",
        id="two-job-cycle",
    ),
    pytest.param(
        submit(job("x"), job("a", depends_on=["a"])),
        False,
        "jobs[1].depends_on",
        id="self-dependency",
    ),
    pytest.param(
        submit(
            job("root"),
            job("a", depends_on=["root", "c"]),
            job("b", depends_on=["a"]),
            job("c", depends_on=["b"]),
        ),
        False,
        "jobs[1].depends_on",
        id="three-job-cycle-below-a-root",
    ),
    # PostgreSQL stores no NUL character: refused before anything is published.
    pytest.param(
        submit(job(), submitted_by="al\x00ice"), False, "submitted_by", id="nul-submitter"
    ),
    pytest.param(
        submit(job("a"), job("b", labels={"team": "md\x00"})),
        False,
        "jobs[1].labels['team']",
        id="nul-label-value",
    ),
    pytest.param(
        submit(job("a", labels={"t\x00": "x"})),
        False,
        "jobs[0].labels['t\\x00']",  # the key as repr() shows it: no NUL in the reply
        id="nul-label-key",
    ),
    pytest.param(
        submit(job("a", depends_on=["b\x00"])), False, "jobs[0].depends_on[0]", id="nul-dependency"
    ),
    pytest.param(
        submit(job("a", system=pb.System(structure=pb.Structure(pdb_content="ATOM\x00")))),
        False,
        "jobs[0].system.structure.pdb_content",
        id="nul-deep-in-the-system",
    ),
]


@pytest.mark.parametrize(("request_", "key_required", "field"), SUBMIT_ERROR_CASES)
def test_validate_submit_names_the_bad_field(
    request_: pb.SubmitRequest, key_required: bool, field: str
) -> None:
    error = field_error(
        lambda: validate_submit(
            request_, request_id=RID, resolve_external=resolve, key_required=key_required
        )
    )
    assert error.field == field


def test_cycle_message_shows_the_loop() -> None:
    request = submit(
        job("a", depends_on=["b"]), job("b", depends_on=["c"]), job("c", depends_on=["a"])
    )
    error = field_error(lambda: validate_submit(request, request_id=RID, resolve_external=resolve))
    assert "a -> b -> c -> a" in error.message


def test_unknown_dependency_is_not_looked_up_when_it_is_a_name_here() -> None:
    asked: list[str] = []

    def recording(ref: str) -> str | None:
        asked.append(ref)
        return resolve(ref)

    validate_submit(
        submit(job("a"), job("b", depends_on=["a", "earlier-key"])),
        request_id=RID,
        resolve_external=recording,
    )
    assert asked == ["earlier-key"]


# -- accepted submits: ids, dependencies, order -------------------------------------------------

# (submit, expected [(name, depends_on_ids)] in publication order)
ACCEPT_CASES = [
    pytest.param(submit(job("solo")), [("solo", ())], id="single-job"),
    pytest.param(
        submit(job("c", depends_on=["b"]), job("b", depends_on=["a"]), job("a")),
        [("a", ()), ("b", (f"{RID}-a",)), ("c", (f"{RID}-b",))],
        id="chain-given-backwards-comes-out-dependencies-first",
    ),
    pytest.param(
        submit(
            job("report", task=pb.TASK_ANALYZE, depends_on=["left", "right"]),
            job("left", depends_on=["min"]),
            job("right", depends_on=["min"]),
            job("min", task=pb.TASK_MINIMIZE),
        ),
        [
            ("min", ()),
            ("left", (f"{RID}-min",)),
            ("right", (f"{RID}-min",)),
            ("report", (f"{RID}-left", f"{RID}-right")),
        ],
        id="diamond",
    ),
    pytest.param(
        submit(job("md", depends_on=["feedfacecafe-eq"])),
        [("md", ("feedfacecafe-eq",))],
        id="external-job-id",
    ),
    pytest.param(
        submit(job("md", depends_on=["earlier-key"])),
        [("md", ("beefbeefbeef-prep",))],
        id="external-key-of-single-job-submit",
    ),
    pytest.param(
        submit(job("a"), job("b", depends_on=["earlier-key", "a", "feedfacecafe-eq"])),
        [("a", ()), ("b", (f"{RID}-a", "beefbeefbeef-prep", "feedfacecafe-eq"))],
        id="internal-then-external-ids",
    ),
    pytest.param(
        submit(job("a"), job("b", depends_on=["a", "a", "earlier-key", "earlier-key"])),
        [("a", ()), ("b", (f"{RID}-a", "beefbeefbeef-prep"))],
        id="repeated-dependencies-collapse",
    ),
    pytest.param(
        submit(job("first"), job("second"), job("third")),
        [("first", ()), ("second", ()), ("third", ())],
        id="independent-jobs-keep-submit-order",
    ),
]


@pytest.mark.parametrize(("request_", "expected"), ACCEPT_CASES)
def test_validate_submit_orders_and_resolves(
    request_: pb.SubmitRequest, expected: list[tuple[str, tuple[str, ...]]]
) -> None:
    accepted = validate_submit(request_, request_id=RID, resolve_external=resolve)
    assert [(job.name, job.depends_on_ids) for job in accepted] == expected
    position = {job.name: index for index, job in enumerate(accepted)}
    for accepted_job in accepted:
        for name in accepted_job.depends_on_names:
            assert position[name] < position[accepted_job.name]


def test_accepted_jobs_are_normalized_and_keep_their_depends_on() -> None:
    (first, second) = validate_submit(
        submit(job("a"), job("b", depends_on=["a"])), request_id=RID, resolve_external=resolve
    )
    assert first.spec.steps == 10_000
    assert second.spec.depends_on == ["a"]
    assert second.depends_on_names == ("a",)
    assert job_id(RID, second.name) == f"{RID}-b"


def test_keyless_submit_is_fine_unless_required() -> None:
    accepted = validate_submit(submit(job(), key=""), request_id=RID, resolve_external=resolve)
    assert [job.name for job in accepted] == ["a"]


# -- find_cycle --------------------------------------------------------------------------------

CYCLE_CASES: list[object] = [
    pytest.param({}, None, id="empty"),
    pytest.param({"a": [], "b": ["a"], "c": ["b"]}, None, id="chain"),
    pytest.param({"a": [], "b": ["a"], "c": ["a"], "d": ["b", "c"]}, None, id="diamond"),
    pytest.param({"a": ["outside"]}, None, id="edge-to-unknown-node-ignored"),
    pytest.param({"a": ["a"]}, ["a", "a"], id="self-loop"),
    pytest.param({"a": ["b"], "b": ["a"]}, ["a", "b", "a"], id="two-cycle"),
    pytest.param(
        {"root": [], "a": ["root", "b"], "b": ["c"], "c": ["a"]},
        ["a", "b", "c", "a"],
        id="three-cycle-beside-a-root",
    ),
    pytest.param(
        {"x": ["y"], "y": [], "p": ["q"], "q": ["p"]}, ["p", "q", "p"], id="cycle-in-second-part"
    ),
]


@pytest.mark.parametrize(("edges", "expected"), CYCLE_CASES)
def test_find_cycle(edges: dict[str, Sequence[str]], expected: list[str] | None) -> None:
    assert find_cycle(edges) == expected


def test_find_cycle_on_a_long_chain() -> None:
    edges: dict[str, Sequence[str]] = {f"j{i}": [f"j{i - 1}"] if i else [] for i in range(500)}
    assert find_cycle(edges) is None
    edges["j0"] = ["j499"]
    cycle = find_cycle(edges)
    assert cycle is not None
    assert cycle[0] == cycle[-1]
    assert len(cycle) == 501


def test_jobs_without_dependencies_come_in_submit_order_with_none() -> None:
    accepted = validate_submit(
        submit(job("c"), job("a"), job("b", steps=7)), request_id=RID, resolve_external=resolve
    )
    assert [(j.name, j.depends_on_names, j.depends_on_ids) for j in accepted] == [
        ("c", (), ()),
        ("a", (), ()),
        ("b", (), ()),
    ]
    assert [j.spec for j in accepted] == [
        normalize_job(spec, f"jobs[{index}]")
        for index, spec in enumerate([job("c"), job("a"), job("b", steps=7)])
    ]
