"""The placement service: the log in, bindings and pods out.

Placement keeps no database. It folds the job log (``JobBook``) and the latest load of every
node into memory, then reconciles level-triggered: WAITING jobs whose dependencies succeeded
are released, PENDING jobs are planned by the pure core (``mdq.core.placement.plan``) and for
each decision it publishes ``bound`` (with every node's score) and then creates the pod on the
chosen node. Both effects are idempotent (the event id and the pod name are derived from job
and attempt), so a restart — which folds the log again and repairs BOUND jobs whose pod may
never have been created — binds no job twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from nats.js import JetStreamContext
from nats.js.api import DeliverPolicy

from mdq.backends.port import ClusterBackend, PodExists, PodSpec
from mdq.bus.log import follow_log
from mdq.bus.publisher import EventPublisher
from mdq.bus.subjects import Subjects
from mdq.contracts import pb
from mdq.core import ids
from mdq.core.placement import Decision, NodeState, PlacementConfig, QueuedJob, plan
from mdq.core.runner_task import RunnerTask, job_dir
from mdq.core.state import JobBook, JobState, JobView, event_time
from services.placement.settings import PlacementSettings

log = logging.getLogger("mdq.placement")

Clock = Callable[[], datetime]


def _utcnow() -> datetime:
    return datetime.now(UTC)


class Placement:
    """Binds jobs to nodes; one instance per process (see docs for running replicas)."""

    def __init__(
        self,
        *,
        js: JetStreamContext,
        subjects: Subjects,
        publisher: EventPublisher,
        backend: ClusterBackend,
        settings: PlacementSettings,
        nats_url: str,
        namespace: str,
        data_dir: Path,
        clock: Clock = _utcnow,
    ) -> None:
        self._js = js
        self._subjects = subjects
        self._publisher = publisher
        self._backend = backend
        self._settings = settings
        self._runner_nats_url = settings.runner_nats_url or nats_url
        self._namespace = namespace
        self._data_dir = data_dir
        self._clock = clock
        self._config = PlacementConfig(
            overload_threshold=settings.overload_threshold,
            overload_penalty=settings.overload_penalty,
            load_timeout_s=settings.load_timeout_s,
        )
        self.book = JobBook()
        self.nodes: dict[str, NodeState] = {}
        self._by_state: dict[JobState, set[str]] = {state: set() for state in JobState}
        self._dirty = asyncio.Event()
        self._jobs_ready = asyncio.Event()
        self._nodes_ready = asyncio.Event()
        self.bound_total = 0

    # -- folding the log -------------------------------------------------------------------
    def _index(self, view: JobView) -> None:
        for state, members in self._by_state.items():
            if state is view.state:
                members.add(view.job_id)
            else:
                members.discard(view.job_id)

    async def on_job_event(self, sequence: int, event: pb.Event) -> None:
        view = self.book.apply(sequence, event)
        if view is not None:
            self._index(view)
            self._dirty.set()

    async def on_node_event(self, _sequence: int, event: pb.Event) -> None:
        if event.WhichOneof("body") != "node_load":
            return
        load = event.node_load
        known = self.nodes.get(load.node)
        reported_at = event_time(event)
        if known is None:
            self.nodes[load.node] = NodeState(
                name=load.node,
                cpu_capacity=load.cpu_capacity,
                memory_capacity_mb=load.memory_capacity_mb,
                ready=load.ready,
                cpu_load=load.cpu_load,
                memory_load=load.memory_load,
                reported_at=reported_at,
            )
        elif reported_at >= known.reported_at:
            known.cpu_capacity, known.memory_capacity_mb = (
                load.cpu_capacity,
                load.memory_capacity_mb,
            )
            known.ready, known.cpu_load = load.ready, load.cpu_load
            known.memory_load, known.reported_at = load.memory_load, reported_at
        self._dirty.set()

    # -- deciding --------------------------------------------------------------------------
    def _views(self, state: JobState) -> list[JobView]:
        return [self.book.jobs[job_id] for job_id in self._by_state[state]]

    async def _release_waiting(self) -> None:
        for view in self._views(JobState.WAITING):
            deps = [self.book.jobs.get(dep) for dep in view.depends_on_ids]
            failed = [d for d in deps if d is not None and d.state is JobState.FAILED]
            if failed and self._settings.fail_on_dependency_failure:
                names = ", ".join(d.job_id for d in failed)
                await self._emit_and_apply(
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
            elif all(d is not None and d.state is JobState.SUCCEEDED for d in deps):
                await self._emit_and_apply(
                    view,
                    self._publisher.event(
                        "released",
                        pb.JobReleased(depends_on_ids=list(view.depends_on_ids)),
                        job_id=view.job_id,
                        attempt=0,
                    ),
                )

    async def _emit_and_apply(self, view: JobView, event: pb.Event) -> None:
        """Publish an event and fold it in at once (the log echoes it later, a no-op then)."""
        await self._publisher.publish(event)
        if view.apply(event):
            self._index(view)

    def _snapshot(self) -> list[NodeState]:
        for node in self.nodes.values():
            node.reserved_cpu, node.reserved_memory_mb = 0.0, 0
        for state in (JobState.BOUND, JobState.RUNNING):
            for view in self._views(state):
                if (host := self.nodes.get(view.node)) is not None:
                    host.reserved_cpu += view.resources.cpu
                    host.reserved_memory_mb += view.resources.memory_mb
        return sorted(self.nodes.values(), key=lambda node: node.name)

    def _queue(self, now: datetime) -> list[QueuedJob]:
        return [
            QueuedJob(
                job_id=view.job_id,
                cpu=view.resources.cpu,
                memory_mb=view.resources.memory_mb,
                priority=view.priority,
                submitted_at=view.submitted_at,
                avoid_nodes=frozenset(view.avoid_nodes),
            )
            for view in self._views(JobState.PENDING)
            if view.not_before is None or view.not_before <= now
        ]

    def pod_for(self, view: JobView) -> PodSpec:
        """The pod of the job's current attempt on its bound node."""
        task = RunnerTask(
            job_id=view.job_id,
            attempt=view.attempt,
            spec=view.spec,
            job_dir=job_dir(self._data_dir, view.job_id),
            threads=max(1, math.ceil(view.resources.cpu)),
            resume_from=view.resume_from,
            input_dirs=tuple(job_dir(self._data_dir, dep) for dep in view.depends_on_ids),
        )
        env = task.to_env() | {
            "NATS_URL": self._runner_nats_url,
            "MDQ_NAMESPACE": self._namespace,
            "MDQ_DATA_DIR": str(self._data_dir),
        }
        return PodSpec(
            name=ids.pod_name(view.job_id, view.attempt),
            job_id=view.job_id,
            attempt=view.attempt,
            node=view.node,
            cpu=view.resources.cpu,
            memory_mb=view.resources.memory_mb,
            priority_class=view.spec.priority_class,
            command=tuple(self._settings.runner_command),
            env=env,
        )

    async def _ensure_pod(self, view: JobView) -> None:
        with contextlib.suppress(PodExists):
            await self._backend.create_pod(self.pod_for(view))

    async def _bind(self, decision: Decision) -> None:
        view = self.book.jobs[decision.job_id]
        body = pb.JobBound(
            node=decision.node,
            pod_name=ids.pod_name(view.job_id, view.attempt),
            candidates=[
                pb.NodeScore(
                    node=s.node,
                    score=s.score,
                    filtered=s.filtered,
                    cpu_load=s.cpu_load,
                    memory_load=s.memory_load,
                )
                for s in decision.scores
            ],
        )
        body.resources.CopyFrom(view.resources)
        if view.resume_from is not None:
            body.resume_from.CopyFrom(view.resume_from)
        event = self._publisher.event("bound", body, job_id=view.job_id, attempt=view.attempt)
        await self._emit_and_apply(view, event)
        await self._ensure_pod(view)
        self.bound_total += 1

    async def reconcile(self) -> int:
        """One pass: release chains, bind what fits. Returns the number of jobs bound."""
        await self._release_waiting()
        now = self._clock()
        decisions = plan(self._snapshot(), self._queue(now), now, self._config)
        await asyncio.gather(*(self._bind(decision) for decision in decisions))
        return len(decisions)

    async def repair(self) -> None:
        """After a restart: make sure every BOUND job's pod exists (create is idempotent)."""
        await asyncio.gather(*(self._ensure_pod(v) for v in self._views(JobState.BOUND)))

    # -- running ---------------------------------------------------------------------------
    async def _caught_up_jobs(self) -> None:
        self._jobs_ready.set()

    async def _caught_up_nodes(self) -> None:
        self._nodes_ready.set()

    async def run(self) -> None:
        """Follow the logs and reconcile, forever."""
        followers = [
            asyncio.create_task(
                follow_log(
                    self._js,
                    self._subjects.job_all("*"),
                    on_event=self.on_job_event,
                    on_caught_up=self._caught_up_jobs,
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
            await self._jobs_ready.wait()
            await self._nodes_ready.wait()
            log.info("caught up: %d jobs, %d nodes", len(self.book.jobs), len(self.nodes))
            await self.repair()
            while True:
                for task in followers:
                    if task.done():
                        task.result()
                self._dirty.clear()
                try:
                    bound = await self.reconcile()
                    if bound:
                        log.info("bound %d jobs", bound)
                except Exception:
                    log.exception("reconcile failed; retrying")
                    await asyncio.sleep(0.5)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(
                        self._dirty.wait(), timeout=self._settings.reconcile_interval_s
                    )
        finally:
            for task in followers:
                task.cancel()
