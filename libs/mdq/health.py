"""A service's liveness as a file: the service renews the file's modification time every few
seconds while its event loop runs, and a probe (Kubernetes' ``livenessProbe``, or anyone on
the host) reads how old it is: ``python -m mdq.health FILE [MAX_AGE_S]`` exits 0 when the file
was renewed within ``MAX_AGE_S`` seconds and 1 otherwise, saying why.

A service whose loop is stuck (a deadlock, a call that blocks the loop) stops renewing it, and
its supervisor restarts it; one that waits for NATS or PostgreSQL goes on renewing it, since
waiting out an outage is what it is built to do (docs/architecture.md, "One service runtime").
This module imports nothing beyond the standard library, so the probe starts fast.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

HEALTH_FILE_ENV = "MDQ_HEALTH_FILE"
"""Where a service is told its liveness file (``mdq.settings.CommonSettings.health_file``)."""
RENEW_EVERY_S = 5.0
"""How often a running service renews its file."""
DEFAULT_MAX_AGE_S = 30.0
"""The probe's default: a file older than this says the service's loop is stuck."""

log = logging.getLogger("mdq.health")


def renew(path: Path) -> None:
    """Create the file, or set its modification time to now."""
    path.touch(mode=0o640, exist_ok=True)


async def keep_renewing(path: Path, *, every_s: float = RENEW_EVERY_S) -> None:
    """Renew the file now and every ``every_s`` seconds, forever (as a task). A file that
    cannot be written (a folder that is missing or read-only) is logged at each try, and the
    probe then says the service is not alive: the log says why."""
    while True:
        try:
            renew(path)
        except OSError as error:
            log.error("cannot renew the liveness file %s: %s", path, error)
        await asyncio.sleep(every_s)


@contextlib.asynccontextmanager
async def renewed_while(path: Path | None) -> AsyncIterator[None]:
    """Renew ``path`` (``keep_renewing``) for as long as the block runs; nothing when None."""
    task = asyncio.create_task(keep_renewing(path), name="health") if path else None
    try:
        yield
    finally:
        if task is not None:
            task.cancel()


def age_problem(path: Path, max_age_s: float, *, now: float | None = None) -> str:
    """Why the file says the service is not alive ("" when it is)."""
    try:
        modified = path.stat().st_mtime
    except FileNotFoundError:
        return f"{path} does not exist: the service has not started its loop"
    age = (time.time() if now is None else now) - modified
    if age > max_age_s:
        return f"{path} was last renewed {age:.0f} s ago (more than {max_age_s:g} s)"
    return ""


def main(argv: Sequence[str] | None = None) -> int:
    """The probe: exit status 0 when alive, 1 (with the reason on stderr) when not, 2 on a
    wrong command line."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not 1 <= len(args) <= 2:
        print("usage: python -m mdq.health FILE [MAX_AGE_S]", file=sys.stderr)
        return 2
    try:
        max_age_s = float(args[1]) if len(args) == 2 else DEFAULT_MAX_AGE_S
    except ValueError:
        print(f"MAX_AGE_S must be a number of seconds, not {args[1]!r}", file=sys.stderr)
        return 2
    problem = age_problem(Path(args[0]), max_age_s)
    if problem:
        print(problem, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
