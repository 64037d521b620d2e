"""A service's snapshot in a KV bucket of its own: placement's (``<namespace>_placement_snapshot``,
written by the leader) and recovery's (``<namespace>_recovery_snapshot``); read on start. The
format and the checks are ``mdq.core.snapshot``.

Keys: ``head`` (written last, in one put, with compare-and-set on the revision it replaces: a
deposed leader's late write is refused) and ``a.<i>`` / ``b.<i>``, the compressed chunks of
the two slots used in turn. The bucket keeps one revision per key, so its size is bounded by
twice the largest snapshot written. Two writers at once (two recovery replicas) can mix their
chunks in one slot; the head's checksum then fails and the next start replays the whole log.
Every failure here is logged and survived: without a snapshot a service replays the log, as it
always could.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig
from nats.js.errors import KeyNotFoundError, NotFoundError
from nats.js.kv import KeyValue

from mdq.bus.outage import warn_try_failed
from mdq.bus.streams import open_bucket
from mdq.core.log_continuity import ServerLog, message_digest
from mdq.core.snapshot import (
    Head,
    Resume,
    SnapshotUnreadable,
    chunk_key,
    decode,
    encode,
    next_slot,
    resume,
)

log = logging.getLogger("mdq.snapshots")

HEAD_KEY = "head"


@dataclass(frozen=True, slots=True)
class Loaded:
    """What ``SnapshotStore.load`` found: where to resume, and the state when restorable."""

    resume: Resume
    state: dict[str, Any] | None = None
    sha256: str | None = None


class SnapshotStore:
    """Reads and writes one service's snapshot of the jobs stream ``stream``."""

    def __init__(self, js: JetStreamContext, *, bucket: str, stream: str, replicas: int) -> None:
        self._js = js
        self._bucket_name = bucket
        self._stream = stream
        self._replicas = replicas
        self._kv: KeyValue | None = None

    async def _bucket(self) -> KeyValue:
        if self._kv is None:
            self._kv = await open_bucket(
                self._js,
                KeyValueConfig(bucket=self._bucket_name, history=1, replicas=self._replicas),
            )
        return self._kv

    async def _head(self) -> tuple[Head | None, int]:
        """The current head and its revision (None, 0: none). Raises ``SnapshotUnreadable``."""
        kv = await self._bucket()
        try:
            entry = await kv.get(HEAD_KEY)
        except KeyNotFoundError:
            return None, 0
        if entry.value is None:
            return None, entry.revision or 0
        return Head.from_json(entry.value), entry.revision or 0

    async def _server(self, sequence: int) -> ServerLog:
        info = await self._js.stream_info(self._stream)
        if info.created is None:
            raise RuntimeError(f"the server gave no creation time for stream {self._stream}")
        return ServerLog(
            created=info.created,
            first_seq=info.state.first_seq or 0,
            last_seq=info.state.last_seq or 0,
            offset_digest=await self._digest(sequence, info.state.last_seq or 0),
        )

    async def _digest(self, sequence: int, last: int) -> str | None:
        if not 0 < sequence <= last:
            return None
        with contextlib.suppress(NotFoundError):  # expired, purged or deleted
            held = await self._js.get_msg(self._stream, seq=sequence)
            return message_digest(held.subject or "", held.data or b"")
        return None

    async def load(self) -> Loaded:
        """The snapshot to restore, or why the whole log is replayed."""
        try:
            head, _ = await self._head()
            verdict = resume(head, await self._server(head.sequence if head else 0))
            if head is None or not verdict.after:
                return Loaded(verdict)
            kv = await self._bucket()
            chunks: list[bytes | None] = []
            for index in range(head.chunks):
                try:
                    chunks.append((await kv.get(chunk_key(head.slot, index))).value)
                except KeyNotFoundError:
                    chunks.append(None)
            return Loaded(verdict, decode(head, chunks), head.sha256)
        except SnapshotUnreadable as error:
            return Loaded(Resume(0, f"snapshot unreadable: {error}"))
        except Exception as error:  # the bucket or the stream could not be read
            warn_try_failed(log, "could not read the snapshot", error)
            return Loaded(Resume(0, f"snapshot unreadable: {error!r}"))

    async def write(
        self, sha256: str, chunks: list[bytes], *, sequence: int, jobs: int, now: datetime
    ) -> None:
        """Write a state ``encode`` made (at jobs-stream ``sequence``) as the new snapshot.
        Chunks first, into the slot the head does not name, then the head in one put with
        compare-and-set (refused if someone else wrote one meanwhile). Raises on failure."""
        kv = await self._bucket()
        try:
            current, revision = await self._head()
        except SnapshotUnreadable:
            current, revision = None, (await kv.get(HEAD_KEY)).revision or 0
        slot = next_slot(current)
        for index, chunk in enumerate(chunks):
            await kv.put(chunk_key(slot, index), chunk)
        server = await self._server(sequence)
        head = Head(
            slot=slot,
            chunks=len(chunks),
            sha256=sha256,
            stream=self._stream,
            stream_created=server.created,
            sequence=sequence,
            digest=server.offset_digest,
            jobs=jobs,
            written_at=now,
        )
        if revision:
            await kv.update(HEAD_KEY, head.to_json(), last=revision)
        else:
            await kv.create(HEAD_KEY, head.to_json())


State = TypeVar("State")


class SnapshotKeeper:
    """What a stateful service does with its snapshots, logged the same way by each: restore
    the last one on start (or say why the whole log is replayed), and write the state again
    when it changed since it was written or restored."""

    def __init__(self, store: SnapshotStore, *, logger: logging.Logger) -> None:
        self._store = store
        self._log = logger
        self._sha256: str | None = None
        """The SHA-256 of the state last written or restored (nothing new: nothing written)."""

    async def restore(self, rebuild: Callable[[dict[str, Any]], State]) -> tuple[State, int] | None:
        """The state ``rebuild`` makes of the snapshot, and the jobs-stream sequence it reflects
        (the log is to be followed from the next one); None when the whole log is to be
        replayed. Logs one line either way."""
        loaded = await self._store.load()
        if loaded.state is None:
            self._log.info("full replay of the jobs log: %s", loaded.resume.reason)
            return None
        try:
            state = rebuild(loaded.state)
        except (ValueError, TypeError, KeyError) as error:
            self._log.warning("full replay of the jobs log: snapshot unreadable: %r", error)
            return None
        self._sha256 = loaded.sha256
        self._log.info(
            "restored from the %s; replaying the jobs log from sequence %d",
            loaded.resume.reason,
            loaded.resume.after + 1,
        )
        return state, loaded.resume.after

    async def write(self, content: dict[str, Any], *, now: datetime) -> bool:
        """Write ``content`` (a state's ``snapshot()``) unless it is what was last written or
        restored; True when written. Best effort: a failure is logged, and only makes the
        next start replay more of the log."""
        try:
            sha256, chunks = await asyncio.to_thread(encode, content)
            if sha256 == self._sha256:
                return False
            await self._store.write(
                sha256,
                chunks,
                sequence=int(content["last_sequence"]),
                jobs=len(content["jobs"]),
                now=now,
            )
        except Exception as error:
            warn_try_failed(self._log, "could not write the snapshot", error)
            return False
        self._sha256 = sha256
        return True
