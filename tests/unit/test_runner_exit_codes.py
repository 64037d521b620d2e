"""The runner's exit code names the kind of failure recovery must handle (a table of cases)."""

from __future__ import annotations

import errno
from pathlib import Path

from mdq.core.exit_codes import RunnerExit
from mdq.datadisk import VolumeMissing
from services.runner.app import exit_code_for
from services.runner.errors import InvalidInputError
from tests.tables import named_cases


def _written_to_dev_full() -> OSError:
    """The error a real write to a full device raises (Linux's /dev/full: ENOSPC)."""
    try:
        with open("/dev/full", "w") as full:
            full.write("x" * 8192)
    except OSError as error:
        return error
    raise AssertionError("/dev/full accepted a write")


def _raised_from(cause: BaseException) -> RuntimeError:
    try:
        raise RuntimeError("saving the checkpoint failed") from cause
    except RuntimeError as error:
        return error


CASES = [
    ("a plain bug", ValueError("boom"), RunnerExit.CRASHED),
    ("no memory", MemoryError(), RunnerExit.OUT_OF_MEMORY),
    ("bad input", InvalidInputError("no such dependency output"), RunnerExit.INVALID_INPUT),
    ("disk full", _written_to_dev_full(), RunnerExit.NO_SPACE),
    ("disk full, wrapped", _raised_from(_written_to_dev_full()), RunnerExit.NO_SPACE),
    ("quota exceeded", OSError(errno.EDQUOT, "Disk quota exceeded"), RunnerExit.NO_SPACE),
    ("device I/O error", OSError(errno.EIO, "Input/output error"), RunnerExit.DISK_FAILED),
    ("read-only disk", OSError(errno.EROFS, "Read-only file system"), RunnerExit.DISK_FAILED),
    ("volume not mounted", VolumeMissing(Path("/data")), RunnerExit.DISK_FAILED),
    ("another OS error", OSError(errno.EACCES, "Permission denied"), RunnerExit.CRASHED),
    ("a connection refused", ConnectionRefusedError(111, "refused"), RunnerExit.CRASHED),
]


@named_cases(("error", "expected"), CASES)
def test_exit_code_for(error: BaseException, expected: RunnerExit) -> None:
    assert exit_code_for(error) is expected
