"""How long a running job has been silent, on the watcher's own clock.

A runner stamps its reports with its node's clock, which may be minutes off the watcher's (a node
whose time service failed), and the watcher's wall clock may itself be stepped. Silence is
therefore measured from when this watcher first saw each new sign of life (a report, the
attempt's start), on its monotonic clock: a runner whose clock is behind is not lost for it,
and one whose clock is ahead is not kept alive by it (docs/architecture.md, "The job state
machine").
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True, slots=True)
class Sign:
    """A job's latest sign of life as its view holds it: two differ when anything new came."""

    attempt: int
    step: int
    stamped_at: datetime


class SilenceClock:
    """When this watcher first saw each job's current sign of life, in monotonic seconds."""

    def __init__(self) -> None:
        self._seen: dict[str, tuple[Sign, float]] = {}

    def silent_for(self, job_id: str, sign: Sign, now: float) -> float:
        """Seconds since ``sign`` was first seen for ``job_id`` (0 when it is new at ``now``)."""
        seen = self._seen.get(job_id)
        if seen is None or seen[0] != sign:
            self._seen[job_id] = (sign, now)
            return 0.0
        return now - seen[1]

    def forget_all_but(self, running: set[str]) -> None:
        """Drop what is kept of jobs no longer running."""
        for job_id in self._seen.keys() - running:
            del self._seen[job_id]
