"""System recipes: from a job's ``system`` to an OpenMM topology, system and start positions.

Four recipes (``water_box``, ``lennard_jones``, ``structure``, ``openmm_xml``), each
deterministic for a given spec, so every attempt rebuilds the same system and a checkpoint only
carries the state. Paths and force-field names resolve only inside trusted folders, and a
serialized System holding a force OpenMM does not ship is refused; every problem with the input
is an :class:`InvalidInputError`. Design: docs/jobspec.md, "Systems"; docs/engines.md, "OpenMM";
docs/security.md, "Runner isolation".
"""

from __future__ import annotations

import inspect
import io
import math
import xml.etree.ElementTree as ElementTree
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path, PurePosixPath

import openmm
import openmm.app as app
import openmm.unit as unit

from mdq.contracts import pb
from mdq.core.spec import lennard_jones_box_nm
from mdq.forcefields import ForceFieldFolders, ForceFieldRefused
from services.runner.errors import InvalidInputError

PDBX_SUFFIXES = (".cif", ".pdbx", ".mmcif")
_NONBONDED_METHODS = {
    pb.NONBONDED_PME: app.PME,
    pb.NONBONDED_CUTOFF_PERIODIC: app.CutoffPeriodic,
    pb.NONBONDED_CUTOFF_NON_PERIODIC: app.CutoffNonPeriodic,
    pb.NONBONDED_NO_CUTOFF: app.NoCutoff,
}
_PERIODIC = (pb.NONBONDED_PME, pb.NONBONDED_CUTOFF_PERIODIC)


@dataclass(frozen=True, slots=True)
class Model:
    """A built system: what OpenMM needs to simulate it."""

    topology: app.Topology
    system: openmm.System
    positions: unit.Quantity
    periodic: bool
    state: openmm.State | None = None
    """The state to start from when the input gave one (a serialized State)."""


INPUTS_FOLDER = "inputs"
"""The folder of the data folder that structure files may come from (``inputs/x.pdb``)."""


def force_field(*names: str, folders: ForceFieldFolders | None = None) -> app.ForceField:
    """A force field from trusted files only: each name is resolved in OpenMM's data or the
    operator's folder (``folders``, default from the environment) to an absolute path, so
    OpenMM never searches the working directory."""
    trusted = folders or ForceFieldFolders.from_env()
    paths: list[str] = []
    for name in names:
        try:
            paths.append(str(trusted.resolve(name)))
        except ForceFieldRefused as error:
            raise InvalidInputError(f"force field refused: {error}") from None
    return _load_force_field(*paths)


@cache
def _load_force_field(*paths: str) -> app.ForceField:
    """The force field of these absolute paths (cached: loading amber14 takes ~1 s)."""
    try:
        return app.ForceField(*paths)
    except (OSError, ValueError) as error:
        raise InvalidInputError(f"cannot load the force fields {list(paths)}: {error}") from None


def build_model(
    spec: pb.JobSpec,
    *,
    data_dir: Path | None = None,
    input_dirs: Sequence[Path] = (),
    work_dir: Path | None = None,
) -> Model:
    """The system of ``spec`` (normalised); files are looked up in the job's working folder
    ``work_dir`` (its input files), under ``data_dir`` and in ``input_dirs`` only."""
    kind = spec.system.WhichOneof("kind")
    if kind == "water_box":
        return water_box(spec)
    if kind == "lennard_jones":
        return lennard_jones(spec)
    if kind == "structure":
        return structure(spec, data_dir=data_dir, input_dirs=input_dirs, work_dir=work_dir)
    if kind == "openmm_xml":
        if work_dir is None:
            raise InvalidInputError("a serialized system needs the job's input files")
        return serialized(spec, work_dir=work_dir)
    raise InvalidInputError(f"the job's system is not one the runner knows: {kind!r}")


def _check_cutoff(cutoff_nm: float, box: unit.Quantity) -> None:
    """A periodic cutoff must stay below half the smallest box width (minimum image)."""
    vectors = [vector.value_in_unit(unit.nanometer) for vector in box]
    widths = (vectors[0][0], vectors[1][1], vectors[2][2])
    if cutoff_nm >= min(widths) / 2:
        raise InvalidInputError(
            f"cutoff_nm {cutoff_nm:.4g} is not below half the periodic box "
            f"({min(widths):.4g} nm wide): use a smaller cutoff or more padding"
        )


def water_box(spec: pb.JobSpec) -> Model:
    """A cubic box of TIP3P water with rigid water and constrained H bonds."""
    box_nm = spec.system.water_box.box_nm
    fields = force_field("amber14-all.xml", "amber14/tip3p.xml")
    modeller = app.Modeller(app.Topology(), [])
    modeller.addSolvent(
        fields, model="tip3p", boxSize=openmm.Vec3(box_nm, box_nm, box_nm) * unit.nanometer
    )
    _check_cutoff(spec.cutoff_nm, modeller.topology.getPeriodicBoxVectors())
    system = fields.createSystem(
        modeller.topology,
        nonbondedMethod=_NONBONDED_METHODS[spec.nonbonded_method or pb.NONBONDED_PME],
        nonbondedCutoff=spec.cutoff_nm * unit.nanometer,
        constraints=app.HBonds,
        rigidWater=True,
    )
    return Model(
        topology=modeller.topology, system=system, positions=modeller.positions, periodic=True
    )


def lattice_positions(atoms: int, box_nm: float) -> list[openmm.Vec3]:
    """``atoms`` points of a simple cubic lattice filling a cubic box of edge ``box_nm``."""
    per_side = math.ceil(round(atoms ** (1.0 / 3.0), 9))
    spacing = box_nm / per_side
    points: list[openmm.Vec3] = []
    for index in range(atoms):
        i, rest = divmod(index, per_side * per_side)
        j, k = divmod(rest, per_side)
        points.append(openmm.Vec3((i + 0.5) * spacing, (j + 0.5) * spacing, (k + 0.5) * spacing))
    return points


def lennard_jones(spec: pb.JobSpec) -> Model:
    """A periodic Lennard-Jones fluid: no charges, cutoff with the dispersion correction."""
    fluid = spec.system.lennard_jones
    box_nm = lennard_jones_box_nm(fluid)
    topology = app.Topology()
    chain = topology.addChain()
    argon = app.element.argon if math.isclose(fluid.mass_dalton, 39.948) else None
    system = openmm.System()
    force = openmm.NonbondedForce()
    force.setNonbondedMethod(openmm.NonbondedForce.CutoffPeriodic)
    force.setCutoffDistance(fluid.cutoff_nm)
    force.setUseDispersionCorrection(True)
    for _ in range(fluid.atoms):
        residue = topology.addResidue("LJ", chain)
        topology.addAtom("LJ", argon, residue)
        system.addParticle(fluid.mass_dalton)
        force.addParticle(0.0, fluid.sigma_nm, fluid.epsilon_kj_mol)
    system.addForce(force)
    system.addForce(openmm.CMMotionRemover())
    vectors = (
        openmm.Vec3(box_nm, 0, 0),
        openmm.Vec3(0, box_nm, 0),
        openmm.Vec3(0, 0, box_nm),
    )
    system.setDefaultPeriodicBoxVectors(*vectors)
    topology.setPeriodicBoxVectors(vectors * unit.nanometer)
    positions = lattice_positions(fluid.atoms, box_nm) * unit.nanometer
    return Model(topology=topology, system=system, positions=positions, periodic=True)


@dataclass(frozen=True, slots=True)
class InputRoot:
    """A folder a relative input path is resolved in, and the folder it must stay inside."""

    base: Path
    fence: Path


def input_roots(
    data_dir: Path | None, input_dirs: Sequence[Path], work_dir: Path | None = None
) -> list[InputRoot]:
    """Where a job's structure path may lead: its own input files (the working folder),
    ``<data>/inputs`` (named from the data folder, ``inputs/x.pdb``) and each dependency's
    folder, nowhere else."""
    roots = [InputRoot(base=folder, fence=folder) for folder in input_dirs]
    if data_dir is not None:
        roots.insert(0, InputRoot(base=data_dir, fence=data_dir / INPUTS_FOLDER))
    if work_dir is not None:
        roots.insert(0, InputRoot(base=work_dir, fence=work_dir))
    return roots


def resolve_input(relative: str, *, roots: Sequence[InputRoot]) -> Path:
    """The file ``relative`` names under the first root that has it, never outside that
    root's fence (symlinks are followed before the check); InvalidInputError if there is
    none."""
    parts = PurePosixPath(relative).parts
    if not parts or PurePosixPath(relative).is_absolute() or ".." in parts or "\\" in relative:
        raise InvalidInputError(f"structure path {relative!r} must be relative, without '..'")
    for root in roots:
        base = root.base.resolve()
        fence = root.fence.resolve()
        candidate = (base / Path(*parts)).resolve()
        if not candidate.is_relative_to(fence):
            continue  # not in this root's allowed folder: maybe in the next root's
        if candidate.is_file():
            return candidate
    searched = ", ".join(str(root.fence) for root in roots) or "nothing (no data folder)"
    raise InvalidInputError(
        f"structure file {relative!r} not found inside the job's allowed folders ({searched}; "
        "symlinks are followed and must stay inside)"
    )


def _read_structure(
    source: pb.Structure, *, roots: Sequence[InputRoot]
) -> tuple[app.Topology, unit.Quantity]:
    if source.WhichOneof("source") == "pdb_path":
        path = resolve_input(source.pdb_path, roots=roots)
        is_pdbx = path.suffix.lower() in PDBX_SUFFIXES
        reader = app.PDBxFile if is_pdbx else app.PDBFile
        where = str(path)
        opened: object = str(path)
    else:
        text = source.pdb_content
        is_pdbx = text.lstrip().startswith("data_")
        reader = app.PDBxFile if is_pdbx else app.PDBFile
        where = "the inline structure"
        opened = io.StringIO(text)
    try:
        parsed = reader(opened)
    except Exception as error:  # the readers raise anything from ValueError to IndexError
        kind = "PDBx" if is_pdbx else "PDB"
        raise InvalidInputError(f"cannot read {where} as {kind}: {error!r}") from None
    if parsed.topology.getNumAtoms() == 0:
        raise InvalidInputError(f"{where} holds no atoms")
    return parsed.topology, parsed.positions


def structure(
    spec: pb.JobSpec,
    *,
    data_dir: Path | None = None,
    input_dirs: Sequence[Path] = (),
    work_dir: Path | None = None,
) -> Model:
    """A user structure with the spec's force fields, solvated when ``padding_nm`` > 0."""
    source = spec.system.structure
    roots = input_roots(data_dir, input_dirs, work_dir)
    topology, positions = _read_structure(source, roots=roots)
    fields = force_field(*source.force_fields)
    modeller = app.Modeller(topology, positions)
    if source.padding_nm > 0:
        try:
            modeller.addSolvent(
                fields, model=source.water_model, padding=source.padding_nm * unit.nanometer
            )
        except Exception as error:  # unknown water model for these force fields, ...
            raise InvalidInputError(
                f"cannot solvate with {source.water_model}: {error!r}"
            ) from None
    box = modeller.topology.getPeriodicBoxVectors()
    method = spec.nonbonded_method or (
        pb.NONBONDED_PME if box is not None else pb.NONBONDED_NO_CUTOFF
    )
    if method in _PERIODIC:
        if box is None:
            raise InvalidInputError(
                "a periodic nonbonded method needs a periodic structure: the file has no unit "
                "cell (CRYST1) and padding_nm is 0"
            )
        _check_cutoff(spec.cutoff_nm, box)
    try:
        system = fields.createSystem(
            modeller.topology,
            nonbondedMethod=_NONBONDED_METHODS[method],
            nonbondedCutoff=spec.cutoff_nm * unit.nanometer,
            constraints=app.HBonds,
            rigidWater=True,
        )
    except Exception as error:  # missing templates, missing hydrogens, ...
        raise InvalidInputError(
            f"the force fields {list(source.force_fields)} cannot parameterise the structure "
            f"(is it complete, hydrogens included?): {error}"
        ) from None
    return Model(
        topology=modeller.topology,
        system=system,
        positions=modeller.positions,
        periodic=method in _PERIODIC,
    )


SAFE_FORCES = frozenset(
    name
    for name, kind in vars(openmm).items()
    if inspect.isclass(kind) and issubclass(kind, openmm.Force) and kind is not openmm.Force
) - {"PythonForce"}
"""Force types a serialized System may hold: those OpenMM itself ships, less PythonForce
(its XML carries a pickled Python callable, which reading would run)."""


def check_serialized(text: str, *, expected: str, where: str) -> ElementTree.Element:
    """The root of serialized OpenMM XML whose ``type`` is ``expected`` ("System", "State"),
    every ``Force`` in it of :data:`SAFE_FORCES`; InvalidInputError otherwise. Checked before
    OpenMM deserialises anything."""
    if "<!DOCTYPE" in text or "<!ENTITY" in text:
        raise InvalidInputError(f"{where}: a document type or entity is not allowed")
    try:
        root = ElementTree.fromstring(text)
    except ElementTree.ParseError as error:
        raise InvalidInputError(f"{where} is not XML: {error}") from None
    if root.get("type") != expected:
        raise InvalidInputError(
            f"{where} holds a serialized {root.get('type') or root.tag!r}, not a {expected}"
        )
    for force in root.iter("Force"):
        kind = force.get("type", "")
        if kind not in SAFE_FORCES:
            raise InvalidInputError(
                f"{where}: force {kind!r} is refused (only forces OpenMM ships are read, and "
                "never a PythonForce, whose XML holds code)"
            )
    return root


def _read_input(work_dir: Path, name: str) -> str:
    path = resolve_input(name, roots=[InputRoot(base=work_dir, fence=work_dir)])
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError) as error:
        raise InvalidInputError(f"cannot read the input file {name!r}: {error}") from None


def serialized(spec: pb.JobSpec, *, work_dir: Path) -> Model:
    """A System and a State deserialised from two of the job's input files; the topology is
    one anonymous atom per particle (what a trajectory needs)."""
    source = spec.system.openmm_xml
    system_text = _read_input(work_dir, source.system_xml)
    state_text = _read_input(work_dir, source.state_xml)
    check_serialized(system_text, expected="System", where=source.system_xml)
    check_serialized(state_text, expected="State", where=source.state_xml)
    try:
        system = openmm.XmlSerializer.deserialize(system_text)
        state = openmm.XmlSerializer.deserialize(state_text)
    except Exception as error:  # OpenMM raises a bare Exception on malformed XML
        raise InvalidInputError(f"OpenMM cannot read the serialized system: {error}") from None
    if not isinstance(system, openmm.System) or not isinstance(state, openmm.State):
        raise InvalidInputError("the serialized files are not a System and a State")
    positions = state.getPositions(asNumpy=False)
    if len(positions) != system.getNumParticles():
        raise InvalidInputError(
            f"{source.state_xml} has {len(positions)} positions but {source.system_xml} "
            f"{system.getNumParticles()} particles"
        )
    periodic = bool(system.usesPeriodicBoundaryConditions())
    topology = app.Topology()
    chain = topology.addChain()
    for _ in range(system.getNumParticles()):
        topology.addAtom("X", None, topology.addResidue("X", chain))
    if periodic:
        vectors = state.getPeriodicBoxVectors()
        system.setDefaultPeriodicBoxVectors(*vectors)
        topology.setPeriodicBoxVectors(vectors)
    return Model(
        topology=topology, system=system, positions=positions, periodic=periodic, state=state
    )
