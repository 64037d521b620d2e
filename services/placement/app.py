"""The placement service: the log in, bindings and pods out.

Placement keeps no database. It folds the job log (``JobBook``) and the latest load of every
node into memory (on start, from its last snapshot and the log after it when the snapshot is
usable, ``snapshot.py``; else from the whole log), then reconciles level-triggered: WAITING
jobs whose dependencies succeeded are released, PENDING jobs are planned by the pure core
(``mdq.core.placement.plan``) and for each decision it publishes ``bound`` (with the scores
that explain it) and then creates the pod on the chosen node. A high-priority job that fits
nowhere may preempt lower-priority running work (``plan_preemptions``): the victims' pods are
deleted (SIGTERM: the runner checkpoints and exits PREEMPTED; recovery requeues them from that
checkpoint) and the room is held for the preemptor until it is bound.

Safety (docs/placement.md):
- every effect is idempotent: the bound event id and the pod name derive from job and attempt;
- the bound event is published with ``Nats-Expected-Last-Subject-Sequence`` set to the last
  ``bound`` of that job this replica has seen: if anyone else bound the job since, JetStream
  refuses the publish and this replica creates no pod — no job is bound twice, whatever the
  replicas or restarts;
- replicas elect a leader with a KV lease (``lease.py``); followers fold the log and take over
  when the lease expires, first re-creating the pod of every BOUND job (a leader killed between
  publishing ``bound`` and creating the pod leaves exactly that).

State (``mdq.core.placement_state``): everything placement knows — the folded log, the nodes'
loads, reservations, in-flight bindings, fences, nominations, tenants' usage — is one pure
``PlacementState``; this module keeps only I/O (subscriptions, publishes, pods, KV, logs).

Job control (``services.placement.control``, docs/control.md): the leader answers cancel, hold,
release, requeue, reprioritize and extend requests, in this loop between passes, so a job is
never decided on by a pass and a request at once. A job that runs nothing is cancelled or held
by one event; a bound or running one is stopped: the request's event, then its pod deleted (the
runner checkpoints and exits; recovery decides what follows). Each pass also settles what a
crash may have left half done: a cancel folded for a job that runs nothing is ended, a stopping
job's pod is deleted (once per attempt and process), a pod of a job cancelled while bound is
deleted, and a job being stopped never gets a pod (re)created.

Tenants (``mdq.core.tenants``): placement reads each tenant's policy from the tenants bucket
(``TenantDirectory``, live) and binds no job that would take its tenant's BOUND and RUNNING CPU
above ``max_running_cpu``: the job waits (``mdq explain`` says "tenant alice is at its CPU
quota: 8 of 8 cores running"), other tenants' jobs bind meanwhile, and it binds once one of its
tenant's jobs ends. Each tenant's running CPU and queued jobs are kept incrementally as the log
is folded, and written (``TenantUsage``, when they changed) into the waiting bucket under
``tenant.<name>`` for intake's queued-jobs quota.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import Callable
from datetime import UTC, datetime

from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import DeliverPolicy
from nats.js.errors import NotFoundError

from mdq.backends.port import ClusterBackend
from mdq.bus.codec import decode_event
from mdq.bus.log import follow_log, raise_if_cancelling
from mdq.bus.outage import warn_try_failed
from mdq.bus.publisher import EventPublisher
from mdq.bus.snapshots import SnapshotKeeper, SnapshotStore
from mdq.bus.storage import StorageSettings
from mdq.bus.subjects import Subjects
from mdq.bus.tenants import TenantDirectory
from mdq.contracts import pb
from mdq.core.expiry import (
    CHECK_EVERY,
    ENDED_BY_PLACEMENT,
    expired,
    expiry_message,
    max_job_age,
)
from mdq.core.node_health import NodeHealth, NodeHealthPolicy, Suspicion
from mdq.core.placement import (
    NodeState,
)
from mdq.core.placement_state import PlacementState
from mdq.core.spec import SpecError, normalize_job
from mdq.core.state import (
    JobBook,
    JobState,
    JobView,
    event_time,
)
from mdq.core.tenants import RunawayLimits
from mdq.memory import keep_state_out_of_gc
from mdq.settings import LimitSettings
from services.placement.accounting import TenantAccounting
from services.placement.binder import Binder
from services.placement.control import ControlDesk, ControlRegistry
from services.placement.cordons import Cordons
from services.placement.emitter import Emitter
from services.placement.job_control import JobControl
from services.placement.lease import LeaderLease
from services.placement.preemption import Preemptor
from services.placement.scores import candidate_entry
from services.placement.settings import PlacementSettings
from services.placement.waiting import WaitingBucket, WaitingExplainer

__all__ = ["REPLAY_PRUNE_BATCH", "Placement", "candidate_entry"]

log = logging.getLogger("mdq.placement")

REPLAY_PRUNE_BATCH = 1024
"""While placement replays the log (before it has caught up), it forgets ended jobs every this
many, so a cold start's memory follows the live jobs, not the length of the history."""

Clock = Callable[[], datetime]

TENANT_POLICIES_WAIT_S = 10.0
"""At start, how long placement waits for the tenants' policies before it places anyway."""


def _utcnow() -> datetime:
    return datetime.now(UTC)


class Placement:
    """Binds jobs to nodes; one instance per process, any number of replicas."""

    def __init__(
        self,
        *,
        js: JetStreamContext,
        subjects: Subjects,
        publisher: EventPublisher,
        backend: ClusterBackend,
        settings: PlacementSettings,
        namespace: str,
        clock: Clock = _utcnow,
        instance: str = "",
        stream_replicas: int = 1,
        tenants: TenantDirectory | None = None,
        jobs_log_days: float = 365.0,
        nc: Client | None = None,
        storage: StorageSettings | None = None,
        limits: RunawayLimits | None = None,
    ) -> None:
        """``jobs_log_days``: how long the jobs log keeps events (``MDQ_STORAGE_JOBS_DAYS``): a
        job that has waited that long less a day without running is ended
        (``mdq.core.expiry``). ``nc``: the connection job-control requests are answered on
        while this replica leads (None: none are). ``limits``: the operator's default runaway
        limits (``MDQ_LIMITS_*``), which bound an extend where a tenant's policy sets none."""
        self._js = js
        self._subjects = subjects
        self._publisher = publisher
        self._backend = backend
        self._settings = settings
        self._namespace = namespace
        self._clock = clock
        self._jobs_log_days = jobs_log_days
        self._max_age = max_job_age(jobs_log_days)
        self._expiry_checked_at: datetime | None = None
        self.tenants = tenants or TenantDirectory(js, subjects)
        self.instance = instance or f"{socket.gethostname()}-{os.getpid()}-{id(self):x}"
        self._config = settings.placement_config()
        self._lease = (
            LeaderLease(
                js=js,
                bucket=subjects.lease_bucket,
                holder=self.instance,
                ttl_s=settings.lease_ttl_s,
                replicas=stream_replicas,
            )
            if settings.leader_election
            else None
        )
        self._health_policy = NodeHealthPolicy(
            failures_to_cordon=settings.node_failures_to_cordon,
            window_s=settings.node_failure_window_s,
            cordon_s=settings.node_cordon_s,
            max_cordoned_fraction=settings.max_cordoned_fraction,
        )
        self.state = PlacementState(
            self._config,
            load_settle_s=settings.load_settle_s,
            health_policy=self._health_policy,
            fail_on_dependency_failure=settings.fail_on_dependency_failure,
            ended_memory=settings.ended_memory,
        )
        """What placement knows (pure); everything below is this replica's I/O bookkeeping."""
        self.cordons = Cordons(self._current_state)
        bucket = WaitingBucket(js, bucket=subjects.waiting_bucket, replicas=stream_replicas)
        self.accounting = TenantAccounting(
            state=self._current_state,
            tenants=self.tenants,
            settings=settings,
            clock=clock,
            bucket=bucket,
        )
        self.explainer = WaitingExplainer(
            state=self._current_state,
            config=self._config,
            settings=settings,
            bucket=bucket,
            cordons=self.cordons.failure_cordons,
            shares=self.accounting.shares,
            maximum=self.accounting.maximum,
        )
        self._emitter = Emitter(
            state=self._current_state, publisher=publisher, changed=self.explainer.changed
        )
        self.preemptor = Preemptor(
            state=self._current_state,
            backend=backend,
            settings=settings,
            config=self._config,
            shares=self.accounting.shares,
        )
        self.binder = Binder(
            state=self._current_state,
            publisher=publisher,
            backend=backend,
            settings=settings,
            config=self._config,
            emitter=self._emitter,
            cordons=self.cordons,
            accounting=self.accounting,
            explainer=self.explainer,
            preemptor=self.preemptor,
        )
        self._snapshots = SnapshotKeeper(
            SnapshotStore(
                js,
                bucket=subjects.placement_snapshot_bucket,
                stream=subjects.jobs_stream,
                replicas=stream_replicas,
            ),
            logger=log,
        )
        """SHA-256 of the state last written as (or restored from) the snapshot."""
        self._snapshot_at: float | None = None
        self.restored_sequence = 0
        """The jobs-stream sequence of the snapshot this replica started from (0: it replayed
        the whole log)."""
        self.snapshots_written = 0
        self.snapshot_decisions = 0
        """How many times an interval passed and the snapshot was written or found unchanged."""
        self._stream_replicas = stream_replicas
        self._dirty = asyncio.Event()
        self._jobs_ready = asyncio.Event()
        self._nodes_ready = asyncio.Event()
        self.leader = self._lease is None
        self.passes_total = 0
        """Reconcile passes begun (tests wait for passes instead of sleeping)."""
        self.controls = (
            None
            if nc is None
            else ControlDesk(
                nc=nc,
                subjects=subjects,
                registry=ControlRegistry(js, subjects, replicas=stream_replicas, storage=storage),
                decide=self.control,
                allow_high=lambda tenant: not tenant or self.tenants.policy(tenant).allow_high,
            )
        )
        self.job_control = JobControl(
            state=self._current_state,
            publisher=publisher,
            emitter=self._emitter,
            backend=backend,
            settings=settings,
            tenants=self.tenants,
            limits=limits if limits is not None else LimitSettings().defaults(),
            desk=self.controls,
            dirty=self._dirty,
            js=js,
            subjects=subjects,
        )
        self.invalid_specs_total = 0
        """``submitted`` events whose spec failed validation here: never bound."""

    # -- the state ---------------------------------------------------------------------------
    def _current_state(self) -> PlacementState:
        """The state now, for the parts (``restore`` replaces it)."""
        return self.state

    @property
    def book(self) -> JobBook:
        """The jobs folded from the log (``PlacementState.book``)."""
        return self.state.book

    @property
    def nodes(self) -> dict[str, NodeState]:
        """Each node's latest load report (``PlacementState.nodes``)."""
        return self.state.nodes

    @property
    def health(self) -> NodeHealth:
        """Recent crashes per node and the suspicions they caused."""
        return self.state.health

    @property
    def bound_total(self) -> int:
        return self.binder.bound_total

    @property
    def fenced_total(self) -> int:
        return self.binder.fenced_total

    @property
    def reclaimed_total(self) -> int:
        return self.preemptor.reclaimed_total

    def tenant_usage(self, tenant: str) -> tuple[int, float]:
        """``tenant``'s jobs not running yet and the CPU of its BOUND and RUNNING jobs."""
        return self.state.tenant_usage(tenant)

    def _changed(self, view: JobView) -> None:
        """A job's view changed: an explanation of why it waits is kept only while PENDING."""
        self.explainer.changed(view)

    # -- folding the log -------------------------------------------------------------------
    def is_own_echo(self, sequence: int) -> bool:
        """Whether the log message at ``sequence`` is a bound event this replica applied."""
        if self.binder.forget_echo(sequence):
            # the state holds every event up to it (the log is fed in order): a snapshot
            # taken now reflects this sequence, and a restart need not read it again
            self.book.last_sequence = max(self.book.last_sequence, sequence)
            return True
        return False

    def _valid_submitted(self, event: pb.Event) -> bool:
        """Whether a ``submitted`` event's spec passes intake's validation again. Only intake
        may publish it, but placement acts on the spec (its resources, what the pod runs),
        so a forged or corrupt one is skipped, counted and logged, never bound."""
        try:
            normalize_job(event.submitted.spec, "spec")
        except SpecError as error:
            self.invalid_specs_total += 1
            log.error(
                "ignoring job %s: its submitted spec is invalid (%s); it is never bound",
                event.job_id,
                error,
            )
            return False
        return True

    async def on_job_event(self, sequence: int, event: pb.Event) -> None:
        kind = event.WhichOneof("body")
        if kind == "submitted" and not self._valid_submitted(event):
            return
        if kind == "bound":
            self.binder.forget_echo(sequence)  # the echo overtook the publish's ack
        folded = self.state.apply(sequence, event)
        if not self._jobs_ready.is_set() and self.state.unpruned_ended >= REPLAY_PRUNE_BATCH:
            # replaying: no pass runs yet, so no view is in use, and ended jobs are let go as
            # the replay goes, not all at once after it (a cold start folds the whole log)
            self.state.prune()
        if folded is not None:
            view = folded.view
            self._changed(view)
            if folded.suspect:
                log.info(
                    "node %s suspect for %.0fs: %d jobs crashed there",
                    event.attempt_failed.node,
                    self.health.policy.cordon_s,
                    self.health.policy.failures_to_cordon,
                )
            if kind == "bound" and not self.binder.is_binding(view.job_id):
                # bound by someone else (our own bindings are applied before their echo)
                self.state.note_binding(view, event_time(event))
                self.binder.adopt(view.job_id)
            self._dirty.set()

    async def on_node_event(self, _sequence: int, event: pb.Event) -> None:
        if event.WhichOneof("body") != "node_load":
            return
        if self.state.apply_load(event.node_load, event_time(event)):
            self._dirty.set()

    # -- job control -------------------------------------------------------------------------
    async def control(
        self, request: pb.ControlRequest, tenant: str, control_id: str
    ) -> pb.ControlReply:
        """Decide a job-control request in the loop, between passes (``JobControl.control``)."""
        return await self.job_control.control(request, tenant, control_id)

    async def _learn_fences(self) -> None:
        """Read from the log the last ``bound`` of each job whose publish fence is not known
        (an extended job placement had forgotten, a binding refused by its fence): a binding of
        an earlier attempt becomes the fence, one of the current attempt is left to its echo."""
        for job_id in self.state.take_unknown_fences():
            try:
                message = await self._js.get_last_msg(
                    self._subjects.jobs_stream, self._subjects.job(job_id, "bound")
                )
            except NotFoundError:
                continue
            except Exception as error:
                warn_try_failed(log, f"could not read the last binding of {job_id}", error)
                self.state.ask_fence_again(job_id)
                continue
            view = self.book.jobs.get(job_id)
            try:
                bound_attempt = decode_event(message.data or b"").attempt
            except Exception:
                bound_attempt = 0
            if view is None or bound_attempt >= view.attempt:
                continue  # a binding of this attempt is in the log: its echo settles the job
            self.state.fence_learned(job_id, message.seq or 0)

    # -- deciding --------------------------------------------------------------------------
    async def _look_up_dependencies(self) -> bool:
        """Read from the log the final state of each dependency the state no longer remembers
        (it keeps the ``ended_memory`` jobs that ended last): the last ``succeeded`` or
        ``failed`` event on the dependency's own subject. True when any was learned."""
        learned = False
        for job_id in self.state.take_unknown_dependencies():
            final: JobState | None = None
            try:
                for kind, state in (
                    ("succeeded", JobState.SUCCEEDED),
                    ("failed", JobState.FAILED),
                    ("cancelled", JobState.CANCELLED),
                ):
                    try:
                        await self._js.get_last_msg(
                            self._subjects.jobs_stream, self._subjects.job(job_id, kind)
                        )
                    except NotFoundError:
                        continue
                    final = state
                    break
            except Exception as error:  # asked again on a later pass
                warn_try_failed(log, f"could not read dependency {job_id} from the log", error)
                self.state.ask_again(job_id)
                continue
            if final is None:
                log.warning(
                    "dependency %s is neither live nor ended in the jobs log (aged out?): "
                    "the jobs that depend on it wait",
                    job_id,
                )
                self.state.learn_missing(job_id)
            else:
                self.state.learn_final(job_id, final)
                learned = True
        return learned

    async def _release_waiting(self) -> None:
        held_waiting = [v for v in self.state.views(JobState.HELD) if v.hold == "WAITING"]
        for view in [*self.state.views(JobState.WAITING), *held_waiting]:
            cancelled = self.state.cancelled_dependencies(view)
            if cancelled:
                names = ", ".join(cancelled)
                await self._emitter.emit(
                    view,
                    self._publisher.event(
                        "cancelled",
                        pb.JobCancelled(
                            dependency=cancelled[0],
                            message=f"dependency {names} was cancelled",
                        ),
                        job_id=view.job_id,
                        attempt=view.attempt,
                    ),
                )
                continue
            if view.state is not JobState.WAITING:
                continue
            failed = self.state.dependency_verdict(view)
            if failed:
                names = ", ".join(failed)
                await self._emitter.emit(
                    view,
                    self._publisher.event(
                        "failed",
                        pb.JobFailed(
                            reason=pb.FAILURE_DEPENDENCY_FAILED,
                            message=f"dependency failed for good: {names}",
                        ),
                        job_id=view.job_id,
                        attempt=view.attempt,
                    ),
                )
            elif failed is not None:
                await self._emitter.emit(
                    view,
                    self._publisher.event(
                        "released",
                        pb.JobReleased(depends_on_ids=list(view.depends_on_ids)),
                        job_id=view.job_id,
                        attempt=0,
                    ),
                )

    async def _end_expired(self) -> None:
        """End every job that has waited as long as the jobs log keeps events, less a day,
        without an attempt under way (``FAILURE_EXPIRED``)."""
        now = self._clock()
        if self._expiry_checked_at is not None and now - self._expiry_checked_at < CHECK_EVERY:
            return  # not on every pass: a flood's pending jobs would be walked each time
        self._expiry_checked_at = now
        for state in ENDED_BY_PLACEMENT:
            for view in self.state.views(state):
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

    def failure_cordons(self, now: datetime) -> dict[str, Suspicion]:
        """The cordons placement imposes now (``Cordons.failure_cordons``)."""
        return self.cordons.failure_cordons(now)

    def snapshot(self, now: datetime) -> list[NodeState]:
        """Copies of the known nodes as a pass sees them now (``Cordons.nodes``)."""
        return self.cordons.nodes(now)

    async def reconcile(self) -> int:
        """One pass: release chains, bind what fits, preempt for what does not fit.

        Returns the number of jobs bound.
        """
        self.passes_total += 1
        await self.job_control.settle_stops()
        await self._learn_fences()
        await self._end_expired()
        await self._release_waiting()
        if await self._look_up_dependencies():
            await self._release_waiting()  # what the log said releases or fails its dependents
        await self.binder.ensure_adopted()
        now = self._clock()
        try:
            return await self.binder.place(now)
        finally:
            await self.accounting.write_usage()

    async def repair(self) -> None:
        """On taking over: make sure every BOUND job's pod exists (create is idempotent)."""
        await self.binder.repair()

    # -- running ---------------------------------------------------------------------------
    async def restore(self) -> int:
        """Start from the snapshot if it may be used (``mdq.core.snapshot.resume``);
        returns the jobs-stream sequence it reflects (0: the whole log is to be replayed).
        Logs one line either way."""
        restored = await self._snapshots.restore(
            lambda data: PlacementState.from_snapshot(
                data,
                self._config,
                load_settle_s=self._settings.load_settle_s,
                health_policy=self._health_policy,
                fail_on_dependency_failure=self._settings.fail_on_dependency_failure,
                ended_memory=self._settings.ended_memory,
            )
        )
        if restored is None:
            return 0
        self.state, self.restored_sequence = restored
        return self.restored_sequence

    async def _write_snapshot(self) -> None:
        """Write the snapshot, at most every ``snapshot_interval_s`` and only when the state
        changed since it was last written (or restored). Best effort: a snapshot that cannot
        be written only makes the next restart replay more of the log."""
        interval = self._settings.snapshot_interval_s
        now = asyncio.get_running_loop().time()
        if interval <= 0 or (self._snapshot_at is not None and now - self._snapshot_at < interval):
            return
        self._snapshot_at = now
        if not self.book.last_sequence:
            return
        written = await self._snapshots.write(self.state.snapshot(), now=self._clock())
        self.snapshot_decisions += 1
        if written:
            self.snapshots_written += 1

    async def _caught_up_jobs(self) -> None:
        self._jobs_ready.set()

    async def _caught_up_nodes(self) -> None:
        self._nodes_ready.set()

    async def _keep_lease(self, lease: LeaderLease) -> None:
        """Take or renew the lease every third of its TTL; flip ``leader`` accordingly."""
        interval = self._settings.lease_ttl_s / 3
        while True:
            try:
                held = await lease.try_acquire()
            except Exception:
                log.exception("lease check failed")
                held = False
            raise_if_cancelling()  # else a stopped replica would go on renewing its lease
            if held and not self.leader:
                await self.repair()
                self._dirty.set()
            self.leader = held
            await asyncio.sleep(interval)

    async def run(self) -> None:
        """Follow the logs and reconcile (while leader), forever."""
        after = await self.restore()
        tasks = [
            asyncio.create_task(
                follow_log(
                    self._js,
                    self._subjects.job_all("*"),
                    on_event=self.on_job_event,
                    on_caught_up=self._caught_up_jobs,
                    skip=self.is_own_echo,
                    start_sequence=after + 1 if after else 0,
                ),
                name="placement-jobs",
            ),
            asyncio.create_task(
                follow_log(
                    self._js,
                    self._subjects.node_load("*"),
                    on_event=self.on_node_event,
                    on_caught_up=self._caught_up_nodes,
                    deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
                ),
                name="placement-nodes",
            ),
        ]
        try:
            if not await self.tenants.wait_synced(TENANT_POLICIES_WAIT_S):
                log.warning(
                    "tenant policies not read after %.0f s; placing with what is known",
                    TENANT_POLICIES_WAIT_S,
                )
            await self._jobs_ready.wait()
            await self._nodes_ready.wait()
            log.info("caught up: %d jobs, %d nodes", len(self.book.jobs), len(self.nodes))
            tasks.append(asyncio.create_task(keep_state_out_of_gc(), name="gc"))
            if self._lease is not None:
                tasks.append(asyncio.create_task(self._keep_lease(self._lease), name="lease"))
            else:
                await self.repair()
            while True:
                for task in tasks:
                    if task.done():
                        task.result()
                self._dirty.clear()
                self.state.prune()  # between passes: no view of an ended job is in use
                await self.job_control.serve(self.leader)
                if self.leader:
                    try:
                        started = time.perf_counter()
                        bound = await self.reconcile()
                        if bound:
                            log.info(
                                "bound %d jobs in %.1f ms",
                                bound,
                                1000 * (time.perf_counter() - started),
                            )
                    except Exception:
                        log.exception("reconcile failed; retrying")
                        await asyncio.sleep(0.5)
                    await self._write_snapshot()
                else:
                    self.binder.drop_adopted()
                raise_if_cancelling()  # a cancel that a pass's NATS requests dropped
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self._settings.reconcile_interval_s):
                        await self._dirty.wait()
        finally:
            for task in tasks:
                task.cancel()
            await self.job_control.close()
            await self.tenants.close()
            if self._lease is not None:
                with contextlib.suppress(Exception):
                    await asyncio.shield(self._lease.release())
