"""The recovery service: every failed attempt gets a decision, exactly once.

Recovery folds the job log into memory (``RecoveryState``: the jobs that have not ended) and
decides for each RECOVERING job with the pure policy (``mdq.core.recovery.decide``):
``requeued``, ``failed`` or ``cancelled``. A restart resumes from its snapshot and folds only
the log after it.

The service and its policy: docs/recovery.md; its snapshot: docs/architecture.md, "Where
placement's state comes from on start".
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from datetime import datetime
from typing import Any

from nats.js import JetStreamContext

from mdq.bus.log import follow_log
from mdq.bus.publisher import EventPublisher
from mdq.bus.runtime import every, run_parts
from mdq.bus.snapshots import SnapshotKeeper, SnapshotStore
from mdq.bus.subjects import Subjects
from mdq.contracts import pb
from mdq.core.recovery import Cancel, GiveUp, RecoveryPolicy, Wait, decide, requeued_body
from mdq.core.recovery_state import RecoveryState
from mdq.core.state import JobState, JobView
from mdq.core.timestamps import utc_now

log = logging.getLogger("mdq.recovery")


class Recovery:
    """Turns attempt failures into requeues or final failures."""

    def __init__(
        self,
        *,
        js: JetStreamContext,
        subjects: Subjects,
        publisher: EventPublisher,
        policy: RecoveryPolicy,
        snapshots: SnapshotStore | None = None,
        snapshot_interval_s: float = 60.0,
        clock: Callable[[], datetime] = utc_now,
    ) -> None:
        self._js = js
        self._subjects = subjects
        self._publisher = publisher
        self._policy = policy
        self._snapshots = None if snapshots is None else SnapshotKeeper(snapshots, logger=log)
        self._snapshot_interval_s = snapshot_interval_s
        self._clock = clock
        self.state = RecoveryState()
        """What recovery knows (pure): the live jobs."""
        self._caught_up = False
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._rechecks: set[asyncio.Task[None]] = set()
        self.decisions = 0
        self.restored_sequence = 0
        """The jobs-stream sequence of the snapshot this start restored (0: full replay)."""
        self.snapshots_written = 0
        self.first_sequence_read = 0
        """The first jobs-stream sequence this start read (the snapshot's + 1 after a restore)."""

    async def on_event(self, sequence: int, event: pb.Event) -> None:
        self.first_sequence_read = self.first_sequence_read or sequence
        view = self.state.apply(sequence, event)
        if view is not None and view.state is JobState.RECOVERING and self._caught_up:
            await self._decide(view)

    async def on_caught_up(self) -> None:
        self._caught_up = True
        recovering = self.state.recovering()
        log.info(
            "caught up: %d live jobs, %d to recover", len(self.state.book.jobs), len(recovering)
        )
        for view in recovering:
            await self._decide(view)

    async def _decide(self, view: JobView) -> None:
        decision = decide(view, self._policy, self._clock())
        if isinstance(decision, Wait):
            self._recheck_at(view.job_id, decision.until)
            return
        if isinstance(decision, Cancel):
            event = self._publisher.event(
                "cancelled",
                pb.JobCancelled(origin=decision.origin, message=decision.message),
                job_id=view.job_id,
                attempt=view.attempt,
            )
            log.info("job %s %s", view.job_id, decision.message)
        elif isinstance(decision, GiveUp):
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
            self.state.note(view)
        self.decisions += 1

    def _recheck_at(self, job_id: str, when: datetime) -> None:
        """Decide again at ``when`` (unless an event about the job decides it first)."""
        if job_id in self._timers:
            return
        delay = max(0.0, (when - self._clock()).total_seconds())
        loop = asyncio.get_running_loop()

        def fire() -> None:
            self._timers.pop(job_id, None)
            view = self.state.get(job_id)
            if view is not None and view.state is JobState.RECOVERING:
                task = loop.create_task(self._decide(view))
                self._rechecks.add(task)
                task.add_done_callback(self._rechecks.discard)

        self._timers[job_id] = loop.call_later(delay, fire)

    async def restore(self) -> int:
        """Start from the snapshot if it may be used (``mdq.core.snapshot.resume``); returns
        the jobs-stream sequence it reflects (0: the whole log is to be replayed). Logs one
        line either way."""
        if self._snapshots is None:
            return 0
        restored = await self._snapshots.restore(RecoveryState.from_snapshot)
        if restored is None:
            return 0
        self.state, self.restored_sequence = restored
        return self.restored_sequence

    async def write_snapshot(self) -> bool:
        """Write the state as the snapshot when it changed since it was last written (or
        restored); True when one was written. Best effort: a snapshot that cannot be written
        only makes the next start replay more of the log."""
        if self._snapshots is None or not self.state.last_sequence:
            return False
        if not await self._snapshots.write(self.state.snapshot(), now=self._clock()):
            return False
        self.snapshots_written += 1
        return True

    async def _keep_snapshots(self, caught_up: asyncio.Event) -> None:
        """Once caught up: a snapshot at once, then at most every ``snapshot_interval_s``."""
        await caught_up.wait()
        await every(self._snapshot_interval_s, self.write_snapshot, what="recovery's snapshot")

    async def run(self) -> None:
        """Restore, then follow the job log, forever, writing snapshots as it goes."""
        after = await self.restore()
        caught_up = asyncio.Event()

        async def on_caught_up() -> None:
            await self.on_caught_up()
            caught_up.set()

        parts: dict[str, Coroutine[Any, Any, object]] = {
            "recovery-jobs": follow_log(
                self._js,
                self._subjects.job_all("*"),
                on_event=self.on_event,
                on_caught_up=on_caught_up,
                start_sequence=after + 1 if after else 0,
            )
        }
        if self._snapshots is not None and self._snapshot_interval_s > 0:
            parts["snapshots"] = self._keep_snapshots(caught_up)
        await run_parts(parts)
