"""The placement service: the jobs log in, bindings and pods out (docs/placement.md, job
control: docs/control.md). ``Placement`` composes the parts of this package, each I/O with one
concern around the pure ``PlacementState`` (docs/architecture.md, "Inside placement", lists
them), orders a pass's steps (``reconcile``) and is the service's face: what ``__main__``, the
tests and the benchmarks use."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from datetime import datetime

from nats.aio.client import Client
from nats.js import JetStreamContext

from mdq.backends.port import ClusterBackend
from mdq.bus.lease import LeaderLease
from mdq.bus.publisher import EventPublisher
from mdq.bus.storage import StorageSettings
from mdq.bus.subjects import Subjects
from mdq.bus.tenants import TenantDirectory
from mdq.contracts import pb
from mdq.core.node_health import NodeHealthPolicy, Suspicion
from mdq.core.placement import NodeState
from mdq.core.placement_state import PlacementState
from mdq.core.state import JobBook
from mdq.core.tenants import RunawayLimits
from mdq.core.timestamps import utc_now
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
from services.placement.loop import ServiceLoop
from services.placement.preemption import Preemptor
from services.placement.scores import candidate_entry
from services.placement.settings import PlacementSettings
from services.placement.snapshots import StateSnapshots
from services.placement.waiting import WaitingBucket, WaitingExplainer

__all__ = ["REPLAY_PRUNE_BATCH", "Placement", "candidate_entry"]

Clock = Callable[[], datetime]


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
        clock: Clock = utc_now,
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
        self._clock = clock
        self.tenants = tenants or TenantDirectory(js, subjects)
        self.instance = instance or f"{socket.gethostname()}-{os.getpid()}-{id(self):x}"
        config = settings.placement_config()
        lease = (
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
        health_policy = NodeHealthPolicy(
            failures_to_cordon=settings.node_failures_to_cordon,
            window_s=settings.node_failure_window_s,
            cordon_s=settings.node_cordon_s,
            max_cordoned_fraction=settings.max_cordoned_fraction,
        )
        self.state = PlacementState(
            config,
            load_settle_s=settings.load_settle_s,
            health_policy=health_policy,
            fail_on_dependency_failure=settings.fail_on_dependency_failure,
            ended_memory=settings.ended_memory,
        )
        """What placement knows (pure); the parts below hold only this replica's I/O
        bookkeeping, and ask for the state each time (``restore`` replaces it)."""
        self.restored_sequence = 0
        """The jobs-stream sequence of the snapshot this replica started from (0: it replayed
        the whole log)."""
        self.snapshots = StateSnapshots(
            js=js,
            subjects=subjects,
            replicas=stream_replicas,
            settings=settings,
            config=config,
            health_policy=health_policy,
            clock=clock,
        )
        self.service_loop = ServiceLoop(js=js, subjects=subjects, settings=settings, lease=lease)
        self.passes_total = 0
        """Reconcile passes begun (tests wait for passes instead of sleeping)."""

        state = self._current_state
        bucket = WaitingBucket(js, bucket=subjects.waiting_bucket, replicas=stream_replicas)
        self.cordons = Cordons(state)
        self.accounting = TenantAccounting(
            state=state, tenants=self.tenants, settings=settings, clock=clock, bucket=bucket
        )
        self.explainer = WaitingExplainer(
            state=state,
            config=config,
            settings=settings,
            bucket=bucket,
            cordons=self.cordons.failure_cordons,
            shares=self.accounting.shares,
            maximum=self.accounting.maximum,
        )
        emitter = Emitter(state=state, publisher=publisher, changed=self.explainer.changed)
        self.preemptor = Preemptor(
            state=state,
            backend=backend,
            settings=settings,
            config=config,
            shares=self.accounting.shares,
        )
        self.binder = Binder(
            state=state,
            publisher=publisher,
            backend=backend,
            settings=settings,
            config=config,
            emitter=emitter,
            cordons=self.cordons,
            accounting=self.accounting,
            explainer=self.explainer,
            preemptor=self.preemptor,
        )
        self.intake = Intake(
            state=state,
            binder=self.binder,
            changed=self.explainer.changed,
            dirty=self.service_loop.dirty,
            caught_up=self.service_loop.jobs_ready,
            nodes_caught_up=self.service_loop.nodes_ready,
            clock=clock,
            js=js,
            subjects=subjects,
        )
        self.dependencies = Dependencies(
            state=state, publisher=publisher, emitter=emitter, js=js, subjects=subjects
        )
        self.expiry = Expiry(
            state=state,
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
            state=state,
            publisher=publisher,
            emitter=emitter,
            backend=backend,
            settings=settings,
            tenants=self.tenants,
            limits=limits if limits is not None else LimitSettings().defaults(),
            desk=self.controls,
            dirty=self.service_loop.dirty,
            js=js,
            subjects=subjects,
        )

    # -- the state and the counters ------------------------------------------------------------
    def _current_state(self) -> PlacementState:
        """The state now, for the parts (``restore`` replaces it)."""
        return self.state

    @property
    def leader(self) -> bool:
        """Whether this replica places jobs now (it holds the lease, or there is none)."""
        return self.service_loop.leader

    @property
    def book(self) -> JobBook:
        """The jobs folded from the log (``PlacementState.book``)."""
        return self.state.book

    @property
    def nodes(self) -> dict[str, NodeState]:
        """Each node's latest load report (``PlacementState.nodes``)."""
        return self.state.nodes

    def tenant_usage(self, tenant: str) -> tuple[int, float]:
        """``tenant``'s jobs not running yet and the CPU of its BOUND and RUNNING jobs."""
        return self.state.tenant_usage(tenant)

    def failure_cordons(self, now: datetime) -> dict[str, Suspicion]:
        """The cordons placement imposes now (``Cordons.failure_cordons``)."""
        return self.cordons.failure_cordons(now)

    def snapshot(self, now: datetime) -> list[NodeState]:
        """Copies of the known nodes as a pass sees them now (``Cordons.nodes``)."""
        return self.cordons.nodes(now)

    @property
    def bound_total(self) -> int:
        return self.binder.bound_total

    @property
    def fenced_total(self) -> int:
        return self.binder.fenced_total

    @property
    def reclaimed_total(self) -> int:
        return self.preemptor.reclaimed_total

    @property
    def invalid_specs_total(self) -> int:
        return self.intake.invalid_specs_total

    @property
    def snapshots_written(self) -> int:
        return self.snapshots.snapshots_written

    @property
    def snapshot_decisions(self) -> int:
        return self.snapshots.snapshot_decisions

    # -- the logs in, job control ----------------------------------------------------------------
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

    # -- a pass ----------------------------------------------------------------------------------
    async def reconcile(self) -> int:
        """One pass: settle job control's stops, end expired jobs, release chains, bind what
        fits, preempt for what does not fit.

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

    # -- running ---------------------------------------------------------------------------------
    async def restore(self) -> int:
        """Start from the snapshot if it may be used (``mdq.core.snapshot.resume``);
        returns the jobs-stream sequence it reflects (0: the whole log is to be replayed).
        Logs one line either way."""
        restored = await self.snapshots.restore()
        if restored is None:
            return 0
        self.state, self.restored_sequence = restored
        return self.restored_sequence

    async def run(self) -> None:
        """Follow the logs and reconcile (while leader), forever (``ServiceLoop.run``)."""
        await self.service_loop.run(self)
