"""Do ``make bench-history``'s synthetic rows look like the rows mdq's projection writes?

``bench/history_pg.py`` loads its year straight into the tables (``INSERT … SELECT``): fast, but
only worth measuring if the rows have the shape the watcher's own writes have. This check runs
both side by side on one embedded PostgreSQL and NATS: a succeeded job (a water box, with a
campaign label, progress reports, its usage) and a failed one are published as their services
would and projected by the watcher's ``Projector`` into one database; ``history_pg.load`` fills
another with 1,000 synthetic jobs. Then, table by table, it compares which columns hold values
(a column the projection fills and the load leaves NULL, or the other way round), and, per event
kind, the top-level keys of ``job_events.body`` and of ``jobs.spec``. One JSON line: the
differences, and ``same_shape`` (true when there are none beyond ``EXPECTED``, each said why).
Exits 1 otherwise.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "libs"))
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import asyncpg  # noqa: E402
import history_pg  # noqa: E402

from mdq.bus.connect import connect  # noqa: E402
from mdq.bus.subjects import Subjects  # noqa: E402
from mdq.contracts import pb  # noqa: E402
from mdq.embedded import start_nats, start_postgres  # noqa: E402
from mdq.store.engine import asyncpg_dsn, create_writer_pool  # noqa: E402
from mdq.store.migrate import upgrade_async  # noqa: E402
from tests.integration import test_history_views as history_views  # noqa: E402
from tests.integration.test_projector import History, history_projected  # noqa: E402

TABLES = ("jobs", "attempts", "placements", "progress", "usage_samples")
EXPECTED: dict[str, str] = {}
"""Known differences (``table.column`` only one side fills) and why they do not matter to the
queries measured."""

USAGE = pb.AttemptUsage()
USAGE.CopyFrom(history_views.USAGE)
USAGE.source, USAGE.steps = "cgroup", 1000
"""The history tests' usage report, as a cgroup measures it, of the whole 1,000-step run."""


def _bound(history: History, node: str) -> pb.Event:
    """Bound as placement binds: with the resources the attempt was given."""
    event = history.bound(1, node)
    event.bound.resources.CopyFrom(history.spec.resources)
    return event


def _events() -> list[pb.Event]:
    done = History("md", request_id="0000000000aa")
    doomed = History("doomed", request_id="0000000000bb")
    for history, box_nm in ((done, 3.0), (doomed, 2.5)):
        history.spec.system.water_box.box_nm = box_nm
        history.spec.temperature_k = 300
        history.spec.labels["campaign"] = "c0"
    return [
        done.submitted(),
        _bound(done, "node-1"),
        done.started(1, "node-1"),
        *(done.progress(1, step) for step in range(100, 600, 100)),
        done.checkpoint(1, 500),
        *(done.progress(1, step) for step in range(600, 1000, 100)),
        done.progress(1, 1000, "steps_reached"),
        done.event("usage", USAGE, 1),
        done.succeeded(1, 1000),
        doomed.submitted(),
        _bound(doomed, "node-2"),
        doomed.started(1, "node-2"),
        doomed.progress(1, 100),
        doomed.attempt_failed(1, "node-2", last_step=100),
        doomed.failed(1),
    ]


async def _project(database_url: str, nats_url: str) -> None:
    subjects = Subjects("shape")
    nc = await connect(nats_url, name="bench-history-shape", subjects=subjects)
    pool = await create_writer_pool(database_url, size=2)
    try:
        async with history_projected(nc.jetstream(), subjects, pool, _events(), within=30):
            pass
    finally:
        await pool.close()
        await nc.drain()


async def shape(database_url: str) -> dict[str, Any]:
    """Which columns hold a value in some row, per table; body keys per event kind."""
    connection = await asyncpg.connect(asyncpg_dsn(database_url))
    try:
        filled: dict[str, set[str]] = {}
        for table in TABLES:
            columns = [
                row["attname"]
                for row in await connection.fetch(
                    "SELECT attname FROM pg_attribute WHERE attrelid = $1::regclass "
                    "AND attnum > 0 AND NOT attisdropped",
                    table,
                )
            ]
            tests = ", ".join(f"bool_or({name} IS NOT NULL) AS {name}" for name in columns)
            row = await connection.fetchrow(f"SELECT {tests} FROM {table}")
            filled[table] = {name for name in columns if row is not None and row[name]}
        bodies: dict[str, set[str]] = {}
        for row in await connection.fetch(
            "SELECT kind, array_agg(DISTINCT k) AS keys FROM job_events, "
            "jsonb_object_keys(body) AS k GROUP BY kind"
        ):
            bodies[row["kind"]] = set(row["keys"])
        spec_keys = {
            row[0]
            for row in await connection.fetch("SELECT DISTINCT jsonb_object_keys(spec) FROM jobs")
        }
        return {"filled": filled, "bodies": bodies, "spec_keys": spec_keys}
    finally:
        await connection.close()


async def main() -> int:
    folder = Path(tempfile.mkdtemp(prefix="mdq-bench-history-shape-"))
    server = start_postgres(folder / "pg", database="mdq", keep=False)
    bus = start_nats(folder / "nats")
    try:
        admin = await asyncpg.connect(asyncpg_dsn(server.url))
        await admin.execute("CREATE DATABASE synthetic")
        await admin.close()
        synthetic_url = server.url.replace("/mdq?", "/synthetic?", 1)
        for url in (server.url, synthetic_url):
            await upgrade_async(url)
        await _project(server.url, bus.url)
        await history_pg.load(synthetic_url, 1_000, 20_000, lambda line: None)
        projected, synthetic = await shape(server.url), await shape(synthetic_url)
    finally:
        bus.stop()
        server.stop()
        shutil.rmtree(folder, ignore_errors=True)
    columns: dict[str, list[str]] = {}
    for table in TABLES:
        for side, mine, theirs in (
            ("only_projected", projected["filled"][table], synthetic["filled"][table]),
            ("only_synthetic", synthetic["filled"][table], projected["filled"][table]),
        ):
            for name in sorted(mine - theirs):
                columns.setdefault(side, []).append(f"{table}.{name}")
    kinds = sorted(set(projected["bodies"]) & set(synthetic["bodies"]))
    body_keys = {
        kind: sorted(synthetic["bodies"][kind] - projected["bodies"][kind])
        for kind in kinds
        if synthetic["bodies"][kind] - projected["bodies"][kind]
    }
    unexpected = [name for names in columns.values() for name in names if name not in EXPECTED] + [
        f"job_events.body[{kind}]" for kind in body_keys
    ]
    spec_only_synthetic = sorted(synthetic["spec_keys"] - projected["spec_keys"])
    unexpected += [f"jobs.spec.{key}" for key in spec_only_synthetic]
    result = {
        "bench": "history_shape",
        "columns_filled_on_one_side": columns,
        "expected": {name: why for name, why in EXPECTED.items()},
        "event_kinds_compared": kinds,
        "body_keys_only_synthetic": body_keys,
        "spec_keys_only_synthetic": spec_only_synthetic,
        "unexpected": unexpected,
        "same_shape": not unexpected,
    }
    print(json.dumps(result), flush=True)
    return 0 if not unexpected else 1


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
