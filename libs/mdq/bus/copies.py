"""The store every cluster shares: copies of each job's latest checkpoints and of its outputs.

The runner copies each verified checkpoint, and a successful attempt's outputs, in chunks into
the stream ``NS_COPIES`` (``CopyStore``); a retry on another cluster fetches the copy named by
the newest manifest and checks its sha256 before it resumes from it. The layout (two slots per
attempt, a manifest published last) and why the bus rather than an object store:
docs/placement.md, "Checkpoints outlive their cluster".
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from mdq.bus.subjects import Subjects
from mdq.contracts import pb
from mdq.core.timestamps import set_timestamp

log = logging.getLogger("mdq.bus.copies")

CHUNK_BYTES = 256 * 1024
"""The bytes of a file in one message of the copies stream."""
IN_FLIGHT = 8
"""Chunks published before their acknowledgements are awaited."""
SLOTS = ("a", "b")
MANIFEST = "m"
_TEMP_PREFIX = ".copy-"


class CopyUnusable(ValueError):
    """A copy is missing a chunk or its bytes do not hash to its manifest's sha256."""


@dataclass(frozen=True, slots=True)
class FileToCopy:
    """One file of a copy: where it is, and what it is (``CopiedFile.kind``)."""

    path: Path
    kind: str


def copy_slot(attempt: int, slot: str) -> str:
    """The ``Checkpoint.copy_slot`` of ``attempt``'s slot ``slot``."""
    return f"{attempt}.{slot}"


def parse_copy_slot(value: str) -> tuple[int, str]:
    """(attempt, slot) of a ``copy_slot``; ValueError if it is not one."""
    attempt, _, slot = value.partition(".")
    if not attempt.isdigit() or slot not in SLOTS:
        raise ValueError(f"not a copy slot: {value!r}")
    return int(attempt), slot


def other_slot(slot: str) -> str:
    return SLOTS[1] if slot == SLOTS[0] else SLOTS[0]


class CopyStore:
    """The copies of one namespace, through a JetStream context (a runner's: it may touch its
    own job's copies only)."""

    def __init__(
        self, js: JetStreamContext, subjects: Subjects, *, chunk_bytes: int = CHUNK_BYTES
    ) -> None:
        self._js = js
        self._subjects = subjects
        self._chunk_bytes = chunk_bytes

    # -- subjects ---------------------------------------------------------------------------
    def _checkpoint_base(self, job_id: str, attempt: int, slot: str) -> str:
        return self._subjects.copy(job_id, f"ckpt.{attempt}.{slot}")

    def _outputs_base(self, job_id: str, attempt: int) -> str:
        return self._subjects.copy(job_id, f"out.{attempt}")

    # -- writing ----------------------------------------------------------------------------
    async def put_checkpoint(
        self,
        *,
        job_id: str,
        attempt: int,
        slot: str,
        checkpoint: pb.Checkpoint,
        files: Sequence[FileToCopy],
    ) -> pb.CopyManifest:
        """Copy a checkpoint's files into ``slot`` of ``attempt``, then its manifest (whose
        checkpoint has ``copy_slot`` set); the manifest once stored."""
        if slot not in SLOTS:
            raise ValueError(f"slot must be one of {SLOTS}, not {slot!r}")
        manifest = pb.CopyManifest(job_id=job_id, attempt=attempt, slot=slot)
        manifest.checkpoint.CopyFrom(checkpoint)
        manifest.checkpoint.copy_slot = copy_slot(attempt, slot)
        base = self._checkpoint_base(job_id, attempt, slot)
        await self._put_files(base, manifest, files)
        expected = {"state_xml": checkpoint.sha256, "native": checkpoint.native_sha256}
        for copied in manifest.files:
            if copied.kind in expected and copied.sha256 != expected[copied.kind]:
                raise CopyUnusable(
                    f"{copied.name} changed while it was copied (sha256 {copied.sha256}, "
                    f"the checkpoint's {expected[copied.kind]}): no manifest published"
                )
        await self._publish_manifest(base, manifest)
        return manifest

    async def put_outputs(
        self, *, job_id: str, attempt: int, files: Sequence[FileToCopy]
    ) -> pb.CopyManifest:
        """Copy a successful attempt's output files, then their manifest."""
        manifest = pb.CopyManifest(job_id=job_id, attempt=attempt)
        base = self._outputs_base(job_id, attempt)
        await self._put_files(base, manifest, files)
        await self._publish_manifest(base, manifest)
        return manifest

    async def _put_files(
        self, base: str, manifest: pb.CopyManifest, files: Sequence[FileToCopy]
    ) -> None:
        for index, file in enumerate(files):
            manifest.files.append(await self._put_file(f"{base}.{index}", file))

    async def _publish_manifest(self, base: str, manifest: pb.CopyManifest) -> None:
        """Store the manifest, after every chunk it names was acknowledged."""
        set_timestamp(manifest.copied_at, datetime.now(UTC))
        await self._js.publish(f"{base}.{MANIFEST}", manifest.SerializeToString())

    async def _put_file(self, base: str, file: FileToCopy) -> pb.CopiedFile:
        """Publish one file's chunks, ``IN_FLIGHT`` at a time; read in a worker thread so the
        event loop (and the runner's progress reports) never waits on the disk."""
        digest = hashlib.sha256()
        size = 0
        chunks = 0
        pending: list[asyncio.Future[object]] = []
        with file.path.open("rb") as handle:
            while True:
                data = await asyncio.to_thread(handle.read, self._chunk_bytes)
                if not data and chunks:
                    break
                digest.update(data)
                size += len(data)
                pending.append(asyncio.ensure_future(self._js.publish(f"{base}.{chunks}", data)))
                chunks += 1
                if len(pending) >= IN_FLIGHT:
                    await pending.pop(0)
                if not data:
                    break  # an empty file is one empty chunk
        await asyncio.gather(*pending)
        return pb.CopiedFile(
            name=file.path.name,
            sha256=digest.hexdigest(),
            size_bytes=size,
            chunks=chunks,
            kind=file.kind,
        )

    # -- reading ----------------------------------------------------------------------------
    async def _last(self, subject: str) -> bytes | None:
        try:
            message = await self._js.get_last_msg(
                self._subjects.copies_stream, subject, direct=True
            )
        except NotFoundError:
            return None
        return message.data or b""

    async def checkpoint_manifest(
        self, job_id: str, attempt: int, slot: str
    ) -> pb.CopyManifest | None:
        """The manifest in ``slot`` of ``attempt``'s checkpoint copies, None if none."""
        data = await self._last(f"{self._checkpoint_base(job_id, attempt, slot)}.{MANIFEST}")
        return None if data is None else pb.CopyManifest.FromString(data)

    async def outputs_manifest(self, job_id: str, attempt: int) -> pb.CopyManifest | None:
        """The manifest of ``attempt``'s copied outputs, None if none."""
        data = await self._last(f"{self._outputs_base(job_id, attempt)}.{MANIFEST}")
        return None if data is None else pb.CopyManifest.FromString(data)

    async def fetch(self, manifest: pb.CopyManifest, into: Path) -> list[Path]:
        """Write every file of ``manifest`` into ``into`` (each atomically: a temporary file,
        fsynced, renamed, the folder fsynced) after checking its sha256; CopyUnusable if a
        chunk is missing or a file's bytes do not match (nothing of that file is left)."""
        if manifest.slot:
            base = self._checkpoint_base(manifest.job_id, manifest.attempt, manifest.slot)
        else:
            base = self._outputs_base(manifest.job_id, manifest.attempt)
        await asyncio.to_thread(into.mkdir, parents=True, exist_ok=True)
        written = []
        for index, file in enumerate(manifest.files):
            if Path(file.name).name != file.name or file.name.startswith("."):
                raise CopyUnusable(f"a copied file may not be named {file.name!r}")
            written.append(await self._fetch_file(f"{base}.{index}", file, into))
        return written

    async def _fetch_file(self, base: str, file: pb.CopiedFile, into: Path) -> Path:
        target = into / file.name
        temp = into / f"{_TEMP_PREFIX}{file.name}.{os.getpid()}"
        digest = hashlib.sha256()
        try:
            with temp.open("wb") as handle:
                for index in range(file.chunks):
                    data = await self._last(f"{base}.{index}")
                    if data is None:
                        raise CopyUnusable(f"{file.name}: chunk {index} is missing")
                    digest.update(data)
                    await asyncio.to_thread(handle.write, data)
                await asyncio.to_thread(_sync, handle.fileno())
            if digest.hexdigest() != file.sha256:
                raise CopyUnusable(
                    f"{file.name}: sha256 is {digest.hexdigest()}, expected {file.sha256}"
                )
            os.replace(temp, target)
            await asyncio.to_thread(_sync_folder, into)
        finally:
            temp.unlink(missing_ok=True)
        return target


def _sync(descriptor: int) -> None:
    os.fsync(descriptor)


def _sync_folder(folder: Path) -> None:
    descriptor = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
