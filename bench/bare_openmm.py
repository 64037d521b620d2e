"""Bench-only baseline of ``make bench-runner``: the job as a user writes it in plain OpenMM, as
a process of its own, with no mdq in the loop.

``python bench/bare_openmm.py SPEC_JSON OUT_DIR --threads N --report-every R
--checkpoint-every C --warmup I`` builds the job's system with the runner's recipe
(``services.runner.system.build_system``: same force field, cutoff, constraints, integrator,
platform and threads, so that both sides integrate the same physics), then does what an OpenMM
user's script does, with OpenMM's own reporters and nothing of mdq's: ``minimizeEnergy`` (``I``
iterations), velocities at temperature, a ``StateDataReporter`` writing the energies to
``OUT_DIR/energies.csv`` every ``R`` steps, another printing the step to stdout every ``R`` steps
(the bench timestamps each line on receipt, as it timestamps the runner's progress events), a
``CheckpointReporter`` writing ``OUT_DIR/checkpoints/checkpoint.chk`` every ``C`` steps, one
``simulation.step`` over every step, and ``saveState`` at the end.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "libs")]

import openmm.unit as unit  # noqa: E402
from google.protobuf import json_format  # noqa: E402
from openmm import app  # noqa: E402

from mdq.contracts import pb  # noqa: E402
from services.runner.system import build_system  # noqa: E402


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
    (out / "checkpoints").mkdir(parents=True, exist_ok=True)

    md = build_system(spec, threads=args.threads)
    print(f"atoms {md.atoms}", flush=True)
    simulation = md.simulation
    simulation.context.setPositions(md.initial_positions)
    simulation.minimizeEnergy(maxIterations=args.warmup)
    simulation.context.setVelocitiesToTemperature(spec.temperature_k * unit.kelvin, spec.seed)

    every = args.report_every
    energies = app.StateDataReporter(
        str(out / "energies.csv"),
        every,
        step=True,
        time=True,
        potentialEnergy=True,
        kineticEnergy=True,
        temperature=True,
    )
    progress = app.StateDataReporter(sys.stdout, every, step=True)
    checkpoints = app.CheckpointReporter(
        str(out / "checkpoints" / "checkpoint.chk"), args.checkpoint_every
    )
    simulation.reporters.extend([energies, progress, checkpoints])
    simulation.step(spec.steps)
    simulation.saveState(str(out / "final_state.xml"))


if __name__ == "__main__":
    main()
