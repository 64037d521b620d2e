"""Benchmark: placement over several clusters: ``make bench-multicluster``.

Placement's rate with 3 clusters of 1,000 nodes against 1 cluster of 3,000, the real intake
and placement on one NATS server; then a whole local cluster frozen mid-campaign, timing the
failover and counting the steps lost and the jobs that succeed exactly once, from outside.
The last line printed is one JSON object. Method and keys: docs/benchmarks.md,
"make bench-multicluster".
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
from nats.aio.client import Client
from nats.aio.msg import Msg

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository's tools/

from bench_figures import percentile
from bench_stack import BenchFailed, failing_as, servers, stack_on
from placement import processes, side_env, submit_payload, wait_for_responder
from recovery import submit

from mdq.bus.codec import decode_event
from mdq.bus.connect import connect
from mdq.bus.publisher import EventPublisher
from mdq.bus.setup import prepare_bus
from mdq.bus.subjects import Subjects
from mdq.contracts import pb
from mdq.core import ids
from mdq.core.clusters import qualified
from mdq.core.runner_task import ENV_ATTEMPT, ENV_JOB_ID, job_dir
from mdq.embedded import SHARED_FILE_STORE, start_nats
from mdq.sdk.client import MdqClient
from mdq.testing.agent_log import PodEnd, read_pod_ends
from mdq.testing.runner_files import (
    checkpoint_steps,
    energy_rows,
    last_energy_step,
    logged_resume,
    retry_table_problem,
)
from tools.processes import runner_environments
from tools.submitting import water_job

NODES = 3000
NODE_CORES = 64
MEMORY_MB_PER_CORE = 4096


def sized_payload(key: str, cores: int) -> bytes:
    """A submit of one job asking for ``cores`` cores and 4 GiB each."""
    request = pb.SubmitRequest(idempotency_key=key, submitted_by="bench")
    job = request.jobs.add(name="j", steps=1000)
    job.resources.cpu, job.resources.memory_mb = cores, cores * MEMORY_MB_PER_CORE
    return request.SerializeToString()


def round_payloads(prefix: str, count: int) -> list[tuple[str, bytes]]:
    """(job id, submit) of a round's jobs, 1 to 16 cores in turn."""
    out = []
    for i in range(count):
        key = f"{prefix}-{i}"
        out.append((ids.job_id(ids.request_id_for_key(key), "j"), sized_payload(key, 1 + i % 16)))
    return out


async def round_throughput(
    nc: Client, request_subject: str, bound_subject: str, payloads: list[tuple[str, bytes]]
) -> float:
    """Jobs bound per second, submit of the first to ``bound`` of the last of ``payloads``;
    only these jobs' bound events count."""
    expected = {job for job, _ in payloads}
    at: dict[str, float] = {}
    done = asyncio.Event()

    async def on_bound(message: Msg) -> None:
        job = message.subject.split(".")[-2]
        if job in expected:
            at.setdefault(job, time.perf_counter())
            if len(at) == len(expected):
                done.set()

    subscription = await nc.subscribe(bound_subject, cb=on_bound)
    slots = asyncio.Semaphore(256)

    async def one(payload: bytes) -> None:
        async with slots:
            await nc.request(request_subject, payload, timeout=30)

    started = time.perf_counter()
    await asyncio.gather(*(one(payload) for _, payload in payloads))
    try:
        await asyncio.wait_for(done.wait(), timeout=120)
    except TimeoutError:
        raise BenchFailed(f"{len(expected) - len(at)} of the round's jobs never bound") from None
    finally:
        await subscription.unsubscribe()
    return len(payloads) / (max(at.values()) - started)


SHAPES = {"one": (1, 3000), "three": (3, 1000)}
"""namespace -> (clusters, nodes per cluster)."""


def node_names(clusters: int, per_cluster: int) -> list[tuple[str, str]]:
    """(cluster, qualified node name) of every node; the one-cluster shape is unnamed."""
    if clusters == 1:
        return [("", f"node{i}") for i in range(per_cluster)]
    return [
        (f"c{k}", qualified(f"c{k}", f"node{i}"))
        for k in range(clusters)
        for i in range(per_cluster)
    ]


async def keep_nodes_reporting(
    nc: Client, subjects: Subjects, nodes: list[tuple[str, str]]
) -> None:
    bus = EventPublisher(js=nc.jetstream(), subjects=subjects, producer="metrics")
    while True:
        stamp = time.time_ns()
        await bus.publish_all(
            bus.event(
                "node_load",
                pb.NodeLoad(
                    node=name,
                    cpu_load=0.1 + 0.5 * ((i * 7919) % 100) / 100,  # mixed live loads
                    memory_load=0.2,
                    cpu_capacity=NODE_CORES,
                    memory_capacity_mb=NODE_CORES * MEMORY_MB_PER_CORE,
                    ready=True,
                    cluster=cluster,
                    cluster_labels={"site": cluster} if cluster else {},
                ),
                job_id="",
                attempt=0,
                detail=f"{name}:{stamp}",
            )
            for i, (cluster, name) in enumerate(nodes)
        )
        await asyncio.sleep(2.0)


async def open_side(
    namespace: str, url: str, root: Path, stack: contextlib.ExitStack
) -> tuple[Client, asyncio.Task[None]]:
    subjects = Subjects(namespace)
    await prepare_bus(url, namespace=namespace)
    nc = await connect(url, name=f"bench-{namespace}", subjects=subjects)
    clusters, per_cluster = SHAPES[namespace]
    reporter = asyncio.create_task(
        keep_nodes_reporting(nc, subjects, node_names(clusters, per_cluster))
    )
    env = side_env(url, namespace, root / namespace)
    logs = root / namespace / "logs"
    logs.mkdir(parents=True)
    python = sys.executable
    stack.enter_context(
        processes(
            [[python, "-m", "services.intake"], [python, "bench/placement_noop.py"]], env, logs
        )
    )
    probe = ids.job_id(ids.request_id_for_key("probe"), "j")
    probe_bound = await nc.subscribe(subjects.job(probe, "bound"))
    await wait_for_responder(nc, subjects.api_submit, submit_payload("probe"))
    await probe_bound.next_msg(timeout=120)  # placement follows, and knows the nodes
    await round_throughput(
        nc, subjects.api_submit, subjects.job("*", "bound"), round_payloads("warm", 300)
    )
    return nc, reporter


async def bench(jobs: int, rounds: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="mdq-bench-multicluster-") as folder:
        root = Path(folder)
        # two namespaces reserve their streams' size limits against one file store
        server = start_nats(root / "nats", max_file_store=SHARED_FILE_STORE)
        try:
            with contextlib.ExitStack() as stack:
                sides = {
                    namespace: await open_side(namespace, server.url, root, stack)
                    for namespace in SHAPES
                }
                try:
                    per_round: list[dict[str, float]] = []
                    for round_index in range(rounds):
                        order = list(SHAPES) if round_index % 2 == 0 else list(SHAPES)[::-1]
                        rates: dict[str, float] = {}
                        for namespace in order:
                            nc, _ = sides[namespace]
                            subjects = Subjects(namespace)
                            rates[namespace] = await round_throughput(
                                nc,
                                subjects.api_submit,
                                subjects.job("*", "bound"),
                                round_payloads(f"r{round_index}", jobs),
                            )
                        per_round.append(rates)
                        print(
                            f"round {round_index + 1}: 1x3000 {rates['one']:.0f}/s, "
                            f"3x1000 {rates['three']:.0f}/s",
                            file=sys.stderr,
                            flush=True,
                        )
                finally:
                    for nc, reporter in sides.values():
                        reporter.cancel()
                        with contextlib.suppress(asyncio.CancelledError):
                            await reporter
                        await nc.drain()
        finally:
            server.stop()
    ratios = [r["three"] / r["one"] for r in per_round]
    return {
        "bench": "multicluster",
        "nodes": NODES,
        "node_cores": NODE_CORES,
        "job_cores": "1-16",
        "load_avg": [round(x, 2) for x in os.getloadavg()],
        "jobs_per_round": jobs,
        "rounds": rounds,
        "placement_ratio_3x1000_vs_1x3000": round(statistics.median(ratios), 3),
        "round_ratios": [round(r, 3) for r in ratios],
        "bound_per_s_1x3000": [round(r["one"], 1) for r in per_round],
        "bound_per_s_3x1000": [round(r["three"], 1) for r in per_round],
        "goals": {"placement_ratio_3x1000_vs_1x3000": 0.9},
        "measured": "wall clock from the first submit to the last job.<id>.bound of the "
        "round's own jobs, the real intake and placement processes, side by side in one run",
    }


FAILOVER_CHECKPOINT_INTERVAL = 500
FAILOVER_REPORT_INTERVAL = 100


def failover_job(name: str, cluster: str, steps: int) -> dict[str, object]:
    return water_job(
        name,
        steps=steps,
        report_interval_steps=FAILOVER_REPORT_INTERVAL,
        checkpoint_interval_steps=FAILOVER_CHECKPOINT_INTERVAL,
        memory_mb=512,
        clusters={"prefer": {"site": cluster}},
        max_retries=3,
    )


def runners_under(pid: int) -> dict[str, tuple[int, psutil.Process]]:
    """job -> (attempt, process) of every runner below the process ``pid`` (a node agent)."""
    found: dict[str, tuple[int, psutil.Process]] = {}
    for child in psutil.Process(pid).children(recursive=True):
        try:
            env = child.environ()
            if ENV_JOB_ID in env and "services.runner" in " ".join(child.cmdline()):
                found[env[ENV_JOB_ID]] = (int(env[ENV_ATTEMPT]), child)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def attempt_running(job_id: str, attempt: int, frozen: set[int]) -> bool:
    return any(
        process.pid not in frozen
        and env.get(ENV_JOB_ID) == job_id
        and env.get(ENV_ATTEMPT) == str(attempt)
        for process, env in runner_environments()
    )


PARTITION_NOT_STUCK_S = 3600.0
"""How long lab1's frozen agent may stay silent before the stack would restart it as stuck:
the freeze plays a partitioned cluster, which the stack must not heal."""


async def failover(jobs: int, steps: int) -> dict[str, Any]:
    env = {"MDQ_LOCAL_CPU_PER_NODE": "4", "MDQ_RECOVERY_BACKOFF_BASE_S": "0.5"}
    frozen: list[psutil.Process] = []
    async with (
        servers("mdq-bench-failover-") as bus_and_db,
        stack_on(
            bus_and_db,
            "benchfail",
            local_nodes=1,
            clusters=2,
            extra_env=env,
            grace_s=5.0,
            stuck_after_s=PARTITION_NOT_STUCK_S,
        ) as stack,
    ):
        try:
            async with await MdqClient.connect(bus_and_db.nats_url, "benchfail") as client:
                specs = [
                    failover_job(f"md{i}", "lab1" if i % 2 == 0 else "lab2", steps)
                    for i in range(jobs)
                ]
                job_ids = await submit(client, "failover", *specs)
                agent = stack.child_pid("local-backend-lab1")
                if agent is None:
                    raise BenchFailed("no node agent of lab1")
                # every job running, each past its first checkpoint
                deadline = time.monotonic() + 300
                while True:
                    on_lab1 = runners_under(agent)
                    checkpointed = [
                        j
                        for j in job_ids
                        if any((job_dir(stack.data_dir, j) / "checkpoints").glob("ckpt-*.xml"))
                    ]
                    if on_lab1 and len(checkpointed) == len(job_ids):
                        break
                    if time.monotonic() > deadline:
                        raise BenchFailed("the jobs never all ran and checkpointed")
                    await asyncio.sleep(0.2)
                frozen = [psutil.Process(agent), *(p for _, p in on_lab1.values())]
                for process in frozen:
                    process.send_signal(signal.SIGSTOP)
                lost_at = time.monotonic()
                last_steps = {
                    j: last_energy_step(job_dir(stack.data_dir, j) / "energies.csv")
                    for j in on_lab1
                }
                frozen_rows = {
                    j: energy_rows(job_dir(stack.data_dir, j) / "energies.csv") for j in on_lab1
                }
                frozen_checkpoints = {
                    j: checkpoint_steps(job_dir(stack.data_dir, j) / "checkpoints") for j in on_lab1
                }
                print(f"froze lab1 with {sorted(on_lab1)}", file=sys.stderr, flush=True)
                frozen_pids = {p.pid for p in frozen}
                moved: dict[str, float] = {}
                while len(moved) < len(on_lab1):
                    for job_id, (attempt, _) in on_lab1.items():
                        if job_id not in moved and attempt_running(
                            job_id, attempt + 1, frozen_pids
                        ):
                            moved[job_id] = time.monotonic() - lost_at
                    if time.monotonic() - lost_at > 300:
                        raise BenchFailed(f"not every job of lab1 moved: {sorted(moved)}")
                    await asyncio.sleep(0.05)
                lost_steps = []
                for job_id, (attempt, _) in on_lab1.items():
                    log = stack.data_dir / "pods" / f"{ids.pod_name(job_id, attempt + 1)}.log"
                    for _ in range(600):
                        if (resumed := logged_resume(log)) is not None:
                            break
                        await asyncio.sleep(0.1)
                    else:
                        raise BenchFailed(f"{log} never said where it resumed")
                    if resumed and resumed not in frozen_checkpoints[job_id]:
                        raise BenchFailed(f"{job_id}: the retry says step {resumed}, no such file")
                    table = job_dir(stack.data_dir, job_id) / "energies.csv"
                    for _ in range(1200):  # the retry's first row past its resume, on disk
                        if last_energy_step(table) > resumed:
                            break
                        await asyncio.sleep(0.1)
                    problem = retry_table_problem(
                        frozen_rows[job_id], energy_rows(table), resumed, FAILOVER_REPORT_INTERVAL
                    )
                    if problem:
                        raise BenchFailed(f"{job_id}: the retry's energy table: {problem}")
                    lost_steps.append(max(0, last_steps[job_id] - resumed))
                for process in frozen:  # the cluster is back
                    process.send_signal(signal.SIGCONT)
                stale = [p for p in frozen[1:]]
                gone = psutil.wait_procs(stale, timeout=60)[1]
                if gone:
                    raise BenchFailed(
                        f"stale runners still alive 60 s after lab1 came back: {gone}"
                    )
                states = await client.wait(job_ids, timeout=900)
                js = client.nc.jetstream()
                succeeded: dict[str, int] = {}
                subscription = await js.subscribe(
                    client.subjects.job("*", "succeeded"), ordered_consumer=True
                )
                try:
                    while True:
                        try:
                            message = await subscription.next_msg(timeout=2)
                        except Exception:
                            break
                        event = decode_event(message.data)
                        succeeded[event.job_id] = succeeded.get(event.job_id, 0) + 1
                finally:
                    await subscription.unsubscribe()
                ends = [
                    end
                    for name in ("local-backend-lab1", "local-backend-lab2")
                    for end in read_pod_ends(stack.logs_dir / f"{name}.log")
                ]
                on_disk = {j: succeeded_on_disk(stack.data_dir, j, steps, ends) for j in job_ids}
        finally:
            for process in frozen:
                with contextlib.suppress(psutil.NoSuchProcess):
                    process.send_signal(signal.SIGCONT)
    timings = list(moved.values())
    mdq_once = all(succeeded.get(j) == 1 for j in job_ids)
    mdq_succeeded = sum(1 for j in job_ids if str(states.get(j)) == "SUCCEEDED")
    outside = sum(1 for problem in on_disk.values() if problem is None)
    if (outside == len(job_ids)) != (mdq_once and mdq_succeeded == len(job_ids)):
        raise BenchFailed(f"mdq's events and the files disagree: {on_disk}, {succeeded}")
    return {
        "failover_p50_s": round(statistics.median(timings), 2),
        "failover_p95_s": round(percentile(timings, 0.95), 2),
        "failover_jobs_moved": len(timings),
        "max_steps_lost": max(lost_steps),
        "checkpoint_interval_steps": FAILOVER_CHECKPOINT_INTERVAL,
        "report_interval_steps": FAILOVER_REPORT_INTERVAL,
        "jobs": len(job_ids),
        "succeeded": outside,
        "succeeded_exactly_once": outside == len(job_ids),
        "not_exactly_once": {j: p for j, p in on_disk.items() if p is not None},
        "mdq_reported_succeeded": mdq_succeeded,
        "mdq_reported_succeeded_exactly_once": mdq_once,
        "failover_measured": "time: bench clock, freeze to the retry's runner process; steps "
        "lost: frozen runner's energies.csv minus the retry's logged resume, checked against "
        "the checkpoint files and energies.csv; success: the node agents' records of runner "
        "exits and each job's files; mdq_reported_*: mdq's events, in no figure",
    }


def succeeded_on_disk(data_dir: Path, job_id: str, steps: int, ends: list[PodEnd]) -> str | None:
    """Why ``job_id`` did not succeed exactly once as its files and the agents' records say,
    or None: exactly one of its runner processes exited 0, its energy table is one trajectory
    to ``steps``, and its folder holds the checkpoint of ``steps``."""
    pods = {ids.pod_name(job_id, attempt) for attempt in range(1, 20)}
    exits = [end for end in ends if end.pod in pods and end.returncode == 0]
    if len(exits) != 1:
        return f"{len(exits)} runner processes exited 0"
    folder = job_dir(data_dir, job_id)
    table = [step for step, _ in energy_rows(folder / "energies.csv")]
    if table != list(range(FAILOVER_REPORT_INTERVAL, steps + 1, FAILOVER_REPORT_INTERVAL)):
        return "the energy table is not one trajectory to the last step"
    if steps not in checkpoint_steps(folder / "checkpoints"):
        return f"no checkpoint of step {steps}"
    return None


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=3000, help="jobs per round and side")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="1,000 jobs, 2 rounds")
    parser.add_argument("--failover-jobs", type=int, default=4)
    parser.add_argument("--failover-steps", type=int, default=8000)
    parser.add_argument("--no-failover", action="store_true")
    parser.add_argument("--no-placement", action="store_true")
    cli = parser.parse_args()
    if cli.quick:
        cli.jobs, cli.rounds = 1000, 2
    result: dict[str, Any] = {"bench": "multicluster"}
    with failing_as("multicluster"):
        if not cli.no_placement:
            result |= asyncio.run(bench(cli.jobs, cli.rounds))
        if not cli.no_failover:
            result |= asyncio.run(failover(cli.failover_jobs, cli.failover_steps))
    print(json.dumps(result))
