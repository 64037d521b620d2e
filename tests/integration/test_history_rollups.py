"""Old months of ``progress`` rolled up: a summary per job, attempt and month in
``progress_rollups`` plus every Nth report kept, run by the watcher as the writer; newer months
untouched; once per month; the settings that turn it on."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest
from pydantic import ValidationError

from mdq.store.partitions import keep_partitions, roll_up_progress
from mdq.store.roles import RoleUrls
from services.watcher.settings import WatcherSettings
from tests.helpers import wait_for
from tests.integration.test_partitions import owner, writer

__all__ = ["owner", "writer"]  # the fixtures, for this module's tests

PROGRESS = (
    "INSERT INTO progress (job_id, attempt, step, time, time_ps, potential_kj_mol, "
    "kinetic_kj_mol, temperature_k, ns_per_day, event_id, stream, stream_seq, producer, "
    "target_steps, eta_s, done_reason) VALUES ($1, $2, $3, $4, 0, $5, 0, 300, 20, $6, 'P', 1, "
    "'runner', 1000, 0, $7)"
)
JANUARY = datetime(2025, 1, 10, tzinfo=UTC)


async def _reports(owner: asyncpg.Connection, job: str, at: datetime, steps: range) -> None:
    """One report per step of ``steps``, a minute apart from ``at``; the last ends the run."""
    await owner.executemany(
        PROGRESS,
        [
            (
                job,
                1,
                step,
                at + timedelta(minutes=step),
                -1000.0 - step,
                f"progress:{job}:1:{step}",
                "steps_reached" if step == steps[-1] else "",
            )
            for step in steps
        ],
    )


async def _steps(owner: asyncpg.Connection, job: str) -> list[int]:
    rows = await owner.fetch("SELECT step FROM progress WHERE job_id = $1 ORDER BY step", job)
    return [row["step"] for row in rows]


async def test_an_old_month_keeps_a_summary_and_every_nth_report(
    owner: asyncpg.Connection, writer: asyncpg.Pool
) -> None:
    await owner.execute("SELECT mdq_make_partitions('2025-01-01Z', '2025-01-31Z')")
    await _reports(owner, "old-a", JANUARY, range(1, 26))  # 25 reports, the last done
    await _reports(owner, "old-b", JANUARY, range(1, 4))
    await owner.execute("UPDATE progress SET units = 'lj' WHERE job_id = 'old-b'")  # LAMMPS
    now = datetime.now(UTC)
    await _reports(owner, "new", now - timedelta(hours=1), range(1, 26))

    rolled = await roll_up_progress(writer, rollup_days=90, keep_every=10)  # the watcher
    again = await roll_up_progress(writer, rollup_days=90, keep_every=10)
    off = await roll_up_progress(writer, rollup_days=0, keep_every=10)

    kept_a = await _steps(owner, "old-a")
    kept_b = await _steps(owner, "old-b")
    units_b = await owner.fetch("SELECT DISTINCT units FROM progress WHERE job_id = 'old-b'")
    kept_new = await _steps(owner, "new")
    summaries = [
        dict(row)
        for row in await owner.fetch(
            "SELECT job_id, attempt, month, reports, kept, first_step, last_step, "
            "min_potential_kj_mol, max_potential_kj_mol, mean_potential_kj_mol, "
            "mean_temperature_k, mean_ns_per_day FROM progress_rollups ORDER BY job_id"
        )
    ]
    comment = await owner.fetchval(
        "SELECT obj_description('progress_y2025m01'::regclass, 'pg_class')"
    )
    assert rolled == ["progress_y2025m01"]
    assert again == [] and off == []  # a month is rolled up once; 0 rolls nothing up
    assert kept_a == [1, 11, 21, 25]  # the first, every 10th after it, the last
    assert kept_b == [1, 3]
    assert [row["units"] for row in units_b] == ["lj"]  # a kept report keeps its units
    assert kept_new == list(range(1, 26))  # a recent month is untouched
    assert summaries == [
        {
            "job_id": "old-a",
            "attempt": 1,
            "month": JANUARY.date().replace(day=1),
            "reports": 25,
            "kept": 4,
            "first_step": 1,
            "last_step": 25,
            "min_potential_kj_mol": -1025.0,
            "max_potential_kj_mol": -1001.0,
            "mean_potential_kj_mol": -1013.0,
            "mean_temperature_k": 300.0,
            "mean_ns_per_day": 20.0,
        },
        {
            "job_id": "old-b",
            "attempt": 1,
            "month": JANUARY.date().replace(day=1),
            "reports": 3,
            "kept": 2,
            "first_step": 1,
            "last_step": 3,
            "min_potential_kj_mol": -1003.0,
            "max_potential_kj_mol": -1001.0,
            "mean_potential_kj_mol": -1002.0,
            "mean_temperature_k": 300.0,
            "mean_ns_per_day": 20.0,
        },
    ]
    assert comment == "rolled up by mdq_rollup_progress: kept every 10-th report"


async def test_only_the_writer_may_roll_up_and_the_reader_reads_the_summaries(
    database_roles: RoleUrls,
) -> None:
    reader = await asyncpg.connect(database_roles.reader)
    try:
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await reader.fetch("SELECT mdq_rollup_progress(now(), 10)")
        assert await reader.fetchval("SELECT count(*) FROM progress_rollups") == 0
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await reader.execute(
                "INSERT INTO progress_rollups VALUES ('x', 1, '2025-01-01', 1, 1, 1, 1, now(), "
                "now(), 0, 0, 0, 0, 0)"
            )
    finally:
        await reader.close()


async def test_the_watchers_keeper_rolls_up_with_its_settings(
    owner: asyncpg.Connection, writer: asyncpg.Pool
) -> None:
    await owner.execute("SELECT mdq_make_partitions('2025-01-01Z', '2025-01-31Z')")
    await _reports(owner, "old-a", JANUARY, range(1, 8))
    keeper = asyncio.create_task(
        keep_partitions(writer, months_ahead=2, retention_days=0, rollup_days=60, keep_every=3)
    )
    try:

        async def rolled() -> bool:
            return bool(await owner.fetchval("SELECT count(*) FROM progress_rollups"))

        await wait_for(rolled, timeout=10, what="January rolled up")
        assert not keeper.done()
    finally:
        keeper.cancel()
    assert await _steps(owner, "old-a") == [1, 4, 7]


def test_the_settings_turn_it_on_past_a_month(monkeypatch: pytest.MonkeyPatch) -> None:
    assert (
        WatcherSettings().progress_rollup_days,
        WatcherSettings().progress_rollup_keep_every,
    ) == (
        0,
        10,
    )
    monkeypatch.setenv("MDQ_WATCHER_PROGRESS_ROLLUP_DAYS", "90")
    monkeypatch.setenv("MDQ_WATCHER_PROGRESS_ROLLUP_KEEP_EVERY", "20")
    chosen = WatcherSettings()
    assert (chosen.progress_rollup_days, chosen.progress_rollup_keep_every) == (90, 20)
    monkeypatch.setenv("MDQ_WATCHER_PROGRESS_ROLLUP_DAYS", "7")
    with pytest.raises(ValidationError, match="progress_rollup_days"):
        WatcherSettings()
    monkeypatch.setenv("MDQ_WATCHER_PROGRESS_ROLLUP_DAYS", "90")
    monkeypatch.setenv("MDQ_WATCHER_PROGRESS_ROLLUP_KEEP_EVERY", "0")
    with pytest.raises(ValidationError, match="progress_rollup_keep_every"):
        WatcherSettings()
