"""Keeping the monthly partitions of ``progress`` and ``job_events``.

The watcher, the database's one writer, runs ``keep_partitions`` beside its projector: at start
and every hour it makes the months from now through ``months_ahead`` that are missing
(``mdq_make_partitions``), so a report never waits in the default partition at a month's turn,
and, with a retention, detaches the months that ended more than ``retention_days`` ago
(``mdq_detach_partitions``): they leave the history tables (and ``mdq ls``/``show``), stay in the
database as plain tables readable by the owner alone, to archive and drop; and, with a roll-up
age, it rolls the months of ``progress`` that ended more than ``rollup_days`` ago up into
per-job summaries plus every ``keep_every``-th report (``mdq_rollup_progress``).
The functions run as the schema's owner; the writer may execute them and has no DDL of
its own. A database that
is away is tried again later: the projector waits for it anyway, and nothing here is urgent.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import asyncpg

log = logging.getLogger(__name__)

CHECK_INTERVAL_S = 3600.0
"""How often the months ahead and the retention are checked."""
RETRY_S = 30.0
"""How soon after a failure (the database away) they are tried again."""


async def make_partitions(pool: asyncpg.Pool, *, months_ahead: int) -> int:
    """Make this month's and the next ``months_ahead`` months' partitions that are missing;
    return how many were made."""
    made = await pool.fetchval(
        "SELECT mdq_make_partitions(now(), now() + make_interval(months => $1))", months_ahead
    )
    return int(made or 0)


async def detach_expired(pool: asyncpg.Pool, *, retention_days: int) -> list[str]:
    """Detach the monthly partitions that ended more than ``retention_days`` ago (0: none);
    return their names."""
    if retention_days <= 0:
        return []
    rows = await pool.fetch(
        "SELECT mdq_detach_partitions(now() - make_interval(days => $1))", retention_days
    )
    return [str(row[0]) for row in rows]


async def roll_up_progress(pool: asyncpg.Pool, *, rollup_days: int, keep_every: int) -> list[str]:
    """Roll up the months of ``progress`` that ended more than ``rollup_days`` ago (0: none)
    and are not rolled up yet, keeping every ``keep_every``-th report of each attempt (and its
    first and last); return the partitions rolled up."""
    if rollup_days <= 0:
        return []
    rows = await pool.fetch(
        "SELECT mdq_rollup_progress(now() - make_interval(days => $1), $2)",
        rollup_days,
        keep_every,
    )
    return [str(row[0]) for row in rows]


async def keep_partitions(
    pool: asyncpg.Pool,
    *,
    months_ahead: int,
    retention_days: int,
    rollup_days: int = 0,
    keep_every: int = 10,
    interval_s: float = CHECK_INTERVAL_S,
    retry_s: float = RETRY_S,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> None:
    """Keep the partitions made ahead, the expired ones detached and the old months of progress
    rolled up, for ever."""
    while True:
        try:
            made = await make_partitions(pool, months_ahead=months_ahead)
            detached = await detach_expired(pool, retention_days=retention_days)
            rolled = await roll_up_progress(pool, rollup_days=rollup_days, keep_every=keep_every)
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as error:
            log.warning(
                "keeping the history's partitions failed (%r); again in %.0f s", error, retry_s
            )
            await sleep(retry_s)
            continue
        if made:
            log.info("made %d monthly partitions ahead", made)
        for name in detached:
            log.info(
                "detached %s: older than %d days; archive it (pg_dump -t %s) and drop it",
                name,
                retention_days,
                name,
            )
        for name in rolled:
            log.info(
                "rolled up %s: older than %d days; kept every %d-th report and a summary per "
                "job (progress_rollups)",
                name,
                rollup_days,
                keep_every,
            )
        await sleep(interval_s)
