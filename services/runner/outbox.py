"""Publishing the runner's events without stalling the MD loop.

Each event is published in its own task, so many are in flight while OpenMM steps in its
worker thread; tasks start in the order the events were made, so they reach the stream in step
order. The loop awaits them only at checkpoints and before exit (``flush``). A progress event
that cannot be published is logged and dropped (the next one supersedes it); a checkpoint event
or a final progress event is retried, because recovery and the watcher depend on it.
"""

from __future__ import annotations

import asyncio
import logging

from google.protobuf.message import Message

from mdq.bus.publisher import EventPublisher
from mdq.contracts import pb

log = logging.getLogger(__name__)

RETRY_BASE_DELAY_S = 0.2


class Outbox:
    """The events of one attempt, published concurrently."""

    def __init__(
        self,
        *,
        publisher: EventPublisher,
        job_id: str,
        attempt: int,
        attempts_per_important_event: int,
    ) -> None:
        self._publisher = publisher
        self._job_id = job_id
        self._attempt = attempt
        self._tries = attempts_per_important_event
        self._in_flight: set[asyncio.Task[None]] = set()
        self.failed = 0
        """Events that could not be published (given up on)."""
        self.last_step = 0
        """The step of the latest progress event (for the usage report)."""
        self.first_step: int | None = None
        """The step this attempt started from, once its engine started (the checkpoint it
        resumed from may be later than the one announced: ``CheckpointStore.load``)."""
        self.ns_per_day = 0.0
        """The speed of the latest progress event that had one."""

    def progress(self, progress: pb.Progress) -> None:
        """Publish a progress event (id ``progress:<job>:<attempt>:<step>``)."""
        self.last_step = max(self.last_step, progress.step)
        if progress.ns_per_day > 0:
            self.ns_per_day = progress.ns_per_day
        self._send("progress", progress, detail=progress.step, important=bool(progress.done_reason))

    def checkpoint(self, checkpoint: pb.Checkpoint) -> None:
        """Publish a checkpoint event (id ``checkpoint:<job>:<attempt>:<step>``)."""
        self._send("checkpoint", checkpoint, detail=checkpoint.step, important=True)

    def copied(self, copied: pb.CheckpointCopied) -> None:
        """Publish that a checkpoint was copied to the shared store (id
        ``copied:<job>:<attempt>:<step>``)."""
        self._send("copied", copied, detail=copied.checkpoint.step, important=True)

    def fetched(self, fetched: pb.CopyFetched) -> None:
        """Publish that the attempt resumed from a copy fetched from the shared store (id
        ``fetched:<job>:<attempt>``)."""
        self._send("fetched", fetched, detail=None, important=True)

    def outputs(self, outputs: pb.JobOutputs) -> None:
        """Publish the outputs event of a successful attempt (id ``outputs:<job>:<attempt>``)."""
        self._send("outputs", outputs, detail=None, important=True)

    def usage(self, usage: pb.AttemptUsage) -> None:
        """Publish what the attempt used, once as it ends (id ``usage:<job>:<attempt>``)."""
        self._send("usage", usage, detail=None, important=True)

    async def flush(self, *, timeout_s: float) -> bool:
        """Wait for every event in flight; False if some were still pending at the timeout."""
        if not self._in_flight:
            return True
        _, pending = await asyncio.wait(set(self._in_flight), timeout=timeout_s)
        if pending:
            log.error("%d events still unpublished after %.0f s", len(pending), timeout_s)
        return not pending

    def _send(self, kind: str, body: Message, *, detail: int | None, important: bool) -> None:
        event = self._publisher.event(
            kind, body, job_id=self._job_id, attempt=self._attempt, detail=detail
        )
        task = asyncio.get_running_loop().create_task(
            self._publish(event, tries=self._tries if important else 1)
        )
        self._in_flight.add(task)
        task.add_done_callback(self._in_flight.discard)

    async def _publish(self, event: pb.Event, *, tries: int) -> None:
        for attempt in range(1, tries + 1):
            try:
                await self._publisher.publish(event)
                return
            except Exception as error:  # any bus error: retry or give up, never crash the run
                if attempt == tries:
                    self.failed += 1
                    log.warning("gave up publishing %s: %r", event.event_id, error)
                    return
                await asyncio.sleep(RETRY_BASE_DELAY_S * 2 ** (attempt - 1))
