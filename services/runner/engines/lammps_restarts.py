"""The LAMMPS engine's checkpoints: restart files, written atomically and verified.

A checkpoint of step S is LAMMPS's binary restart file ``checkpoints/ckpt-<S:012d>.restart``
and its ``.json`` sidecar, written last: a restart without its sidecar was never finished and is
never resumed from. The file read back from disk must have a LAMMPS restart's header holding the
step of its name, and its sha256 is what is announced. Design: docs/engines.md, "Checkpoint
files" and "LAMMPS".
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from mdq.contracts import pb
from services.runner.checkpoints import (
    TEMP_PREFIX,
    CheckpointFile,
    StepFolder,
    newest_verified,
    read_sidecar,
    resume_point,
    sha256_of,
    write_sidecar,
)
from services.runner.durable import fsync_dir, fsync_file

log = logging.getLogger(__name__)

MAGIC = b"LammpS RestartT\x00"
ENDIAN = 1
HEADER_VERSION, HEADER_UNITS, HEADER_NTIMESTEP = 0, 4, 5
"""The header records of a restart file that hold a string (version, units) and the step."""
HEADER_RECORDS = 64
"""The step comes within the first few records; a file without it in these is not a restart."""
_NAME = re.compile(r"^ckpt-(\d{12})\.restart$")
SUFFIX = ".restart"
UNREADABLE_SUFFIX = ".unreadable"
"""Added to the name of a restart LAMMPS could not read, so no resume takes it again."""


class RestartUnusable(ValueError):
    """A restart file that is not whole, not a restart, or not of the step it should be."""


@dataclass(frozen=True, slots=True)
class RestartHeader:
    """What a restart file's header says."""

    version: str
    units: str
    step: int


def read_header(path: Path) -> RestartHeader:
    """The header of a LAMMPS restart file; RestartUnusable if it is not one."""
    with path.open("rb") as handle:
        data = handle.read(4096)
    if not data.startswith(MAGIC):
        raise RestartUnusable(f"{path.name} is not a LAMMPS restart file")
    offset = len(MAGIC)
    try:
        endian, _revision = struct.unpack_from("<ii", data, offset)
        offset += 8
        if endian != ENDIAN:
            raise RestartUnusable(f"{path.name} was written with another byte order")
        version = units = ""
        for _ in range(HEADER_RECORDS):
            (flag,) = struct.unpack_from("<i", data, offset)
            offset += 4
            if flag in (HEADER_VERSION, HEADER_UNITS):
                (length,) = struct.unpack_from("<i", data, offset)
                offset += 4
                text = data[offset : offset + length].rstrip(b"\x00").decode()
                offset += length
                if flag == HEADER_VERSION:
                    version = text
                else:
                    units = text
            elif flag == HEADER_NTIMESTEP:
                (step,) = struct.unpack_from("<q", data, offset)
                return RestartHeader(version=version, units=units, step=step)
            else:
                offset += 4
    except (struct.error, UnicodeDecodeError) as error:
        raise RestartUnusable(f"{path.name} has a torn header: {error}") from None
    raise RestartUnusable(f"{path.name} has no step in its header")


def checkpoint_name(step: int) -> str:
    return f"ckpt-{step:012d}{SUFFIX}"


def step_of(path: Path) -> int | None:
    match = _NAME.match(path.name)
    return int(match.group(1)) if match else None


@dataclass(frozen=True, slots=True)
class LoadedRestart:
    """A verified restart file to resume from."""

    file: CheckpointFile
    header: RestartHeader


class RestartStore(StepFolder):
    """The checkpoint folder of one LAMMPS job."""

    def __init__(self, *, directory: Path) -> None:
        super().__init__(
            directory=directory, name_of=checkpoint_name, step_of=step_of, companions=(".json",)
        )

    def write(
        self, write_restart: Callable[[Path], None], *, step: int, time_ps: float, units: str
    ) -> CheckpointFile:
        """Have LAMMPS write the restart of ``step`` (``write_restart`` given a temporary
        path), make it durable, rename it into place, verify it and write its sidecar;
        prune older ones. When any of it fails (LAMMPS may leave a short file without a word
        when the disk fills; the sidecar then cannot be written either), the files of ``step``
        are removed and the error raised."""
        self._directory.mkdir(parents=True, exist_ok=True)
        path = self.path_of(step)
        temp = path.with_name(f"{TEMP_PREFIX}{path.name}.{os.getpid()}")
        temp.unlink(missing_ok=True)
        replaced = False
        try:
            write_restart(temp)
            fsync_file(temp)
            os.replace(temp, path)
            replaced = True
            fsync_dir(self._directory)
            header = read_header(path)  # read back from disk: what is announced is what is there
            if header.step != step:
                raise RestartUnusable(f"{path.name} holds step {header.step}, not {step}")
            checkpoint = CheckpointFile.on_disk(path, step=step, time_ps=time_ps)
            write_sidecar(checkpoint, engine="lammps", units=units)
        except BaseException:
            # nothing half-written stays under a checkpoint's name (an earlier attempt's restart
            # of this step stays, unless this one already took its place)
            leftovers = [temp, path.with_suffix(".json"), path] if replaced else [temp]
            for leftover in leftovers:
                with contextlib.suppress(OSError):
                    leftover.unlink(missing_ok=True)
            raise
        self._prune(keep_step=step)
        return checkpoint

    def set_aside(self, path: Path) -> Path:
        """Rename a restart LAMMPS could not read (its sidecar removed), so that the next
        resume falls back to the one before it; returns the new name."""
        aside = path.with_name(path.name + UNREADABLE_SUFFIX)
        os.replace(path, aside)
        path.with_suffix(".json").unlink(missing_ok=True)
        fsync_dir(self._directory)
        return aside

    def load(self, announced: pb.Checkpoint) -> LoadedRestart | None:
        """The restart to resume from (``resume_point``): the announced one verifies by sha256,
        header and step. The announced path is only a name: the file is looked up in this
        folder."""
        return resume_point(
            announced,
            kind="restart",
            directory=self._directory,
            path=self._directory / Path(announced.path).name,
            verify_announced=lambda path: self._verify(
                path, step=announced.step, sha256=announced.sha256
            ),
            newest_good=lambda after, before: self._newest_good(after=after, before=before),
        )

    def _newest_good(self, *, after: int = -1, before: int | None = None) -> LoadedRestart | None:
        def verify(step: int) -> LoadedRestart:
            return self._verify(self.path_of(step), step=step, sha256=None)

        return newest_verified(self.steps(), verify, after=after, before=before)

    def _verify(self, path: Path, *, step: int, sha256: str | None) -> LoadedRestart:
        if path.is_symlink() or step_of(path) != step:
            raise RestartUnusable(f"{path.name} is not the restart of step {step}")
        sidecar = read_sidecar(path)
        expected = sha256 or str(sidecar.get("sha256") or "")
        if not expected:
            raise RestartUnusable(f"{path.name} has no sidecar: its write never finished")
        actual = sha256_of(path)
        if actual != expected:
            raise RestartUnusable(f"sha256 is {actual}, expected {expected}")
        header = read_header(path)
        if header.step != step:
            raise RestartUnusable(f"the restart is of step {header.step}, expected {step}")
        time_ps = sidecar.get("time_ps")
        return LoadedRestart(
            file=CheckpointFile(
                step=step,
                path=path,
                sha256=actual,
                size_bytes=path.stat().st_size,
                time_ps=float(time_ps) if isinstance(time_ps, int | float) else 0.0,
            ),
            header=header,
        )
