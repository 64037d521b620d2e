"""Intake's held answers to requests past their tenant's rate: sent when the tenant may submit
again (at most the hold), in the order that comes, at once when there is no room or nothing to
wait for, and all of them when intake stops."""

from __future__ import annotations

import asyncio

from services.intake.held import HeldAnswers
from tests.helpers import wait_for

HEADERS = {"content-type": "application/json"}


class Sent:
    def __init__(self) -> None:
        self.replies: list[str] = []

    async def __call__(self, reply: str, payload: bytes, headers: dict[str, str]) -> None:
        assert payload == b"refused" and headers == HEADERS
        self.replies.append(reply)


async def test_an_answer_waits_until_its_tenant_may_submit_and_no_longer_than_the_hold() -> None:
    sent = Sent()
    held = HeldAnswers(sent, hold_s=0.2)
    loop = asyncio.get_running_loop()
    started = loop.time()
    await held.answer("late", b"refused", HEADERS, wait_s=60.0)  # held for the hold only
    await held.answer("soon", b"refused", HEADERS, wait_s=0.05)
    await held.answer("now", b"refused", HEADERS, wait_s=0.0)
    assert sent.replies == ["now"] and len(held) == 2

    async def both_sent() -> bool:
        return len(sent.replies) == 3

    await wait_for(both_sent, timeout=5, interval=0.01, what="the held answers")
    assert sent.replies == ["now", "soon", "late"]
    assert loop.time() - started >= 0.2 and len(held) == 0


async def test_past_its_room_an_answer_goes_at_once() -> None:
    sent = Sent()
    held = HeldAnswers(sent, hold_s=5.0, most=2)
    for name in ("a", "b", "c"):
        await held.answer(name, b"refused", HEADERS, wait_s=5.0)
    assert sent.replies == ["c"] and len(held) == 2


async def test_a_stop_sends_every_held_answer_in_order() -> None:
    sent = Sent()
    held = HeldAnswers(sent, hold_s=5.0)
    for number in range(200):  # more than a turn's worth
        await held.answer(f"r{number}", b"refused", HEADERS, wait_s=5.0 - number / 100)
    await held.release_all()
    assert sent.replies == [f"r{number}" for number in reversed(range(200))]
    assert len(held) == 0
