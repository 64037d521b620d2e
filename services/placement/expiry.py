"""Jobs that waited as long as the jobs log keeps events, less a day, without an attempt under
way: placement ends them (``FAILURE_EXPIRED``; the rule is ``mdq.core.expiry``)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime

from mdq.bus.publisher import EventPublisher
from mdq.contracts import pb
from mdq.core.expiry import (
    CHECK_EVERY,
    ENDED_BY_PLACEMENT,
    expired,
    expiry_message,
    max_job_age,
)
from mdq.core.placement_state import PlacementState
from services.placement.emitter import Emitter

log = logging.getLogger("mdq.placement")


class Expiry:
    """Ends the jobs too old for the jobs log, looking at most every ``CHECK_EVERY``."""

    def __init__(
        self,
        *,
        state: Callable[[], PlacementState],
        publisher: EventPublisher,
        emitter: Emitter,
        clock: Callable[[], datetime],
        jobs_log_days: float,
    ) -> None:
        """``state``: placement's state now (a restore replaces it). ``jobs_log_days``: how
        long the jobs log keeps events (``MDQ_STORAGE_JOBS_DAYS``)."""
        self._state = state
        self._publisher = publisher
        self._emitter = emitter
        self._clock = clock
        self._jobs_log_days = jobs_log_days
        self._max_age = max_job_age(jobs_log_days)
        self._checked_at: datetime | None = None

    async def end_expired(self) -> None:
        """End every job that has waited as long as the jobs log keeps events, less a day,
        without an attempt under way (``FAILURE_EXPIRED``)."""
        now = self._clock()
        if self._checked_at is not None and now - self._checked_at < CHECK_EVERY:
            return  # not on every pass: a flood's pending jobs would be walked each time
        self._checked_at = now
        for state in ENDED_BY_PLACEMENT:
            for view in self._state().views(state):
                if not expired(view, now, self._max_age):
                    continue
                message = expiry_message(view, now, self._jobs_log_days)
                log.warning("job %s ended: %s", view.job_id, message)
                await self._emitter.emit(
                    view,
                    self._publisher.event(
                        "failed",
                        pb.JobFailed(reason=pb.FAILURE_EXPIRED, message=message),
                        job_id=view.job_id,
                        attempt=view.attempt,
                    ),
                )
