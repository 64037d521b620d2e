"""The jobs log and the nodes' loads folded into placement's state as they arrive, and what a
pass reads back from the log of a job's bindings (its fence). A ``submitted`` event whose spec
fails validation is never bound (docs/placement.md, "Inputs", "Replicas and restarts")."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import datetime

from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from mdq.bus.codec import decode_event
from mdq.bus.outage import warn_try_failed
from mdq.bus.subjects import Subjects
from mdq.contracts import pb
from mdq.core.placement_state import PlacementState
from mdq.core.spec import SpecError, SpecMemo
from mdq.core.state import JobView, event_time
from services.placement.binder import Binder

log = logging.getLogger("mdq.placement")

REPLAY_PRUNE_BATCH = 1024
"""While placement replays the log (before it has caught up), it forgets ended jobs every this
many, so a cold start's memory follows the live jobs, not the length of the history."""


class Intake:
    """Feeds the logs' events to the state and wakes the loop when they change anything."""

    def __init__(
        self,
        *,
        state: Callable[[], PlacementState],
        binder: Binder,
        changed: Callable[[JobView], None],
        dirty: asyncio.Event,
        caught_up: asyncio.Event,
        nodes_caught_up: asyncio.Event,
        clock: Callable[[], datetime],
        js: JetStreamContext,
        subjects: Subjects,
    ) -> None:
        """``state``: placement's state now (a restore replaces it). ``changed``: told of
        each job whose view an event changed. ``dirty``: set when a pass has work.
        ``caught_up``: set once the jobs log is folded up to its end (replaying until then);
        ``nodes_caught_up`` the same for the nodes log, after which a load report counts as
        made when it arrives, on ``clock`` (``on_node_event``)."""
        self._state = state
        self._binder = binder
        self._changed = changed
        self._dirty = dirty
        self._caught_up = caught_up
        self._nodes_caught_up = nodes_caught_up
        self._clock = clock
        self._js = js
        self._subjects = subjects
        self.invalid_specs_total = 0
        """``submitted`` events whose spec failed validation here: never bound."""
        self._specs = SpecMemo()
        """The specs that passed lately: one that equals one of them (but for its name) passes
        without being normalized again."""

    def is_own_echo(self, sequence: int) -> bool:
        """Whether the log message at ``sequence`` is a bound event this replica applied."""
        if self._binder.forget_echo(sequence):
            # the state holds every event up to it (the log is fed in order): a snapshot
            # taken now reflects this sequence, and a restart need not read it again
            book = self._state().book
            book.last_sequence = max(book.last_sequence, sequence)
            return True
        return False

    def _valid_submitted(self, event: pb.Event) -> bool:
        """Whether a ``submitted`` event's spec passes intake's validation again. Only intake
        may publish it, but placement acts on the spec (its resources, what the pod runs),
        so a forged or corrupt one is skipped, counted and logged, never bound."""
        try:
            self._specs.check(event.submitted.spec, "spec")
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
            self._binder.forget_echo(sequence)  # the echo overtook the publish's ack
        state = self._state()
        folded = state.apply(sequence, event)
        if not self._caught_up.is_set() and state.unpruned_ended >= REPLAY_PRUNE_BATCH:
            # replaying: no pass runs yet, so no view is in use, and ended jobs are let go as
            # the replay goes, not all at once after it (a cold start folds the whole log)
            state.prune()
        if folded is not None:
            view = folded.view
            self._changed(view)
            if folded.suspect:
                log.info(
                    "node %s suspect for %.0fs: %d jobs crashed there",
                    event.attempt_failed.node,
                    state.health.policy.cordon_s,
                    state.health.policy.failures_to_cordon,
                )
            if kind == "bound" and not self._binder.is_binding(view.job_id):
                # bound by someone else (our own bindings are applied before their echo)
                state.note_binding(view, event_time(event))
                self._binder.adopt(view.job_id)
            self._dirty.set()

    async def on_node_event(self, _sequence: int, event: pb.Event) -> None:
        """A node's load report, judged fresh or old on placement's own clock: one that
        arrives live counts as made now, whatever its sender's clock says (a metrics service
        or an agent on a node whose clock is behind would otherwise make every node look
        silent, and nothing would be bound); one read while catching up, maybe long after it
        was made, counts from its own time stamp, never later than now."""
        if event.WhichOneof("body") != "node_load":
            return
        now = self._clock()
        made_at = now if self._nodes_caught_up.is_set() else min(event_time(event), now)
        if self._state().apply_load(event.node_load, made_at):
            self._dirty.set()

    async def learn_fences(self) -> None:
        """Read from the log the last ``bound`` of each job whose publish fence is not known
        (an extended job placement had forgotten, a binding refused by its fence): a binding of
        an earlier attempt becomes the fence, one of the current attempt is left to its echo."""
        for job_id in self._state().take_unknown_fences():
            try:
                message = await self._js.get_last_msg(
                    self._subjects.jobs_stream, self._subjects.job(job_id, "bound")
                )
            except NotFoundError:
                continue
            except Exception as error:
                warn_try_failed(log, f"could not read the last binding of {job_id}", error)
                self._state().ask_fence_again(job_id)
                continue
            view = self._state().book.jobs.get(job_id)
            try:
                bound_attempt = decode_event(message.data or b"").attempt
            except Exception:
                bound_attempt = 0
            if view is None or bound_attempt >= view.attempt:
                continue  # a binding of this attempt is in the log: its echo settles the job
            self._state().fence_learned(job_id, message.seq or 0)
