"""Which MD engine runs a job (pure): told by its system, never by anything else.

A job whose system is a LAMMPS input script runs on LAMMPS; every other system (a water box, a
Lennard-Jones fluid, a structure with force fields, a serialized OpenMM System) on OpenMM. An
analysis job runs no engine. Above the runner only the resource recommender asks
(``mdq.core.recommend``: a LAMMPS job costs what LAMMPS jobs cost); docs/engines.md.
"""

from __future__ import annotations

from mdq.contracts import pb

OPENMM = "openmm"
LAMMPS = "lammps"
ENGINES = (OPENMM, LAMMPS)


def engine_of(spec: pb.JobSpec) -> str:
    """The engine that runs ``spec``'s system."""
    return LAMMPS if spec.system.WhichOneof("kind") == "lammps" else OPENMM
