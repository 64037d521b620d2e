"""What the metrics service keeps in memory, folded from events (pure: no I/O).

``JobCounts`` folds the jobs log with the shared state machine and keeps how many jobs are in
each state. ``ProgressBoard`` keeps the latest MD step and energy of each job's current attempt
and forgets a job once it is finished, so the exported series stay bounded.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from mdq.contracts import pb
from mdq.core.state import JobBook, JobState, JobView


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

    def is_finished(self, job_id: str) -> bool:
        view = self.book.jobs.get(job_id)
        return view is not None and view.state.terminal


@dataclass(frozen=True, slots=True)
class JobProgress:
    """The latest progress of one attempt of a job."""

    job_id: str
    attempt: int
    step: int
    potential_kj_mol: float


class ProgressBoard:
    """The latest progress of each unfinished job (its newest attempt only)."""

    def __init__(self) -> None:
        self.jobs: dict[str, JobProgress] = {}

    def apply(self, event: pb.Event) -> tuple[JobProgress | None, JobProgress | None]:
        """Fold a progress event; return (the entry it replaced if of another attempt, the
        new entry), or (None, None) when it is stale."""
        previous = self.jobs.get(event.job_id)
        if previous is not None and (
            event.attempt < previous.attempt
            or (event.attempt == previous.attempt and event.progress.step < previous.step)
        ):
            return None, None
        entry = JobProgress(
            job_id=event.job_id,
            attempt=event.attempt,
            step=event.progress.step,
            potential_kj_mol=event.progress.potential_kj_mol,
        )
        self.jobs[event.job_id] = entry
        replaced = previous if previous is not None and previous.attempt != entry.attempt else None
        return replaced, entry

    def forget(self, job_id: str) -> JobProgress | None:
        """Drop a finished job; return what was shown for it."""
        return self.jobs.pop(job_id, None)
