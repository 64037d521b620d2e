"""When a job has lived too long for the jobs log to remember it (pure).

The jobs log keeps events for ``MDQ_STORAGE_JOBS_DAYS`` (365 by default, at least 30), and an
age limit removes messages whatever the discard policy: a job still alive after that long would
lose its ``submitted`` event, and a replay of the log (a service without a usable snapshot,
``mdq replay --rebuild``) would no longer know it. So a job that has lived that long less a day
(``EXPIRY_MARGIN``: the services look at least hourly) is ended with ``FAILURE_EXPIRED`` while
its whole history is still in the log: by the watcher when an attempt is bound or running (the
pod is deleted), by placement when it never ran, and recovery does not retry it. A real MD job
runs for hours or days; one alive for a year is a runaway or forgotten.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from mdq.core.state import JobState, JobView

EXPIRY_MARGIN = timedelta(days=1)
"""How long before its events would age out a job is ended."""
CHECK_EVERY = timedelta(minutes=1)
"""How often the services look for expired jobs: the margin is a day, so a look per minute is
plenty, and it stays off their per-pass and per-second paths."""


def max_job_age(jobs_log_days: float) -> timedelta:
    """The age at which a job is ended, for a jobs log that keeps ``jobs_log_days``."""
    return timedelta(days=jobs_log_days) - EXPIRY_MARGIN


def expired(view: JobView, now: datetime, max_age: timedelta) -> bool:
    """Whether ``view`` is a job still alive at ``now`` that was submitted over ``max_age``
    ago."""
    return not view.state.terminal and now - view.submitted_at > max_age


def expiry_message(view: JobView, now: datetime, jobs_log_days: float) -> str:
    """What the job's failure says, for people."""
    lived = (now - view.submitted_at).total_seconds() / 86400
    return (
        f"alive for {lived:.1f} days: the jobs log keeps {jobs_log_days:g} days "
        "(MDQ_STORAGE_JOBS_DAYS), so it is ended before its history ages out"
    )


ENDED_BY_THE_WATCHER = frozenset({JobState.BOUND, JobState.RUNNING})
"""An attempt with a pod: ``attempt_failed`` and the pod deleted."""
ENDED_BY_PLACEMENT = frozenset({JobState.WAITING, JobState.PENDING, JobState.HELD})
"""No attempt under way: ``failed``. (RECOVERING is recovery's to decide first; it becomes
one of the others.)"""
