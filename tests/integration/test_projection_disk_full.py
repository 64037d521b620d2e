"""PostgreSQL on a full disk stalls the projection, says so, and catches up losing nothing.

The database of this test lives on a real ext4 filesystem of its own (``SmallDisk``, loop
mounted: the embedded stack's state folder volume), which is filled to the last byte while the
watcher (its real composition, ``run_watcher``) projects a campaign's events. The projection
stalls: one clear log line says the disk is full, nothing more is stored, and the watcher's
consumer lag (what ``mdq_consumer_lag_messages`` exports) shows what waits. Once the disk has
room again every event is projected exactly once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from nats.aio.client import Client

from mdq.bus.subjects import Subjects
from mdq.embedded import EmbeddedPostgres
from mdq.testing.disks import SmallDisk
from services.metrics.app import sample_consumer_lag
from services.metrics.exporter import Exporter
from services.watcher.app import run_watcher
from tests.helpers import RecordingBackend, publisher, wait_for
from tests.integration.test_fail_apart import (
    SETTINGS,
    alive,
    background,
    caught_up_once,
    migrated_postgres,
    projected_up_to,
    publish_campaign,
    rows_of,
)


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[SmallDisk]:
    small = SmallDisk(mount_point=tmp_path / "state", image=tmp_path / "state.img", size_mb=160)
    small.create()
    try:
        yield small
    finally:
        small.destroy()


@pytest.fixture
async def postgres_on_disk(disk: SmallDisk) -> AsyncIterator[EmbeddedPostgres]:
    async with migrated_postgres(disk.mount_point / "postgres") as server:
        yield server


async def publish_jobs(client: Client, subjects: Subjects, prefix: str, jobs: int) -> None:
    """``jobs`` jobs that each ran 100 reports and succeeded."""
    names = [f"r{prefix}{n}-job" for n in range(jobs)]
    await publish_campaign(publisher(client.jetstream(), subjects), names, range(10, 1001, 10))


async def test_a_full_database_disk_stalls_the_projection_which_then_catches_up(
    nc: Client,
    subjects: Subjects,
    disk: SmallDisk,
    postgres_on_disk: EmbeddedPostgres,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="mdq.store.projection")
    js = nc.jetstream()
    url = postgres_on_disk.url
    await publish_jobs(nc, subjects, "a", 5)
    watcher = run_watcher(
        nc=nc, subjects=subjects, database_url=url, backend=RecordingBackend(), settings=SETTINGS
    )
    async with background(watcher) as task:

        async def caught_up() -> bool:
            alive(task)
            return await projected_up_to(url, js, subjects)

        await wait_for(caught_up, timeout=60, what="the first projection")
        filled = await asyncio.to_thread(disk.fill)
        assert filled > 0
        await publish_jobs(nc, subjects, "b", 20)

        async def said_so() -> bool:
            alive(task)
            return any("out of disk space" in message for message in caplog.messages)

        await wait_for(said_so, timeout=60, what="the projector to say the disk is full")
        exporter = Exporter()
        await sample_consumer_lag(js, subjects, exporter)
        lag = exporter.registry.get_sample_value(
            "mdq_consumer_lag_messages",
            {"consumer": "watcher-progress", "stream": subjects.progress_stream},
        )
        assert lag is not None and lag > 0, "the lag metric shows what waits"
        assert not await projected_up_to(url, js, subjects), "nothing more was stored"

        await asyncio.to_thread(disk.free)
        await caught_up_once(url, js, subjects, task, timeout=120)
        states = await rows_of(url, "SELECT state, last_step FROM jobs")
        assert sorted(tuple(r) for r in states) == [("SUCCEEDED", 1000)] * 25
        alive(task)
