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

from mdq.backends.port import ClusterBackend
from mdq.bus.log import follow_log, raise_if_cancelling
from mdq.bus.publisher import EventPublisher
from mdq.bus.snapshots import SnapshotKeeper, SnapshotStore
from mdq.bus.storage import StorageSettings
from mdq.bus.subjects import Subjects
from mdq.bus.tenants import TenantDirectory
from mdq.contracts import pb
from mdq.core.node_health import NodeHealth, NodeHealthPolicy, Suspicion
from mdq.core.placement import (
    NodeState,
)
from mdq.core.placement_state import PlacementState
from mdq.core.state import (
    JobBook,
)
from mdq.core.tenants import RunawayLimits
from mdq.memory import keep_state_out_of_gc
from mdq.settings import LimitSettings
from services.placement.accounting import TenantAccounting
from services.placement.binder import Binder
from services.placement.control import ControlDesk, ControlRegistry
from services.placement.cordons import Cordons
from services.placement.dependencies import Dependencies
from services.placement.emitter import Emitter
from services.placement.expiry import Expiry
from services.placement.intake import REPLAY_PRUNE_BATCH, Intake
from services.placement.job_control import JobControl
from services.placement.lease import LeaderLease
from services.placement.preemption import Preemptor
from services.placement.scores import candidate_entry
from services.placement.settings import PlacementSettings
from services.placement.waiting import WaitingBucket, WaitingExplainer

__all__ = ["REPLAY_PRUNE_BATCH", "Placement", "candidate_entry"]

log = logging.getLogger("mdq.placement")

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
        emitter = Emitter(
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
            emitter=emitter,
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
        self.intake = Intake(
            state=self._current_state,
            binder=self.binder,
            changed=self.explainer.changed,
            dirty=self._dirty,
            caught_up=self._jobs_ready,
            js=js,
            subjects=subjects,
        )
        self.dependencies = Dependencies(
            state=self._current_state,
            publisher=publisher,
            emitter=emitter,
            js=js,
            subjects=subjects,
        )
        self.expiry = Expiry(
            state=self._current_state,
            publisher=publisher,
            emitter=emitter,
            clock=clock,
            jobs_log_days=jobs_log_days,
        )
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
            emitter=emitter,
            backend=backend,
            settings=settings,
            tenants=self.tenants,
            limits=limits if limits is not None else LimitSettings().defaults(),
            desk=self.controls,
            dirty=self._dirty,
            js=js,
            subjects=subjects,
        )

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

    @property
    def invalid_specs_total(self) -> int:
        return self.intake.invalid_specs_total

    def is_own_echo(self, sequence: int) -> bool:
        """Whether the log message at ``sequence`` is a bound event this replica applied."""
        return self.intake.is_own_echo(sequence)

    async def on_job_event(self, sequence: int, event: pb.Event) -> None:
        await self.intake.on_job_event(sequence, event)

    async def on_node_event(self, sequence: int, event: pb.Event) -> None:
        await self.intake.on_node_event(sequence, event)

    async def control(
        self, request: pb.ControlRequest, tenant: str, control_id: str
    ) -> pb.ControlReply:
        """Decide a job-control request in the loop, between passes (``JobControl.control``)."""
        return await self.job_control.control(request, tenant, control_id)

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
        await self.intake.learn_fences()
        await self.expiry.end_expired()
        await self.dependencies.release()
        if await self.dependencies.look_up():
            await self.dependencies.release()  # what the log said releases or fails dependents
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
