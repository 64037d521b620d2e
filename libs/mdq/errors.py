"""The root of the exceptions mdq raises on purpose, a small tree under it, and their exit codes.

A caller catches one kind wherever it comes from (the core, the SDK, the bus, a service):
``InvalidInput`` says what was wrong with what it was given (``field``: the path of the
culprit), ``Unavailable`` that something it needs does not answer, and so on. The ``mdq``
command turns every one into a message and its exit code in one place (``mdq.cli.errors``).
"""

from __future__ import annotations

from typing import ClassVar

EXIT_OK = 0
"""Everything asked for was done (and every job waited for succeeded)."""
EXIT_FAILED = 1
"""A job waited for did not succeed, or an ``MdqError`` of no narrower kind."""


class MdqError(Exception):
    """The root of mdq's errors. ``message`` is what went wrong without the field, when the
    error keeps them apart ("" when ``str()`` says it all)."""

    exit_code: ClassVar[int] = EXIT_FAILED
    field: str = ""
    """The path of the culprit in what was given (``jobs[0].resources.cpu``); "" for none."""
    message: str = ""

    def __init__(self, message: str = "", *, field: str = "") -> None:
        super().__init__(f"{field}: {message}" if field else message)
        self.field = field
        self.message = message


class InvalidInput(MdqError, ValueError):
    """What was given cannot be accepted: a spec, a request, a file, a name. Nothing changed."""

    exit_code: ClassVar[int] = 2
    source: str = ""
    """Where the input came from (a job file's name), "" when it goes without saying."""


class Unavailable(MdqError):
    """Something needed does not answer (NATS, PostgreSQL, intake, placement, the stack); the
    same request may succeed later."""

    exit_code: ClassVar[int] = 3


class PermissionDenied(MdqError, PermissionError):
    """The identity asking may not do or read this."""

    exit_code: ClassVar[int] = 4


class NotFound(MdqError, LookupError):
    """What was named does not exist (a cluster, a bucket, a job)."""

    exit_code: ClassVar[int] = 5


class Conflict(MdqError):
    """What was asked contradicts what exists (a pod already made, a trust that differs)."""

    exit_code: ClassVar[int] = 6
