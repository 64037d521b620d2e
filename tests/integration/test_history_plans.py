"""Every query of docs/history.md is measured by ``make bench-history`` and reads an index.

The bench (``bench/history_pg.py``) names, for each documented query, the index its plan must
read at a year's size (``DOC_PLANS``). Here: a query added to the docs without an entry there
fails, and each query's plan, on the bench's own synthetic history at a small size, reads that
index and scans no table whole. At this size a sequential scan is cheaper, and PostgreSQL would
rightly choose it; with ``enable_seqscan`` off the planner takes the cheapest plan that does
not scan a table whole, so a query that no index can serve still shows a Seq Scan and fails.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from sqlalchemy.dialects import postgresql

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
        if not expected:  # a table of a row per consumer
            assert scanned <= {"consumer_offsets"}, (name, scanned)
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
