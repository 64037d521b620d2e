"""The OpenMM side of the runner: building a job's system, reading and writing its states.

A job's system is rebuilt from its spec in every attempt (a TIP3P water box is deterministic
for a given edge), so a checkpoint only has to carry the State: positions, velocities, box and
time, as portable XML.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import openmm
import openmm.app as app
import openmm.unit as unit

from mdq.contracts import pb
from services.runner.errors import InvalidInputError, UnstableError

MOLAR_GAS_CONSTANT_KJ_MOL_K = 0.00831446261815324
"""R in kJ/(mol K): kinetic energy to temperature."""
MAX_CUTOFF_NM = 1.0
CUTOFF_MARGIN_NM = 0.05


@cache
def _force_field() -> app.ForceField:
    return app.ForceField("amber14-all.xml", "amber14/tip3p.xml")


@dataclass(frozen=True, slots=True)
class EnergySample:
    """The energies of the current state, as reported in progress events."""

    step: int
    time_ps: float
    potential_kj_mol: float
    kinetic_kj_mol: float
    temperature_k: float


@dataclass(slots=True)
class MdSystem:
    """One job's OpenMM simulation and what is needed to interpret its states."""

    simulation: app.Simulation
    initial_positions: unit.Quantity
    atoms: int
    degrees_of_freedom: int
    timestep_ps: float

    @property
    def context(self) -> openmm.Context:
        return self.simulation.context

    @property
    def step(self) -> int:
        return int(self.simulation.currentStep)

    def temperature_k(self, kinetic_kj_mol: float) -> float:
        """Instantaneous temperature from the kinetic energy (equipartition)."""
        if self.degrees_of_freedom <= 0:
            return 0.0
        return 2.0 * kinetic_kj_mol / (self.degrees_of_freedom * MOLAR_GAS_CONSTANT_KJ_MOL_K)

    def sample(self, *, step: int | None = None) -> EnergySample:
        """Energies of the current state (``step`` overrides the step, e.g. for minimising)."""
        state = self.context.getState(getEnergy=True)
        kinetic = state.getKineticEnergy().value_in_unit(unit.kilojoule_per_mole)
        return EnergySample(
            step=self.step if step is None else step,
            time_ps=state.getTime().value_in_unit(unit.picosecond),
            potential_kj_mol=state.getPotentialEnergy().value_in_unit(unit.kilojoule_per_mole),
            kinetic_kj_mol=kinetic,
            temperature_k=self.temperature_k(kinetic),
        )

    def snapshot(self) -> tuple[str, float]:
        """The full current state (positions, velocities, box, time, energies) as XML, and
        its time in ps."""
        state = self.context.getState(
            getPositions=True, getVelocities=True, getEnergy=True, enforcePeriodicBox=False
        )
        time_ps = float(state.getTime().value_in_unit(unit.picosecond))
        return str(openmm.XmlSerializer.serialize(state)), time_ps

    def restore(self, state: openmm.State, *, step: int) -> None:
        """Continue exactly from ``state`` (positions, velocities, box, time) at ``step``."""
        self._check_atoms(state)
        self.context.setState(state)
        self.simulation.currentStep = step

    def start_from_structure(self, state: openmm.State, *, temperature_k: float, seed: int) -> None:
        """Take positions and box from ``state`` (e.g. a minimised structure); keep its
        velocities if it has any, else draw them at ``temperature_k``. Step and time start at 0.
        """
        self._check_atoms(state)
        self.context.setPeriodicBoxVectors(*state.getPeriodicBoxVectors())
        self.context.setPositions(state.getPositions())
        velocities = _velocities_of(state)
        if velocities is not None:
            self.context.setVelocities(velocities)
        else:
            self.context.setVelocitiesToTemperature(temperature_k * unit.kelvin, seed)
        self.context.setTime(0.0)
        self.simulation.currentStep = 0

    def start_fresh(self, *, minimize_iterations: int, temperature_k: float, seed: int) -> None:
        """Start from the built box: a brief minimisation, then velocities at temperature."""
        self.context.setPositions(self.initial_positions)
        if minimize_iterations > 0:
            openmm.LocalEnergyMinimizer.minimize(self.context, 10.0, minimize_iterations)
        self.context.setVelocitiesToTemperature(temperature_k * unit.kelvin, seed)
        self.context.setTime(0.0)
        self.simulation.currentStep = 0

    def _check_atoms(self, state: openmm.State) -> None:
        count = len(state.getPositions(asNumpy=False))
        if count != self.atoms:
            raise InvalidInputError(
                f"the saved state has {count} atoms but this job's system has {self.atoms}: "
                "it was written for a different system"
            )


def _velocities_of(state: openmm.State) -> unit.Quantity | None:
    """The state's velocities, or None when it has none (or only zeros, as a minimiser's)."""
    try:
        velocities = state.getVelocities(asNumpy=True)
    except Exception:  # a State saved without velocities raises a bare Exception
        return None
    if not (velocities.value_in_unit(unit.nanometer / unit.picosecond) != 0.0).any():
        return None
    return velocities


def cutoff_nm(box_nm: float) -> float:
    """Nonbonded cutoff for a cubic box: 1 nm, or less than half the box edge."""
    return min(MAX_CUTOFF_NM, box_nm / 2.0 - CUTOFF_MARGIN_NM)


def build_system(
    spec: pb.JobSpec, *, threads: int, integrator: openmm.Integrator | None = None
) -> MdSystem:
    """The job's water box (PME, HBonds, rigid water) on the CPU platform.

    Without ``integrator`` a LangevinMiddleIntegrator at the spec's temperature, friction and
    time step is used, seeded with ``spec.seed`` (0 = random).
    """
    if spec.system.WhichOneof("kind") != "water_box":
        raise InvalidInputError("the job's system is not a water box, the only kind supported")
    box_nm = spec.system.water_box.box_nm
    force_field = _force_field()
    modeller = app.Modeller(app.Topology(), [])
    modeller.addSolvent(
        force_field, model="tip3p", boxSize=openmm.Vec3(box_nm, box_nm, box_nm) * unit.nanometer
    )
    system = force_field.createSystem(
        modeller.topology,
        nonbondedMethod=app.PME,
        nonbondedCutoff=cutoff_nm(box_nm) * unit.nanometer,
        constraints=app.HBonds,
        rigidWater=True,
    )
    if integrator is None:
        langevin = openmm.LangevinMiddleIntegrator(
            spec.temperature_k * unit.kelvin,
            spec.friction_per_ps / unit.picosecond,
            spec.timestep_fs * unit.femtosecond,
        )
        langevin.setRandomNumberSeed(spec.seed)
        integrator = langevin
    platform = openmm.Platform.getPlatformByName("CPU")
    simulation = app.Simulation(
        modeller.topology, system, integrator, platform, {"Threads": str(threads)}
    )
    simulation.context.setPositions(modeller.positions)
    atoms = system.getNumParticles()
    removes_com = any(
        isinstance(system.getForce(index), openmm.CMMotionRemover)
        for index in range(system.getNumForces())
    )
    return MdSystem(
        simulation=simulation,
        initial_positions=modeller.positions,
        atoms=atoms,
        degrees_of_freedom=3 * atoms - system.getNumConstraints() - (3 if removes_com else 0),
        timestep_ps=spec.timestep_fs / 1000.0,
    )


def read_state(path: Path) -> openmm.State:
    """A State from an XML file; InvalidInputError if it cannot be read."""
    try:
        return parse_state(path.read_text())
    except OSError as error:
        raise InvalidInputError(f"cannot read the state {path}: {error}") from None
    except ValueError as error:
        raise InvalidInputError(f"{path} is not an OpenMM State: {error}") from None


def parse_state(xml: str) -> openmm.State:
    """A State from its XML text; ValueError if it is not one."""
    try:
        state = openmm.XmlSerializer.deserialize(xml)
    except Exception as error:  # OpenMM raises a bare Exception on malformed XML
        raise ValueError(str(error) or type(error).__name__) from None
    if not isinstance(state, openmm.State):
        raise ValueError(f"the XML holds a {type(state).__name__}, not a State")
    return state


def check_stable(sample: EnergySample, *, atoms: int, absurd_per_atom: float) -> None:
    """UnstableError if the energies are NaN/inf or absurdly large for ``atoms`` atoms."""
    energies = (sample.potential_kj_mol, sample.kinetic_kj_mol)
    if not all(math.isfinite(value) for value in energies):
        raise UnstableError(
            f"energy is not finite at step {sample.step}: potential "
            f"{sample.potential_kj_mol} kJ/mol, kinetic {sample.kinetic_kj_mol} kJ/mol"
        )
    if abs(sample.potential_kj_mol) > absurd_per_atom * max(atoms, 1):
        raise UnstableError(
            f"potential energy exploded at step {sample.step}: "
            f"{sample.potential_kj_mol:.6g} kJ/mol for {atoms} atoms"
        )


def is_nan_error(error: BaseException) -> bool:
    """Whether an OpenMM exception reports NaN coordinates (a blown-up simulation)."""
    return isinstance(error, openmm.OpenMMException) and "nan" in str(error).lower()
