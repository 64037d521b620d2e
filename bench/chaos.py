"""``make chaos`` / ``make chaos-soak``: MD jobs on the embedded stack while every part fails.

A thin command line over ``tools.chaos`` (which documents what is injected and checked).
One campaign (``make chaos``) prints its JSON line and exits 1 when a check failed;
``--soak N`` (``make chaos-soak SEEDS=N``) runs N campaigns on fresh random seeds, or
``--seeds A,B`` those seeds, writing each seed as it starts and each campaign's line as it ends
to stderr, then prints one JSON line of the whole (``SoakReport``) and exits 0 only if every
campaign passed. Whatever goes wrong in the harness itself becomes a problem in that line, with
its traceback, and exit 1: it never ends with a bare traceback. Needs root for the data disk (a
loop-mounted ext4 file, else a tmpfs); without it the disk-full episodes are reported as
unavailable and the campaign fails.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository's tools/

from tools.chaos import (
    FAULT_KINDS,
    Campaign,
    ChaosConfig,
    ChaosReport,
    run_soak,
)


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=40)
    parser.add_argument("--seed", type=int, default=None, help="Default: a random one (printed).")
    parser.add_argument("--soak", type=int, default=0, help="Run this many campaigns.")
    parser.add_argument("--seeds", default="", help="Comma-separated seeds: a soak over them.")
    parser.add_argument("--steps", type=int, default=10000)
    parser.add_argument("--checkpoint-interval", type=int, default=500)
    parser.add_argument(
        "--kinds",
        default=",".join(FAULT_KINDS),
        help="Comma-separated fault kinds (default: all of them).",
    )
    parser.add_argument("--faults-per-kind", type=int, default=2)
    parser.add_argument(
        "--once-per-kind",
        type=int,
        default=1,
        help="Long episodes and worst-moment strikes of each kind.",
    )
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
    return parser


def config_of(args: argparse.Namespace) -> ChaosConfig:
    return ChaosConfig(
        jobs=args.jobs,
        seed=args.seed,
        steps=args.steps,
        checkpoint_interval_steps=args.checkpoint_interval,
        kinds=tuple(kind for kind in args.kinds.split(",") if kind),
        faults_per_kind=args.faults_per_kind,
        once_per_kind=args.once_per_kind,
        extra_faults=args.extra_faults,
        max_faults_ahead=args.faults_ahead,
        deadline_s=args.deadline,
        work_dir=args.work_dir,
        keep=args.keep,
        env=dict(item.split("=", 1) for item in args.env),
    )


def _progress(index: int, report: ChaosReport) -> None:
    print(f"campaign {index + 1}: {report.to_json()}", file=sys.stderr, flush=True)


async def _soak(config: ChaosConfig, seeds: list[int]) -> int:
    def started(index: int) -> None:
        print(
            f"campaign {index + 1} of {len(seeds)}: seed {seeds[index]}",
            file=sys.stderr,
            flush=True,
        )

    def ended(index: int, report: ChaosReport) -> None:
        _progress(index, report)
        if index + 1 < len(seeds):
            started(index + 1)

    started(0)
    soak = await run_soak(config, seeds, on_report=ended)
    print(soak.to_json(), flush=True)
    return 0 if soak.ok else 1


async def _one(config: ChaosConfig) -> int:
    campaign = Campaign(config)
    try:
        report = await campaign.run()
    except (asyncio.CancelledError, KeyboardInterrupt):  # Ctrl-C: what it saw, cleaned up
        report = campaign.report
    print(report.to_json(), flush=True)
    return 0 if report.ok else 1


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    # What the libraries log goes to each campaign's harness.log (tools.chaos), never
    # to the terminal, also before and after one: the report is the line printed.
    logging.getLogger().addHandler(logging.NullHandler())
    try:
        config = config_of(args)
        if args.seeds or args.soak:
            seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
            fresh = random.SystemRandom()
            seeds += [fresh.randrange(1 << 31) for _ in range(max(0, args.soak - len(seeds)))]
            return asyncio.run(_soak(config, seeds))
        return asyncio.run(_one(config))
    except BaseException as error:  # the harness never ends with a bare traceback
        trace = "".join(traceback.format_exception(error)).rstrip()
        line = {"ok": False, "seed": args.seed, "problems": [f"the harness failed: {trace}"]}
        print(json.dumps(line), flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
