"""The OpenMM side of the runner: the job's simulation, its states and its energies.

A job's system is rebuilt from its spec in every attempt (:mod:`services.runner.recipes` is
deterministic), so a checkpoint only has to carry the state: the portable State XML
(positions, velocities, box, time and step count) and, for an exact continuation on the same
platform, OpenMM's native checkpoint (which also holds the integrator's random state).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import openmm
import openmm.app as app
import openmm.unit as unit

from mdq.contracts import pb
from services.runner.errors import InvalidInputError
from services.runner.recipes import Model, build_model
from services.runner.samples import EnergySample

MOLAR_GAS_CONSTANT_KJ_MOL_K = 0.00831446261815324
"""R in kJ/(mol K): kinetic energy to temperature."""
GRAMS_PER_CM3_PER_DALTON_PER_NM3 = 1.66053906660e-3
"""1 Da/nm^3 in g/cm^3."""
DEFAULT_PLATFORM = "CPU"


@dataclass(slots=True)
class MdSystem:
    """One job's OpenMM simulation and what is needed to interpret its states."""

    simulation: app.Simulation
    initial_positions: unit.Quantity
    atoms: int
    degrees_of_freedom: int
    timestep_ps: float
    periodic: bool = True
    mass_dalton: float = 0.0
    platform: str = DEFAULT_PLATFORM
    start_state: openmm.State | None = None
    """The state the job's input gave to start from (a serialized State), if any."""

    @property
    def context(self) -> openmm.Context:
        return self.simulation.context

    @property
    def topology(self) -> app.Topology:
        return self.simulation.topology

    @property
    def step(self) -> int:
        return int(self.simulation.currentStep)

    def run(self, steps: int) -> None:
        """Integrate ``steps`` steps in one call (the context counts the steps).

        ``Simulation.step`` would split them into calls of 10 steps to stay responsive to
        Ctrl-C; the runner bounds its chunks itself, so it calls the integrator directly."""
        self.simulation.integrator.step(steps)

    def temperature_k(self, kinetic_kj_mol: float) -> float:
        """Instantaneous temperature from the kinetic energy (equipartition)."""
        if self.degrees_of_freedom <= 0:
            return 0.0
        return 2.0 * kinetic_kj_mol / (self.degrees_of_freedom * MOLAR_GAS_CONSTANT_KJ_MOL_K)

    def sample(self, *, step: int | None = None) -> EnergySample:
        """Energies of the current state (``step`` overrides the step, e.g. for minimising)."""
        state = self.context.getState(getEnergy=True)
        kinetic = state.getKineticEnergy().value_in_unit(unit.kilojoule_per_mole)
        volume = (
            float(state.getPeriodicBoxVolume().value_in_unit(unit.nanometer**3))
            if self.periodic
            else 0.0
        )
        return EnergySample(
            step=self.step if step is None else step,
            time_ps=state.getTime().value_in_unit(unit.picosecond),
            potential_kj_mol=state.getPotentialEnergy().value_in_unit(unit.kilojoule_per_mole),
            kinetic_kj_mol=kinetic,
            temperature_k=self.temperature_k(kinetic),
            volume_nm3=volume,
            density_g_cm3=(
                self.mass_dalton / volume * GRAMS_PER_CM3_PER_DALTON_PER_NM3 if volume else 0.0
            ),
        )

    def snapshot(self) -> tuple[str, float]:
        """The full current state (positions, velocities, box, time, step, energies) as XML,
        and its time in ps."""
        state = self.context.getState(
            getPositions=True, getVelocities=True, getEnergy=True, enforcePeriodicBox=False
        )
        time_ps = float(state.getTime().value_in_unit(unit.picosecond))
        return str(openmm.XmlSerializer.serialize(state)), time_ps

    def native_checkpoint(self) -> bytes:
        """OpenMM's native checkpoint of the context (exact, platform-specific)."""
        return bytes(self.context.createCheckpoint())

    def load_native_checkpoint(self, data: bytes) -> None:
        """Continue exactly from a native checkpoint of this platform (step included)."""
        self.context.loadCheckpoint(data)

    def positions(self) -> tuple[unit.Quantity, unit.Quantity]:
        """Positions (wrapped into the box when periodic) and box vectors, for a frame."""
        state = self.context.getState(getPositions=True, enforcePeriodicBox=self.periodic)
        return state.getPositions(asNumpy=True), state.getPeriodicBoxVectors()

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
        """Start from the built system: a brief minimisation, then velocities at temperature."""
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


def make_integrator(spec: pb.JobSpec) -> openmm.Integrator:
    """The spec's integrator at its temperature, friction and time step, seeded with
    ``spec.seed`` (0 = random)."""
    temperature = spec.temperature_k * unit.kelvin
    friction = spec.friction_per_ps / unit.picosecond
    timestep = spec.timestep_fs * unit.femtosecond
    kind = spec.integrator or pb.INTEGRATOR_LANGEVIN_MIDDLE
    if kind == pb.INTEGRATOR_VERLET:
        return openmm.VerletIntegrator(timestep)
    if kind == pb.INTEGRATOR_NOSE_HOOVER:
        return openmm.NoseHooverIntegrator(temperature, friction, timestep)
    langevin_class = (
        openmm.LangevinIntegrator
        if kind == pb.INTEGRATOR_LANGEVIN
        else openmm.LangevinMiddleIntegrator
    )
    integrator = langevin_class(temperature, friction, timestep)
    integrator.setRandomNumberSeed(spec.seed)
    return integrator


def available_platforms() -> list[str]:
    return [
        openmm.Platform.getPlatform(index).getName()
        for index in range(openmm.Platform.getNumPlatforms())
    ]


def select_platform(name: str, *, threads: int) -> tuple[openmm.Platform, dict[str, str]]:
    """The OpenMM platform called ``name`` and its properties; InvalidInputError if it is not
    installed here."""
    name = name or DEFAULT_PLATFORM
    try:
        platform = openmm.Platform.getPlatformByName(name)
    except Exception:  # OpenMMException: "There is no registered Platform called ..."
        raise InvalidInputError(
            f"platform {name!r} is not available here (available: "
            f"{', '.join(available_platforms())})"
        ) from None
    properties: dict[str, str] = {}
    if name == "CPU":
        properties["Threads"] = str(threads)
    elif name in ("CUDA", "OpenCL", "HIP"):
        properties["Precision"] = "mixed"
    return platform, properties


def _add_barostat(spec: pb.JobSpec, model: Model) -> None:
    barostat = spec.barostat
    if barostat.pressure_bar <= 0:
        return
    if not model.periodic:
        raise InvalidInputError("a barostat needs a periodic system (a box or padding_nm > 0)")
    force = openmm.MonteCarloBarostat(
        barostat.pressure_bar * unit.bar,
        spec.temperature_k * unit.kelvin,
        barostat.frequency_steps or 25,
    )
    force.setRandomNumberSeed(spec.seed)
    model.system.addForce(force)


def build_system(
    spec: pb.JobSpec,
    *,
    threads: int,
    integrator: openmm.Integrator | None = None,
    data_dir: Path | None = None,
    input_dirs: Sequence[Path] = (),
    work_dir: Path | None = None,
) -> MdSystem:
    """The job's simulation: its system (recipe), barostat, integrator (default: the spec's)
    and platform. Files are looked up in ``work_dir`` (the job's input files), under
    ``data_dir`` and in ``input_dirs``."""
    model = build_model(spec, data_dir=data_dir, input_dirs=input_dirs, work_dir=work_dir)
    _add_barostat(spec, model)
    platform, properties = select_platform(spec.platform, threads=threads)
    try:
        simulation = app.Simulation(
            model.topology,
            model.system,
            integrator or make_integrator(spec),
            platform,
            properties,
        )
    except openmm.OpenMMException as error:
        raise InvalidInputError(f"OpenMM cannot create the simulation: {error}") from None
    simulation.context.setPositions(model.positions)
    system = model.system
    masses = [
        system.getParticleMass(index).value_in_unit(unit.dalton)
        for index in range(system.getNumParticles())
    ]
    removes_com = any(
        isinstance(system.getForce(index), openmm.CMMotionRemover)
        for index in range(system.getNumForces())
    )
    moving = sum(1 for mass in masses if mass > 0)
    return MdSystem(
        simulation=simulation,
        initial_positions=model.positions,
        atoms=system.getNumParticles(),
        degrees_of_freedom=3 * moving - system.getNumConstraints() - (3 if removes_com else 0),
        timestep_ps=spec.timestep_fs / 1000.0,
        periodic=model.periodic,
        mass_dalton=math.fsum(masses),
        platform=platform.getName(),
        start_state=model.state,
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


def is_nan_error(error: BaseException) -> bool:
    """Whether an OpenMM exception reports NaN coordinates (a blown-up simulation)."""
    return isinstance(error, openmm.OpenMMException) and "nan" in str(error).lower()
