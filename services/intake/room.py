"""How full the jobs log is: intake stops accepting submits before the jobs stream fills.

The jobs stream discards *new* events when full (``mdq.bus.storage``): nothing accepted is ever
dropped to make room, but a full stream would refuse the lifecycle events of jobs already
running. So intake refuses new submits once the stream holds ``high_water`` of its size limit,
and the room above that mark is kept for the jobs accepted before it. The stream's size and
limit are read from the server (its stream info, at most once per ``refresh_s``; concurrent
submits share one read), so the mark follows a limit an operator raises at run time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from mdq.core.spec import SpecError


@dataclass(frozen=True, slots=True)
class LogSize:
    """What the jobs stream holds and may hold, in bytes (``limit`` <= 0: no limit)."""

    held: int
    limit: int


def _size(count: float) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count:.0f} bytes"


def room_refusal(size: LogSize, high_water: float) -> SpecError | None:
    """The refusal of a new submit at ``size``, or None while there is room."""
    if size.limit <= 0 or size.held < high_water * size.limit:
        return None
    return SpecError(
        "",
        f"mdq's jobs log is full: it holds {_size(size.held)} of its {_size(size.limit)} "
        f"limit (MDQ_STORAGE_JOBS_BYTES), and above {high_water:.0%} it takes no new submits, "
        "keeping the rest for the jobs already accepted; submit again once old history has "
        "aged out or an operator has raised the limit",
    )


class JobsLogRoom:
    """Answers "may a new submit be accepted now?" from the jobs stream's size."""

    def __init__(
        self,
        read_size: Callable[[], Awaitable[LogSize]],
        *,
        high_water: float,
        refresh_s: float = 1.0,
    ) -> None:
        self._read_size = read_size
        self._high_water = high_water
        self._refresh_s = refresh_s
        self._size: LogSize | None = None
        self._read_at = 0.0
        self._reading = asyncio.Lock()
        """One read at a time: concurrent batches wait for it and share its answer."""

    def _fresh(self) -> LogSize | None:
        if self._size is None:
            return None
        age = asyncio.get_running_loop().time() - self._read_at
        return self._size if age < self._refresh_s else None

    async def size(self) -> LogSize:
        """The stream's size, read again when the last reading is older than ``refresh_s``."""
        if (size := self._fresh()) is not None:
            return size
        async with self._reading:
            if (size := self._fresh()) is not None:  # read by the batch this one waited for
                return size
            self._size = await self._read_size()
            self._read_at = asyncio.get_running_loop().time()
            return self._size

    async def refusal(self) -> SpecError | None:
        """The refusal of a new submit now, or None while the log has room."""
        return room_refusal(await self.size(), self._high_water)
