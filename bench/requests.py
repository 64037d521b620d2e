"""Benchmark: resource requests learned from history against requests set by hand.

The whole stack runs one MD campaign twice on the same local nodes, first with hand-set
requests, then with ``resources: {auto: true}``; memory and CPU slack, OOM kills and the
makespan are measured from the process table, never from mdq's own figures. Usage:
``make bench-requests`` (``--quick`` runs fewer steps); the last line printed is one JSON object.
Method and runs: docs/requests.md, "Measured".
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import psutil
from bench_figures import percentile
from bench_stack import servers, stack_on
from google.protobuf import json_format

from mdq.contracts import pb
from mdq.core.runner_task import ENV_ATTEMPT, ENV_JOB_ID
from mdq.sdk.client import MdqClient
from mdq.stack import LOCAL_AGENT
from mdq.testing.agent_log import PodEnd, read_pod_ends

SYSTEMS: list[tuple[str, dict[str, object], int]] = [
    # name, system, atoms (for the hand-set rule)
    ("water-2nm", {"water_box": {"box_nm": 2.0}}, 774),
    ("water-3nm", {"water_box": {"box_nm": 3.0}}, 2661),
    ("water-4nm", {"water_box": {"box_nm": 4.0}}, 6282),
    ("lj-1k", {"lennard_jones": {"atoms": 1000}}, 1000),
    ("lj-4k", {"lennard_jones": {"atoms": 4000}}, 4000),
    ("lj-12k", {"lennard_jones": {"atoms": 12000}}, 12000),
]
HAND_SET = {"cpu": 2, "memory_mb": 4096}
"""The brief's "2-4 cores, 4-8 Gi" for an MD job without history, at its low end."""
MACHINE_CORES = os.cpu_count() or 1
NODES = 2 if 2 * int(HAND_SET["cpu"]) <= MACHINE_CORES else 1
NODE_CPU = MACHINE_CORES // NODES
"""The machine's cores shared among the nodes, not overcommitted (the module docstring)."""
NODE_MEMORY_MB = 8192
CLOCK_TICKS = 100  # os.sysconf("SC_CLK_TCK") on Linux


def hand_set(atoms: int, *, rule: bool = False) -> dict[str, object]:
    """What a careful person requests without history (the module docstring): the brief's
    figure, or with ``rule`` the older per-size rule."""
    if rule:
        return {"cpu": 1, "memory_mb": 512 if atoms < 5000 else 1024}
    return dict(HAND_SET)


@dataclass
class Seen:
    """One attempt's runner as the sampler saw it."""

    peak_kib: int = 0
    cpu_s: float = 0.0
    first: float = 0.0
    last: float = 0.0


@dataclass
class Sampler:
    """Reads every runner's VmHWM and CPU time from /proc, every ``interval_s``."""

    interval_s: float = 0.1
    seen: dict[tuple[str, int], Seen] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _pids: dict[int, tuple[str, int] | None] = field(default_factory=dict)

    def runner_pids(self) -> dict[int, tuple[str, int]]:
        """Every runner process found so far: pid -> (job, attempt)."""
        return {pid: key for pid, key in list(self._pids.items()) if key is not None}

    def _attempt_of(self, process: psutil.Process) -> tuple[str, int] | None:
        if process.pid not in self._pids:
            try:
                cmdline = " ".join(process.cmdline())
                env = process.environ() if "services.runner" in cmdline else {}
            except psutil.Error:
                return None
            job_id, attempt = env.get(ENV_JOB_ID), env.get(ENV_ATTEMPT)
            self._pids[process.pid] = (job_id, int(attempt)) if job_id and attempt else None
        return self._pids[process.pid]

    @staticmethod
    def _read(pid: int) -> tuple[int, float]:
        peak = 0
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                peak = int(line.split()[1])
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return peak, (int(fields[11]) + int(fields[12])) / CLOCK_TICKS

    def sample(self) -> None:
        now = time.monotonic()
        for process in psutil.process_iter():
            key = self._attempt_of(process)
            if key is None:
                continue
            try:
                tree = [process, *process.children(recursive=True)]
                readings = [self._read(member.pid) for member in tree]
            except (OSError, psutil.Error, ValueError, IndexError):
                continue
            seen = self.seen.setdefault(key, Seen(first=now))
            seen.peak_kib = max(seen.peak_kib, sum(peak for peak, _ in readings))
            seen.cpu_s = max(seen.cpu_s, sum(cpu for _, cpu in readings))
            seen.last = now

    def run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval_s)

    def stop(self) -> None:
        self._stop.set()


def agent_ends(log_path: Path, offset: int) -> dict[int, PodEnd]:
    """What the node agent recorded of each pod process that ended, from ``offset`` of its
    log on, by pid."""
    return {end.pid: end for end in read_pod_ends(log_path, offset)}


def jobs(phase: str, runs: int, steps: int, *, rule: bool = False) -> list[dict[str, object]]:
    out = []
    for name, system, atoms in SYSTEMS:
        for run in range(runs):
            out.append(
                {
                    "name": f"{name}-{phase}-{run}",
                    "system": system,
                    "steps": steps,
                    "report_interval_steps": min(100, steps),
                    "checkpoint_interval_steps": steps,
                    "seed": run + 1,
                    "resources": (
                        {"auto": True} if phase == "learned" else hand_set(atoms, rule=rule)
                    ),
                    "max_retries": 3,
                }
            )
    return out


async def submit(client: MdqClient, key: str, specs: list[dict[str, object]]) -> list[str]:
    request = json_format.ParseDict({"idempotency_key": key, "jobs": specs}, pb.SubmitRequest())
    return await client.submit_when_ready(request, within_s=600, answer_within_s=10)


def machine_cpu_busy(before: Any, after: Any) -> float:
    """The share of the machine's CPU time (all cores) that was busy between two readings of
    ``psutil.cpu_times()``: near 1 means the campaign was bound by the cores themselves, and
    no choice of requests could have run it faster."""
    total = sum(after) - sum(before)
    idle = (after.idle + getattr(after, "iowait", 0.0)) - (
        before.idle + getattr(before, "iowait", 0.0)
    )
    return 1 - idle / total if total > 0 else 0.0


@dataclass
class Phase:
    makespan_s: float
    machine_cpu_busy: float
    memory_slack: list[float]
    cpu_slack: list[float]
    oom_kills: int
    """Runner processes the node agent killed for memory (SIGKILL), from its records."""
    over_request: int
    """Attempts whose VmHWM went above their memory request (the kernel's count)."""
    mdq_oom_kills: int
    """mdq's own count (attempts.failure_reason): printed, never used in a ratio."""
    requested: dict[str, tuple[float, int]]

    def figures(self, prefix: str) -> dict[str, object]:
        """The slack and kill figures of this phase, each key after ``prefix``."""
        figures = {
            "mean_memory_slack": round(statistics.mean(self.memory_slack), 3),
            "p95_memory_slack": round(percentile(self.memory_slack, 0.95), 3),
            "mean_cpu_slack": round(statistics.mean(self.cpu_slack), 3),
            "oom_kills": self.oom_kills,
            "over_request_attempts": self.over_request,
            "mdq_reported_oom_kills": self.mdq_oom_kills,
        }
        return {prefix + key: value for key, value in figures.items()}


TERMINAL = ("SUCCEEDED", "FAILED", "CANCELLED")


async def until(check: Any, what: str, timeout_s: float = 120.0) -> Any:
    """Poll ``check`` (async, returning a truthy value when done) until it is; its value."""
    deadline = time.monotonic() + timeout_s
    while not (value := await check()):
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        await asyncio.sleep(0.2)
    return value


async def run_phase(
    client: MdqClient,
    database_url: str,
    sampler: Sampler,
    agent_log: Path,
    phase: str,
    runs: int,
    steps: int,
    rule: bool,
) -> Phase:
    offset = await asyncio.to_thread(os.path.getsize, agent_log)
    started, cpu_before = time.monotonic(), psutil.cpu_times()
    job_ids = await submit(client, f"bench-requests-{phase}", jobs(phase, runs, steps, rule=rule))
    await client.wait(job_ids, timeout=3600)
    busy = machine_cpu_busy(cpu_before, psutil.cpu_times())
    pids = {pid: key for pid, key in sampler.runner_pids().items() if key[0] in job_ids}

    async def every_runner_ended() -> dict[int, PodEnd] | None:
        ends = await asyncio.to_thread(agent_ends, agent_log, offset)
        return ends if set(pids) <= set(ends) else None

    ends = await until(every_runner_ended, "the node agent's end record of every runner seen")
    last_seen = [s.last for key, s in list(sampler.seen.items()) if key[0] in job_ids]
    if not last_seen:
        raise RuntimeError(f"{phase}: the sampler saw no runner of the campaign")
    makespan = max(last_seen) - started
    oom_killed = {p for p in pids if ends[p].oom_killed}
    connection = await asyncpg.connect(database_url)
    try:

        async def projected() -> bool:
            ended = await connection.fetchval(
                "SELECT count(*) FROM jobs WHERE job_id = ANY($1::text[]) "
                "AND state = ANY($2::text[])",
                job_ids,
                list(TERMINAL),
            )
            return bool(ended == len(job_ids))

        await until(projected, "mdq's projection of every job's end (for the requests)")
        rows = await connection.fetch(
            "SELECT job_id, spec FROM jobs WHERE job_id = ANY($1::text[])", job_ids
        )
        failures = await connection.fetchval(
            "SELECT count(*) FROM attempts WHERE job_id = ANY($1::text[]) "
            "AND failure_reason = 'FAILURE_OOM_KILLED'",
            job_ids,
        )
    finally:
        await connection.close()
    requested: dict[str, tuple[float, int]] = {}
    for row in rows:
        spec = json.loads(row["spec"]) if isinstance(row["spec"], str) else row["spec"]
        resources = spec.get("resources", {})
        requested[row["job_id"]] = (float(resources["cpu"]), int(resources["memory_mb"]))
    memory_slack, cpu_slack, over_request = [], [], 0
    for (job_id, _attempt), seen in sampler.seen.items():
        if job_id not in requested:
            continue
        cpu, memory_mb = requested[job_id]
        over_request += seen.peak_kib / 1024 > memory_mb
        if seen.last <= seen.first:
            continue
        memory_slack.append(1 - seen.peak_kib / 1024 / memory_mb)
        cpu_slack.append(1 - (seen.cpu_s / (seen.last - seen.first)) / cpu)
    return Phase(
        makespan,
        busy,
        memory_slack,
        cpu_slack,
        len(oom_killed),
        over_request,
        int(failures),
        requested,
    )


async def main(
    runs: int, steps: int, nodes: int, node_cpu: int, node_memory_mb: int, rule: bool
) -> dict[str, object]:
    sampler = Sampler()
    thread = threading.Thread(target=sampler.run, daemon=True)
    async with servers("mdq-bench-requests-") as bus_and_db:
        env = {
            "MDQ_METRICS_INTERVAL_S": "1",
            "MDQ_LOCAL_CPU_PER_NODE": str(node_cpu),
            "MDQ_LOCAL_MEMORY_MB_PER_NODE": str(node_memory_mb),
            "MDQ_INTAKE_HISTORY_DATABASE_URL": bus_and_db.database_url,
            "MDQ_INTAKE_HISTORY_REFRESH_S": "2",
            "MDQ_RUNNER_WARMUP_MINIMIZE_ITERATIONS": "20",
        }
        stack = stack_on(bus_and_db, "benchreq", local_nodes=nodes, extra_env=env, grace_s=5.0)
        thread.start()
        async with stack:
            try:
                async with await MdqClient.connect(bus_and_db.nats_url, "benchreq") as client:
                    agent_log = stack.logs_dir / f"{LOCAL_AGENT}.log"
                    database_url = bus_and_db.database_url
                    hand = await run_phase(
                        client, database_url, sampler, agent_log, "hand", runs, steps, rule
                    )
                    await asyncio.sleep(5.0)  # intake reads the first campaign's usage (every 2 s)
                    learned = await run_phase(
                        client, database_url, sampler, agent_log, "learned", runs, steps, rule
                    )
            finally:
                sampler.stop()
                thread.join(timeout=5)
    if not learned.memory_slack or not hand.memory_slack:
        raise SystemExit("no runner was measured")
    return {
        "systems": len(SYSTEMS),
        "runs": len(learned.memory_slack),
        "runs_per_system": runs,
        "steps": steps,
        **learned.figures(""),
        "makespan_ratio": round(learned.makespan_s / hand.makespan_s, 3),
        **hand.figures("hand_set_"),
        "hand_set": "rule: 1 core, 512/1024 MiB by size" if rule else "brief: 2 cores, 4096 MiB",
        "hand_set_makespan_s": round(hand.makespan_s, 1),
        "learned_makespan_s": round(learned.makespan_s, 1),
        "hand_set_machine_cpu_busy": round(hand.machine_cpu_busy, 3),
        "learned_machine_cpu_busy": round(learned.machine_cpu_busy, 3),
        "learned_requests_mb": sorted({memory for _, memory in learned.requested.values()}),
        "nodes": f"{nodes} x ({node_cpu} cores, {node_memory_mb} MiB)",
        "machine_cores": os.cpu_count(),
        "load_avg": [round(x, 2) for x in os.getloadavg()],
        "measured": "peak: VmHWM of each runner's process tree from /proc, sampled every 0.1 s "
        "by the bench; requested: the resources each job was recorded with; oom_kills: runner "
        "pids the node agent (their parent) recorded killed for memory with SIGKILL's status; "
        "makespan: bench clock, submit to the last sighting of a runner of the campaign; "
        "mdq_reported_*: mdq's own attempts table, in no ratio",
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=4, help="runs of each system per campaign")
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--quick", action="store_true", help="3 runs of 300 steps")
    parser.add_argument("--nodes", type=int, default=NODES)
    parser.add_argument(
        "--node-cpu",
        type=int,
        default=NODE_CPU,
        help="cores of each node (all nodes together at most the machine's: no overcommit)",
    )
    parser.add_argument("--node-memory-mb", type=int, default=NODE_MEMORY_MB)
    parser.add_argument(
        "--hand-set-rule",
        action="store_true",
        help="hand-set requests by the older per-size rule instead of the brief's 2 cores, 4 Gi",
    )
    args = parser.parse_args()
    if args.nodes * args.node_cpu > MACHINE_CORES:
        parser.error(f"{args.nodes} nodes x {args.node_cpu} cores overcommit this machine's cores")
    if not args.hand_set_rule and (
        args.node_cpu < int(HAND_SET["cpu"]) or args.node_memory_mb < int(HAND_SET["memory_mb"])
    ):
        parser.error(f"a hand-set job ({HAND_SET}) fits no node of this size")
    runs, steps = (3, 300) if args.quick else (args.runs, args.steps)
    result = asyncio.run(
        main(
            runs,
            steps,
            args.nodes,
            args.node_cpu,
            args.node_memory_mb,
            args.hand_set_rule,
        )
    )
    print(json.dumps(result), flush=True)
    sys.exit(0)
