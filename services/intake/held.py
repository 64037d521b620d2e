"""Answers to requests past their tenant's rate, sent when the tenant may submit again.

A client that waits for each answer before it asks again (request-reply, any number of requests
in flight) asks as fast as it is answered: answered at once, a flooding tenant's requests cost
intake and the server as many messages a second as its client can send. Held until the tenant
has a token again (at most ``hold_s``), its answers pace it to its requests in flight per
``hold_s``. A client that waits as its answer says loses nothing; the answer is the same. Design:
docs/security.md, "Limits".
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Awaitable, Callable

Send = Callable[[str, bytes, dict[str, str]], Awaitable[None]]
"""Publishes one answer: (reply subject, payload, headers); a NATS error is its to swallow."""

RELEASE_TURN = 64
"""Answers sent before the loop runs anything else, when many are due at once."""


class HeldAnswers:
    """Answers waiting for their time, in the order it comes; at most ``most`` at once (one
    more is sent at once: a flood past that is answered as it comes)."""

    def __init__(self, send: Send, *, hold_s: float = 1.0, most: int = 10_000) -> None:
        self._send = send
        self._hold_s = hold_s
        self._most = most
        self._held: list[tuple[float, int, str, bytes, dict[str, str]]] = []
        self._order = itertools.count()
        self._timer: asyncio.TimerHandle | None = None
        self._releasing: set[asyncio.Task[None]] = set()

    def __len__(self) -> int:
        return len(self._held)

    async def answer(
        self, reply: str, payload: bytes, headers: dict[str, str], *, wait_s: float
    ) -> None:
        """Send the answer once ``wait_s`` (at most ``hold_s``) has passed: held, or now when
        there is nothing to wait for or no room to hold it."""
        hold = min(wait_s, self._hold_s)
        if hold <= 0 or len(self._held) >= self._most:
            await self._send(reply, payload, headers)
            return
        loop = asyncio.get_running_loop()
        due = loop.time() + hold
        heapq.heappush(self._held, (due, next(self._order), reply, payload, headers))
        if self._held[0][0] == due:  # the earliest now: the timer goes off for it
            self._arm(loop)

    def _arm(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = loop.call_at(self._held[0][0], self._release_due) if self._held else None

    def _release_due(self) -> None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        due = []
        while self._held and self._held[0][0] <= now:
            due.append(heapq.heappop(self._held))
        self._timer = None
        self._arm(loop)
        if due:
            task = loop.create_task(self._send_all([entry[2:] for entry in due]))
            self._releasing.add(task)
            task.add_done_callback(self._releasing.discard)

    async def _send_all(self, answers: list[tuple[str, bytes, dict[str, str]]]) -> None:
        for number, (reply, payload, headers) in enumerate(answers, start=1):
            await self._send(reply, payload, headers)
            if number % RELEASE_TURN == 0:
                await asyncio.sleep(0)  # a turn for the rest of the loop

    async def release_all(self) -> None:
        """Send every held answer now (intake is stopping) and wait until they are out."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        held, self._held = sorted(self._held), []
        await self._send_all([entry[2:] for entry in held])
        if self._releasing:
            await asyncio.wait(set(self._releasing))
