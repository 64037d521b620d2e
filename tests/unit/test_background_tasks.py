"""mdq.testing.tasks: a background task's failure reaches whoever closes or checks it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import pytest

from mdq.testing.tasks import Background, BackgroundFailed


async def fails() -> None:
    await asyncio.sleep(0)
    raise ValueError("the watch broke")


async def forever() -> None:
    await asyncio.Event().wait()


async def ends() -> None:
    await asyncio.sleep(0)


@dataclass(frozen=True)
class Case:
    name: str
    tasks: tuple[Callable[[], Coroutine[Any, Any, None]], ...]
    failed: tuple[str, ...]
    """The messages of the failures ``close`` raises (none: it returns)."""


CASES = [
    Case("nothing started", (), ()),
    Case("a task that ends", (ends,), ()),
    Case("a task still running is cancelled, not a failure", (forever,), ()),
    Case("a task that raised", (fails,), ("the watch broke",)),
    Case("every failure, beside a running task", (fails, forever, fails), ("the watch broke",) * 2),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
async def test_close_raises_what_failed(case: Case) -> None:
    background = Background("double")
    for index, make in enumerate(case.tasks):
        background.spawn(make(), name=f"task {index}")
    for _ in range(3):
        await asyncio.sleep(0)
    if not case.failed:
        await background.close()
        assert background.running == 0
        return
    with pytest.raises(BackgroundFailed) as raised:
        await background.close()
    assert [str(e) for e in raised.value.exceptions] == list(case.failed)
    assert raised.value.message.startswith(f"double: {len(case.failed)} background task(s)")
    assert background.running == 0


async def test_check_raises_a_failure_once() -> None:
    background = Background("kubelet n1")
    task = background.spawn(fails(), name="heartbeat")
    await asyncio.wait({task})
    with pytest.raises(BackgroundFailed, match=r"kubelet n1: 1 .*\(kubelet n1: heartbeat\)"):
        background.check()
    background.check()  # reported once


async def test_the_body_error_travels_with_the_tasks_failures() -> None:
    with pytest.raises(BackgroundFailed) as raised:
        async with Background("helper") as background:
            task = background.spawn(fails(), name="watch")
            await asyncio.wait({task})
            raise AssertionError("the test's own assertion")
    assert [type(e) for e in raised.value.exceptions] == [AssertionError, ValueError]


async def test_a_cancelled_task_is_no_failure() -> None:
    background = Background("helper")
    task = background.spawn(forever(), name="watch")
    await background.cancel(task)
    assert task.cancelled()
    assert background.failures == []
