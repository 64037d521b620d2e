"""``mdq recommend FILE`` and the "history would have chosen" lines of ``mdq show`` / ``explain``.

The recommendation is ``mdq.core.recommend``'s, from the measured usage in PostgreSQL
(``mdq.store.queries.usage_history``) when a database is reachable, else from the physical
estimate alone (said so). docs/requests.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.table import Table

from mdq.cli.history import open_engine
from mdq.contracts import pb
from mdq.core.recommend import History, UsageHistory, recommend_job
from mdq.core.spec import normalize_job
from mdq.store import queries


async def read_history(database_url: str, *, days: int) -> UsageHistory:
    async with open_engine(database_url) as engine:
        return await queries.usage_history(engine, days=days)


def _resources(spec: pb.JobSpec) -> str:
    cpu = f"{spec.resources.cpu:g}" if spec.resources.cpu else "auto"
    memory = f"{spec.resources.memory_mb} MiB" if spec.resources.memory_mb else "auto"
    return f"{cpu} cores, {memory}"


def recommendations_table(request: pb.SubmitRequest, *, history: History, source: str) -> Table:
    """One row per job of ``request``: what it states, what is recommended, and why.
    SpecError (naming the field) for a job that does not validate."""
    table = Table(title=f"resource recommendations ({source})")
    for column in ("job", "stated", "recommended", "confidence", "evidence"):
        table.add_column(column)
    for index, raw in enumerate(request.jobs):
        spec = normalize_job(raw, f"jobs[{index}]")
        _, recommended = recommend_job(spec, history=history)
        table.add_row(
            spec.name,
            "auto" if spec.resources.auto else _resources(spec),
            f"{recommended.cpu:g} cores, {recommended.memory_mb} MiB"
            + (" (applied)" if recommended.applied else ""),
            recommended.confidence,
            recommended.evidence,
        )
    return table


def recorded_choice(submitted_body: Mapping[str, Any]) -> str | None:
    """The line of ``mdq show`` / ``explain`` about a job's recorded recommendation (the
    ``submitted`` event's body, protobuf JSON), or None when it has none."""
    recommended = submitted_body.get("recommended")
    if not isinstance(recommended, Mapping):
        return None
    cpu = float(recommended.get("cpu", 0))
    memory = int(recommended.get("memory_mb", recommended.get("memoryMb", 0)))
    evidence = recommended.get("evidence", "")
    verb = "history chose" if recommended.get("applied") else "history would have chosen"
    return f"{verb}: {cpu:g} cores, {memory} MiB ({evidence})"
