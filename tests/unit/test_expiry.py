"""When a job has lived too long for the jobs log (``mdq.core.expiry``): table of named cases."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from mdq.contracts import pb
from mdq.core.events import make_event
from mdq.core.expiry import (
    ENDED_BY_PLACEMENT,
    ENDED_BY_THE_WATCHER,
    expired,
    expiry_message,
    max_job_age,
)
from mdq.core.state import JobBook, JobState, JobView

NOW = datetime(2027, 6, 1, tzinfo=UTC)
MAX_AGE = max_job_age(365)


def job(state: JobState, age: timedelta) -> JobView:
    submitted = make_event(
        "submitted",
        pb.JobSubmitted(spec=pb.JobSpec(name="a"), request_id="r"),
        job_id="r-a",
        attempt=0,
        producer="test",
        at=NOW - age,
    )
    view = JobBook().apply(1, submitted)
    assert view is not None
    return replace(view, state=state)


@pytest.mark.parametrize(
    ("name", "state", "age", "ended"),
    [
        ("running for 363 days", JobState.RUNNING, timedelta(days=363), False),
        (
            "running for 364 days and a minute",
            JobState.RUNNING,
            timedelta(days=364, minutes=1),
            True,
        ),
        ("waiting on a dependency for 364.5 days", JobState.WAITING, timedelta(days=364.5), True),
        ("pending for a day", JobState.PENDING, timedelta(days=1), False),
        ("succeeded, submitted two years ago", JobState.SUCCEEDED, timedelta(days=730), False),
        ("failed, submitted two years ago", JobState.FAILED, timedelta(days=730), False),
    ],
)
def test_which_jobs_are_ended(name: str, state: JobState, age: timedelta, ended: bool) -> None:
    assert expired(job(state, age), NOW, MAX_AGE) is ended, name


def test_a_day_before_the_log_forgets() -> None:
    assert max_job_age(30) == timedelta(days=29)
    assert max_job_age(365) == timedelta(days=364)


def test_every_live_state_has_someone_to_end_it_but_recovering() -> None:
    """Recovery decides a RECOVERING job first (it becomes PENDING, or FAILED)."""
    live = {state for state in JobState if not state.terminal}
    assert live - {JobState.RECOVERING} == ENDED_BY_THE_WATCHER | ENDED_BY_PLACEMENT
    assert not ENDED_BY_THE_WATCHER & ENDED_BY_PLACEMENT


def test_the_message_says_why() -> None:
    message = expiry_message(job(JobState.RUNNING, timedelta(days=364.5)), NOW, 365)
    assert message.startswith("alive for 364.5 days: the jobs log keeps 365 days")
