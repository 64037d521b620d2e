"""End to end: `mdq up` restarts a part that runs but is stuck.

A service or node agent whose event loop is blocked, or whose process is stopped, does not
exit, so waiting for its exit would leave it stuck for good. It stops renewing its liveness
file (``mdq.health``), and the supervisor kills it so that it is restarted as after a crash.
One that merely waits, for a NATS server that does not answer, goes on renewing it and is
left alone.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import psutil
import pytest

from mdq.health import RENEW_EVERY_S
from mdq.stack import LOCAL_AGENT, NATS_SERVER, Stack
from tests.helpers import stack_part, wait_for

pytestmark = pytest.mark.e2e

STUCK_AFTER_S = 12.0
"""The stack's threshold here (30 s by default): more than two renewals missed."""
STUCKS = ("console", LOCAL_AGENT)
"""A service and the node agent: every child renews its file the same way."""


def renewed(stack: Stack, name: str) -> float:
    """When the child last renewed its liveness file (0 when it has not made it yet)."""
    try:
        return (stack.health_dir / f"{name}.alive").stat().st_mtime
    except FileNotFoundError:
        return 0.0


@pytest.mark.expected_crashes(dict.fromkeys(STUCKS, 1))  # the stack's kill -9 of each
async def test_a_stopped_service_and_agent_are_killed_and_restarted(
    tmp_path: Path, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("NATS_URL", raising=False)
    monkeypatch.delenv("DATABASE_URL", raising=False)
    stack = Stack(
        state_dir=tmp_path / "state",
        namespace=namespace,
        services=("console",),
        local_nodes=1,
        metrics_port=0,
        grace_s=15.0,
        stuck_after_s=STUCK_AFTER_S,
    )
    await stack.start()
    try:
        started = time.time()

        async def renewing() -> bool:
            return all(renewed(stack, name) > started for name in STUCKS)

        await wait_for(renewing, timeout=2 * RENEW_EVERY_S + 30, what="each child renewing")

        # NATS stopped for longer than the threshold: its clients wait, and are left alone
        _, _, nats_pid = stack_part(stack, NATS_SERVER)
        assert nats_pid is not None
        os.kill(nats_pid, signal.SIGSTOP)
        try:
            await asyncio.sleep(STUCK_AFTER_S + RENEW_EVERY_S)
        finally:
            os.kill(nats_pid, signal.SIGCONT)
        for name in STUCKS:
            running, restarts, _ = stack_part(stack, name)
            assert running and restarts == 0, f"{name} was restarted while it only waited"

        before = {name: stack_part(stack, name) for name in STUCKS}
        for _, _, pid in before.values():
            assert pid is not None
            os.kill(pid, signal.SIGSTOP)
        stopped_at = time.monotonic()

        async def restarted() -> bool:
            for name, (_, restarts, pid) in before.items():
                running, now_restarts, now_pid = stack_part(stack, name)
                if not (running and now_restarts == restarts + 1 and now_pid != pid):
                    return False
            return True

        await wait_for(restarted, timeout=STUCK_AFTER_S + 30, what="both restarted")
        # killed once silent for the threshold: the last renewal came at most one period
        # before the stop
        assert time.monotonic() - stopped_at >= STUCK_AFTER_S - RENEW_EVERY_S
        for name, (_, _, pid) in before.items():
            assert pid is not None and not psutil.pid_exists(pid), f"the stuck {name} is gone"
        log = (stack.logs_dir / "stack.log").read_text()
        for name in STUCKS:
            assert f"{name}: running but silent for" in log
        renewed_again = time.time()

        async def renewing_again() -> bool:
            return all(renewed(stack, name) > renewed_again for name in STUCKS)

        await wait_for(renewing_again, timeout=2 * RENEW_EVERY_S + 30, what="renewing again")
    finally:
        await asyncio.shield(stack.stop())
