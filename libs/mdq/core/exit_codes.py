"""Exit codes of the runner, shared by the runner (which exits with them) and recovery
(which classifies failures by them)."""

from __future__ import annotations

from enum import IntEnum


class RunnerExit(IntEnum):
    """How a runner process ends."""

    OK = 0
    """Step target reached, converged, minimised or analysed."""
    CRASHED = 1
    """An unexpected error (a bug, a lost connection): worth a retry."""
    INVALID_INPUT = 3
    """The job's input cannot be used (missing dependency output, bad structure)."""
    UNSTABLE = 4
    """NaN or exploding energy: retrying the same physics will not help."""
    PREEMPTED = 5
    """SIGTERM: a checkpoint was written and the runner stopped on request."""
    OUT_OF_MEMORY = 6
    """The runner hit its memory limit (MemoryError under RLIMIT_AS)."""
    NO_SPACE = 7
    """The data disk was full (ENOSPC) or its quota exceeded (EDQUOT): the environment
    failed, not the job."""
    DISK_FAILED = 8
    """The data disk refused a write or a read (EROFS: mounted read-only; EIO: an I/O error),
    or the data volume is not mounted: the environment failed, not the job."""
    LIMIT_EXCEEDED = 9
    """The job's folder outgrew its ``max_disk_mb``: a checkpoint was written and the runner
    stopped; the job fails for good (FAILURE_LIMIT_EXCEEDED)."""


def describe(code: int) -> str:
    """What an exit code of the runner says, for people ("exited with 7: ..."); "" for a code
    the runner does not use."""
    try:
        member = RunnerExit(code)
    except ValueError:
        return ""
    return _DESCRIPTIONS.get(member, "")


_DESCRIPTIONS = {
    RunnerExit.INVALID_INPUT: "invalid input",
    RunnerExit.UNSTABLE: "the simulation blew up",
    RunnerExit.PREEMPTED: "stopped on request after a checkpoint",
    RunnerExit.OUT_OF_MEMORY: "out of memory",
    RunnerExit.NO_SPACE: "the data disk was full (ENOSPC/EDQUOT)",
    RunnerExit.DISK_FAILED: "the data disk failed (read-only, I/O error or not mounted)",
    RunnerExit.LIMIT_EXCEEDED: "the job's folder outgrew its max_disk_mb",
}
