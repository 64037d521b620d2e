"""tests.helpers.running() fails the block when the service under test did not survive it."""

from __future__ import annotations

import asyncio

import pytest

from tests.helpers import running


async def serve_forever() -> None:
    await asyncio.Event().wait()


async def crash_soon() -> None:
    await asyncio.sleep(0)
    raise RuntimeError("boom")


async def return_soon() -> None:
    await asyncio.sleep(0)


async def leak_a_cancel() -> None:
    inner = asyncio.get_running_loop().create_future()
    inner.cancel()
    await inner


async def ignore_cancel(release: asyncio.Event) -> None:
    while not release.is_set():
        try:
            await release.wait()
        except asyncio.CancelledError:
            continue


async def test_a_service_that_runs_until_cancelled_passes() -> None:
    async with running(serve_forever()) as task:
        await asyncio.sleep(0)
    assert task.cancelled()


async def test_a_replica_the_test_cancels_itself_passes() -> None:
    async with running(serve_forever()) as task:
        await asyncio.sleep(0)
        task.cancel()
        await asyncio.wait([task])


async def test_a_crash_is_re_raised_at_the_end_of_the_block() -> None:
    with pytest.raises(RuntimeError, match="boom") as caught:
        async with running(crash_soon()) as task:
            await asyncio.wait([task])
    assert any("crash_soon" in note for note in caught.value.__notes__)


async def test_the_crash_wins_over_the_block_failing_and_keeps_it_as_context() -> None:
    with pytest.raises(RuntimeError, match="boom") as caught:
        async with running(crash_soon()) as task:
            await asyncio.wait([task])
            raise AssertionError("nothing happened")
    assert isinstance(caught.value.__context__, AssertionError)


async def test_a_service_that_returns_early_fails_the_block() -> None:
    with pytest.raises(AssertionError, match="returned before the end"):
        async with running(return_soon()) as task:
            await asyncio.wait([task])


async def test_a_cancelled_error_leaking_out_of_the_service_is_a_crash() -> None:
    with pytest.raises(AssertionError, match="no cancel"):
        async with running(leak_a_cancel()) as task:
            await asyncio.wait([task])


async def test_a_service_that_will_not_stop_fails_the_block() -> None:
    release = asyncio.Event()
    with pytest.raises(AssertionError, match="did not stop"):
        async with running(ignore_cancel(release), stop_timeout=0.1) as task:
            await asyncio.sleep(0)
    release.set()
    await task
