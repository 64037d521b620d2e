"""LAMMPS's unit systems in mdq's reporting units (pure): kJ/mol, K, ps, nm³, g/cm³, bar.

A LAMMPS script chooses its units (``units metal``); its thermo output (with ``thermo_modify
norm no``: energies of the whole system) is converted with the factors here, so a LAMMPS job's
progress reads like an OpenMM job's (docs/engines.md). ``lj`` has no conversion (its values
are in the reduced units of the script's own epsilon, sigma and mass): its factors are 1 and
the progress says ``units: "lj"``.

Energies "per mole" are LAMMPS's per-system energies times Avogadro's number where LAMMPS
reports them per system (metal: eV; si: J; ...), as OpenMM's kJ/mol are.
"""

from __future__ import annotations

from dataclasses import dataclass

AVOGADRO = 6.02214076e23
EV_KJ_MOL = 96.48533212331002
"""1 eV per system in kJ/mol (N_A e / 1000)."""
HARTREE_KJ_MOL = 2625.4996394798254
BOHR_NM = 0.0529177210903
AMU_G = 1.66053906660e-24


@dataclass(frozen=True, slots=True)
class UnitFactors:
    """Multiply a LAMMPS thermo value in these units by the factor to get mdq's unit."""

    energy_kj_mol: float
    time_ps: float
    volume_nm3: float
    density_g_cm3: float
    pressure_bar: float
    reduced: bool = False
    """True for ``lj``: no conversion; the values are reduced."""

    @property
    def label(self) -> str:
        """``Progress.units``: "" (converted) or "lj"."""
        return "lj" if self.reduced else ""


UNITS: dict[str, UnitFactors] = {
    "lj": UnitFactors(1.0, 1.0, 1.0, 1.0, 1.0, reduced=True),
    "real": UnitFactors(
        energy_kj_mol=4.184,  # kcal/mol
        time_ps=1e-3,  # fs
        volume_nm3=1e-3,  # Å³
        density_g_cm3=1.0,
        pressure_bar=1.01325,  # atm
    ),
    "metal": UnitFactors(
        energy_kj_mol=EV_KJ_MOL,  # eV
        time_ps=1.0,  # ps
        volume_nm3=1e-3,  # Å³
        density_g_cm3=1.0,
        pressure_bar=1.0,  # bar
    ),
    "si": UnitFactors(
        energy_kj_mol=AVOGADRO / 1000.0,  # J
        time_ps=1e12,  # s
        volume_nm3=1e27,  # m³
        density_g_cm3=1e-3,  # kg/m³
        pressure_bar=1e-5,  # Pa
    ),
    "cgs": UnitFactors(
        energy_kj_mol=AVOGADRO * 1e-10,  # erg = 1e-7 J
        time_ps=1e12,  # s
        volume_nm3=1e21,  # cm³
        density_g_cm3=1.0,
        pressure_bar=1e-6,  # dyne/cm²
    ),
    "electron": UnitFactors(
        energy_kj_mol=HARTREE_KJ_MOL,  # Hartree
        time_ps=1e-3,  # fs
        volume_nm3=BOHR_NM**3,  # bohr³
        density_g_cm3=AMU_G / (BOHR_NM * 1e-7) ** 3,  # amu/bohr³
        pressure_bar=1e-5,  # Pa
    ),
    "micro": UnitFactors(
        energy_kj_mol=AVOGADRO * 1e-18,  # picogram µm²/µs² = 1e-15 J
        time_ps=1e6,  # µs
        volume_nm3=1e9,  # µm³
        density_g_cm3=1.0,  # picogram/µm³
        pressure_bar=1e-2,  # picogram/(µm µs²) = 1e3 Pa
    ),
    "nano": UnitFactors(
        energy_kj_mol=AVOGADRO * 1e-24,  # attogram nm²/ns² = 1e-21 J
        time_ps=1e3,  # ns
        volume_nm3=1.0,  # nm³
        density_g_cm3=1e3,  # attogram/nm³
        pressure_bar=10.0,  # attogram/(nm ns²) = 1e6 Pa
    ),
}
"""Every LAMMPS ``units`` style."""


def factors(units: str) -> UnitFactors:
    """The factors of a LAMMPS ``units`` style; KeyError for one LAMMPS does not have."""
    return UNITS[units]
