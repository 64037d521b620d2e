"""Benchmark: fair share between tenants on a flooded cluster.

Three tenants of weights 1:1:2 flood the whole stack with MD jobs and a fourth arrives later;
each tenant's share of the cores is read from the process table four times a second, against
the same run with fair share off, and the steps the stopped attempts lose are checked on disk.
The last line printed is one JSON object. Method and keys: docs/benchmarks.md,
"make bench-fairshare".
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository's tools/

from bench_stack import BenchFailed, failing_as, servers, stack_on

from mdq.bus.subjects import Subjects
from mdq.bus.tenants import ensure_tenants_bucket, put_policy
from mdq.core import ids
from mdq.core.runner_task import ENV_ATTEMPT, ENV_JOB_ID, job_dir
from mdq.core.tenants import TenantPolicy
from mdq.sdk.client import IntakeUnavailable, MdqClient
from mdq.testing.runner_files import (
    checkpoint_steps,
    energy_rows,
    last_energy_step,
    logged_resume,
    newest_checkpoint_step,
    retry_table_problem,
)
from tools.processes import runner_environments
from tools.submitting import submit_request, water_job

NAMESPACE = "benchfair"
CHECKPOINT_INTERVAL = 200
REPORT_INTERVAL = 20
FLOODERS = {"ada": 1.0, "bo": 1.0, "cy": 2.0}
NEWCOMER = ("dee", 2.0)
"""Its weight: 2, so with 12 cores every fair share is whole cores (2, 2, 4 and 4)."""
POLL_S = 0.25


def job(name: str, checkpoint_interval: int) -> dict[str, object]:
    return water_job(
        name,
        steps=10_000_000,  # longer than the bench: every tenant always wants more
        report_interval_steps=REPORT_INTERVAL,
        checkpoint_interval_steps=checkpoint_interval,
        memory_mb=256,
        max_retries=20,
    )


async def flood(client: MdqClient, tenant: str, jobs: int, checkpoint_interval: int) -> None:
    request = submit_request(
        *(job(f"md{i}", checkpoint_interval) for i in range(jobs)), key=f"flood-{tenant}"
    )
    try:
        await client.submit_when_ready(request, within_s=600, answer_within_s=10)
    except IntakeUnavailable as silent:
        raise BenchFailed(f"intake never answered {tenant}'s submit") from silent


def running_attempts() -> dict[str, int]:
    """job id -> attempt of every runner process on this machine (from their environment)."""
    found: dict[str, int] = {}
    for _, env in runner_environments():
        if ENV_JOB_ID in env and env.get(ENV_ATTEMPT, "").isdigit():
            found[env[ENV_JOB_ID]] = int(env[ENV_ATTEMPT])
    return found


def checkpoint_interval_s(data_dir: Path) -> float | None:
    """The median time between two checkpoints of one job, from the files' modification times
    (the wall-clock length of a checkpoint interval on this loaded machine)."""
    gaps = []
    for folder in (data_dir / "jobs").glob("*/checkpoints"):
        times = sorted(path.stat().st_mtime for path in folder.glob("ckpt-*.xml"))
        gaps += [later - earlier for earlier, later in itertools.pairwise(times)]
    return round(statistics.median(gaps), 2) if gaps else None


@dataclass
class Sample:
    at: float
    cores: dict[str, int]


@dataclass
class Run:
    samples: list[Sample] = field(default_factory=list)
    newcomer_at: float = 0.0
    stopped: dict[tuple[str, int], tuple[int, int]] = field(default_factory=dict)
    """(job, attempt) of every attempt seen to stop while its job went on -> the last step of
    its energy table while it ran, and the newest checkpoint step on disk when it had gone."""
    stopped_files: dict[tuple[str, int], tuple[list[tuple[int, str]], set[int]]] = field(
        default_factory=dict
    )
    """The same attempts -> their energy table's rows and the checkpoint steps on disk when
    they had gone."""
    checkpoint_interval_s: float | None = None
    tables_checked: int = 0
    """Stopped attempts whose retry's energy table was checked against them on disk."""


def fair_shares(tenants: dict[str, float]) -> dict[str, float]:
    total = sum(tenants.values())
    return {tenant: weight / total for tenant, weight in tenants.items()}


async def measure(args: argparse.Namespace, *, fair_share: bool) -> dict[str, Any]:
    cores = 2 * args.cores_per_node
    env = {
        "MDQ_LOCAL_CPU_PER_NODE": str(args.cores_per_node),
        "MDQ_PLACEMENT_FAIR_SHARE": "true" if fair_share else "false",
        "MDQ_PLACEMENT_FAIR_SHARE_MIN_RUN_S": str(args.min_run_s),
        "MDQ_RECOVERY_BACKOFF_BASE_S": "0.5",
        "MDQ_RECOVERY_QUARANTINE_AFTER": "1000",
    }
    run = Run()
    async with (
        servers("mdq-bench-fairshare-") as bus_and_db,
        stack_on(bus_and_db, NAMESPACE, local_nodes=2, extra_env=env, grace_s=5.0) as stack,
    ):
        async with await MdqClient.connect(bus_and_db.nats_url, NAMESPACE) as operator:
            js = operator.nc.jetstream()
            subjects = Subjects(NAMESPACE)
            await ensure_tenants_bucket(js, subjects)
            everyone = {**FLOODERS, NEWCOMER[0]: NEWCOMER[1]}
            for tenant, weight in everyone.items():
                # no CPU quota in the way: fair share alone decides
                await put_policy(
                    js, subjects, tenant, TenantPolicy(weight=weight, max_running_cpu=None)
                )
            clients = {
                tenant: MdqClient(nc=operator.nc, subjects=subjects, tenant=tenant)
                for tenant in everyone
            }
            # the three floods together, as three groups starting a campaign the same morning
            await asyncio.gather(
                *(
                    flood(clients[tenant], tenant, args.jobs_per_tenant, args.checkpoint_interval)
                    for tenant in FLOODERS
                )
            )
            started = time.monotonic()
            seen: dict[str, int] = {}
            steps: dict[tuple[str, int], int] = {}
            end = started + args.newcomer_s + args.after_s
            while time.monotonic() < end:
                now = time.monotonic()
                if not run.newcomer_at and now - started >= args.newcomer_s:
                    run.newcomer_at = now - started
                    await flood(
                        clients[NEWCOMER[0]],
                        NEWCOMER[0],
                        args.jobs_per_tenant,
                        args.checkpoint_interval,
                    )
                attempts = await asyncio.to_thread(running_attempts)
                for job_id, attempt in attempts.items():
                    table = job_dir(stack.data_dir, job_id) / "energies.csv"
                    if table.is_file():  # a runner just started may not have written one yet
                        steps[(job_id, attempt)] = max(
                            steps.get((job_id, attempt), -1), last_energy_step(table)
                        )
                for job_id, attempt in seen.items():
                    if attempts.get(job_id) != attempt and (job_id, attempt) not in run.stopped:
                        # gone: what it reached, and the newest checkpoint on disk now (the
                        # runner writes one on SIGTERM before it exits; a retry resumes there)
                        folder = job_dir(stack.data_dir, job_id) / "checkpoints"
                        run.stopped[(job_id, attempt)] = (
                            steps.get((job_id, attempt), -1),
                            newest_checkpoint_step(folder),
                        )
                        table = job_dir(stack.data_dir, job_id) / "energies.csv"
                        run.stopped_files[(job_id, attempt)] = (
                            energy_rows(table) if table.is_file() else [],
                            checkpoint_steps(folder),
                        )
                seen = attempts
                cores_now: dict[str, int] = {}
                for job_id in attempts:
                    tenant = ids.tenant_of(job_id)
                    if tenant not in everyone:
                        continue  # not one of the bench's jobs (a runner's own helper process)
                    cores_now[tenant] = cores_now.get(tenant, 0) + 1
                run.samples.append(Sample(at=now - started, cores=cores_now))
                if args.verbose and len(run.samples) % 8 == 0:
                    print(
                        f"{now - started:6.1f} s {dict(sorted(cores_now.items()))}",
                        file=sys.stderr,
                        flush=True,
                    )
                await asyncio.sleep(POLL_S)
        lost = []
        last_attempt: dict[str, int] = {}
        for job_id, attempt in run.stopped:
            last_attempt[job_id] = max(last_attempt.get(job_id, 0), attempt + 1)
        for (job_id, attempt), (last_step, newest) in sorted(run.stopped.items()):
            log_path = stack.data_dir / "pods" / f"{ids.pod_name(job_id, attempt + 1)}.log"
            resumed = logged_resume(log_path)  # a retry that ran says where it resumed
            start = resumed if resumed is not None else newest
            rows, on_disk = run.stopped_files[(job_id, attempt)]
            if resumed:
                if resumed not in on_disk:
                    raise BenchFailed(f"{job_id}#{attempt + 1} says step {resumed}: no such file")
                table = job_dir(stack.data_dir, job_id) / "energies.csv"
                table_now = energy_rows(table)
                if last_attempt[job_id] == attempt + 1 and table_now and table_now[-1][0] > resumed:
                    problem = retry_table_problem(rows, table_now, resumed, REPORT_INTERVAL)
                    if problem:
                        raise BenchFailed(f"{job_id}#{attempt + 1}'s energy table: {problem}")
                    run.tables_checked += 1
            if last_step >= 0 and start >= 0:
                lost.append(max(0, last_step - start))
        run.checkpoint_interval_s = checkpoint_interval_s(stack.data_dir)
    summary = summarise(run, cores, lost)
    summary["checkpoint_interval_steps"] = args.checkpoint_interval
    if fair_share:  # what this bench promises to measure; the baseline may well never get there
        if summary["time_to_fair_s"] is None:
            raise BenchFailed("the newcomer never held its fair share")
        if not lost:
            raise BenchFailed(
                "no attempt was seen stopped for the newcomer: no steps lost measured"
            )
        if not summary["steady_samples"]:
            raise BenchFailed("no steady window: the cluster was never full")
    return summary


def summarise(run: Run, cores: int, lost: list[int]) -> dict[str, Any]:
    before = fair_shares(FLOODERS)
    after = fair_shares({**FLOODERS, NEWCOMER[0]: NEWCOMER[1]})
    first_window: list[Sample] = []
    full_at = next((s.at for s in run.samples if sum(s.cores.values()) >= cores), None)
    newcomer_rel = run.newcomer_at
    due = after[NEWCOMER[0]] * cores
    fair_at = next(
        (
            s.at
            for s in run.samples
            if s.at >= newcomer_rel and s.cores.get(NEWCOMER[0], 0) >= due - 1e-9
        ),
        None,
    )
    if full_at is not None:  # the second half of the first phase: past the first floods' start
        settled = max(full_at, newcomer_rel / 2)
        first_window = [s for s in run.samples if settled <= s.at < newcomer_rel]
    second_window = [s for s in run.samples if fair_at is not None and s.at >= fair_at]
    from_arrival = [s for s in run.samples if s.at >= newcomer_rel]

    def errors(window: list[Sample], fair: dict[str, float]) -> list[float]:
        return [
            max(abs(s.cores.get(t, 0) / cores - share) for t, share in fair.items()) for s in window
        ]

    errs = errors(first_window, before) + errors(second_window, after)
    arrival_errs = errors(from_arrival, after)
    busy = [s for s in run.samples if full_at is not None and s.at >= full_at]
    means = (
        {
            t: statistics.mean(s.cores.get(t, 0) / cores for s in from_arrival) / share
            for t, share in after.items()
        }
        if from_arrival
        else {}
    )
    jain = (
        sum(means.values()) ** 2 / (len(means) * sum(x * x for x in means.values()))
        if means
        else 0.0
    )
    return {
        "tenants": len(after),
        "cores": cores,
        "share_error_mean_from_arrival": round(statistics.mean(arrival_errs), 4)
        if arrival_errs
        else None,
        "share_error_max_settled": round(max(errs), 4) if errs else None,
        "utilisation": round(statistics.mean(sum(s.cores.values()) / cores for s in busy), 4)
        if busy
        else None,
        "time_to_fair_s": round(fair_at - newcomer_rel, 2) if fair_at is not None else None,
        "max_steps_lost": max(lost) if lost else None,
        "checkpoint_interval_s": run.checkpoint_interval_s,
        "time_to_fair_goal_s": round(run.checkpoint_interval_s + 5, 2)
        if run.checkpoint_interval_s is not None
        else None,
        "preemptions_measured": len(lost),
        "retry_tables_checked_on_disk": run.tables_checked,
        "jains_index": round(jain, 4) if means else None,
        "steady_samples": len(first_window) + len(second_window),
        "samples_from_arrival": len(from_arrival),
    }


async def main(args: argparse.Namespace) -> dict[str, Any]:
    result = await measure(args, fair_share=True)
    result["bench"] = "fairshare"
    if not args.no_baseline:
        baseline = await measure(args, fair_share=False)
        result["baseline_fair_share_off"] = {
            key: baseline[key]
            for key in (
                "share_error_mean_from_arrival",
                "share_error_max_settled",
                "utilisation",
                "time_to_fair_s",
                "jains_index",
            )
        }
    result["load_avg"] = [round(x, 2) for x in os.getloadavg()]
    result["goals"] = {
        "share_error_max_settled": 0.05,
        "utilisation": 0.95,
        "time_to_fair_s": "one checkpoint interval + 5 s",
        "jains_index (from the newcomer's arrival)": 0.95,
    }
    result["measured"] = (
        "shares: runner processes per tenant in the process table, 4 times a second; steps "
        "lost: the stopped attempt's energies.csv minus its retry's logged resume step (or the "
        "newest checkpoint file while the retry waits), checked against the checkpoint files "
        "and the retry's energies.csv on disk; fairness from the newcomer's arrival"
    )
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cores-per-node", type=int, default=6)
    parser.add_argument("--jobs-per-tenant", type=int, default=16)
    parser.add_argument("--newcomer-s", type=float, default=60.0)
    parser.add_argument("--after-s", type=float, default=60.0)
    parser.add_argument("--min-run-s", type=float, default=5.0)
    parser.add_argument(
        "--checkpoint-interval", type=int, default=CHECKPOINT_INTERVAL, help="steps"
    )
    parser.add_argument("--no-baseline", action="store_true")
    parser.add_argument("--verbose", action="store_true", help="the shares every 2 s on stderr")
    parser.add_argument("--quick", action="store_true", help="45 s, then 45 s, no baseline")
    cli = parser.parse_args()
    if cli.quick:
        cli.newcomer_s, cli.after_s, cli.no_baseline = 45.0, 45.0, True
    with failing_as("fairshare"):
        print(json.dumps(asyncio.run(main(cli))))
