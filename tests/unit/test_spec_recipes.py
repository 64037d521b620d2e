"""Tables of named cases for the system recipes and engine settings of a job spec
(``mdq.core.spec``): defaults filled in, every bad value refused with its field path, and the
path tricks a structure path must not get away with. Pure: no bus, no OpenMM."""

from __future__ import annotations

import math

import pytest

from mdq.contracts import pb
from mdq.core.spec import (
    ARGON_SIGMA_NM,
    DEFAULT_FORCE_FIELDS,
    MAX_PDB_CONTENT_CHARS,
    SpecError,
    lennard_jones_box_nm,
    normalize_job,
)
from tests.helpers import attribute, lj

PDB = "ATOM      1  O   HOH A   1       0.000   0.000   0.000  1.00  0.00           O\n"


def job(**fields: object) -> pb.JobSpec:
    return pb.JobSpec(name="a", **fields)  # type: ignore[arg-type]


def structure(**fields: object) -> pb.System:
    return pb.System(structure=pb.Structure(**fields))  # type: ignore[arg-type]


# (spec, {attribute path: expected value after normalisation})
DEFAULT_CASES = [
    pytest.param(
        job(),
        {
            "integrator": pb.INTEGRATOR_LANGEVIN_MIDDLE,
            "nonbonded_method": pb.NONBONDED_PME,
            "cutoff_nm": 0.95,
            "platform": "CPU",
            "checkpoint_interval_s": 0.0,
            "trajectory_interval_steps": 0,
            "trajectory_format": pb.TRAJECTORY_FORMAT_UNSPECIFIED,
            "barostat.pressure_bar": 0.0,
            "barostat.frequency_steps": 0,
        },
        id="water-box-engine-defaults",
    ),
    pytest.param(
        job(system=pb.System(water_box=pb.WaterBox(box_nm=3))),
        {"cutoff_nm": 1.0},
        id="water-box-cutoff-capped-at-1nm",
    ),
    pytest.param(
        job(system=lj()),
        {
            "system.lennard_jones.atoms": 1000,
            "system.lennard_jones.sigma_nm": ARGON_SIGMA_NM,
            "system.lennard_jones.epsilon_kj_mol": 0.996,
            "system.lennard_jones.mass_dalton": 39.948,
            "system.lennard_jones.density_atoms_nm3": pytest.approx(0.8442 / ARGON_SIGMA_NM**3),
            "system.lennard_jones.cutoff_nm": pytest.approx(2.5 * ARGON_SIGMA_NM),
            "cutoff_nm": pytest.approx(2.5 * ARGON_SIGMA_NM),
            "nonbonded_method": pb.NONBONDED_CUTOFF_PERIODIC,
        },
        id="lj-argon-defaults",
    ),
    pytest.param(
        job(system=lj(sigma_nm=0.2)),
        {
            "system.lennard_jones.density_atoms_nm3": pytest.approx(0.8442 / 0.2**3),
            "cutoff_nm": pytest.approx(0.5),
        },
        id="lj-defaults-follow-sigma",
    ),
    pytest.param(
        job(system=lj(atoms=500), cutoff_nm=0.9),
        {"system.lennard_jones.cutoff_nm": 0.9, "cutoff_nm": 0.9},
        id="lj-cutoff-from-the-job",
    ),
    pytest.param(
        job(system=lj(atoms=500, cutoff_nm=0.9)),
        {"system.lennard_jones.cutoff_nm": 0.9, "cutoff_nm": 0.9},
        id="lj-cutoff-from-the-fluid",
    ),
    pytest.param(
        job(system=structure(pdb_content=PDB)),
        {
            "system.structure.force_fields": list(DEFAULT_FORCE_FIELDS),
            "system.structure.water_model": "tip3p",
            "nonbonded_method": pb.NONBONDED_METHOD_UNSPECIFIED,
            "cutoff_nm": 1.0,
        },
        id="structure-defaults-auto-method",
    ),
    pytest.param(
        job(system=structure(pdb_path="inputs/protein.pdb", padding_nm=1.0)),
        {"nonbonded_method": pb.NONBONDED_PME},
        id="solvated-structure-is-pme",
    ),
    pytest.param(
        job(system=structure(pdb_path="inputs/x.cif", force_fields=["charmm36.xml"])),
        {"system.structure.force_fields": ["charmm36.xml"]},
        id="explicit-force-fields-kept",
    ),
    pytest.param(
        job(barostat=pb.Barostat(pressure_bar=1.0)),
        {"barostat.pressure_bar": 1.0, "barostat.frequency_steps": 25},
        id="barostat-frequency-default",
    ),
    pytest.param(
        job(trajectory_interval_steps=100),
        {"trajectory_format": pb.TRAJECTORY_DCD},
        id="trajectory-dcd-by-default",
    ),
    pytest.param(
        job(trajectory_interval_steps=100, trajectory_format=pb.TRAJECTORY_XTC),
        {"trajectory_format": pb.TRAJECTORY_XTC},
        id="trajectory-xtc-kept",
    ),
    pytest.param(job(platform="cuda"), {"platform": "CUDA"}, id="platform-case-insensitive"),
    pytest.param(job(platform="opencl"), {"platform": "OpenCL"}, id="platform-opencl"),
    pytest.param(
        job(integrator=pb.INTEGRATOR_NOSE_HOOVER, checkpoint_interval_s=600),
        {"integrator": pb.INTEGRATOR_NOSE_HOOVER, "checkpoint_interval_s": 600.0},
        id="explicit-engine-values-kept",
    ),
]


@pytest.mark.parametrize(("spec", "expected"), DEFAULT_CASES)
def test_defaults(spec: pb.JobSpec, expected: dict[str, object]) -> None:
    normalized = normalize_job(spec, "jobs[0]")
    for path, value in expected.items():
        assert attribute(normalized, path) == value, path


@pytest.mark.parametrize(("spec", "expected"), DEFAULT_CASES)
def test_normalizing_twice_changes_nothing(spec: pb.JobSpec, expected: object) -> None:
    once = normalize_job(spec, "j")
    assert normalize_job(once, "j") == once


def test_lennard_jones_box_edge() -> None:
    fluid = normalize_job(job(system=lj(atoms=1000)), "j").system.lennard_jones
    assert lennard_jones_box_nm(fluid) == pytest.approx((1000 / fluid.density_atoms_nm3) ** (1 / 3))
    assert lennard_jones_box_nm(fluid) == pytest.approx(10 * ARGON_SIGMA_NM / 0.8442 ** (1 / 3))


# (field of the fluid, its value, a part of the message, id): each refused naming that field
FLUID_LIMITS: list[tuple[str, float, str, str]] = [
    ("atoms", 1, "between", "lj-1-atom"),
    ("atoms", 2_000_000, "between", "lj-too-many"),
    ("atoms", 20, "less than twice the cutoff", "lj-box-too-small-for-default-cutoff"),
    ("density_atoms_nm3", 5000, "between", "lj-density-too-high"),
    ("density_atoms_nm3", -1, "between", "lj-density-negative"),
    ("sigma_nm", math.nan, "", "lj-sigma-nan"),
    ("epsilon_kj_mol", 1000, "between", "lj-epsilon-too-deep"),
    ("mass_dalton", 0.1, "between", "lj-mass-too-small"),
]

# (pdb_path, a part of the message, id): each refused naming system.structure.pdb_path
PATH_TRICKS = [
    ("", "", "path-empty"),
    ("/etc/passwd", "relative", "path-absolute"),
    ("../other-job/x.pdb", "'..'", "path-dotdot-first"),
    ("inputs/../../etc/passwd", "'..'", "path-dotdot-inside"),
    ("inputs\\..\\x.pdb", "'\\'", "path-backslashes"),
    ("~/x.pdb", "relative", "path-home"),
    ("C:/x.pdb", "relative", "path-drive-letter"),
    ("x\x00.pdb", "printable", "path-nul"),
    ("a/" * 600 + "x.pdb", "1 to 1024", "path-too-long"),
]

# (spec, expected field path, a part of the message); validated as jobs[1]. A cutoff against its
# box, a water box without one and the barostat's frequency: tests/unit/test_spec.py's
# MESSAGE_CASES, with their whole messages.
ERROR_CASES = [
    # -- Lennard-Jones fluid
    *(
        pytest.param(
            job(system=lj(**{name: value})),
            f"system.lennard_jones.{name}",
            message,
            id=case,
        )
        for name, value, message, case in FLUID_LIMITS
    ),
    pytest.param(
        job(system=lj(cutoff_nm=0.9), cutoff_nm=1.0),
        "system.lennard_jones.cutoff_nm",
        "differs",
        id="lj-two-different-cutoffs",
    ),
    pytest.param(
        job(system=lj(), nonbonded_method=pb.NONBONDED_PME),
        "nonbonded_method",
        "CUTOFF_PERIODIC",
        id="lj-pme-refused",
    ),
    # -- water box
    pytest.param(job(cutoff_nm=0.05), "cutoff_nm", "between", id="cutoff-too-short"),
    pytest.param(
        job(nonbonded_method=42),
        "nonbonded_method",
        "must be one of NONBONDED_PME",
        id="method-unknown",
    ),
    # -- structure: source and path tricks
    pytest.param(job(system=structure()), "system.structure", "pdb_path or", id="no-source"),
    *(
        pytest.param(
            job(system=structure(pdb_path=path)), "system.structure.pdb_path", message, id=case
        )
        for path, message, case in PATH_TRICKS
    ),
    pytest.param(
        job(system=structure(pdb_content=PDB * (MAX_PDB_CONTENT_CHARS // len(PDB) + 1))),
        "system.structure.pdb_content",
        "at most 65536 characters",
        id="inline-too-big",
    ),
    pytest.param(
        job(system=structure(pdb_content="hello world")),
        "system.structure.pdb_content",
        "neither PDB",
        id="inline-not-a-structure",
    ),
    # -- structure: force fields, water, padding
    pytest.param(
        job(system=structure(pdb_content=PDB, force_fields=["/tmp/evil.xml"])),
        "system.structure.force_fields[0]",
        "relative",
        id="force-field-absolute",
    ),
    pytest.param(
        job(system=structure(pdb_content=PDB, force_fields=["amber14-all.xml", "../evil.xml"])),
        "system.structure.force_fields[1]",
        "'..'",
        id="force-field-dotdot",
    ),
    pytest.param(
        job(system=structure(pdb_content=PDB, force_fields=["amber14-all"])),
        "system.structure.force_fields[0]",
        "shipped with OpenMM",
        id="force-field-not-xml",
    ),
    pytest.param(
        job(system=structure(pdb_content=PDB, force_fields=["a.xml"] * 17)),
        "system.structure.force_fields",
        "at most 16",
        id="force-fields-too-many",
    ),
    pytest.param(
        job(system=structure(pdb_content=PDB, padding_nm=-1)),
        "system.structure.padding_nm",
        "between",
        id="padding-negative",
    ),
    pytest.param(
        job(system=structure(pdb_content=PDB, padding_nm=11)),
        "system.structure.padding_nm",
        "between",
        id="padding-too-big",
    ),
    pytest.param(
        job(system=structure(pdb_content=PDB, water_model="tip7p")),
        "system.structure.water_model",
        "one of",
        id="water-model-unknown",
    ),
    pytest.param(
        job(
            system=structure(pdb_content=PDB, padding_nm=1),
            nonbonded_method=pb.NONBONDED_CUTOFF_NON_PERIODIC,
        ),
        "nonbonded_method",
        "periodic",
        id="solvated-not-periodic",
    ),
    # -- engine
    pytest.param(
        job(integrator=17), "integrator", "must be one of INTEGRATOR_", id="integrator-unknown"
    ),
    pytest.param(
        job(integrator=pb.INTEGRATOR_VERLET, barostat=pb.Barostat(pressure_bar=1)),
        "barostat.pressure_bar",
        "thermostat",
        id="barostat-with-verlet",
    ),
    pytest.param(
        job(barostat=pb.Barostat(pressure_bar=-1)),
        "barostat.pressure_bar",
        "between",
        id="pressure-negative",
    ),
    pytest.param(
        job(barostat=pb.Barostat(frequency_steps=25)),
        "barostat.pressure_bar",
        "needed",
        id="frequency-without-pressure",
    ),
    pytest.param(job(platform="TPU"), "platform", "CPU, CUDA, OpenCL", id="platform-unknown"),
    pytest.param(
        job(checkpoint_interval_s=0.5), "checkpoint_interval_s", "between", id="ckpt-s-too-short"
    ),
    pytest.param(
        job(checkpoint_interval_s=-5), "checkpoint_interval_s", "between", id="ckpt-s-negative"
    ),
    pytest.param(
        job(trajectory_interval_steps=-1),
        "trajectory_interval_steps",
        "between",
        id="trajectory-negative",
    ),
    pytest.param(
        job(trajectory_format=pb.TRAJECTORY_XTC),
        "trajectory_interval_steps",
        "set it",
        id="trajectory-format-without-interval",
    ),
    pytest.param(
        job(trajectory_interval_steps=10, trajectory_format=9),
        "trajectory_format",
        "must be one of TRAJECTORY_",
        id="trajectory-format-unknown",
    ),
]


@pytest.mark.parametrize(("spec", "field", "message"), ERROR_CASES)
def test_bad_values_are_named(spec: pb.JobSpec, field: str, message: str) -> None:
    with pytest.raises(SpecError) as caught:
        normalize_job(spec, "jobs[1]")
    assert caught.value.field == f"jobs[1].{field}"
    assert message in caught.value.message


def test_analyze_jobs_ignore_the_system() -> None:
    spec = normalize_job(
        job(task=pb.TASK_ANALYZE, depends_on=["md"], system=structure()), "jobs[0]"
    )
    assert spec.system.WhichOneof("kind") == "structure", "kept as given, not validated"
