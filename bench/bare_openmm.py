"""Bench-only baseline of ``make bench-runner``: plain OpenMM doing what the runner does, as a
process of its own, with no mdq in the loop.

``python bench/bare_openmm.py SPEC_JSON OUT_DIR --threads N --report-every R
--checkpoint-every C --warmup I`` builds the job's system with the runner's recipe
(``services.runner.system.build_system``: same force field, cutoff, constraints, integrator,
platform and threads), warms up like the runner (``I`` minimiser iterations, velocities at
temperature), then integrates ``spec.steps`` steps in a plain loop that, every ``R`` steps,
reads the energies (``getState(getEnergy=True)``), appends a row to ``OUT_DIR/energies.csv``
(flushed) and prints ``step S`` on stdout (flushed: the bench timestamps the line on receipt,
as it timestamps the runner's progress events); and every ``C`` steps writes a checkpoint as
the runner does (the State XML and OpenMM's native checkpoint, each fsynced, then the folder
fsynced); at the end it writes the final state (State XML, fsynced) as the runner does.
That is the least a job with the same reports and checkpoints costs: no bus, no
sha256, no sidecar, no trajectory bookkeeping.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "libs")]

import openmm  # noqa: E402
import openmm.unit as unit  # noqa: E402
from google.protobuf import json_format  # noqa: E402

from mdq.contracts import pb  # noqa: E402
from services.runner.system import build_system  # noqa: E402


def write_synced(path: Path, data: bytes) -> None:
    """Write ``data`` and fsync it (a checkpoint that may not vanish with the page cache)."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(descriptor, data)
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def fsync_dir(directory: Path) -> None:
    descriptor = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spec_json", help="the job spec as protobuf JSON")
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--report-every", type=int, required=True)
    parser.add_argument("--checkpoint-every", type=int, required=True)
    parser.add_argument("--warmup", type=int, required=True, help="minimiser iterations")
    args = parser.parse_args()
    spec = json_format.Parse(args.spec_json, pb.JobSpec())
    out: Path = args.out_dir
    checkpoints = out / "checkpoints"
    checkpoints.mkdir(parents=True, exist_ok=True)

    md = build_system(spec, threads=args.threads)
    print(f"atoms {md.atoms}", flush=True)
    context, integrator = md.simulation.context, md.simulation.integrator
    context.setPositions(md.initial_positions)
    openmm.LocalEnergyMinimizer.minimize(context, 10.0, args.warmup)
    context.setVelocitiesToTemperature(spec.temperature_k * unit.kelvin, spec.seed)
    context.setTime(0.0)

    kj = unit.kilojoule_per_mole
    step = 0
    with (out / "energies.csv").open("w") as energies:
        energies.write("step,time_ps,potential_kj_mol,kinetic_kj_mol\n")
        while step < spec.steps:
            boundary = min(
                spec.steps,
                (step // args.report_every + 1) * args.report_every,
                (step // args.checkpoint_every + 1) * args.checkpoint_every,
            )
            integrator.step(boundary - step)
            step = boundary
            if step % args.report_every == 0 or step == spec.steps:
                state = context.getState(getEnergy=True)
                energies.write(
                    f"{step},{state.getTime().value_in_unit(unit.picosecond)},"
                    f"{state.getPotentialEnergy().value_in_unit(kj)},"
                    f"{state.getKineticEnergy().value_in_unit(kj)}\n"
                )
                energies.flush()
                print(f"step {step}", flush=True)
            if step % args.checkpoint_every == 0 and step < spec.steps:
                state = context.getState(
                    getPositions=True, getVelocities=True, getEnergy=True, enforcePeriodicBox=False
                )
                name = f"ckpt-{step:012d}"
                write_synced(
                    checkpoints / f"{name}.xml", openmm.XmlSerializer.serialize(state).encode()
                )
                write_synced(checkpoints / f"{name}.chk", bytes(context.createCheckpoint()))
                fsync_dir(checkpoints)
    state = context.getState(
        getPositions=True, getVelocities=True, getEnergy=True, enforcePeriodicBox=False
    )
    write_synced(out / "final_state.xml", openmm.XmlSerializer.serialize(state).encode())
    fsync_dir(out)


if __name__ == "__main__":
    main()
