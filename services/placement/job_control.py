"""Job control decided in placement's loop, between passes, so a job is never decided on by a
pass and a request at once (docs/control.md, "Who acts"). ``services.placement.control`` is the
entrance (``ControlDesk``, ``ControlRegistry``); the decisions are ``mdq.core.control``; this
module publishes them, stops pods, and settles what a crash left half done."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from nats.js import JetStreamContext
from nats.js.api import PubAck
from nats.js.errors import NotFoundError

from mdq.backends.port import ClusterBackend
from mdq.bus.codec import decode_event, foreign_reason
from mdq.bus.outage import warn_try_failed
from mdq.bus.publisher import EventPublisher
from mdq.bus.subjects import Subjects
from mdq.bus.tenants import TenantDirectory
from mdq.contracts import pb
from mdq.core import ids
from mdq.core.control import (
    Action,
    Limits,
    Selector,
    decide,
    forbidden,
    may_control,
    not_found,
    origin_of,
    reply_of,
)
from mdq.core.placement_state import PlacementState
from mdq.core.recovery import cancel_message
from mdq.core.state import IDLE_STATES, LIVE_STATES, JobBook, JobView, Stop
from mdq.core.tenants import RunawayLimits
from services.placement.control import ControlDesk, NotLeader
from services.placement.emitter import Emitter
from services.placement.settings import PlacementSettings

log = logging.getLogger("mdq.placement")

POD_DELETES_AT_ONCE = 64
"""Pods deleted side by side when a request (or a pass) stops many jobs."""
HISTORY_READS_AT_ONCE = 16
"""Jobs placement no longer holds whose history a request reads from the log side by side
(each a message get at a time, no consumer: ``JobControl._read_job``)."""


@dataclass(slots=True)
class PendingControl:
    """A job-control request waiting for its turn in the loop."""

    request: pb.ControlRequest
    tenant: str
    control_id: str
    answer: asyncio.Future[pb.ControlReply]


class JobControl:
    """Queues job-control requests and decides them when the loop serves them."""

    def __init__(
        self,
        *,
        state: Callable[[], PlacementState],
        publisher: EventPublisher,
        emitter: Emitter,
        backend: ClusterBackend,
        settings: PlacementSettings,
        tenants: TenantDirectory,
        limits: RunawayLimits,
        desk: ControlDesk | None,
        dirty: asyncio.Event,
        js: JetStreamContext,
        subjects: Subjects,
    ) -> None:
        """``state``: placement's state now (a restore replaces it). ``limits``: the
        operator's default runaway limits. ``desk``: the entrance opened while this replica
        leads (None: requests come only through ``control``). ``dirty``: set to wake the loop."""
        self._state = state
        self._publisher = publisher
        self._emitter = emitter
        self._backend = backend
        self._settings = settings
        self._tenants = tenants
        self._limit_defaults = limits
        self._desk = desk
        self._dirty = dirty
        self._js = js
        self._subjects = subjects
        self._queue: list[PendingControl] = []
        self._pods_stopped: set[tuple[str, int]] = set()
        """(job, attempt) whose pod this process deleted to stop it (once each)."""
        self.controls_total = 0
        """Job-control requests decided by this replica."""
        self.stopped_total = 0
        """Pods deleted to stop a job on request."""

    async def control(
        self, request: pb.ControlRequest, tenant: str, control_id: str
    ) -> pb.ControlReply:
        """Decide a job-control request (checked already: ``mdq.core.control.check_request``)
        in the loop, between passes; ``NotLeader`` when this replica stops leading first."""
        answer: asyncio.Future[pb.ControlReply] = asyncio.get_running_loop().create_future()
        self._queue.append(PendingControl(request, tenant, control_id, answer))
        self._dirty.set()
        return await answer

    def refuse(self) -> None:
        """Answer every queued request ``NotLeader`` (left unanswered: the client resends)."""
        queue, self._queue = self._queue, []
        for pending in queue:
            if not pending.answer.done():
                pending.answer.set_exception(NotLeader("this placement replica does not lead"))

    async def serve(self, leader: bool) -> None:
        """Open or close the control entrance with the lease; decide what is queued."""
        if self._desk is not None:
            try:
                await self._desk.open_if(leader)
            except Exception as error:
                warn_try_failed(log, "could not open the job-control entrance; retrying", error)
        if not leader:
            self.refuse()
            return
        while self._queue:
            pending = self._queue.pop(0)
            if pending.answer.done():
                continue
            try:
                reply = await self._apply(pending.request, pending.tenant, pending.control_id)
            except Exception as error:  # unanswered: the client sends it again
                log.exception("job-control request %s failed", pending.control_id)
                if not pending.answer.done():
                    pending.answer.set_exception(error)
                continue
            if not pending.answer.done():
                pending.answer.set_result(reply)

    def _limits(self, tenant: str) -> Limits:
        """What bounds an extend of ``tenant``'s jobs: its steps limit (its policy's, else the
        operator's default)."""
        policy = self._tenants.policy(tenant) if tenant else None
        return Limits(max_steps=RunawayLimits.of(policy, self._limit_defaults).max_steps)

    async def _read_job(self, job_id: str) -> tuple[JobView | None, int]:
        """A job placement no longer holds, folded from its history in the log; (None, 0) when
        the log holds none. With the stream sequence of its last ``bound``.

        Placement's state cannot say that a job does not exist: it forgets ended jobs (beyond
        ``ended_memory``), so the log is asked, for every id it does not hold. The history is
        read a message at a time (``STREAM.MSG.GET`` of the next message on the job's subjects,
        until there is none), which makes no consumer: a request naming 10,000 ids that do not
        exist costs 10,000 gets, ``HISTORY_READS_AT_ONCE`` in flight, and leaves the stream's
        consumers (a limited resource every reader of the log shares) as they were."""
        book = JobBook()
        last_bound = 0
        subject = self._subjects.job_all(job_id)
        sequence = 0
        while True:
            try:
                message = await self._js.get_msg(
                    self._subjects.jobs_stream, seq=sequence + 1, subject=subject, next=True
                )
            except NotFoundError:
                break
            sequence = message.seq or sequence + 1
            try:
                event = decode_event(message.data or b"")
            except Exception:  # not mdq's: skipped, as the log's readers do
                continue
            if event.job_id != job_id or foreign_reason(event, message.subject or "") is not None:
                continue
            book.apply(0, event)
            if event.WhichOneof("body") == "bound":
                last_bound = sequence
        return book.jobs.get(job_id), last_bound

    async def _apply(
        self, request: pb.ControlRequest, tenant: str, control_id: str
    ) -> pb.ControlReply:
        origin = origin_of(request, control_id=control_id, tenant=tenant)
        selector = Selector.of(request, tenant)
        limits = self._limits(tenant)
        verb = request.verb
        outcomes: list[pb.ControlOutcome] = []
        targets: list[tuple[JobView, bool]] = []
        """(view, whether placement holds it)"""
        fences: dict[str, int] = {}
        if selector.by_id:
            mine = [job for job in selector.job_ids if may_control(tenant, job)]
            outcomes += [
                forbidden(job, tenant).outcome(job)
                for job in selector.job_ids
                if not may_control(tenant, job)
            ]
            forgotten = [job for job in mine if job not in self._state().book.jobs]
            slots = asyncio.Semaphore(HISTORY_READS_AT_ONCE)

            async def read(job: str) -> tuple[JobView | None, int]:
                async with slots:
                    return await self._read_job(job)

            read_back = await asyncio.gather(*(read(job) for job in forgotten))
            found = dict(zip(forgotten, read_back, strict=True))
            for job in mine:  # decided with no await since the views were taken
                known = self._state().book.jobs.get(job)
                if known is not None:
                    targets.append((known, True))
                    continue
                view, last_bound = found.get(job, (None, 0))
                if view is None:
                    outcomes.append(not_found(job).outcome(job))
                else:
                    targets.append((view, False))
                    fences[job] = last_bound
        else:
            targets = [
                (view, True)
                for view in self._state().book.jobs.values()
                if not view.state.terminal and selector.matches(view)
            ]
        planned: list[tuple[JobView, bool, Action, pb.Event]] = []
        for view, held in targets:
            action = decide(verb, view, request, origin, limits)
            if not action.kind or action.body is None:
                outcomes.append(action.outcome(view.job_id))
                continue
            event = self._publisher.event(
                action.kind,
                action.body,
                job_id=view.job_id,
                attempt=action.attempt,
                detail=action.detail,
            )
            planned.append((view, held, action, event))
        # in batches, as bindings are: one batch's acks are awaited under one timer
        size = self._settings.bind_concurrency
        results: list[PubAck | Exception] = []
        for start in range(0, len(planned), size):
            batch = planned[start : start + size]
            results += await self._publisher.publish_each([(event, None) for *_, event in batch])
        failure: Exception | None = None
        stops: list[tuple[str, int]] = []
        for (view, held, action, event), result in zip(planned, results, strict=True):
            if isinstance(result, Exception):
                failure = failure or result
                continue
            outcomes.append(action.outcome(view.job_id))
            if event.WhichOneof("body") == "extended" and view.job_id in fences:
                self._state().fence_learned(view.job_id, fences[view.job_id])
            if held:
                self._emitter.apply(view, event)
            if action.stop_pod:
                stops.append((view.job_id, view.attempt))
        await self._stop_pods(stops)
        if failure is not None:
            raise failure  # unanswered; the resend finds what did land already done
        self.controls_total += 1
        log.info(
            "job control %s (%s): %d jobs",
            control_id,
            pb.ControlVerb.Name(verb),
            len(outcomes),
        )
        return reply_of(control_id, outcomes)

    async def _stop_pods(self, pods: list[tuple[str, int]]) -> None:
        """Delete the pods of these (job, attempt)s, once each per process: each runner gets
        SIGTERM, checkpoints and exits."""
        pods = [pod for pod in pods if pod not in self._pods_stopped]
        if not pods:
            return
        slots = asyncio.Semaphore(POD_DELETES_AT_ONCE)

        async def stop(job_id: str, attempt: int) -> None:
            async with slots:
                await self._backend.delete_pod(ids.pod_name(job_id, attempt))
            self._pods_stopped.add((job_id, attempt))
            self.stopped_total += 1

        results = await asyncio.gather(*(stop(*pod) for pod in pods), return_exceptions=True)
        for pod, result in zip(pods, results, strict=True):
            if isinstance(result, Exception):
                log.warning("could not delete the pod of %s attempt %d: %r", *pod, result)

    async def settle_stops(self) -> None:
        """What job control left to do, level-triggered (a crash between a request's event and
        its effect, a cancel folded after the job's attempt ended): end a cancelled job that
        runs nothing, delete the pods of jobs being stopped and of jobs cancelled while bound."""
        pods: list[tuple[str, int]] = list(self._state().take_orphan_pods())
        stopping = self._state().stopping()
        self._pods_stopped &= {(view.job_id, view.attempt) for view in stopping}
        for view in stopping:
            if view.stop is Stop.CANCEL and view.state in IDLE_STATES:
                origin = view.stop_origin or pb.ControlOrigin()
                await self._emitter.emit(
                    view,
                    self._publisher.event(
                        "cancelled",
                        pb.JobCancelled(origin=origin, message=cancel_message(origin)),
                        job_id=view.job_id,
                        attempt=view.attempt,
                    ),
                )
            elif view.state in LIVE_STATES:
                pods.append((view.job_id, view.attempt))
        await self._stop_pods(pods)

    async def close(self) -> None:
        """Close the entrance and refuse what is still queued."""
        if self._desk is not None:
            await self._desk.close()
        self.refuse()
