"""Reading a KV bucket through, with a "caught up" marker that can be trusted.

nats-py's KV watcher can say "every existing key delivered" (``None``) before the keys arrive.
``watch_through`` yields the watcher's entries and one ``None`` of its own, where the watch has
really caught up. Design: docs/architecture.md, "When NATS or PostgreSQL is down".
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from nats.js.kv import KeyValue

__all__ = ["bucket_keys", "watch_through"]


async def watch_through(watcher: Any) -> AsyncIterator[KeyValue.Entry | None]:
    """Every entry of ``watcher`` (a ``KeyValue.KeyWatcher``), with ``None`` yielded exactly
    once, right after the last entry that existed when the watch began."""
    synced = False
    seen = 0
    async for entry in watcher:
        if entry is None:
            if not synced and await _consumer_caught_up(watcher, seen):
                synced = True
                yield None
            continue
        seen += 1
        yield entry
        if not synced and entry.delta == 0:
            synced = True
            yield None


async def _consumer_caught_up(watcher: Any, seen: int) -> bool:
    """Whether the watch's consumer has nothing pending and delivered only what was seen."""
    info = await watcher._sub.consumer_info()
    return int(info.num_pending or 0) == 0 and int(info.delivered.consumer_seq or 0) <= seen


async def bucket_keys(kv: KeyValue) -> list[str]:
    """The keys the bucket holds now (deleted and purged ones left out), in the order the
    server delivers them; an empty list for an empty bucket (nats-py's ``keys()`` raises)."""
    watcher = await kv.watchall(meta_only=True)
    keys: dict[str, None] = {}
    try:
        async for entry in watch_through(watcher):
            if entry is None:
                break
            if entry.operation is None:
                keys[entry.key] = None
            else:
                keys.pop(entry.key, None)
    finally:
        await watcher.stop()  # type: ignore[no-untyped-call]
    return list(keys)
