"""Dependency chains: WAITING jobs released once their dependencies succeeded, failed or
cancelled with them otherwise, and the final state of a dependency placement no longer
remembers read back from the jobs log (docs/placement.md, "Where the state lives", "Chains and
DAGs")."""

from __future__ import annotations

import logging
from collections.abc import Callable

from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from mdq.bus.outage import warn_try_failed
from mdq.bus.publisher import EventPublisher
from mdq.bus.subjects import Subjects
from mdq.contracts import pb
from mdq.core.placement_state import PlacementState
from mdq.core.state import JobState
from services.placement.emitter import Emitter

log = logging.getLogger("mdq.placement")


class Dependencies:
    """Moves WAITING jobs on as their dependencies end."""

    def __init__(
        self,
        *,
        state: Callable[[], PlacementState],
        publisher: EventPublisher,
        emitter: Emitter,
        js: JetStreamContext,
        subjects: Subjects,
    ) -> None:
        """``state``: placement's state now (a restore replaces it)."""
        self._state = state
        self._publisher = publisher
        self._emitter = emitter
        self._js = js
        self._subjects = subjects

    async def look_up(self) -> bool:
        """Read from the log the final state of each dependency the state no longer remembers
        (it keeps the ``ended_memory`` jobs that ended last): the last ``succeeded`` or
        ``failed`` event on the dependency's own subject. True when any was learned."""
        learned = False
        for job_id in self._state().take_unknown_dependencies():
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
                self._state().ask_again(job_id)
                continue
            if final is None:
                log.warning(
                    "dependency %s is neither live nor ended in the jobs log (aged out?): "
                    "the jobs that depend on it wait",
                    job_id,
                )
                self._state().learn_missing(job_id)
            else:
                self._state().learn_final(job_id, final)
                learned = True
        return learned

    async def release(self) -> None:
        """Release each WAITING job whose dependencies succeeded, fail it when one failed for
        good, cancel it (WAITING or held while WAITING) when one was cancelled."""
        state = self._state()
        held_waiting = [v for v in state.views(JobState.HELD) if v.hold == "WAITING"]
        for view in [*state.views(JobState.WAITING), *held_waiting]:
            cancelled = self._state().cancelled_dependencies(view)
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
            failed = self._state().dependency_verdict(view)
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
