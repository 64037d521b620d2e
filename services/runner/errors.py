"""Failures the runner knows how to name: each carries the exit code it ends the process with."""

from __future__ import annotations

from mdq.core.exit_codes import RunnerExit


class RunnerError(Exception):
    """A failure with a known cause; the process exits with ``exit_code``."""

    exit_code: RunnerExit = RunnerExit.CRASHED


class InvalidInputError(RunnerError):
    """The job's input cannot be used (missing dependency output, mismatched structure)."""

    exit_code = RunnerExit.INVALID_INPUT


class UnstableError(RunnerError):
    """The simulation blew up (NaN or exploding energy); retrying will not help."""

    exit_code = RunnerExit.UNSTABLE


class RestartUnreadable(RunnerError):
    """LAMMPS could not read the restart a resume chose (it was set aside): the next attempt
    resumes from the one before it."""

    exit_code = RunnerExit.CRASHED
