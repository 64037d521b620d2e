"""What every engine reports: the energies of one state, and the runner's stability check.

Engine-neutral (docs/engines.md): an engine converts what it computes into these units (kJ/mol,
K, ps, nm³, g/cm³, bar), except a LAMMPS script in reduced Lennard-Jones units, whose values
have no conversion and are reported as LAMMPS gives them (``Progress.units == "lj"``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from services.runner.errors import UnstableError


@dataclass(frozen=True, slots=True)
class EnergySample:
    """The energies of the current state, as reported in progress events."""

    step: int
    time_ps: float
    potential_kj_mol: float
    kinetic_kj_mol: float
    temperature_k: float
    volume_nm3: float = 0.0
    density_g_cm3: float = 0.0
    pressure_bar: float | None = None
    """None where the engine computes no pressure (OpenMM)."""

    @property
    def total_kj_mol(self) -> float:
        return self.potential_kj_mol + self.kinetic_kj_mol

    def minimized(self, iteration: int) -> EnergySample:
        """This state as a minimiser reports it after ``iteration`` iterations: no dynamics,
        so no time, kinetic energy or temperature."""
        return replace(self, step=iteration, time_ps=0.0, kinetic_kj_mol=0.0, temperature_k=0.0)


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
