"""How many lines of one kind a service may log: a token bucket per kind, so that something
outside the service repeating itself (a tenant's flood of refused submits, a rogue producer's
unreadable events) costs the shared log a few lines a second, and the lines it held back are
counted in the next one it lets through (docs/architecture.md, "Logs a flood cannot fill").

Pure: the caller passes ``now`` (seconds on any monotonic clock).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class _Bucket:
    tokens: float
    at: float
    held_back: int = 0


class LineBudget:
    """``burst`` lines of a kind at once, then ``per_s`` a second; at most ``max_kinds`` kinds
    remembered (the longest quiet forgotten first, which gives it a full burst again)."""

    def __init__(self, *, burst: int = 50, per_s: float = 5.0, max_kinds: int = 4096) -> None:
        if burst < 1 or per_s <= 0 or max_kinds < 1:
            raise ValueError("a line budget needs burst >= 1, per_s > 0 and max_kinds >= 1")
        self._burst, self._per_s, self._max_kinds = float(burst), per_s, max_kinds
        self._buckets: dict[object, _Bucket] = {}
        """By kind, the one that logged last at the end."""

    def __len__(self) -> int:
        return len(self._buckets)

    def take(self, kind: object, now: float) -> int | None:
        """None: hold this line back (it is counted). Otherwise log it, and the number is how
        many lines of its kind were held back since the last one logged (usually 0)."""
        bucket = self._buckets.pop(kind, None)
        if bucket is None:
            bucket = _Bucket(self._burst, now)
        else:
            bucket.tokens = min(
                self._burst, bucket.tokens + max(0.0, now - bucket.at) * self._per_s
            )
            bucket.at = now
        self._buckets[kind] = bucket
        while len(self._buckets) > self._max_kinds:
            del self._buckets[next(iter(self._buckets))]
        if bucket.tokens < 1.0:
            bucket.held_back += 1
            return None
        bucket.tokens -= 1.0
        held_back, bucket.held_back = bucket.held_back, 0
        return held_back
