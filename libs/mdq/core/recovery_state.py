"""Recovery's state, as one pure object: the jobs that have not ended, folded from the log.

Recovery decides for RECOVERING jobs only, and what it decides from is each such job's own
history (attempts, failures, checkpoints: ``JobView``). A job that ended (SUCCEEDED or FAILED)
can never be decided again, and nothing of it is asked by any other job, so it is forgotten the
moment its terminal event is folded: the state holds the live jobs and nothing else, whatever
the length of the history (no set of ended ids either: the log never carries a job's
``submitted`` again once the job has events, so an ended job cannot come back).

``snapshot()`` / ``from_snapshot()`` give the JSON the service writes to its snapshot bucket
(``mdq.core.snapshot``, ``mdq.bus.snapshots``), so a restart folds only the log's tail.
"""

from __future__ import annotations

from typing import Any

from mdq.contracts import pb
from mdq.core.state import JobBook, JobState, JobView

SNAPSHOT_VERSION = 1
"""Layout of ``RecoveryState.snapshot()``; a snapshot of any other is not restored."""


class RecoveryState:
    """The live jobs and which of them wait for a decision."""

    def __init__(self) -> None:
        self.book = JobBook()
        self._recovering: set[str] = set()
        self.forgotten = 0
        """Jobs forgotten since the start because they ended."""

    @property
    def last_sequence(self) -> int:
        """The last jobs-stream sequence folded in."""
        return self.book.last_sequence

    def apply(self, sequence: int, event: pb.Event) -> JobView | None:
        """Fold one event; return the view it changed (None: nothing changed). A view that
        ended is returned once more and then forgotten."""
        view = self.book.apply(sequence, event)
        if view is not None:
            self.note(view)
        return view

    def note(self, view: JobView) -> None:
        """Index ``view`` by its state now (after the service applied its own decision)."""
        if view.state is JobState.RECOVERING:
            self._recovering.add(view.job_id)
            return
        self._recovering.discard(view.job_id)
        if view.state.terminal and self.book.jobs.pop(view.job_id, None) is not None:
            self.forgotten += 1

    def recovering(self) -> list[JobView]:
        """The jobs waiting for a decision, by id."""
        return [self.book.jobs[job_id] for job_id in sorted(self._recovering)]

    def get(self, job_id: str) -> JobView | None:
        """The live job ``job_id`` (None: unknown, or ended)."""
        return self.book.jobs.get(job_id)

    def sizes(self) -> dict[str, int]:
        """How many entries each part holds (what memory grows with)."""
        return {"jobs": len(self.book.jobs), "recovering": len(self._recovering)}

    # -- snapshot ---------------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        """The state's content as JSON-able values (the RECOVERING index is derived)."""
        return {
            "version": SNAPSHOT_VERSION,
            "last_sequence": self.book.last_sequence,
            "jobs": [self.book.jobs[job_id].to_dict() for job_id in sorted(self.book.jobs)],
        }

    @classmethod
    def from_snapshot(cls, data: dict[str, Any]) -> RecoveryState:
        """The state ``snapshot`` wrote. Raises ``ValueError`` (or ``KeyError``/``TypeError``
        for a damaged one) for a snapshot it cannot restore; the caller then replays the log."""
        if data.get("version") != SNAPSHOT_VERSION:
            raise ValueError(f"recovery snapshot version {data.get('version')!r} is not mine")
        state = cls()
        state.book.last_sequence = int(data["last_sequence"])
        for raw in data["jobs"]:
            view = JobView.from_dict(raw)
            if view.state.terminal:
                raise ValueError(f"recovery snapshot holds ended job {view.job_id}")
            state.book.jobs[view.job_id] = view
            state.note(view)
        return state
