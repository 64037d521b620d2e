"""The watcher's lifecycle half: pod updates and silence become job events.

It follows the backend's pod updates and publishes ``pod`` and the lifecycle event each implies,
fenced by attempt; it declares silent and expired runs lost, stops runs past ``max_wall_s`` and
deletes pods that must not run. Event ids derive from job, attempt and phase, so each fact is
published once. Design: docs/architecture.md, "The job state machine".
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from nats.js import JetStreamContext
from nats.js.api import DeliverPolicy
from nats.js.errors import NotFoundError

from mdq.backends.port import ClusterBackend, PodUpdate
from mdq.bus.codec import decode_event
from mdq.bus.log import follow_log, raise_if_cancelling
from mdq.bus.outage import warn_try_failed
from mdq.bus.publisher import EventPublisher
from mdq.bus.subjects import Subjects
from mdq.contracts import pb
from mdq.core import ids
from mdq.core.expiry import (
    CHECK_EVERY,
    ENDED_BY_THE_WATCHER,
    expired,
    expiry_message,
    max_job_age,
)
from mdq.core.recovery import classify_stopped
from mdq.core.state import JobBook, JobState, JobView, Stop, event_time
from mdq.core.timestamps import utc_now
from services.watcher.silence import Sign, SilenceClock

log = logging.getLogger("mdq.watcher.lifecycle")


@dataclass(frozen=True, slots=True)
class LostRunPolicy:
    """When a running job counts as lost."""

    min_silence_s: float = 60.0
    """Never declare a job lost sooner than this after its last sign of life."""
    interval_factor: float = 5.0
    """... nor sooner than this many of its own observed progress intervals."""
    first_report_s: float = 300.0
    """An attempt with no report yet is never lost sooner than this after its start: its
    inputs are fetched, its system built and minimised and its first chunk timed before the
    runner reports (at least every ``MDQ_RUNNER_ALIVE_REPORT_S`` from then on)."""


class Lifecycle:
    """Pod updates and silence in, lifecycle events out."""

    def __init__(
        self,
        *,
        js: JetStreamContext,
        subjects: Subjects,
        publisher: EventPublisher,
        backend: ClusterBackend,
        lost: LostRunPolicy = LostRunPolicy(),
        check_interval_s: float = 1.0,
        clock: Callable[[], datetime] = utc_now,
        jobs_log_days: float = 365.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        """``jobs_log_days``: how long the jobs log keeps events (``MDQ_STORAGE_JOBS_DAYS``); a
        bound or running attempt of a job that has lived that long less a day is ended
        (``mdq.core.expiry``)."""
        self._js = js
        self._subjects = subjects
        self._publisher = publisher
        self._backend = backend
        self._lost = lost
        self._check_interval_s = check_interval_s
        self._clock = clock
        self._monotonic = monotonic
        self._silence = SilenceClock()
        self._jobs_log_days = jobs_log_days
        self._max_age = max_job_age(jobs_log_days)
        self._expiry_checked_at: datetime | None = None
        self.book = JobBook()
        self._intervals: dict[str, float] = {}
        """Seconds between a running job's last two reports (of one attempt)."""
        self._last_report: dict[str, tuple[int, datetime]] = {}
        """Each job's last report: its attempt, and its time by the runner's clock."""
        self._deferred: dict[str, PodUpdate] = {}
        self._jobs_ready = asyncio.Event()

    # -- folding ---------------------------------------------------------------------------
    async def on_job_event(self, sequence: int, event: pb.Event) -> None:
        view = self.book.apply(sequence, event)
        if view is not None and (update := self._deferred.pop(view.job_id, None)):
            await self.on_pod(update)

    async def on_progress(self, _sequence: int, event: pb.Event) -> None:
        view = self.book.jobs.get(event.job_id)
        if view is None:
            return
        if not view.apply(event):
            return
        # the interval between two reports of one attempt, both stamped by the runner's clock
        # (never against the watcher's ``started``: the clocks may disagree by minutes)
        at = event_time(event)
        before = self._last_report.get(view.job_id)
        if before is not None and before[0] == event.attempt:
            self._intervals[view.job_id] = max(0.0, (at - before[1]).total_seconds())
        self._last_report[view.job_id] = (event.attempt, at)

    async def _mark_caught_up(self) -> None:
        self._jobs_ready.set()

    # -- pods ------------------------------------------------------------------------------
    async def on_pod(self, update: PodUpdate) -> None:
        """Publish the pod event and the lifecycle event it implies (if any)."""
        phase = pb.PodPhase.Name(update.phase)
        await self._publisher.emit(
            "pod",
            pb.PodStatus(
                pod_name=update.pod_name,
                node=update.node,
                phase=update.phase,
                exit_code=update.exit_code,
                reason=update.reason,
                message=update.message,
            ),
            job_id=update.job_id,
            attempt=update.attempt,
            detail=phase,
        )
        view = self.book.jobs.get(update.job_id)
        if (
            view is None
            or update.attempt > view.attempt
            or (
                update.attempt == view.attempt
                and view.state is JobState.PENDING
                and update.phase != pb.POD_PENDING
            )
        ):
            self._deferred[update.job_id] = update  # the log has not caught up with the pod
            return
        if (
            view.state is JobState.CANCELLED
            and update.attempt == view.attempt
            and update.phase in (pb.POD_PENDING, pb.POD_RUNNING)
        ):
            # cancelled while bound (a cancel that raced a binding): nothing may run it
            await self._backend.delete_pod(update.pod_name)
            return
        if update.attempt < view.attempt or view.state.terminal:
            return
        if (
            update.phase == pb.POD_SUCCEEDED
            and view.state in (JobState.BOUND, JobState.RUNNING)
            and not view.current.started_logged
        ):
            # The pod ran and ended before its Running phase was seen (a watcher that started
            # after it, a phase change faster than the watch): it did start, and the log says
            # so before it says the job succeeded.
            started = self._publisher.event(
                "started",
                pb.JobStarted(node=update.node, pod_name=update.pod_name),
                job_id=view.job_id,
                attempt=view.attempt,
            )
            await self._publisher.publish(started)
            view.apply(started)
        event = await self._lifecycle_event(view, update)
        if event is not None:
            await self._publisher.publish(event)
            view.apply(event)

    async def _lifecycle_event(self, view: JobView, update: PodUpdate) -> pb.Event | None:
        job, attempt = view.job_id, view.attempt
        if (
            update.phase == pb.POD_RUNNING
            and view.state in (JobState.BOUND, JobState.RUNNING)
            and not view.current.started_logged
        ):
            # RUNNING already: the runner's first report was folded before the pod's phase
            # (a busy watch); the attempt still gets its one ``started`` in the log.
            body: pb.JobStarted | pb.JobSucceeded | pb.AttemptFailed = pb.JobStarted(
                node=update.node, pod_name=update.pod_name
            )
            return self._publisher.event("started", body, job_id=job, attempt=attempt)
        if update.phase == pb.POD_SUCCEEDED and view.state in (JobState.BOUND, JobState.RUNNING):
            final = await self._last_progress(job, attempt) or pb.Progress(
                step=view.last_step, done_reason=view.done_reason
            )
            body = pb.JobSucceeded(
                final_step=final.step, reason=final.done_reason or "completed", output_dir=""
            )
            return self._publisher.event("succeeded", body, job_id=job, attempt=attempt)
        if update.phase == pb.POD_FAILED and view.state in (JobState.BOUND, JobState.RUNNING):
            last = await self._last_progress(job, attempt)
            stopping = view.stop is not Stop.NONE
            reason = classify_stopped(
                pod_reason=update.reason, exit_code=update.exit_code, stopping=stopping
            )
            message = update.message or update.reason
            if reason == pb.FAILURE_STOPPED:
                message = f"stopped for a {view.stop.value}: {message}"
            elif reason == pb.FAILURE_LIMIT_EXCEEDED:
                limit = view.spec.max_disk_mb
                message = f"its folder outgrew its max_disk_mb of {limit} MiB: {message}"
            body = pb.AttemptFailed(
                reason=reason,
                exit_code=update.exit_code,
                message=message,
                node=update.node,
                last_step=max(view.last_step, last.step if last else 0),
            )
            return self._publisher.event("attempt_failed", body, job_id=job, attempt=attempt)
        return None

    async def _last_progress(self, job: str, attempt: int) -> pb.Progress | None:
        """The newest progress of this attempt, straight from the stream (not our fold)."""
        try:
            message = await self._js.get_last_msg(
                self._subjects.progress_stream, self._subjects.progress(job)
            )
        except NotFoundError:
            return None
        event = decode_event(message.data or b"")
        return event.progress if event.attempt == attempt else None

    async def _watch_pods(self) -> None:
        async for update in self._backend.watch_pods():
            try:
                await self.on_pod(update)
            except Exception as error:
                warn_try_failed(log, f"pod update {update.pod_name} failed; seen again", error)

    # -- silence ---------------------------------------------------------------------------
    def silence_limit(self, view: JobView) -> float:
        """Seconds of silence after which this running job counts as lost."""
        reported = self._last_report.get(view.job_id)
        if reported is None or reported[0] != view.attempt:
            return max(self._lost.min_silence_s, self._lost.first_report_s)
        interval = self._intervals.get(view.job_id, 0.0)
        return max(self._lost.min_silence_s, self._lost.interval_factor * interval)

    async def check_lost(self) -> list[str]:
        """Declare every silent RUNNING job lost; return their ids. Silence counts from when
        this watcher first saw the job's latest sign of life, on its monotonic clock
        (``services.watcher.silence``), never from the runner's own time stamp."""
        now = self._monotonic()
        lost: list[str] = []
        running: set[str] = set()
        for view in list(self.book.jobs.values()):
            if view.state is not JobState.RUNNING or view.last_progress_at is None:
                continue
            running.add(view.job_id)
            sign = Sign(view.attempt, view.last_step, view.last_progress_at)
            silence = self._silence.silent_for(view.job_id, sign, now)
            if silence <= self.silence_limit(view):
                continue
            await self._end_attempt(view, pb.FAILURE_LOST, f"no progress for {silence:.0f}s")
            log.warning("job %s attempt %d lost after %.0fs", view.job_id, view.attempt, silence)
            lost.append(view.job_id)
        self._silence.forget_all_but(running)
        for table in (self._intervals, self._last_report):
            for job_id in table.keys() - running:
                del table[job_id]
        return lost

    async def check_limits(self) -> list[str]:
        """Stop every running job that ran longer than its ``max_wall_s`` (``limit_exceeded``,
        pod deleted: the runner checkpoints and exits); return their ids."""
        now = self._clock()
        stopped: list[str] = []
        if not self._jobs_ready.is_set():
            return stopped  # the log's tail may have stopped them already
        for view in list(self.book.jobs.values()):
            limit = view.spec.max_wall_s
            if limit <= 0 or view.state is not JobState.RUNNING:
                continue
            if view.stop in (Stop.CANCEL, Stop.LIMIT):
                continue
            ran = view.ran_s(now)
            if ran <= limit:
                continue
            message = f"ran {ran:.0f} s, its max_wall_s is {limit:g} s"
            event = self._publisher.event(
                "limit_exceeded",
                pb.LimitExceeded(limit="max_wall_s", limit_value=limit, used=ran, message=message),
                job_id=view.job_id,
                attempt=view.attempt,
            )
            await self._publisher.publish(event)
            view.apply(event)
            await self._backend.delete_pod(view.pod_name or ids.pod_name(view.job_id, view.attempt))
            log.warning("job %s attempt %d stopped: %s", view.job_id, view.attempt, message)
            stopped.append(view.job_id)
        return stopped

    async def check_expired(self) -> list[str]:
        """End the bound or running attempt of every job that has lived as long as the jobs
        log keeps events, less a day (``FAILURE_EXPIRED``, pod deleted); return their ids."""
        now = self._clock()
        ended: list[str] = []
        if not self._jobs_ready.is_set():
            return ended  # the log's tail may still end them
        if self._expiry_checked_at is not None and now - self._expiry_checked_at < CHECK_EVERY:
            return ended  # once a minute, not with every silence check
        self._expiry_checked_at = now
        for view in list(self.book.jobs.values()):
            if view.state not in ENDED_BY_THE_WATCHER or not expired(view, now, self._max_age):
                continue
            message = expiry_message(view, now, self._jobs_log_days)
            await self._end_attempt(view, pb.FAILURE_EXPIRED, message)
            log.warning("job %s ended: %s", view.job_id, message)
            ended.append(view.job_id)
        return ended

    async def _end_attempt(self, view: JobView, reason: pb.FailureReason, message: str) -> None:
        """Fail ``view``'s current attempt (``attempt_failed``, folded in at once) and delete
        its pod, so that the next attempt never runs beside it."""
        event = self._publisher.event(
            "attempt_failed",
            pb.AttemptFailed(
                reason=reason, message=message, node=view.node, last_step=view.last_step
            ),
            job_id=view.job_id,
            attempt=view.attempt,
        )
        await self._publisher.publish(event)
        pod = view.pod_name or ids.pod_name(view.job_id, view.attempt)
        view.apply(event)
        await self._backend.delete_pod(pod)

    async def _watch_silence(self) -> None:
        while True:
            await asyncio.sleep(self._check_interval_s)
            try:
                await self.check_lost()
                await self.check_limits()
                await self.check_expired()
            except Exception as error:
                warn_try_failed(log, "lost-run check failed", error)
            raise_if_cancelling()  # a stop its NATS requests dropped (mdq.bus.log)

    # -- running ---------------------------------------------------------------------------
    async def run(self) -> None:
        """Follow the logs, then the pods and the silence, forever."""
        tasks = [
            asyncio.create_task(
                follow_log(
                    self._js,
                    self._subjects.job_all("*"),
                    on_event=self.on_job_event,
                    on_caught_up=self._mark_caught_up,
                )
            ),
        ]
        try:
            await self._jobs_ready.wait()
            tasks.append(
                asyncio.create_task(
                    follow_log(
                        self._js,
                        self._subjects.progress_all,
                        on_event=self.on_progress,
                        on_caught_up=_nothing,
                        deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
                    )
                )
            )
            tasks.append(asyncio.create_task(self._watch_pods()))
            tasks.append(asyncio.create_task(self._watch_silence()))
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            for task in done:
                task.result()
        finally:
            for task in tasks:
                task.cancel()


async def _nothing() -> None:
    return None
