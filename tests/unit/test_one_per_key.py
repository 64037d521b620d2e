"""intake's per-request-id mutual exclusion (``OnePerKey``): order, exclusion, cancellation."""

from __future__ import annotations

import asyncio

from services.intake.handlers import OnePerKey


async def test_holders_of_one_key_take_turns_in_arrival_order() -> None:
    locks = OnePerKey()
    inside: list[str] = []
    order: list[str] = []

    async def worker(name: str, key: str) -> None:
        async with locks.hold(key):
            inside.append(name)
            assert [n for n in inside if n[0] == name[0]] == [name]  # alone with its key
            order.append(name)
            await asyncio.sleep(0.01)
            inside.remove(name)

    await asyncio.gather(*(worker(f"a{i}", "a") for i in range(4)), worker("b0", "b"))

    assert [n for n in order if n.startswith("a")] == ["a0", "a1", "a2", "a3"]
    assert order.index("b0") < order.index("a1")  # another key does not wait
    assert locks.waiting == {}


async def test_a_cancelled_waiter_gives_up_its_turn() -> None:
    locks = OnePerKey()
    release = asyncio.Event()
    got: list[str] = []

    async def first() -> None:
        async with locks.hold("k"):
            await release.wait()

    async def waiter(name: str) -> None:
        async with locks.hold("k"):
            got.append(name)

    holder = asyncio.create_task(first())
    await asyncio.sleep(0)
    doomed = asyncio.create_task(waiter("doomed"))
    survivor = asyncio.create_task(waiter("survivor"))
    await asyncio.sleep(0)
    doomed.cancel()
    await asyncio.sleep(0)
    release.set()
    await asyncio.gather(holder, survivor)

    assert doomed.cancelled() and got == ["survivor"]
    assert locks.waiting == {}


async def test_a_waiter_cancelled_as_its_turn_came_passes_the_key_on() -> None:
    locks = OnePerKey()
    got: list[str] = []

    async def waiter(name: str) -> None:
        async with locks.hold("k"):
            got.append(name)

    async with locks.hold("k"):
        handed = asyncio.create_task(waiter("handed"))
        after = asyncio.create_task(waiter("after"))
        await asyncio.sleep(0)
    handed.cancel()  # its turn was set when the holder left, before it could run
    await asyncio.gather(after, return_exceptions=True)
    await asyncio.gather(handed, return_exceptions=True)

    assert got == ["after"] and handed.cancelled()
    assert locks.waiting == {}
