"""A queue that hands out its items taking turns between their owners: intake's waiting
request-reply submits, so that one tenant's thousand waiting requests delay another's next one
by one turn, not by a thousand (docs/security.md, "What the server does not hold a tenant to").

Pure: no I/O.
"""

from __future__ import annotations

from collections import deque
from typing import Generic, TypeVar

T = TypeVar("T")


class FairQueue(Generic[T]):
    """Items in first-in first-out order per owner; ``take`` goes round the owners, one item
    each, starting after the owner it served last, so every owner with items waiting gets one
    in each round whatever the others hold."""

    def __init__(self) -> None:
        self._queues: dict[str, deque[T]] = {}
        """Owners with items waiting, in the order they take their turns."""

    def __len__(self) -> int:
        return sum(len(queue) for queue in self._queues.values())

    def __bool__(self) -> bool:
        return bool(self._queues)

    def append(self, owner: str, item: T) -> None:
        """``item`` waits behind ``owner``'s others; a new owner's turn comes last."""
        self._queues.setdefault(owner, deque()).append(item)

    def take(self, count: int) -> list[T]:
        """Up to ``count`` items, one per owner per round; an owner served goes to the back."""
        taken: list[T] = []
        while self._queues and len(taken) < count:
            owner = next(iter(self._queues))
            queue = self._queues.pop(owner)
            taken.append(queue.popleft())
            if queue:
                self._queues[owner] = queue  # to the back of the line
        return taken
