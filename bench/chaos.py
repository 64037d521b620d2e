"""``make chaos``: MD jobs on the embedded stack while every part of it fails at random.

A thin command line over ``mdq.testing.chaos`` (which documents what is injected and checked);
prints one JSON line of figures and exits 1 when a check failed. Needs root for the data disk
(a loop-mounted ext4 file, else a tmpfs); without it the disk-full episodes are reported as
unavailable and the campaign fails.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from mdq.testing.chaos import FAULT_KINDS, ChaosConfig, run_campaign


def parse(argv: list[str]) -> ChaosConfig:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=40)
    parser.add_argument("--seed", type=int, default=None, help="Default: a random one (printed).")
    parser.add_argument("--steps", type=int, default=10000)
    parser.add_argument("--checkpoint-interval", type=int, default=500)
    parser.add_argument(
        "--kinds",
        default=",".join(FAULT_KINDS),
        help="Comma-separated fault kinds (default: all of them).",
    )
    parser.add_argument("--faults-per-kind", type=int, default=2)
    parser.add_argument("--extra-faults", type=int, default=10)
    parser.add_argument(
        "--faults-ahead",
        type=int,
        default=4,
        help="Spread faults over the campaign: at most this many ahead of the jobs' progress.",
    )
    parser.add_argument("--deadline", type=float, default=1500.0, help="Seconds, all in.")
    parser.add_argument("--work-dir", type=Path, default=None, help="Kept afterwards.")
    parser.add_argument("--keep", action="store_true", help="Keep the temporary work folder.")
    parser.add_argument(
        "--env", action="append", default=[], metavar="KEY=VALUE", help="A service setting."
    )
    args = parser.parse_args(argv)
    return ChaosConfig(
        jobs=args.jobs,
        seed=args.seed,
        steps=args.steps,
        checkpoint_interval_steps=args.checkpoint_interval,
        kinds=tuple(kind for kind in args.kinds.split(",") if kind),
        faults_per_kind=args.faults_per_kind,
        extra_faults=args.extra_faults,
        max_faults_ahead=args.faults_ahead,
        deadline_s=args.deadline,
        work_dir=args.work_dir,
        keep=args.keep,
        env=dict(item.split("=", 1) for item in args.env),
    )


def main(argv: list[str]) -> int:
    report = asyncio.run(run_campaign(parse(argv)))
    print(report.to_json(), flush=True)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
