"""The job's trajectory: a DCD or XTC file in its output folder, one frame every N steps.

Frames are written at the steps that are multiples of ``trajectory_interval_steps``, so the
file of a job is one trajectory even across attempts: every checkpoint records the file's
length and frame count at its step (:class:`TrajectoryMark`, in the checkpoint's sidecar), and
an attempt that resumes from that checkpoint first cuts the file back to that length (frames
the failed attempt wrote after the checkpoint are redone), repairs the DCD header's frame
count, and appends from there. ``mark`` flushes and fsyncs the file before a checkpoint is
written, so the recorded length is on disk.
"""

from __future__ import annotations

import logging
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from mdq.contracts import pb
from services.runner.durable import fsync_file

if TYPE_CHECKING:  # OpenMM is imported where a trajectory is written, not by every engine
    import openmm.app as app
    import openmm.unit as unit

log = logging.getLogger(__name__)

FORMATS: dict[int, str] = {pb.TRAJECTORY_DCD: "dcd", pb.TRAJECTORY_XTC: "xtc"}
DCD_FRAME_COUNT_OFFSET = 8
DCD_LAST_STEP_OFFSET = 20


@dataclass(frozen=True, slots=True)
class TrajectoryMark:
    """How far the trajectory file was at a checkpoint."""

    size_bytes: int
    frames: int

    def to_json(self) -> dict[str, int]:
        return {"size_bytes": self.size_bytes, "frames": self.frames}

    @classmethod
    def from_json(cls, document: object) -> TrajectoryMark | None:
        if not isinstance(document, dict):
            return None
        try:
            return cls(size_bytes=int(document["size_bytes"]), frames=int(document["frames"]))
        except (KeyError, TypeError, ValueError):
            return None


def file_name(trajectory_format: int) -> str:
    return f"trajectory.{FORMATS.get(trajectory_format, 'dcd')}"


class Trajectory:
    """The trajectory file of one attempt, opened fresh or continued from a mark."""

    def __init__(
        self,
        *,
        path: Path,
        trajectory_format: int,
        topology: app.Topology,
        timestep_ps: float,
        interval: int,
        resume: TrajectoryMark | None,
        resumed_step: int | None = None,
    ) -> None:
        """Open the trajectory: continued from ``resume`` (the mark of the checkpoint this
        attempt resumed from), or a new file whose first frame is the one after
        ``resumed_step`` (a resume without a usable mark) or at step ``interval``."""
        self.path = path
        self.format = FORMATS.get(trajectory_format, "dcd")
        self.interval = interval
        self.frames = 0
        self._handle: BinaryIO | None = None
        path.parent.mkdir(parents=True, exist_ok=True)
        append = self._prepare(resume)
        first_step = interval
        if not append and resumed_step:
            first_step = (resumed_step // interval + 1) * interval
        import openmm.app as app
        import openmm.unit as unit

        dt = timestep_ps * unit.picosecond
        if self.format == "dcd":
            self._handle = path.open("r+b" if append else "w+b")
            self._writer: app.DCDFile | app.XTCFile = app.DCDFile(
                self._handle, topology, dt, firstStep=first_step, interval=interval, append=append
            )
        else:
            self._writer = app.XTCFile(
                str(path), topology, dt, firstStep=first_step, interval=interval, append=append
            )

    def _prepare(self, resume: TrajectoryMark | None) -> bool:
        """Cut the file back to ``resume``; return whether to append to it."""
        if resume is None or resume.frames == 0:
            self.path.unlink(missing_ok=True)
            return False
        size = self.path.stat().st_size if self.path.is_file() else -1
        if size < resume.size_bytes:
            log.warning(
                "trajectory %s is shorter (%d bytes) than at the checkpoint (%d bytes): "
                "starting a new file",
                self.path,
                size,
                resume.size_bytes,
            )
            self.path.unlink(missing_ok=True)
            return False
        with self.path.open("r+b") as handle:
            handle.truncate(resume.size_bytes)
            if self.format == "dcd":
                handle.seek(DCD_FRAME_COUNT_OFFSET)
                handle.write(struct.pack("<i", resume.frames))
                handle.seek(DCD_LAST_STEP_OFFSET)
                handle.write(struct.pack("<i", resume.frames * self.interval))
            handle.flush()
            os.fsync(handle.fileno())
        self.frames = resume.frames
        log.info("continuing trajectory %s after frame %d", self.path, resume.frames)
        return True

    def write(self, positions: unit.Quantity, box: unit.Quantity) -> None:
        """Append one frame."""
        self._writer.writeModel(positions, periodicBoxVectors=box)
        self.frames += 1

    def mark(self) -> TrajectoryMark:
        """Flush the file to disk; its length and frame count now."""
        if self._handle is not None:
            self._handle.flush()
            os.fsync(self._handle.fileno())
        elif self.path.is_file():
            fsync_file(self.path)
        size = self.path.stat().st_size if self.path.is_file() else 0
        return TrajectoryMark(size_bytes=size, frames=self.frames)

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None
