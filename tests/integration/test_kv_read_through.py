"""Reading a KV bucket through (``mdq.bus.kv``): every key before the "caught up" marker.

nats-py's own marker can come before the keys when the server pushes them all before it answers
the watcher's consumer-info request (seen in CI: ``keys()`` raised ``NoKeysError`` on a bucket of
401 pods). Many reads at once on one connection make that race likely here: in a trial on this
machine, nats-py's ``keys()`` came back short 3 times in 200 such reads.
"""

from __future__ import annotations

import asyncio

from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig
from nats.js.kv import KeyValue

from mdq.bus.kv import bucket_keys, watch_through
from mdq.bus.subjects import Subjects


async def _bucket(js: JetStreamContext, subjects: Subjects, name: str) -> KeyValue:
    return await js.create_key_value(KeyValueConfig(bucket=f"{subjects.namespace}_{name}"))


async def test_every_key_comes_back_from_reads_racing_each_other(
    js: JetStreamContext, subjects: Subjects
) -> None:
    kv = await _bucket(js, subjects, "many")
    await asyncio.gather(*(kv.put(f"k{i}", b"x" * 100) for i in range(400)))
    for _ in range(10):
        reads = await asyncio.gather(*(bucket_keys(kv) for _ in range(20)))
        assert [len(keys) for keys in reads] == [400] * 20
    assert set(reads[0]) == {f"k{i}" for i in range(400)}


async def test_an_empty_bucket_has_no_keys(js: JetStreamContext, subjects: Subjects) -> None:
    assert await bucket_keys(await _bucket(js, subjects, "empty")) == []


async def test_deleted_and_purged_keys_are_left_out(
    js: JetStreamContext, subjects: Subjects
) -> None:
    kv = await _bucket(js, subjects, "gone")
    for key in ("a", "b", "c", "d"):
        await kv.put(key, b"1")
    await kv.delete("b")
    await kv.purge("c")
    assert sorted(await bucket_keys(kv)) == ["a", "d"]


async def test_the_marker_comes_once_and_after_every_existing_entry(
    js: JetStreamContext, subjects: Subjects
) -> None:
    kv = await _bucket(js, subjects, "marker")
    await asyncio.gather(*(kv.put(f"k{i}", b"v") for i in range(300)))

    async def read_until_marker_then_one_write() -> tuple[int, list[str]]:
        watcher = await kv.watchall()
        before, after = 0, list[str]()
        try:
            async for entry in watch_through(watcher):
                if entry is None:
                    assert not after, "a second marker"
                    after.append("<marker>")
                    await kv.put("late", b"v")
                elif after:
                    after.append(entry.key)
                    return before, after
                else:
                    before += 1
        finally:
            await watcher.stop()  # type: ignore[no-untyped-call]
        raise AssertionError("the watch ended")

    results = await asyncio.gather(*(read_until_marker_then_one_write() for _ in range(20)))
    for before, after in results:
        assert before >= 300 and after == ["<marker>", "late"]
