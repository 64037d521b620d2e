"""Which producer may emit which event kind: the consumers' own check behind the server's.

The mapping is the one in proto/mdq/v1/mdq.proto's ``Event.body`` comments. The server
enforces it through each identity's publish permissions (``mdq.bus.security.permissions`` builds
them from this table); the fold checks it again, so an event that reached the log some other way
(a misconfigured server, a JetStream reply aimed at a stream subject) changes nothing.
"""

from __future__ import annotations

EVENT_PRODUCERS: dict[str, frozenset[str]] = {
    "submitted": frozenset({"intake"}),
    "rejected": frozenset({"intake"}),
    "released": frozenset({"placement"}),
    "bound": frozenset({"placement"}),
    "started": frozenset({"watcher"}),
    "succeeded": frozenset({"watcher"}),
    "attempt_failed": frozenset({"watcher"}),
    "pod": frozenset({"watcher"}),
    "requeued": frozenset({"recovery"}),
    "failed": frozenset({"recovery", "placement"}),
    "progress": frozenset({"runner"}),
    "checkpoint": frozenset({"runner"}),
    "outputs": frozenset({"runner"}),
    "usage": frozenset({"runner"}),
    "copied": frozenset({"runner"}),
    "fetched": frozenset({"runner"}),
    "cancel_requested": frozenset({"placement"}),
    "cancelled": frozenset({"placement", "recovery"}),
    "held": frozenset({"placement"}),
    "unheld": frozenset({"placement"}),
    "requeue_requested": frozenset({"placement"}),
    "reprioritized": frozenset({"placement"}),
    "extended": frozenset({"placement"}),
    "limit_exceeded": frozenset({"watcher"}),
    "node_load": frozenset({"metrics"}),
    "node_summary": frozenset({"metrics"}),
}
"""Event kind -> the producers that may emit it (proto/mdq/v1/mdq.proto, ``Event.body``)."""


def producer_may_emit(producer: str, kind: str) -> bool:
    """Whether an event of ``kind`` may come from ``producer``."""
    return producer in EVENT_PRODUCERS.get(kind, frozenset())


def owner_of(kind: str) -> str:
    """A producer that may emit ``kind`` (the first by name; for tools and tests that make
    events on a producer's behalf)."""
    return sorted(EVENT_PRODUCERS[kind])[0]
