"""OpenMM checkpoint files: written atomically, verified by sha256, the previous one kept.

A checkpoint of step S is the portable State XML, OpenMM's native checkpoint of the same step
and a sidecar, in ``checkpoints/ckpt-<S:012d>.xml|.chk|.json``; loading falls back to the newest
good checkpoint in the folder. Design: docs/engines.md, "Checkpoint files" and "OpenMM".
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypeVar

from mdq.contracts import pb
from services.runner.durable import fsync_dir
from services.runner.trajectory import TrajectoryMark

if TYPE_CHECKING:  # OpenMM is imported where a State XML is read, not by every engine
    import openmm

log = logging.getLogger(__name__)

_CHECKPOINT_NAME = re.compile(r"^ckpt-(\d{12})\.xml$")
TEMP_PREFIX = ".tmp-"
"""Names of the files being written, never a checkpoint's."""
NATIVE_SUFFIX = ".chk"
HASH_CHUNK_BYTES = 1 << 20


def checkpoint_name(step: int) -> str:
    """File name of the checkpoint of ``step``."""
    return f"ckpt-{step:012d}.xml"


def step_of(path: Path) -> int | None:
    """The step in a checkpoint file name, or None if it is not a checkpoint's name."""
    match = _CHECKPOINT_NAME.match(path.name)
    return int(match.group(1)) if match else None


def sha256_of(path: Path) -> str:
    """sha256 of a file's bytes, hex."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(HASH_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def write_atomically(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that a crash leaves the old content or the new, whole."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f"{TEMP_PREFIX}{path.name}.{os.getpid()}")
    try:
        descriptor = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            view = memoryview(data)
            while view:
                written = os.write(descriptor, view)
                view = view[written:]
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):  # a full disk must not keep the torn copy too
            temp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


@dataclass(frozen=True, slots=True)
class CheckpointFile:
    """A checkpoint on disk, as announced in a checkpoint event."""

    step: int
    path: Path
    sha256: str
    size_bytes: int
    time_ps: float
    native_path: Path | None = None
    native_sha256: str = ""
    platform: str = ""

    @classmethod
    def on_disk(
        cls,
        path: Path,
        *,
        step: int,
        time_ps: float,
        native_path: Path | None = None,
        platform: str = "",
    ) -> CheckpointFile:
        """The checkpoint of ``step`` just written to ``path`` (and its native checkpoint to
        ``native_path``, for ``platform``): sha256 and size are read back from the files."""
        return cls(
            step=step,
            path=path,
            sha256=sha256_of(path),
            size_bytes=path.stat().st_size,
            time_ps=time_ps,
            native_path=native_path,
            native_sha256=sha256_of(native_path) if native_path is not None else "",
            platform=platform,
        )

    def to_pb(self) -> pb.Checkpoint:
        return pb.Checkpoint(
            step=self.step,
            path=str(self.path),
            sha256=self.sha256,
            size_bytes=self.size_bytes,
            time_ps=self.time_ps,
            native_path=str(self.native_path) if self.native_path else "",
            native_sha256=self.native_sha256,
            platform=self.platform,
        )


@dataclass(frozen=True, slots=True)
class LoadedCheckpoint:
    """A verified checkpoint: its parsed state, and the native checkpoint when it is usable
    on this platform."""

    file: CheckpointFile
    state: openmm.State
    native: bytes | None = None
    trajectory: TrajectoryMark | None = None


def write_sidecar(checkpoint: CheckpointFile, **engine_keys: object) -> None:
    """Write the sidecar of ``checkpoint`` (its file's name with ``.json``), the last file of
    a checkpoint: its step, sha256, size and time, then ``engine_keys`` (what its engine keeps
    beside them)."""
    sidecar = {
        "step": checkpoint.step,
        "sha256": checkpoint.sha256,
        "size_bytes": checkpoint.size_bytes,
        "time_ps": checkpoint.time_ps,
        **engine_keys,
    }
    write_atomically(checkpoint.path.with_suffix(".json"), json.dumps(sidecar).encode())


def read_sidecar(path: Path) -> dict[str, object]:
    """The sidecar of the checkpoint file ``path`` as a JSON object; empty when it is missing or
    is not one."""
    sidecar = path.with_suffix(".json")
    try:
        document = json.loads(sidecar.read_text())
    except (OSError, ValueError):
        return {}
    return document if isinstance(document, dict) else {}


Loaded = TypeVar("Loaded")


def newest_verified(
    steps: Sequence[int],
    verify: Callable[[int], Loaded],
    *,
    after: int = -1,
    before: int | None = None,
) -> Loaded | None:
    """What ``verify`` makes of the newest of ``steps`` after ``after`` and (when given) before
    ``before`` that it accepts (it raises OSError or ValueError for an unusable one, which is
    logged and passed over); None if it accepts none."""
    for step in sorted(steps, reverse=True):
        if step <= after or (before is not None and step >= before):
            continue
        try:
            return verify(step)
        except (OSError, ValueError) as error:
            log.warning("the checkpoint of step %d is unusable: %s", step, error)
    return None


class Resumable(Protocol):
    """A verified checkpoint an engine resumes from."""

    @property
    def file(self) -> CheckpointFile: ...


Verified = TypeVar("Verified", bound=Resumable)


def resume_point(
    announced: pb.Checkpoint,
    *,
    kind: str,
    directory: Path,
    path: Path,
    verify_announced: Callable[[Path], Verified],
    newest_good: Callable[[int, int | None], Verified | None],
) -> Verified | None:
    """The checkpoint to resume from: the newest good one in ``directory`` later than
    ``announced`` (``newest_good(after, before)``), else ``announced``, read from ``path``, if
    ``verify_announced`` accepts it, else the newest good one before it, else None. ``kind``
    names the files in the log ("checkpoint", "restart").

    Every verified checkpoint in the folder is a state of this job's own run, so the newest
    loses least. A later one than announced is an earlier attempt's that could not say so:
    written while NATS was away, or by a runner declared lost while it still ran (a node that
    only looked lost), whose pruning may even have deleted the announced one; starting over
    from step 0 with good checkpoints on disk would lose them all."""
    later = newest_good(announced.step, None)
    if later is not None:
        log.info(
            "%s %s (step %d) is later than the announced step %d: resuming from it",
            kind,
            later.file.path,
            later.file.step,
            announced.step,
        )
        return later
    try:
        return verify_announced(path)
    except (OSError, ValueError) as error:
        log.warning(
            "%s %s (step %d) is unusable: %s; looking for another one",
            kind,
            path,
            announced.step,
            error,
        )
    earlier = newest_good(-1, announced.step)
    if earlier is not None:
        log.warning("falling back to %s %s (step %d)", kind, earlier.file.path, earlier.file.step)
        return earlier
    log.warning("no usable %s in %s", kind, directory)
    return None


class StepFolder:
    """The checkpoint folder of one job, each checkpoint named after its step
    (``name_of(step)``, ``step_of(path)``) and its other files (``companions``: sidecar,
    native checkpoint) named alike with another suffix: what the OpenMM and the LAMMPS stores
    share."""

    def __init__(
        self,
        *,
        directory: Path,
        name_of: Callable[[int], str],
        step_of: Callable[[Path], int | None],
        companions: tuple[str, ...],
    ) -> None:
        self._directory = directory
        self._name_of = name_of
        self._step_of = step_of
        self._companions = companions

    @property
    def directory(self) -> Path:
        return self._directory

    def path_of(self, step: int) -> Path:
        """Where the checkpoint of ``step`` is (or would be)."""
        return self._directory / self._name_of(step)

    def remove_temporaries(self) -> None:
        """Delete temporary files a killed writer left behind (never a real checkpoint)."""
        if not self._directory.is_dir():
            return
        for path in self._directory.glob(f"{TEMP_PREFIX}*"):
            path.unlink(missing_ok=True)

    def steps(self) -> list[int]:
        """Steps of the checkpoint files present, ascending."""
        if not self._directory.is_dir():
            return []
        found = (self._step_of(path) for path in self._directory.iterdir())
        return sorted(step for step in found if step is not None)

    def holds(self, checkpoint: pb.Checkpoint) -> bool:
        """Whether this folder holds ``checkpoint``'s file, its sha256 matching."""
        path = self.path_of(checkpoint.step)
        try:
            return path.is_file() and sha256_of(path) == checkpoint.sha256
        except OSError:
            return False

    def _prune(self, *, keep_step: int) -> None:
        """Keep ``keep_step`` and the newest checkpoint before it; delete older ones with their
        companions. Later ones (left by an attempt that got further) are kept: they are
        overwritten in time."""
        older = [step for step in self.steps() if step < keep_step]
        for step in older[:-1]:
            path = self.path_of(step)
            path.unlink(missing_ok=True)
            for suffix in self._companions:
                path.with_suffix(suffix).unlink(missing_ok=True)


class CheckpointStore(StepFolder):
    """The checkpoint folder of one job."""

    def __init__(self, *, directory: Path) -> None:
        super().__init__(
            directory=directory,
            name_of=checkpoint_name,
            step_of=step_of,
            companions=(NATIVE_SUFFIX, ".json"),
        )

    def write(
        self,
        *,
        state_xml: str,
        step: int,
        time_ps: float,
        native: bytes | None = None,
        platform: str = "",
        trajectory: TrajectoryMark | None = None,
    ) -> CheckpointFile:
        """Write the checkpoint of ``step`` (XML, native, sidecar); prune older ones. When a
        write fails, the files of ``step`` are removed (the sidecar, written last, is then
        never there: nothing half-written is taken for a checkpoint) and the error raised."""
        path = self.path_of(step)
        try:
            checkpoint = self._write_set(
                path,
                state_xml=state_xml,
                step=step,
                time_ps=time_ps,
                native=native,
                platform=platform,
                trajectory=trajectory,
            )
        except BaseException:
            for suffix in (".json", NATIVE_SUFFIX, ".xml"):
                with contextlib.suppress(OSError):
                    path.with_suffix(suffix).unlink(missing_ok=True)
            raise
        self._prune(keep_step=step)
        return checkpoint

    def _write_set(
        self,
        path: Path,
        *,
        state_xml: str,
        step: int,
        time_ps: float,
        native: bytes | None,
        platform: str,
        trajectory: TrajectoryMark | None,
    ) -> CheckpointFile:
        """The files of one checkpoint, the sidecar last."""
        write_atomically(path, state_xml.encode())
        native_path: Path | None = None
        if native is not None:
            native_path = path.with_suffix(NATIVE_SUFFIX)
            write_atomically(native_path, native)
        checkpoint = CheckpointFile.on_disk(
            path,
            step=step,
            time_ps=time_ps,
            native_path=native_path,
            platform=platform if native is not None else "",
        )
        write_sidecar(
            checkpoint,
            native_sha256=checkpoint.native_sha256,
            platform=checkpoint.platform,
            trajectory=trajectory.to_json() if trajectory else None,
        )
        return checkpoint

    def _confined(self, announced: Path) -> Path:
        """The announced checkpoint if it is a file of this job's checkpoint folder (after
        following symlinks), else the file of the same name in that folder: a checkpoint path
        from the bus never makes the runner read another job's files."""
        directory = self._directory.resolve()
        if announced.is_file() and announced.resolve().parent == directory:
            return announced
        return self._directory / announced.name

    def load(self, announced: pb.Checkpoint, *, platform: str = "") -> LoadedCheckpoint | None:
        """The checkpoint to resume from (``resume_point``), the announced one read from this
        folder (``_confined``). Its native checkpoint comes along when it was written on
        ``platform`` and verifies."""
        return resume_point(
            announced,
            kind="checkpoint",
            directory=self._directory,
            path=self._confined(Path(announced.path)),
            verify_announced=lambda path: self._verify(
                path, step=announced.step, sha256=announced.sha256, platform=platform
            ),
            newest_good=lambda after, before: self._newest_good(
                after=after, before=before, platform=platform
            ),
        )

    def _newest_good(
        self, *, after: int = -1, before: int | None = None, platform: str
    ) -> LoadedCheckpoint | None:
        def verify(step: int) -> LoadedCheckpoint:
            return self._verify(self.path_of(step), step=step, sha256=None, platform=platform)

        return newest_verified(self.steps(), verify, after=after, before=before)

    def _verify(
        self, path: Path, *, step: int, sha256: str | None, platform: str
    ) -> LoadedCheckpoint:
        """Read and check one checkpoint against ``sha256`` (or, when None, its sidecar's: a
        checkpoint found in the folder without its sidecar was never finished)."""
        data = path.read_bytes()
        actual = hashlib.sha256(data).hexdigest()
        sidecar = read_sidecar(path)
        if sha256 is None:
            sha256 = str(sidecar.get("sha256") or "")
            if not sha256:
                raise ValueError("it has no sidecar: its write never finished")
        if sha256 and actual != sha256:
            raise ValueError(f"sha256 is {actual}, expected {sha256}")
        import openmm.unit as unit

        from services.runner.system import parse_state

        state = parse_state(data.decode(errors="replace"))
        recorded_step = int(state.getStepCount())
        if recorded_step != step:
            raise ValueError(f"the state is of step {recorded_step}, expected {step}")
        native, native_path, native_sha256 = self._native(path, sidecar, platform=platform)
        checkpoint = CheckpointFile(
            step=step,
            path=path,
            sha256=actual,
            size_bytes=len(data),
            time_ps=float(state.getTime().value_in_unit(unit.picosecond)),
            native_path=native_path,
            native_sha256=native_sha256,
            platform=platform if native is not None else "",
        )
        return LoadedCheckpoint(
            file=checkpoint,
            state=state,
            native=native,
            trajectory=TrajectoryMark.from_json(sidecar.get("trajectory")),
        )

    def _native(
        self, path: Path, sidecar: dict[str, object], *, platform: str
    ) -> tuple[bytes | None, Path | None, str]:
        """The native checkpoint next to ``path`` if it was written on ``platform`` and its
        sha256 matches the sidecar's; else (None, None, "")."""
        native_path = path.with_suffix(NATIVE_SUFFIX)
        expected = str(sidecar.get("native_sha256") or "")
        written_on = str(sidecar.get("platform") or "")
        if not expected or not native_path.is_file():
            return None, None, ""
        if written_on != platform:
            log.info(
                "native checkpoint %s was written on %s, this is %s: using the State XML",
                native_path,
                written_on,
                platform,
            )
            return None, None, ""
        data = native_path.read_bytes()
        actual = hashlib.sha256(data).hexdigest()
        if actual != expected:
            log.warning(
                "native checkpoint %s is corrupt (sha256 %s, expected %s): using the State XML",
                native_path,
                actual,
                expected,
            )
            return None, None, ""
        return data, native_path, actual
