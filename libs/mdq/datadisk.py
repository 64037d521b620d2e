"""The data folder's health: what a full, read-only, failing or unmounted data disk looks like.

A failing data volume is the node's fault, never the job's: ``disk_error`` and
``exit_code_for`` turn the ``OSError`` behind a failure into the runner's exit code, ``claim``
marks the folder as mdq's volume so an unmounted one is told apart, and ``probe`` is the node
agent's health check. Design: docs/placement.md, "Cordons"; docs/backends.md.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from mdq.core.exit_codes import RunnerExit

VOLUME_MARKER = ".mdq-volume"
"""The file that marks a data folder as mdq's volume (``claim``)."""
PROBE_PREFIX = ".mdq-probe-"

DISK_ERRNOS: dict[int, tuple[str, RunnerExit]] = {
    errno.ENOSPC: ("data disk full", RunnerExit.NO_SPACE),
    errno.EDQUOT: ("data disk quota exceeded", RunnerExit.NO_SPACE),
    errno.EROFS: ("data disk read-only", RunnerExit.DISK_FAILED),
    errno.EIO: ("data disk I/O error", RunnerExit.DISK_FAILED),
}
"""The errors of a failing data disk: what to call each, and the runner's exit code for it."""


class VolumeMissing(OSError):
    """The data folder lost its volume (``claim``'s marker is gone): not mounted."""

    def __init__(self, folder: Path) -> None:
        super().__init__(
            errno.ENODEV, f"the data volume is not mounted on {folder} (no {VOLUME_MARKER})"
        )


class NotAnswering(OSError):
    """The data folder did not answer in time (a hung volume): what took too long, how long."""

    def __init__(self, folder: Path, what: str, seconds: float) -> None:
        super().__init__(errno.ETIMEDOUT, f"{what} in {folder} did not finish within {seconds:g} s")


def disk_error(error: BaseException | None) -> OSError | None:
    """The ``OSError`` of a failing data disk behind ``error`` (itself, or one it was raised
    from), or None."""
    seen = 0
    while error is not None and seen < 16:  # a cause chain is short; a cycle is not followed
        if isinstance(error, (VolumeMissing, NotAnswering)) or (
            isinstance(error, OSError) and error.errno in DISK_ERRNOS
        ):
            return error
        error = error.__cause__ or error.__context__
        seen += 1
    return None


def exit_code_for(error: BaseException) -> RunnerExit | None:
    """The runner's exit code for a data disk failure behind ``error``, or None."""
    found = disk_error(error)
    if found is None:
        return None
    if isinstance(found, (VolumeMissing, NotAnswering)):
        return RunnerExit.DISK_FAILED
    return DISK_ERRNOS[found.errno or 0][1]


def describe(error: OSError) -> str:
    """Words for a data disk failure: "data disk full (ENOSPC): No space left on device: ..."."""
    if isinstance(error, VolumeMissing):
        return f"data volume missing: {error.strerror}"
    if isinstance(error, NotAnswering):
        return f"data disk not answering: {error.strerror}"
    what = DISK_ERRNOS.get(error.errno or 0, ("data disk failed", RunnerExit.DISK_FAILED))[0]
    name = errno.errorcode.get(error.errno or 0, str(error.errno))
    where = f": {error.filename}" if error.filename else ""
    return f"{what} ({name}): {error.strerror}{where}"


def claim(folder: Path) -> bool:
    """Make ``folder`` (created if missing) mdq's data volume, writing its marker unless it is
    there; True if it was written now."""
    folder.mkdir(parents=True, exist_ok=True)
    marker = folder / VOLUME_MARKER
    if marker.exists():
        return False
    descriptor = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.write(descriptor, b"mdq data volume: its absence means the volume is not mounted\n")
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
    return True


def check_mounted(folder: Path) -> None:
    """Raise ``VolumeMissing`` when ``folder`` lacks the marker ``claim`` wrote."""
    if not (folder / VOLUME_MARKER).exists():
        raise VolumeMissing(folder)


def probe(folder: Path, *, min_free_bytes: int = 0) -> str:
    """The problem of the data folder in words ("" when healthy): the volume's marker is
    missing, fewer than ``min_free_bytes`` are free, or a small file cannot be written,
    fsynced and removed (full, read-only, I/O errors)."""
    try:
        check_mounted(folder)
        usage = os.statvfs(folder)
        free = usage.f_bavail * usage.f_frsize
        if free < min_free_bytes:
            return (
                f"data disk full: {free // 2**20} MiB free in {folder}, under the "
                f"{min_free_bytes // 2**20} MiB a node needs to take pods"
            )
        path = folder / f"{PROBE_PREFIX}{os.getpid()}"
        try:
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.write(descriptor, b"\0" * 4096)
                os.fsync(descriptor)
            finally:
                os.close(descriptor)
        finally:
            path.unlink(missing_ok=True)
    except OSError as error:
        return describe(error) if disk_error(error) else f"data folder unusable: {error}"
    return ""


__all__ = [
    "DISK_ERRNOS",
    "VOLUME_MARKER",
    "NotAnswering",
    "VolumeMissing",
    "check_mounted",
    "claim",
    "describe",
    "disk_error",
    "exit_code_for",
    "probe",
]
