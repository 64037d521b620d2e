"""The size and age limits of streams and buckets (``mdq.bus.storage``), and the mark above
which intake refuses new submits (``services.intake.room``): tables of named cases."""

from __future__ import annotations

import asyncio

import pytest
from nats.js.api import DiscardPolicy
from pydantic import ValidationError

from mdq.bus.storage import DAY_S, GiB, MiB, StorageSettings
from mdq.bus.streams import bucket_limits, stream_configs, tenant_stream_config
from mdq.bus.subjects import Subjects
from services.intake.room import JobsLogRoom, LogSize, room_refusal

SUBJECTS = Subjects("mdq")
SMALL = StorageSettings.model_validate(
    {
        "submit_bytes": 1 * MiB,
        "submit_days": 2,
        "jobs_bytes": 3 * MiB,
        "jobs_days": 40,
        "progress_bytes": 5 * MiB,
        "progress_days": 9,
        "nodes_bytes": 7 * MiB,
        "nodes_days": 0.5,
        "node_summaries_bytes": 29 * MiB,
        "node_summaries_minutes": 90,
        "tenant_bytes": 11 * MiB,
        "tenant_submit_bytes": 37 * MiB,
        "tenant_days": 13,
        "registry_bytes": 17 * MiB,
        "registry_days": 19,
        "bucket_bytes": 23 * MiB,
        "copies_bytes": 31 * MiB,
        "copies_days": 3,
        "inputs_bytes": 37 * MiB,
        "tenant_inputs_bytes": 41 * MiB,
    }
)

STREAMS = {
    # stream: (size limit, age limit in days, what a full stream does)
    SUBJECTS.submit_stream: (1 * MiB, 2, DiscardPolicy.NEW),  # the submitter is refused
    SUBJECTS.jobs_stream: (3 * MiB, 40, DiscardPolicy.NEW),  # never drops a live job's events
    SUBJECTS.progress_stream: (5 * MiB, 9, DiscardPolicy.OLD),  # PostgreSQL has the history
    SUBJECTS.nodes_stream: (7 * MiB, 0.5, DiscardPolicy.OLD),  # replaced by the next report
    SUBJECTS.node_summaries_stream: (29 * MiB, 90 / 1440, DiscardPolicy.OLD),  # an hour is read
    SUBJECTS.copies_stream: (31 * MiB, 3, DiscardPolicy.OLD),  # ended jobs' copies go first
}


@pytest.mark.parametrize("stream", STREAMS)
def test_each_stream_has_its_limits_and_discard_policy(stream: str) -> None:
    configs = {config.name: config for config in stream_configs(SUBJECTS, storage=SMALL)}
    max_bytes, days, discard = STREAMS[stream]
    config = configs[stream]
    assert (config.max_bytes, config.max_age, config.discard) == (max_bytes, days * DAY_S, discard)


def test_every_stream_is_in_the_table() -> None:
    assert {config.name for config in stream_configs(SUBJECTS, storage=SMALL)} == set(STREAMS)


@pytest.mark.parametrize(
    ("stream", "per_subject"),
    [
        (SUBJECTS.nodes_stream, 1),  # the latest report of each node
        (SUBJECTS.node_summaries_stream, 95),  # one a minute of its 90, and 5 spare
        (SUBJECTS.jobs_stream, -1),  # every event of a job (no limit)
        (SUBJECTS.copies_stream, 1),  # a chunk of a slot: its next copy replaces it
    ],
    ids=["nodes", "node-summaries", "jobs", "copies"],
)
def test_what_each_stream_keeps_of_one_subject(stream: str, per_subject: int) -> None:
    configs = {config.name: config for config in stream_configs(SUBJECTS, storage=SMALL)}
    assert configs[stream].max_msgs_per_subject == per_subject


def test_a_tenant_stream_is_a_copy_that_drops_its_oldest() -> None:
    config = tenant_stream_config(SUBJECTS, "alice", storage=SMALL)
    assert (config.max_bytes, config.max_age, config.discard) == (
        11 * MiB,
        13 * DAY_S,
        DiscardPolicy.OLD,
    )


def test_every_bucket_has_a_size_limit_and_job_controls_the_duplicate_window() -> None:
    limits = bucket_limits(SUBJECTS, SMALL)
    assert limits.pop(SUBJECTS.control_bucket) == (17 * MiB, 19 * DAY_S)
    assert set(limits) == {
        SUBJECTS.tenants_bucket,
        SUBJECTS.pods_bucket,
        SUBJECTS.nodes_bucket,
        SUBJECTS.waiting_bucket,
        SUBJECTS.placement_snapshot_bucket,
        SUBJECTS.recovery_snapshot_bucket,
        SUBJECTS.lease_bucket,
    }
    assert set(limits.values()) == {(23 * MiB, 0.0)}


def test_sizes_take_units_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MDQ_STORAGE_JOBS_BYTES", "2560MiB")
    monkeypatch.setenv("MDQ_STORAGE_PROGRESS_BYTES", "1GiB")
    storage = StorageSettings()
    assert (storage.jobs_bytes, storage.progress_bytes) == (2560 * MiB, 1 * GiB)


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"registry_days": 365}, "MDQ_STORAGE_REGISTRY_DAYS"),  # as long as the log: refused
        ({"registry_days": 40, "jobs_days": 40}, "MDQ_STORAGE_JOBS_DAYS"),
        ({"jobs_days": 7}, "jobs_days"),  # shorter than a job may live
        ({"jobs_high_water": 1.0}, "jobs_high_water"),  # no room left for accepted jobs
        ({"jobs_bytes": 0}, "jobs_bytes"),
        ({"node_summaries_minutes": 60}, "node_summaries_minutes"),  # the hour's first minute
    ],
    ids=[
        "registry-as-long-as-log",
        "registry-equal-log",
        "log-too-short",
        "no-room",
        "zero",
        "summaries-shorter-than-the-hour",
    ],
)
def test_unsafe_settings_are_refused_naming_them(fields: dict[str, object], named: str) -> None:
    with pytest.raises(ValidationError, match=named):
        StorageSettings.model_validate(fields)


def test_server_bytes_is_what_the_namespace_reserves() -> None:
    expected = (
        (1 + 3 + 5 + 7 + 29 + 31) * MiB
        + 17 * MiB
        + 8 * 23 * MiB
        + 37 * MiB  # the operator's inputs bucket
        + 8 * (11 + 37 + 41) * MiB  # each expected tenant's events, submits and inputs bucket
    )
    assert SMALL.server_bytes() == expected


@pytest.mark.parametrize(
    ("held", "limit", "refused"),
    [
        (0, 1000, False),
        (899, 1000, False),  # just below the mark
        (900, 1000, True),  # at it: the rest is the accepted jobs' room
        (1000, 1000, True),
        (10**12, -1, False),  # a stream without a size limit
        (10**12, 0, False),
    ],
    ids=["empty", "below", "at-mark", "full", "no-limit", "zero-limit"],
)
def test_new_submits_are_refused_from_the_high_water_mark(
    held: int, limit: int, refused: bool
) -> None:
    refusal = room_refusal(LogSize(held=held, limit=limit), 0.9)
    assert (refusal is not None) is refused
    if refusal is not None:
        assert "jobs log is full" in refusal.message and "MDQ_STORAGE_JOBS_BYTES" in refusal.message


async def test_concurrent_batches_share_one_reading_of_the_log_size() -> None:
    reads: list[int] = []
    gate = asyncio.Event()

    async def read() -> LogSize:
        reads.append(1)
        await gate.wait()  # the server answers once every batch has asked
        return LogSize(held=950, limit=1000)

    room = JobsLogRoom(read, high_water=0.9, refresh_s=60)
    asking = [asyncio.ensure_future(room.refusal()) for _ in range(5)]
    await asyncio.sleep(0)
    gate.set()
    refusals = await asyncio.gather(*asking)
    assert len(reads) == 1 and all(refusal is not None for refusal in refusals)
    assert await room.refusal() is not None and len(reads) == 1  # still fresh


async def test_a_reading_older_than_the_refresh_is_read_again() -> None:
    sizes = iter([LogSize(held=950, limit=1000), LogSize(held=950, limit=4000)])

    async def read() -> LogSize:
        return next(sizes)

    room = JobsLogRoom(read, high_water=0.9, refresh_s=0)  # 0: read before every batch
    assert await room.refusal() is not None
    assert await room.refusal() is None  # an operator raised the limit meanwhile
