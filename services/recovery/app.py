"""The recovery service: every failed attempt gets a decision, exactly once.

Recovery folds the job log into memory (``JobBook``) and, once caught up and after every
change, decides for each RECOVERING job with the pure policy (``mdq.core.recovery.decide``):
``requeued`` (attempt + 1, resuming from the latest checkpoint, with overrides, an avoid-list
and a not-before time for backoff — placement honours it) or ``failed`` for good. The event
id is derived from job and attempt, so a decision published twice (a crash between publishing
and seeing it echoed, or two replicas) lands once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import UTC, datetime

from nats.js import JetStreamContext

from mdq.bus.log import follow_log
from mdq.bus.publisher import EventPublisher
from mdq.bus.subjects import Subjects
from mdq.contracts import pb
from mdq.core.recovery import GiveUp, RecoveryPolicy, Wait, decide, requeued_body
from mdq.core.state import JobBook, JobState, JobView
from mdq.memory import keep_state_out_of_gc

log = logging.getLogger("mdq.recovery")


def _utcnow() -> datetime:
    return datetime.now(UTC)


class Recovery:
    """Turns attempt failures into requeues or final failures."""

    def __init__(
        self,
        *,
        js: JetStreamContext,
        subjects: Subjects,
        publisher: EventPublisher,
        policy: RecoveryPolicy,
        clock: Callable[[], datetime] = _utcnow,
    ) -> None:
        self._js = js
        self._subjects = subjects
        self._publisher = publisher
        self._policy = policy
        self._clock = clock
        self.book = JobBook()
        self._recovering: set[str] = set()
        self._caught_up = False
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._rechecks: set[asyncio.Task[None]] = set()
        self.decisions = 0

    async def on_event(self, sequence: int, event: pb.Event) -> None:
        view = self.book.apply(sequence, event)
        if view is None:
            return
        if view.state is JobState.RECOVERING:
            self._recovering.add(view.job_id)
            if self._caught_up:
                await self._decide(view)
        else:
            self._recovering.discard(view.job_id)

    async def on_caught_up(self) -> None:
        self._caught_up = True
        log.info("caught up: %d jobs, %d to recover", len(self.book.jobs), len(self._recovering))
        for job_id in sorted(self._recovering):
            await self._decide(self.book.jobs[job_id])

    async def _decide(self, view: JobView) -> None:
        decision = decide(view, self._policy, self._clock())
        if isinstance(decision, Wait):
            self._recheck_at(view.job_id, decision.until)
            return
        if isinstance(decision, GiveUp):
            event = self._publisher.event(
                "failed",
                pb.JobFailed(reason=decision.reason, message=decision.message),
                job_id=view.job_id,
                attempt=view.attempt,
            )
            log.info("job %s failed for good: %s", view.job_id, decision.message)
        else:
            event = self._publisher.event(
                "requeued",
                requeued_body(decision, view, self._clock()),
                job_id=view.job_id,
                attempt=decision.attempt,
            )
            log.info(
                "job %s requeued as attempt %d after %s (resume step %d, delay %.1fs)",
                view.job_id,
                decision.attempt,
                pb.FailureReason.Name(decision.after),
                decision.resume_from.step if decision.resume_from else 0,
                decision.delay_s,
            )
        await self._publisher.publish(event)
        if view.apply(event):
            self._recovering.discard(view.job_id)
        self.decisions += 1

    def _recheck_at(self, job_id: str, when: datetime) -> None:
        """Decide again at ``when`` (unless an event about the job decides it first)."""
        if job_id in self._timers:
            return
        delay = max(0.0, (when - self._clock()).total_seconds())
        loop = asyncio.get_running_loop()

        def fire() -> None:
            self._timers.pop(job_id, None)
            view = self.book.jobs.get(job_id)
            if view is not None and view.state is JobState.RECOVERING:
                task = loop.create_task(self._decide(view))
                self._rechecks.add(task)
                task.add_done_callback(self._rechecks.discard)

        self._timers[job_id] = loop.call_later(delay, fire)

    async def run(self) -> None:
        """Follow the job log, forever (its fold kept out of the cyclic GC's way)."""
        gc_task = asyncio.create_task(keep_state_out_of_gc(), name="gc")
        try:
            await follow_log(
                self._js,
                self._subjects.job_all("*"),
                on_event=self.on_event,
                on_caught_up=self.on_caught_up,
            )
        finally:
            gc_task.cancel()
