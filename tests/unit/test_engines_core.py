"""Tables of named cases for the engines' pure core: which engine runs a job
(``mdq.core.engines``), what a LAMMPS script may do (``mdq.core.lammps_script``), LAMMPS's units
in mdq's (``mdq.core.lammps_units``), the validation of input files, LAMMPS and serialized
OpenMM systems (``mdq.core.spec``), and the engine in the cost fingerprint
(``mdq.core.recommend``)."""

from __future__ import annotations

import pytest

from mdq.contracts import pb
from mdq.core.engines import LAMMPS, OPENMM, engine_of
from mdq.core.lammps_script import (
    ScriptError,
    check_command,
    check_script,
    check_variables,
    parse_script,
    split_words,
)
from mdq.core.lammps_units import EV_KJ_MOL, UNITS, factors
from mdq.core.recommend import LAMMPS_BASE_MB, fingerprint_of, physical_estimate
from mdq.core.spec import SpecError, normalize_job
from tests.helpers import with_fields
from tests.tables import named_cases

SHA = "a" * 64
SHA2 = "b" * 64


def lammps_job(**fields: object) -> pb.JobSpec:
    spec = pb.JobSpec(
        name="melt",
        system=pb.System(lammps=pb.LammpsInput(script="in.melt")),
        inputs=[pb.InputFile(name="in.melt", sha256=SHA, size_bytes=100)],
    )
    for name, value in fields.items():
        if name == "variables":
            spec.system.lammps.variables.update(value)  # type: ignore[call-overload]
        elif name == "inputs":
            del spec.inputs[:]
            spec.inputs.extend(value)  # type: ignore[arg-type]
        elif name == "barostat":
            spec.barostat.CopyFrom(value)  # type: ignore[arg-type]
        else:
            setattr(spec, name, value)
    return spec


def openmm_xml_job(**fields: object) -> pb.JobSpec:
    """A job of a serialized OpenMM System and its State, both among its inputs; ``fields``
    set on it."""
    spec = pb.JobSpec(
        name="x",
        system=pb.System(openmm_xml=pb.OpenMMSystemXml(system_xml="s.xml", state_xml="t.xml")),
        inputs=[pb.InputFile(name="s.xml", sha256=SHA), pb.InputFile(name="t.xml", sha256=SHA2)],
    )
    return with_fields(spec, fields)


# -- which engine ------------------------------------------------------------------------------
ENGINE_CASES = [
    ("a water box runs on OpenMM", pb.System(water_box=pb.WaterBox()), OPENMM),
    (
        "a Lennard-Jones fluid runs on OpenMM",
        pb.System(lennard_jones=pb.LennardJonesFluid()),
        OPENMM,
    ),
    ("a serialized System runs on OpenMM", pb.System(openmm_xml=pb.OpenMMSystemXml()), OPENMM),
    ("a LAMMPS script runs on LAMMPS", pb.System(lammps=pb.LammpsInput(script="in")), LAMMPS),
    ("no system is the default water box: OpenMM", pb.System(), OPENMM),
]


@named_cases(("system", "engine"), ENGINE_CASES)
def test_the_system_chooses_the_engine(system: pb.System, engine: str) -> None:
    assert engine_of(pb.JobSpec(name="a", system=system)) == engine


# -- splitting a script ------------------------------------------------------------------------
SPLIT_CASES = [
    ("plain words", "pair_coeff 1 1 1.0 1.0 2.5", ["pair_coeff", "1", "1", "1.0", "1.0", "2.5"]),
    ("a comment is dropped", "run 10 # the rest", ["run", "10"]),
    ("double quotes group", 'print "a b # c"', ["print", "a b # c"]),
    ("single quotes group", "print 'x y'", ["print", "x y"]),
    ("triple quotes group", 'print """a "b" c"""', ["print", 'a "b" c']),
]


@named_cases(("text", "words"), SPLIT_CASES)
def test_split_words(text: str, words: list[str]) -> None:
    assert [word.text for word in split_words(text)] == words


def test_continuations_join_and_lines_are_counted() -> None:
    commands = parse_script(
        "units lj\n\n# a comment\nregion box block &\n  0 1 0 1 0 1\nmass 1 1.0\n"
    )
    assert [(c.line, c.name) for c in commands] == [(1, "units"), (4, "region"), (6, "mass")]
    assert [w.text for w in commands[1].words][-6:] == ["0", "1", "0", "1", "0", "1"]


def test_a_triple_quote_spans_lines() -> None:
    commands = parse_script('print """one\ntwo"""\nunits lj\n')
    assert [(c.line, c.name) for c in commands] == [(1, "print"), (3, "units")]


def test_an_unterminated_quote_names_its_line() -> None:
    with pytest.raises(ScriptError, match=r"line 2: .*unterminated"):
        parse_script('units lj\nprint "no end\n')


# -- what a script may do ----------------------------------------------------------------------
ALLOWED = [
    ("the LJ melt's setup", "lattice fcc 0.8442"),
    ("a relative data file", "read_data data/cu.data"),
    ("a potential by name", "pair_coeff * * Cu_u3.eam Cu"),
    ("a formula with a division", "variable a equal (v_x+1)/2"),
    ("a dump in the working folder", "dump 1 all custom 100 dump.*.lammpstrj id type x y z"),
    ("print to a file of the folder", 'print "done" file done.txt'),
    ("an include of an input file", "include in.settings"),
    ("a style with a slash", "fix 1 all ave/time 10 10 100 c_msd[4] file msd.txt"),
    ("a variable in a path, checked when it runs", "read_data ${data}"),
    ("an ellipsis is not a parent folder", 'print "wait..."'),
]


@named_cases(("line",), ALLOWED)
def test_allowed_commands(line: str) -> None:
    check_script(line)


REFUSED = [
    ("shell", "shell rm -rf /tmp/x", "'shell' is refused: it runs programs"),
    ("python", 'python f input 1 v_x format f here "def f(x): pass"', "runs Python"),
    ("fix python/invoke", "fix 1 all python/invoke 10 end_of_step f", "'python/invoke' is refused"),
    ("pair_style python", "pair_style python 2.5", "'python' is refused"),
    ("mliappy model", "pair_style mliap model mliappy m.pt descriptor sna d", "pickle"),
    ("a python variable", "variable x python f", "'python' is refused"),
    ("getenv", "variable h getenv HOME", "environment"),
    ("plugin", "plugin load evil.so", "compiled code"),
    ("geturl", "geturl https://example.org/x", "network"),
    ("kim", "kim init SW_StillingerWeber_1985_Si__MO_405512056662_006 metal", "OpenKIM"),
    ("movie dump", "dump m all movie 100 m.mpg type type", "ffmpeg"),
    ("an absolute read", "read_data /etc/passwd", "absolute paths"),
    ("an absolute include", "include /home/alice/in.x", "absolute paths"),
    ("a parent folder", "include ../other-job/in.x", "'..' is refused"),
    ("a parent folder inside", "read_data data/../../x", "'..' is refused"),
    ("a home folder", "read_data ~/x.data", "absolute paths and '~'"),
    ("print to an absolute file", 'print "x" file /tmp/out', "absolute paths"),
    ("a quoted absolute path", 'print "x" file "/tmp/out"', "absolute paths"),
    ("an absolute path in a formula", "variable e equal is_file(/etc/passwd)", "absolute paths"),
    ("a backslash", "read_data data\\x.data", "backslash"),
    ("a gzipped dump (popen of gzip)", "dump 1 all atom 100 'd.gz;curl x|sh;.gz'", "compressed"),
    ("a compressed data file", "read_data cu.data.bz2", "running a program"),
    ("the script's own run", "run 1000", "mdq runs the steps"),
    ("the script's own minimize", "minimize 1e-4 1e-6 100 1000", "minimisation"),
    ("log", "log my.log", "thermo log"),
    ("restart", "restart 1000 a.restart b.restart", "restart files"),
    ("if", 'if "${a} > 1" then "print x"', "substituted only as they run"),
    ("jump", "jump SELF loop", "once each"),
    ("label", "label loop", "once each"),
    ("quit", "quit", "decides when the run ends"),
]


@named_cases(("line", "why"), REFUSED)
def test_refused_commands_are_named_with_their_line(line: str, why: str) -> None:
    with pytest.raises(ScriptError) as caught:
        check_script(f"units lj\n\n{line}\n")
    assert caught.value.line == 3
    assert str(caught.value).startswith(f"line 3: {line[:20]}")
    assert why in str(caught.value)


def test_after_substitution_a_dollar_is_refused() -> None:
    (command,) = parse_script("read_data ${x}")
    check_command(command)  # at submit: the variable is checked when it runs
    with pytest.raises(ScriptError, match="holds another variable"):
        check_command(command, expanded=True)


def test_a_long_line_is_shortened_in_the_message() -> None:
    with pytest.raises(ScriptError) as caught:
        check_script("shell " + "x" * 200)
    assert len(caught.value.command) > 80 and "..." in str(caught.value)


VARIABLE_CASES = [
    ("fine", {"T": "1200", "N_cells": "10"}, None),
    ("a bad name", {"1T": "1"}, "1T"),
    ("an empty value", {"T": " "}, "T"),
    ("an absolute path", {"f": "/etc/passwd"}, "f"),
    ("a parent folder", {"f": "../x"}, "f"),
]


@named_cases(("variables", "culprit"), VARIABLE_CASES)
def test_variables(variables: dict[str, str], culprit: str | None) -> None:
    problem = check_variables(variables)
    assert (problem[0] if problem else None) == culprit


# -- units -------------------------------------------------------------------------------------
UNIT_CASES = [
    ("metal: eV", "metal", "energy_kj_mol", EV_KJ_MOL),
    ("real: kcal/mol", "real", "energy_kj_mol", 4.184),
    ("real: fs", "real", "time_ps", 1e-3),
    ("real: atm", "real", "pressure_bar", 1.01325),
    ("metal: Å³", "metal", "volume_nm3", 1e-3),
    ("si: J per system", "si", "energy_kj_mol", 6.02214076e20),
    ("si: Pa", "si", "pressure_bar", 1e-5),
    ("nano: attogram/nm³", "nano", "density_g_cm3", 1e3),
    ("electron: Hartree", "electron", "energy_kj_mol", 2625.4996394798254),
]


@named_cases(("units", "what", "factor"), UNIT_CASES)
def test_unit_factors(units: str, what: str, factor: float) -> None:
    assert getattr(factors(units), what) == pytest.approx(factor, rel=1e-9)


def test_every_lammps_unit_style_is_known_and_only_lj_is_reduced() -> None:
    assert set(UNITS) == {"lj", "real", "metal", "si", "cgs", "electron", "micro", "nano"}
    assert [name for name, each in UNITS.items() if each.reduced] == ["lj"]
    assert factors("lj").label == "lj" and factors("metal").label == ""
    with pytest.raises(KeyError):
        factors("imperial")


# -- validation --------------------------------------------------------------------------------
def test_a_lammps_job_keeps_its_physics_in_its_script() -> None:
    spec = normalize_job(lammps_job(variables={"T": "1200"}), "jobs[0]")
    assert (spec.temperature_k, spec.timestep_fs, spec.integrator, spec.platform) == (0, 0, 0, "")
    assert spec.steps == 10_000 and spec.report_interval_steps == 500
    assert normalize_job(spec, "jobs[0]") == spec  # normalizing again changes nothing


SPEC_CASES = [
    (
        "a script that is not an input",
        lammps_job(inputs=[]),
        "jobs[0].system.lammps.script",
        "not one of",
    ),
    (
        "no script",
        pb.JobSpec(name="a", system=pb.System(lammps=pb.LammpsInput())),
        "jobs[0].system.lammps.script",
        "must name",
    ),
    ("an OpenMM temperature", lammps_job(temperature_k=300.0), "jobs[0].temperature_k", "OpenMM"),
    ("an OpenMM platform", lammps_job(platform="CPU"), "jobs[0].platform", "OpenMM"),
    ("a seed", lammps_job(seed=5), "jobs[0].seed", "script"),
    ("a barostat", lammps_job(barostat=pb.Barostat(pressure_bar=1)), "jobs[0].barostat", "fixes"),
    (
        "a trajectory",
        lammps_job(trajectory_interval_steps=10),
        "jobs[0].trajectory_interval_steps",
        "OpenMM",
    ),
    (
        "a variable with a path out",
        lammps_job(variables={"f": "/etc/x"}),
        "jobs[0].system.lammps.variables['f']",
        "absolute",
    ),
    (
        "an input name with '..'",
        lammps_job(inputs=[pb.InputFile(name="../in.melt", sha256=SHA)]),
        "jobs[0].inputs[0].name",
        "without '..'",
    ),
    (
        "an absolute input name",
        lammps_job(inputs=[pb.InputFile(name="/in.melt", sha256=SHA)]),
        "jobs[0].inputs[0].name",
        "relative path",
    ),
    (
        "an input in deps/",
        lammps_job(inputs=[pb.InputFile(name="deps/x", sha256=SHA)]),
        "jobs[0].inputs[0].name",
        "mdq's",
    ),
    (
        "a duplicate input",
        lammps_job(
            inputs=[
                pb.InputFile(name="in.melt", sha256=SHA),
                pb.InputFile(name="in.melt", sha256=SHA),
            ]
        ),
        "jobs[0].inputs[1].name",
        "duplicate",
    ),
    (
        "an input without its sha256",
        lammps_job(inputs=[pb.InputFile(name="in.melt")]),
        "jobs[0].inputs[0].sha256",
        "mdq submit fills it in",
    ),
    (
        "a negative size",
        lammps_job(inputs=[pb.InputFile(name="in.melt", sha256=SHA, size_bytes=-1)]),
        "jobs[0].inputs[0].size_bytes",
        "between",
    ),
    (
        "a serialized system without its state",
        pb.JobSpec(
            name="x",
            system=pb.System(openmm_xml=pb.OpenMMSystemXml(system_xml="s.xml")),
            inputs=[pb.InputFile(name="s.xml", sha256=SHA)],
        ),
        "jobs[0].system.openmm_xml.state_xml",
        "must name",
    ),
    (
        "a serialized system with a cutoff",
        openmm_xml_job(cutoff_nm=1.0),
        "jobs[0].cutoff_nm",
        "serialized System",
    ),
]


@named_cases(("spec", "field", "message"), SPEC_CASES)
def test_bad_engine_input_names_the_field(spec: pb.JobSpec, field: str, message: str) -> None:
    with pytest.raises(SpecError) as caught:
        normalize_job(spec, "jobs[0]")
    assert caught.value.field == field
    assert message in caught.value.message


def test_a_serialized_openmm_system_gets_openmm_defaults() -> None:
    spec = normalize_job(openmm_xml_job(), "jobs[0]")
    assert (spec.temperature_k, spec.integrator, spec.platform) == (
        300.0,
        pb.INTEGRATOR_LANGEVIN_MIDDLE,
        "CPU",
    )


# -- the cost fingerprint ----------------------------------------------------------------------
def fingerprint(spec: pb.JobSpec) -> object:
    return fingerprint_of(normalize_job(spec, "jobs[0]"))


FINGERPRINT_CASES = [
    ("the same script and variables", lammps_job(), lammps_job(), True, True),
    (
        "another temperature variable: the same coarse key",
        lammps_job(variables={"T": "1200"}),
        lammps_job(variables={"T": "1500"}),
        False,
        True,
    ),
    (
        "another script",
        lammps_job(),
        lammps_job(inputs=[pb.InputFile(name="in.melt", sha256=SHA2)]),
        False,
        False,
    ),
    (
        "OpenMM and LAMMPS never share one",
        lammps_job(),
        pb.JobSpec(name="melt", system=pb.System(water_box=pb.WaterBox())),
        False,
        False,
    ),
]


@named_cases(("left", "right", "same", "same_coarse"), FINGERPRINT_CASES)
def test_the_fingerprint_includes_the_engine_and_the_inputs(
    left: pb.JobSpec, right: pb.JobSpec, same: bool, same_coarse: bool
) -> None:
    a, b = fingerprint_of(normalize_job(left, "j")), fingerprint_of(normalize_job(right, "j"))
    assert (a == b) is same
    assert (a.coarse() == b.coarse()) is same_coarse


def test_a_lammps_job_is_estimated_from_the_lammps_runner() -> None:
    print_ = fingerprint_of(normalize_job(lammps_job(), "j"))
    assert print_.engine == LAMMPS and print_.system_kind == "lammps"
    estimate = physical_estimate(print_, atoms=0)
    assert estimate.memory_mb >= LAMMPS_BASE_MB * 1.5
    assert "lammps" in estimate.evidence
