"""The runner's side of the store every cluster shares (``mdq.bus.copies``).

* ``CheckpointCopier`` copies each verified checkpoint in the background, so the MD loop never
  waits for it: a checkpoint offered while the previous one is still being copied replaces
  any other waiting one (only the newest is worth copying), and a copy that fails is logged
  and superseded by the next. Each finished copy is announced in a ``copied`` event, with its
  lag (seconds from the checkpoint's write to the copy's manifest being stored), which recovery
  resumes from when the attempt's cluster is lost. Before the runner exits it waits (bounded)
  for the copy in progress and the one waiting, so a preempted attempt's last checkpoint is
  copied too; a successful attempt's outputs are copied before its ``outputs`` event.
* ``fetch_resume_copy`` brings the announced checkpoint from the store when the job's folder
  does not hold it (a retry on another cluster); the engine's checkpoint loading then checks its
  sha256 as it checks any checkpoint.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

from mdq.bus.copies import CopyStore, CopyUnusable, FileToCopy, other_slot, parse_copy_slot
from mdq.contracts import pb
from services.runner.checkpoints import CheckpointFile
from services.runner.outbox import Outbox

log = logging.getLogger(__name__)


class CheckpointFolder(Protocol):
    """An engine's checkpoint folder, as the fetcher of a copy sees it (OpenMM's
    ``CheckpointStore``, LAMMPS's restart folder)."""

    @property
    def directory(self) -> Path: ...

    def holds(self, checkpoint: pb.Checkpoint) -> bool: ...

    def remove_temporaries(self) -> None: ...


class CheckpointCopier:
    """Copies one attempt's checkpoints and outputs into the shared store, in the background."""

    def __init__(
        self,
        store: CopyStore,
        outbox: Outbox,
        *,
        job_id: str,
        attempt: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = store
        self._outbox = outbox
        self._job_id = job_id
        self._attempt = attempt
        self._clock = clock
        self._waiting: tuple[CheckpointFile, float] | None = None
        self._worker: asyncio.Task[None] | None = None
        self._slot = "a"
        self.copied = 0
        """Checkpoints copied."""
        self.failed = 0
        """Copies that failed (a newer checkpoint's copy supersedes each)."""

    def offer(self, checkpoint: CheckpointFile) -> None:
        """Copy ``checkpoint`` once the copy in progress is done (replacing any checkpoint
        still waiting: only the newest matters). Returns at once."""
        self._waiting = (checkpoint, self._clock())
        if self._worker is None or self._worker.done():
            self._worker = asyncio.get_running_loop().create_task(
                self._drain(), name="copy-checkpoints"
            )

    async def finish(self, *, timeout_s: float) -> bool:
        """Wait for the copy in progress and the one waiting; False if they were not done
        within ``timeout_s`` (they are cancelled: the attempt is ending)."""
        worker = self._worker
        if worker is None or worker.done():
            return True
        done, _ = await asyncio.wait({worker}, timeout=timeout_s)
        if not done:
            log.error("the checkpoint copy was not done after %.0f s: given up", timeout_s)
            worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await worker
            return False
        return True

    async def copy_outputs(self, paths: Sequence[tuple[Path, str]]) -> pb.CopyManifest | None:
        """Copy a successful attempt's output files (path, kind); None (logged) if it failed:
        the outputs are still in the job's folder, and the job's success does not hang on
        its copy."""
        files = [FileToCopy(path, kind) for path, kind in paths if path.is_file()]
        if not files:
            return None
        try:
            manifest = await self._store.put_outputs(
                job_id=self._job_id, attempt=self._attempt, files=files
            )
        except Exception as error:  # the bus may be gone: the outputs stay on disk
            log.warning("copying the outputs to the shared store failed: %r", error)
            return None
        log.info(
            "outputs copied to the shared store: %s",
            ", ".join(f"{f.name} ({f.size_bytes} bytes)" for f in manifest.files),
        )
        return manifest

    async def _drain(self) -> None:
        while self._waiting is not None:
            checkpoint, written_at = self._waiting
            self._waiting = None
            try:
                await self._copy(checkpoint, written_at)
            except Exception as error:  # any failure: the next checkpoint's copy supersedes it
                self.failed += 1
                log.warning("copying checkpoint %d failed: %r", checkpoint.step, error)

    async def _copy(self, checkpoint: CheckpointFile, written_at: float) -> None:
        files = [FileToCopy(checkpoint.path, "state_xml")]
        if checkpoint.native_path is not None:
            files.append(FileToCopy(checkpoint.native_path, "native"))
        sidecar = checkpoint.path.with_suffix(".json")
        if sidecar.is_file():
            files.append(FileToCopy(sidecar, "sidecar"))
        manifest = await self._store.put_checkpoint(
            job_id=self._job_id,
            attempt=self._attempt,
            slot=self._slot,
            checkpoint=checkpoint.to_pb(),
            files=files,
        )
        self._slot = other_slot(self._slot)
        self.copied += 1
        lag = self._clock() - written_at
        copied = sum(file.size_bytes for file in manifest.files)
        self._outbox.copied(
            pb.CheckpointCopied(checkpoint=manifest.checkpoint, copy_lag_s=lag, bytes=copied)
        )
        log.info(
            "checkpoint %d copied to the shared store (%s, %d bytes, %.2f s after it was written)",
            checkpoint.step,
            manifest.checkpoint.copy_slot,
            copied,
            lag,
        )


async def fetch_resume_copy(
    announced: pb.Checkpoint | None, *, job_id: str, store: CheckpointFolder, copies: CopyStore
) -> pb.CopyFetched | None:
    """Bring the copy of ``announced`` into the job's checkpoint folder when the folder does
    not hold the checkpoint itself (a retry on another cluster than the one that wrote it);
    what was fetched (the copy's checkpoint, bytes, seconds), None if nothing was (no copy
    announced, the file is here, or no usable copy: the engine's checkpoint loading then falls back
    as it always does).

    The announced copy's slot is tried first, then the other slot of the same attempt: a
    runner of that attempt that went on (a cluster that only looked lost) may have copied a
    newer checkpoint over it, and a newer state of the job's own run loses less."""
    if announced is None or not announced.copy_slot:
        return None
    if await asyncio.to_thread(store.holds, announced):
        log.info("checkpoint %d is in the job's folder: no copy needed", announced.step)
        return None
    try:
        attempt, slot = parse_copy_slot(announced.copy_slot)
    except ValueError as error:
        log.warning("ignoring the announced copy: %s", error)
        return None
    started = time.monotonic()
    manifests = []
    for each in (slot, other_slot(slot)):
        try:
            manifest = await copies.checkpoint_manifest(job_id, attempt, each)
        except Exception as error:  # the bus: resume from what the folder has
            log.warning("reading the copy in slot %s failed: %r", each, error)
            continue
        if manifest is not None:
            manifests.append(manifest)

    def preference(manifest: pb.CopyManifest) -> tuple[bool, int]:
        exact = manifest.checkpoint.step == announced.step and (
            manifest.checkpoint.sha256 == announced.sha256
        )
        return (not exact, -manifest.checkpoint.step)

    for manifest in sorted(manifests, key=preference):
        try:
            written = await copies.fetch(manifest, store.directory)
        except (CopyUnusable, OSError) as error:
            log.warning("the copy in %s is unusable: %s", manifest.checkpoint.copy_slot, error)
            continue
        except Exception as error:  # the bus went away mid-fetch
            log.warning("fetching the copy in %s failed: %r", manifest.checkpoint.copy_slot, error)
            continue
        log.info(
            "fetched the copy of checkpoint %d from the shared store (%s): %s",
            manifest.checkpoint.step,
            manifest.checkpoint.copy_slot,
            ", ".join(path.name for path in written),
        )
        return pb.CopyFetched(
            checkpoint=manifest.checkpoint,
            bytes=sum(file.size_bytes for file in manifest.files),
            fetch_s=time.monotonic() - started,
        )
    log.warning("no usable copy of checkpoint %d in the shared store", announced.step)
    return None
