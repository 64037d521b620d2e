"""Events placement publishes itself, folded into its state at once: the log echoes each later,
a no-op then (docs/placement.md, "Where the state lives")."""

from __future__ import annotations

from collections.abc import Callable

from mdq.bus.publisher import EventPublisher
from mdq.contracts import pb
from mdq.core.placement_state import PlacementState
from mdq.core.state import JobView


class Emitter:
    """Publishes placement's own events and applies them to the state."""

    def __init__(
        self,
        *,
        state: Callable[[], PlacementState],
        publisher: EventPublisher,
        changed: Callable[[JobView], None],
    ) -> None:
        """``state``: placement's state now (a restore replaces it). ``changed``: told of each
        job whose view an event changed."""
        self._state = state
        self._publisher = publisher
        self._changed = changed

    def apply(self, view: JobView, event: pb.Event) -> None:
        """Fold in an event this replica published (its echo from the log is a no-op then)."""
        if self._state().apply_to(view, event):
            self._changed(view)

    async def emit(self, view: JobView, event: pb.Event) -> None:
        """Publish an event and fold it in at once (the log echoes it later, a no-op then)."""
        await self._publisher.publish(event)
        self.apply(view, event)
