"""What the metrics service keeps in memory, folded from events (pure: no I/O).

``JobCounts`` folds the jobs log with the shared state machine and keeps how many jobs are in
each state. ``ProgressBoard`` keeps the latest MD step, energy, temperature and speed of each
job's current attempt, the speed over the last report interval (``mdq.core.speed``), and
forgets a job once its attempt is over, so the exported series are those of the jobs running.
``LifecycleClock`` times placement (PENDING → bound) and names what each retry recovered from.
``LoadSummaries`` folds each node's load samples into one summary per fixed interval (the
``node_summary`` events the console's nodes page draws its hour from).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

from mdq.contracts import pb
from mdq.core.speed import interval_ns_per_day
from mdq.core.state import JobBook, JobState, JobView, event_time


class JobCounts:
    """Jobs by state, from the jobs log folded in order."""

    def __init__(self) -> None:
        self.book = JobBook()
        self.counts: Counter[JobState] = Counter()

    def apply(self, sequence: int, event: pb.Event) -> JobView | None:
        """Fold one event; return the job's view if it changed."""
        before = self.book.jobs.get(event.job_id)
        state_before = before.state if before is not None else None
        view = self.book.apply(sequence, event)
        if view is not None and view.state != state_before:
            if state_before is not None:
                self.counts[state_before] -= 1
            self.counts[view.state] += 1
        return view

    def is_over(self, job_id: str, attempt: int) -> bool:
        """Whether the log already says that ``attempt`` of the job ended: the job finished,
        a later attempt was started, or this one failed. The jobs log and the progress log
        are followed apart, so a report may come before its attempt's ``bound``: not over."""
        view = self.book.jobs.get(job_id)
        if view is None:
            return False
        if view.state.terminal or attempt < view.attempt:
            return True
        return attempt == view.attempt and view.state is JobState.RECOVERING


@dataclass(frozen=True, slots=True)
class JobProgress:
    """The latest progress of one attempt of a job."""

    job_id: str
    attempt: int
    step: int
    potential_kj_mol: float
    temperature_k: float = 0.0
    ns_per_day: float | None = None
    """Over the interval since the attempt's previous report; for its first report seen, the
    runner's own figure (since the attempt started stepping); None without MD (a
    minimisation, an analysis) or before any simulated time passed."""
    time_ps: float = 0.0
    at_s: float = 0.0
    """The report's event time, seconds since the epoch."""


class ProgressBoard:
    """The latest progress of each unfinished job (its newest attempt only)."""

    def __init__(self) -> None:
        self.jobs: dict[str, JobProgress] = {}

    def apply(self, event: pb.Event) -> tuple[JobProgress | None, JobProgress | None]:
        """Fold a progress event; return (the entry it replaced if of another attempt, the
        new entry), or (None, None) when it is stale or adds nothing (a report seen before)."""
        previous = self.jobs.get(event.job_id)
        if previous is not None and (
            event.attempt < previous.attempt
            or (event.attempt == previous.attempt and event.progress.step <= previous.step)
        ):
            return None, None
        report = event.progress
        at_s = event.time.seconds + event.time.nanos / 1e9
        speed = None
        if previous is not None and previous.attempt == event.attempt:
            speed = interval_ns_per_day(
                time_ps=report.time_ps,
                at_s=at_s,
                previous_time_ps=previous.time_ps,
                previous_at_s=previous.at_s,
            )
        if speed is None and report.time_ps > 0 and report.ns_per_day > 0:
            speed = report.ns_per_day
        entry = JobProgress(
            job_id=event.job_id,
            attempt=event.attempt,
            step=report.step,
            potential_kj_mol=report.potential_kj_mol,
            temperature_k=report.temperature_k,
            ns_per_day=speed,
            time_ps=report.time_ps,
            at_s=at_s,
        )
        self.jobs[event.job_id] = entry
        replaced = previous if previous is not None and previous.attempt != entry.attempt else None
        return replaced, entry

    def forget(self, job_id: str) -> JobProgress | None:
        """Drop a finished job; return what was shown for it."""
        return self.jobs.pop(job_id, None)


@dataclass(frozen=True, slots=True)
class LifecycleFacts:
    """What one job event adds to the lifecycle metrics."""

    placement_latency_s: float | None = None
    """Seconds from the job becoming PENDING (submitted, released, requeued) to ``bound``."""
    recovery_reason: str | None = None
    """FailureReason name of the failure a ``requeued`` recovered from."""
    steps_lost: int = 0
    """MD steps lost by the failed attempt a ``requeued`` replaced."""


class LifecycleClock:
    """When each job became PENDING, to time placement; what each requeue recovered from.

    Times are the events' own, so the latency is the log's, not when this process saw it.
    Only the event that the state machine accepted counts (the caller passes the view the
    fold returned), so a redelivered or stale event is never counted twice.
    """

    def __init__(self) -> None:
        self.pending_since: dict[str, datetime] = {}

    def apply(self, event: pb.Event, view: JobView) -> LifecycleFacts:
        kind = event.WhichOneof("body")
        at = event_time(event)
        if kind in ("submitted", "released", "requeued") and view.state is JobState.PENDING:
            self.pending_since[event.job_id] = at
        if kind == "bound":
            since = self.pending_since.pop(event.job_id, None)
            latency = None if since is None else max(0.0, (at - since).total_seconds())
            return LifecycleFacts(placement_latency_s=latency)
        if kind == "requeued":
            return LifecycleFacts(
                recovery_reason=pb.FailureReason.Name(event.requeued.after),
                steps_lost=max(0, event.requeued.steps_lost),
            )
        if view.state.terminal:
            self.pending_since.pop(event.job_id, None)
        return LifecycleFacts()


@dataclass(slots=True)
class _NodeInterval:
    """The samples of one node in the open interval, as running sums and peaks."""

    cluster: str
    samples: int = 0
    cpu_sum: float = 0.0
    cpu_max: float = 0.0
    memory_sum: float = 0.0
    memory_max: float = 0.0

    def add(self, load: pb.NodeLoad) -> None:
        self.samples += 1
        self.cpu_sum += load.cpu_load
        self.memory_sum += load.memory_load
        self.cpu_max = max(self.cpu_max, load.cpu_load)
        self.memory_max = max(self.memory_max, load.memory_load)


class LoadSummaries:
    """Each node's load, summarised over fixed intervals of ``interval_s`` that start at whole
    multiples of it since the epoch (so every node's, and every replica's, line up).

    ``add`` takes one round of samples and the time it was taken; when that time lies in a
    later interval than the open one, the open interval is closed and its summaries returned,
    one per node that was sampled in it. Memory: one running sum per node.
    """

    def __init__(self, interval_s: float) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be > 0: {interval_s}")
        self.interval_s = interval_s
        self._index: int | None = None
        self._nodes: dict[str, _NodeInterval] = {}

    def add(self, loads: Iterable[pb.NodeLoad], at: float) -> list[pb.NodeLoadSummary]:
        """Fold the loads sampled at ``at`` (seconds since the epoch); return the summaries of
        the interval this closes (none while the interval is still open)."""
        index = math.floor(at / self.interval_s)
        closed = self._close() if self._index is not None and index != self._index else []
        self._index = index
        for load in loads:
            node = self._nodes.get(load.node)
            if node is None:
                node = self._nodes[load.node] = _NodeInterval(cluster=load.cluster)
            node.add(load)
        return closed

    def _close(self) -> list[pb.NodeLoadSummary]:
        assert self._index is not None
        start = datetime.fromtimestamp(self._index * self.interval_s, UTC)
        end = datetime.fromtimestamp((self._index + 1) * self.interval_s, UTC)
        summaries = []
        for name, node in sorted(self._nodes.items()):
            summary = pb.NodeLoadSummary(
                node=name,
                cluster=node.cluster,
                samples=node.samples,
                cpu_load_mean=node.cpu_sum / node.samples,
                cpu_load_max=node.cpu_max,
                memory_load_mean=node.memory_sum / node.samples,
                memory_load_max=node.memory_max,
            )
            summary.start.FromDatetime(start)
            summary.end.FromDatetime(end)
            summaries.append(summary)
        self._nodes = {}
        return summaries
