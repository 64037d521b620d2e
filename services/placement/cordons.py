"""The failure cordons placement imposes on each pass, within the cordon budget, and their log
lines, one per episode (docs/placement.md, "Cordons")."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime

from mdq.core.node_health import NodeCapacity, Suspicion
from mdq.core.placement import NodeState
from mdq.core.placement_state import PlacementState

log = logging.getLogger("mdq.placement")


class Cordons:
    """Weighs the suspect nodes against the cordon budget and logs what it decides."""

    def __init__(self, state: Callable[[], PlacementState]) -> None:
        """``state``: placement's state now (a restore replaces it)."""
        self._state = state
        self._notes: dict[str, tuple[datetime | str, bool]] = {}
        """node -> (episode start, cordoned or held back) last logged, so each is logged once."""

    def _capacities(self, now: datetime) -> list[NodeCapacity]:
        """What the cordon budget weighs (``PlacementState.capacities``)."""
        return self._state().capacities(now)

    def failure_cordons(self, now: datetime) -> dict[str, Suspicion]:
        """The cordons placement imposes now (nodes whose environment fails, nodes where jobs
        kept crashing), within the budget; logs each cordon, and each suspect the budget leaves
        open, once per episode."""
        state = self._state()
        # most passes: no node to weigh, and no capacities to build
        if not state.health.suspects(now) and not state.has_node_problems():
            if self._notes:
                self._notes.clear()
            return {}
        cordons = state.health.cordons(now, self._capacities(now))
        for suspicion in cordons.cordoned.values():
            self._note(suspicion, cordoned=True)
        for suspicion in cordons.held_back:
            self._note(suspicion, cordoned=False)
        return cordons.cordoned

    def nodes(self, now: datetime) -> list[NodeState]:
        """Copies of the known nodes with their reservations, in-flight bindings and the
        failure cordons in force."""
        return self._state().node_states(self.failure_cordons(now))

    def pass_nodes(self, now: datetime) -> list[NodeState]:
        """``nodes`` for a pass: lent until the next pass (``PlacementState.pass_nodes``)."""
        return self._state().pass_nodes(self.failure_cordons(now))

    def _note(self, suspicion: Suspicion, *, cordoned: bool) -> None:
        note = (suspicion.problem or suspicion.since, cordoned)
        if self._notes.get(suspicion.node) == note:
            return
        self._notes[suspicion.node] = note
        if suspicion.problem and cordoned:
            log.warning("node %s takes no new pods: %s", suspicion.node, suspicion.problem)
        elif suspicion.problem:
            log.warning(
                "node %s reports %s, but the cordon budget is exhausted (at most %.0f%% of ready "
                "CPU, never the last schedulable node): it keeps taking work",
                suspicion.node,
                suspicion.problem,
                100 * self._state().health.policy.max_cordoned_fraction,
            )
        elif cordoned:
            log.warning(
                "node %s cordoned until %s: %d jobs crashed there",
                suspicion.node,
                suspicion.until.isoformat(timespec="seconds"),
                suspicion.failures,
            )
        else:
            log.warning(
                "node %s would be cordoned (%d jobs crashed there) but the cordon budget is "
                "exhausted (at most %.0f%% of ready CPU, never the last schedulable node): it "
                "keeps taking work",
                suspicion.node,
                suspicion.failures,
                100 * self._state().health.policy.max_cordoned_fraction,
            )
