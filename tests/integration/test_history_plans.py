"""Every query of docs/history.md is measured by ``make bench-history`` and reads an index.

The bench (``bench/history_pg.py``) names, for each documented query, the index its plan must
read at a year's size (``DOC_PLANS``). Here: a query added to the docs without an entry there
fails, and each query's plan, on the bench's own synthetic history at a small size, reads that
index and scans no table whole. At this size a sequential scan is cheaper, and PostgreSQL would
rightly choose it; with ``enable_seqscan`` off the planner takes the cheapest plan that does
not scan a table whole, so a query that no index can serve still shows a Seq Scan and fails.
Every per-job read of ``progress`` and ``job_events`` (documented, and mdq's own) is run with
EXPLAIN ANALYZE and must read no monthly partition that ended before the job's submission.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from sqlalchemy.dialects import postgresql

from mdq.store import queries
from mdq.store.migrate import upgrade_async
from services.console import reads

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import history_pg

JOBS = 5_000
PROGRESS_ROWS = 50_000


def test_every_documented_query_has_a_plan_entry_in_the_bench() -> None:
    documented = history_pg.documented_queries()
    assert len(documented) >= 10  # the parser found the doc's questions
    assert sorted(set(documented) - set(history_pg.DOC_PLANS)) == []  # a new one is measured
    assert sorted(set(history_pg.DOC_PLANS) - set(documented)) == []  # no stale entry


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", ()):
        yield from _nodes(child)


@pytest.fixture
async def year(database_url: str) -> str:
    """A fresh database with the bench's synthetic year, small."""
    await upgrade_async(database_url)
    await history_pg.load(database_url, JOBS, PROGRESS_ROWS, lambda line: None)
    return database_url


async def test_each_documented_query_reads_its_index_and_scans_no_table_whole(
    year: str,
) -> None:
    connection = await asyncpg.connect(year)
    plans: dict[str, tuple[set[str], set[str]]] = {}
    try:
        await connection.execute("SET enable_seqscan = off")
        for name, sql in history_pg.documented_queries().items():
            sql = sql.replace(history_pg.EXAMPLE_JOB, f"{JOBS // 2:012x}-md")
            (plan,) = json.loads(await connection.fetchval(f"EXPLAIN (FORMAT JSON) {sql}"))
            nodes = list(_nodes(plan["Plan"]))
            indexes = {node["Index Name"] for node in nodes if "Index Name" in node}
            scanned = {node["Relation Name"] for node in nodes if node["Node Type"] == "Seq Scan"}
            plans[name] = (indexes, scanned)
    finally:
        await connection.close()
    for name, expected in history_pg.DOC_PLANS.items():
        indexes, scanned = plans[name]
        if not expected:  # tables that do not grow with the history
            assert scanned <= set(history_pg.READ_WHOLE), (name, scanned)
            continue
        assert scanned == set(), (name, scanned)
        assert any(re.search(expected, index) for index in indexes), (name, expected, indexes)


async def test_the_nodes_pages_count_reads_the_hour_from_an_index(year: str) -> None:
    """The console's nodes page counts the attempts of the last hour per node: from
    ``ix_attempts_started_at`` alone, not every attempt of the history."""
    query = reads.node_attempts_last_hour_query(datetime.now(UTC))
    dialect = postgresql.dialect()  # type: ignore[no-untyped-call]
    sql = str(query.compile(dialect=dialect, compile_kwargs={"literal_binds": True}))
    connection = await asyncpg.connect(year)
    try:
        await connection.execute("SET enable_seqscan = off")
        (plan,) = json.loads(await connection.fetchval(f"EXPLAIN (FORMAT JSON) {sql}"))
    finally:
        await connection.close()
    nodes = list(_nodes(plan["Plan"]))
    assert [n["Node Type"] for n in nodes if n["Node Type"] == "Seq Scan"] == []
    assert {n.get("Index Name") for n in nodes} >= {"ix_attempts_started_at"}


MONTH_PARTITION = re.compile(r"^(?:progress|job_events)_y(\d{4})m(\d{2})$")


def _partitions_read(plan: dict[str, Any]) -> set[str]:
    """The monthly partitions of ``progress`` and ``job_events`` an executed plan read."""
    return {
        node["Relation Name"]
        for node in _nodes(plan["Plan"])
        if MONTH_PARTITION.match(node.get("Relation Name", "")) and node.get("Actual Loops", 0)
    }


def _month_end(partition: str) -> datetime:
    match = MONTH_PARTITION.match(partition)
    assert match is not None
    year, month = int(match[1]), int(match[2])
    return datetime(year + month // 12, month % 12 + 1, 1, tzinfo=UTC)


async def test_each_per_job_read_of_the_partitioned_tables_prunes_the_months_before_the_job(
    year: str,
) -> None:
    """Every documented query and every read of mdq (``mdq show``, ``mdq plot``, the console's
    job page) that reads a job's rows in ``progress`` or ``job_events`` reads no month that
    ended before the job was submitted (``mdq_job_since``), run and not only planned."""
    job = f"{JOBS // 2:012x}-md"
    dialect = postgresql.dialect()  # type: ignore[no-untyped-call]

    def literal(query: Any) -> str:
        return str(query.compile(dialect=dialect, compile_kwargs={"literal_binds": True}))

    reads_of_mdq = {
        "job_timeline": literal(queries.job_timeline_query(job)),
        "progress_trace": literal(queries.progress_trace_query(job)),
        "job_outputs": reads.JOB_OUTPUTS.replace(":job", f"'{job}'"),
    }
    documented = {
        name: sql.replace(history_pg.EXAMPLE_JOB, job)
        for name, sql in history_pg.documented_queries().items()
    }
    connection = await asyncpg.connect(year)
    try:
        submitted_at = await connection.fetchval(
            "SELECT submitted_at FROM jobs WHERE job_id = $1", job
        )
        months = {
            row["relname"]
            for row in await connection.fetch(
                "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
                "WHERE i.inhparent IN ('progress'::regclass, 'job_events'::regclass)"
            )
            if MONTH_PARTITION.match(row["relname"])
        }
        read: dict[str, set[str]] = {}
        for name, sql in (documented | reads_of_mdq).items():
            (plan,) = json.loads(await connection.fetchval(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}"))
            read[name] = _partitions_read(plan)
    finally:
        await connection.close()
    before = {month for month in months if _month_end(month) < submitted_at - timedelta(days=1)}
    assert len(before) >= 6  # the job is half a year old: there are months to prune
    per_job = {name for name, partitions in read.items() if partitions}
    assert per_job >= {"job_timeline", "progress_trace", "job_outputs"}
    assert len(per_job) >= 7  # the four documented per-job queries read partitions too
    for name in per_job:
        assert read[name] & before == set(), (name, sorted(read[name] & before))


ROLLUP_MEANS = (
    "SELECT job_id, attempt, month, reports, kept, first_step, last_step, first_time, "
    "last_time, min_potential_kj_mol, max_potential_kj_mol, "
    "round(mean_potential_kj_mol::numeric, 6), round(mean_temperature_k::numeric, 6), "
    "round(mean_ns_per_day::numeric, 6) FROM {}"
)


async def test_the_bench_loads_rolled_up_months_as_the_watchers_rollup_leaves_them(
    year: str,
) -> None:
    """``make bench-history`` loads the months past its rollup age already rolled up
    (``LOAD_PROGRESS_KEPT``, much faster than loading every report and rolling up): into
    scratch tables here, from the same jobs, it must give exactly the rows and summaries that
    ``mdq_rollup_progress`` leaves of every report, which the year holds."""
    connection = await asyncpg.connect(year)
    try:
        before = await connection.fetchval("SELECT now() - interval '90 days'")
        await connection.execute("CREATE TABLE kept_progress (LIKE progress)")
        await connection.execute("CREATE TABLE kept_rollups (LIKE progress_rollups)")
        direct = history_pg.LOAD_PROGRESS_KEPT.replace(
            "INSERT INTO progress_rollups ", "INSERT INTO kept_rollups ", 1
        ).replace("INSERT INTO progress (", "INSERT INTO kept_progress (", 1)
        for first, _, low, high in history_pg.load_chunks(JOBS):
            await connection.execute(direct, PROGRESS_ROWS // JOBS, low, high, first, before, 10)
        rolled = await connection.fetch("SELECT mdq_rollup_progress($1, 10)", before)
        differences = {
            "progress": await connection.fetchval(
                "SELECT count(*) FROM ((TABLE progress EXCEPT TABLE kept_progress) UNION ALL "
                "(TABLE kept_progress EXCEPT TABLE progress)) d"
            ),
            "progress_rollups": await connection.fetchval(
                f"SELECT count(*) FROM (({ROLLUP_MEANS.format('progress_rollups')} EXCEPT "
                f"{ROLLUP_MEANS.format('kept_rollups')}) UNION ALL "
                f"({ROLLUP_MEANS.format('kept_rollups')} EXCEPT "
                f"{ROLLUP_MEANS.format('progress_rollups')})) d"
            ),
        }
        kept, rollups = (
            await connection.fetchval("SELECT count(*) FROM progress"),
            (await connection.fetchval("SELECT count(*) FROM progress_rollups")),
        )
    finally:
        await connection.close()
    assert len(rolled) >= 8, "months older than 90 days were rolled up"
    assert rollups > JOBS // 2 and kept < PROGRESS_ROWS // 2
    assert differences == {"progress": 0, "progress_rollups": 0}
