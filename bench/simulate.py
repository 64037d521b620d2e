"""Benchmark: ``mdq simulate`` at cluster scale, and what it says about mdq's policies.

The simulator's speed against real time, and three policy comparisons (learned against
hand-set requests, fair share against FIFO, load-aware against plain bin-packing), each over
several seeds. Usage: ``make bench-simulate`` (``--quick``, ``--validate``); the last line printed
is one JSON object. Method and keys: docs/simulate.md, "The benchmark".
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence

import psutil

from mdq.sim.config import named
from mdq.sim.engine import simulate
from mdq.sim.generator import GeneratorSpec, NodeClass, generate

CHILD = """
import json, sys
from mdq.sim.config import named
from mdq.sim.engine import simulate
from mdq.sim.generator import GeneratorSpec, generate
nodes, jobs, seed = (int(arg) for arg in sys.argv[1:4])
workload = generate(GeneratorSpec(nodes=nodes, jobs=jobs, seed=seed))
print(json.dumps({"generated": True}), flush=True)
metrics = simulate(workload, named(["load-aware"])[0])
print(json.dumps({"virtual_s": metrics.virtual_s, "succeeded": metrics.succeeded,
                  "passes": metrics.passes}), flush=True)
"""


def spread(values: Sequence[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), 4),
        "min": round(min(values), 4),
        "max": round(max(values), 4),
    }


def speed_round(nodes: int, jobs: int, seed: int) -> dict[str, float]:
    """One child simulation measured from outside: the wall clock from the end of its
    workload's generation (its first line) to its exit, and its CPU time over the same span
    (all of it less what it had used when that line came)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(nodes), str(jobs), str(seed)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    first = child.stdout.readline()
    started = time.monotonic()
    times = psutil.Process(child.pid).cpu_times()  # the generation's, read from outside
    generated_cpu = times.user + times.system
    if not json.loads(first).get("generated"):
        raise SystemExit(f"the child said {first!r}")
    last = child.stdout.readline()
    child.wait()
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime) - generated_cpu
    if child.returncode != 0:
        raise SystemExit(f"the simulation failed ({child.returncode})")
    result = json.loads(last)
    if result["succeeded"] < jobs * 0.95:
        raise SystemExit(f"only {result['succeeded']} of {jobs} jobs succeeded")
    return {"virtual_s": result["virtual_s"], "wall_s": wall, "cpu_s": cpu}


def paired(
    seeds: Sequence[int], make: Callable[[int], GeneratorSpec], first: str, second: str, key: str
) -> tuple[list[float], list[float], list[float]]:
    """For each seed: ``key`` of configuration ``first`` and ``second`` on the same workload,
    and their quotient."""
    ones, twos, quotients = [], [], []
    for seed in seeds:
        workload = generate(make(seed))
        one, two = (simulate(workload, config) for config in named([first, second]))
        a, b = float(getattr(one, key)), float(getattr(two, key))
        ones.append(a)
        twos.append(b)
        quotients.append(a / b if b else float("nan"))
    return ones, twos, quotients


def memory_bound(jobs: int, nodes: int) -> Callable[[int], GeneratorSpec]:
    return lambda seed: GeneratorSpec(
        nodes=nodes,
        jobs=jobs,
        seed=seed,
        node_classes=(NodeClass(1.0, 32.0, 16_384),),
        atoms_min=5_000,
        atoms_max=60_000,
        one_thread=True,
        load=100.0,  # a backlog, as bench/requests.py submits its campaign: all at once
        run_median_s=1_800.0,
        run_sigma=0.5,
        crash_probability=0.0,
    )


def fair_mix(jobs: int, nodes: int) -> Callable[[int], GeneratorSpec]:
    return lambda seed: GeneratorSpec(nodes=nodes, jobs=jobs, seed=seed, load=1.5)


def noisy_mix(jobs: int, nodes: int) -> Callable[[int], GeneratorSpec]:
    return lambda seed: GeneratorSpec(
        nodes=nodes, jobs=jobs, seed=seed, load=1.0, noisy_fraction=0.3, noisy_load=0.6
    )


def validation() -> float:
    """The validation campaign's makespan error (tests/e2e/test_sim_validation.py)."""
    from tools.sim_validation import validate_on_this_machine

    return asyncio.run(validate_on_this_machine()).makespan_error


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--learned-nodes", type=int, default=100)
    parser.add_argument("--policy-jobs", type=int, default=10_000)
    parser.add_argument("--validate", action="store_true")
    parser.add_argument("--quick", action="store_true", help="100 nodes, 10,000 jobs")
    args = parser.parse_args()
    if args.quick:
        args.nodes, args.jobs, args.policy_jobs, args.learned_nodes = 100, 10_000, 3_000, 20
    seeds = list(range(1, args.rounds + 1))
    load_before = os.getloadavg()[0]

    speeds = [speed_round(args.nodes, args.jobs, seed) for seed in seeds]
    for seed, one in zip(seeds, speeds, strict=True):
        print(json.dumps({"speed_round": seed, **{k: round(v, 2) for k, v in one.items()}}))
    wall_speedups = [s["virtual_s"] / s["wall_s"] for s in speeds]
    cpu_speedups = [s["virtual_s"] / s["cpu_s"] for s in speeds]

    sized = (args.policy_jobs, args.learned_nodes)
    _, _, learned_q = paired(seeds, memory_bound(*sized), "learned", "load-aware", "makespan_s")
    fair, fifo, _ = paired(seeds, fair_mix(*sized), "fair-share", "fifo", "share_error_max")
    aware, blind, noisy_q = paired(seeds, noisy_mix(*sized), "load-aware", "binpack", "p95_wait_s")
    line = {
        "nodes": args.nodes,
        "jobs": args.jobs,
        "rounds": args.rounds,
        "speedup_vs_real_time": round(statistics.median(wall_speedups), 1),
        "speedup_vs_real_time_spread": spread(wall_speedups),
        "speedup_vs_real_time_cpu": round(statistics.median(cpu_speedups), 1),
        "virtual_s": spread([s["virtual_s"] for s in speeds]),
        "wall_s": spread([s["wall_s"] for s in speeds]),
        "validation_makespan_error": round(validation(), 4) if args.validate else None,
        "learned_makespan_ratio": round(statistics.median(learned_q), 4),
        "learned_makespan_ratio_spread": spread(learned_q),
        "learned_nodes": args.learned_nodes,
        "policy_jobs": args.policy_jobs,
        "fairshare_share_error_max": round(statistics.median(fair), 4),
        "fairshare_share_error_max_spread": spread(fair),
        "fifo_share_error_max": round(statistics.median(fifo), 4),
        "load_aware_p95_wait_ratio": round(statistics.median(noisy_q), 4),
        "load_aware_p95_wait_ratio_spread": spread(noisy_q),
        "load_aware_p95_wait_s": round(statistics.median(aware), 1),
        "binpack_p95_wait_s": round(statistics.median(blind), 1),
        "load_avg": round(load_before, 2),
        "load_avg_after": round(os.getloadavg()[0], 2),
    }
    print(json.dumps(line))


if __name__ == "__main__":
    main()
