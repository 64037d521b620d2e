"""The simulator checked against reality: a small campaign run for real on this machine (the
whole stack, two local nodes of one core, real OpenMM runners), then simulated from its own
history (``mdq.sim.history``); docs/simulate.md, "Validating it".

Compared: the makespan (the first submit to the last attempt's end, as PostgreSQL recorded
them, against the simulation's) and the order in which jobs first started — the fraction of
job pairs that started at least ``ORDER_RESOLUTION_S`` apart for real and that the simulation
starts the other way round (``order_discordance``, 0 = the same order).
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import asyncpg
from google.protobuf import json_format

from mdq.contracts import pb
from mdq.embedded import start_nats, start_postgres
from mdq.sdk.client import IntakeUnavailable, MdqClient
from mdq.sim.config import SimConfig
from mdq.sim.engine import simulate
from mdq.sim.history import HistoryOptions, export_history
from mdq.stack import Stack
from mdq.store.engine import create_engine

NODE_CPU = 1.0
NODE_MEMORY_MB = 4096
ORDER_RESOLUTION_S = 1.0
"""Jobs that started closer together than this are not ordered (the passes' own grain)."""
STEPS = (600, 1200, 900, 1500, 600, 1200, 900, 1500)
"""The campaign: tiny water boxes of these many steps, one core each, two per node slot."""


def campaign(key: str) -> pb.SubmitRequest:
    jobs = [
        {
            "name": f"water-{index}",
            "system": {"water_box": {"box_nm": 1.6}},
            "steps": steps,
            "report_interval_steps": 300,
            "checkpoint_interval_steps": 300,
            "seed": index + 1,
            "resources": {"cpu": 1, "memory_mb": 1024},
        }
        for index, steps in enumerate(STEPS)
    ]
    return json_format.ParseDict({"idempotency_key": key, "jobs": jobs}, pb.SubmitRequest())


@dataclass(frozen=True, slots=True)
class Validation:
    """Reality and its simulation, side by side."""

    jobs: int
    real_makespan_s: float
    simulated_makespan_s: float
    makespan_error: float
    """|simulated - real| / real."""
    order_discordance: float
    real_order: tuple[str, ...]
    simulated_order: tuple[str, ...]


def discordance(real: dict[str, float], simulated: dict[str, float]) -> float:
    """The fraction of job pairs ordered by ``real`` start times (at least
    ``ORDER_RESOLUTION_S`` apart) that ``simulated`` orders the other way round."""
    names = sorted(real)
    pairs = wrong = 0
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            gap = real[a] - real[b]
            if abs(gap) < ORDER_RESOLUTION_S:
                continue
            pairs += 1
            if (simulated[a] - simulated[b]) * gap < 0:
                wrong += 1
    return wrong / pairs if pairs else 0.0


async def _submit(client: MdqClient, request: pb.SubmitRequest) -> list[str]:
    for _ in range(120):
        try:
            return await client.submit(request, timeout=5)
        except IntakeUnavailable:
            await asyncio.sleep(0.5)
    raise RuntimeError("intake never answered")


async def _projected(database_url: str, job_ids: list[str]) -> None:
    """Until every job's row says SUCCEEDED and every attempt has ended."""
    connection = await asyncpg.connect(database_url)
    try:
        for _ in range(600):
            done = await connection.fetchval(
                "SELECT count(*) FROM jobs WHERE state = 'SUCCEEDED' AND job_id = ANY($1::text[])",
                job_ids,
            )
            open_attempts = await connection.fetchval(
                "SELECT count(*) FROM attempts WHERE ended_at IS NULL AND job_id = ANY($1::text[])",
                job_ids,
            )
            if done == len(job_ids) and not open_attempts:
                return
            await asyncio.sleep(0.1)
    finally:
        await connection.close()
    raise RuntimeError("the projection never showed every job ended")


async def run_and_simulate(
    *, nats_url: str, namespace: str, creds: str, database_url: str, key: str = "sim-validation"
) -> Validation:
    """Run the campaign on a running stack, then simulate it from the history it left."""
    async with await MdqClient.connect(nats_url, namespace, creds=creds) as client:
        job_ids = await _submit(client, campaign(key))
        states = await client.wait(job_ids, timeout=600)
    if {str(state) for state in states.values()} != {"SUCCEEDED"}:
        raise RuntimeError(f"the campaign did not succeed: {states}")
    await _projected(database_url, job_ids)
    engine = create_engine(database_url)
    try:
        workload = await export_history(
            engine, HistoryOptions(days=1, node_cpu=NODE_CPU, node_memory_mb=NODE_MEMORY_MB)
        )
        connection = await asyncpg.connect(database_url)
        try:
            rows = await connection.fetch(
                "SELECT j.job_id, min(j.submitted_at) AS submitted, min(a.started_at) AS started,"
                " max(a.ended_at) AS ended FROM jobs j JOIN attempts a ON a.job_id = j.job_id"
                " WHERE j.job_id = ANY($1::text[]) GROUP BY j.job_id",
                job_ids,
            )
        finally:
            await connection.close()
    finally:
        await engine.dispose()
    t0 = min(row["submitted"] for row in rows)
    real_makespan = (max(row["ended"] for row in rows) - t0).total_seconds()
    real_starts = {row["job_id"]: (row["started"] - t0).total_seconds() for row in rows}
    config = SimConfig(
        "replay",
        pass_interval_s=0.0,  # placement reacts to each event (and reconciles every second)
        start_delay_s=float(workload.notes["start_delay_s"]),
    )
    metrics = simulate(workload, config)
    simulated_starts = {name: at for at, name in metrics.starts}
    return Validation(
        jobs=len(job_ids),
        real_makespan_s=real_makespan,
        simulated_makespan_s=metrics.makespan_s,
        makespan_error=abs(metrics.makespan_s - real_makespan) / real_makespan,
        order_discordance=discordance(real_starts, simulated_starts),
        real_order=tuple(sorted(real_starts, key=lambda name: real_starts[name])),
        simulated_order=tuple(name for _, name in metrics.starts),
    )


def stack_env() -> dict[str, str]:
    """The local nodes the campaign runs on (their capacity is what the simulation is told)."""
    return {
        "MDQ_LOCAL_CPU_PER_NODE": str(NODE_CPU),
        "MDQ_LOCAL_MEMORY_MB_PER_NODE": str(NODE_MEMORY_MB),
        "MDQ_METRICS_INTERVAL_S": "1",
    }


async def validate_on_this_machine() -> Validation:
    """Start NATS, PostgreSQL and the stack in a temporary folder, validate, stop."""
    root = Path(tempfile.mkdtemp(prefix="mdq-sim-validation-"))
    nats = start_nats(root / "nats")
    postgres = start_postgres(root / "pg", keep=False)
    stack = Stack(
        state_dir=root / "state",
        namespace="simval",
        nats_url=nats.url,
        database_url=postgres.url,
        metrics_port=0,
        local_nodes=2,
        extra_env=stack_env(),
        grace_s=5.0,
    )
    await stack.start()
    try:
        return await run_and_simulate(
            nats_url=nats.url,
            namespace="simval",
            creds=stack.info.nats_creds,
            database_url=postgres.url,
        )
    finally:
        await stack.stop()
        nats.stop()
        postgres.stop()
        shutil.rmtree(root, ignore_errors=True)
