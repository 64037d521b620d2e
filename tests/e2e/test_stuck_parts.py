"""End to end: `mdq up` restarts a part that runs but is stuck.

A server, service or node agent whose process is stopped (or whose loop is blocked) does not
exit, so waiting for its exit would leave it stuck for good. A child stops renewing its
liveness file (``mdq.health``), a server stops answering the stack's probes
(``mdq.stack.probes``), and the supervisor kills it so that it is restarted as after a crash.
A child that merely waits, for servers that do not answer, goes on renewing its file and is
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
from mdq.stack import LOCAL_AGENT, NATS_SERVER, POSTGRES, Stack
from tests.helpers import stack_part, wait_for

pytestmark = pytest.mark.e2e

STUCK_AFTER_S = 12.0
"""The stack's threshold here (30 s by default): more than two renewals missed."""
STUCKS = ("console", LOCAL_AGENT)
"""A service and the node agent: every child renews its file the same way."""
SERVERS = (NATS_SERVER, POSTGRES)
"""The embedded servers, which the stack asks whether they answer
(``SERVER_PROBE_EVERY_S``, as often as a child renews its file)."""


def gone(pid: int) -> bool:
    """No such process, or a zombie (the postmaster is not the stack's child: its parent
    reaps it, if anyone does)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def renewed(stack: Stack, name: str) -> float:
    """When the child last renewed its liveness file (0 when it has not made it yet)."""
    try:
        return (stack.health_dir / f"{name}.alive").stat().st_mtime
    except FileNotFoundError:
        return 0.0


@pytest.mark.expected_crashes(dict.fromkeys((*STUCKS, *SERVERS), 1))  # the stack's kill -9s
async def test_stopped_servers_services_and_agents_are_killed_and_restarted(
    tmp_path: Path, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("NATS_URL", raising=False)  # both servers embedded
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

        # the servers stopped: each is killed and started again, and their clients, which
        # only wait for them, go on renewing and are left alone
        await stop_and_see_restarted(stack, SERVERS)
        for name in STUCKS:
            running, restarts, _ = stack_part(stack, name)
            assert running and restarts == 0, f"{name} was restarted while it only waited"
        log = (stack.logs_dir / "stack.log").read_text()
        for name in SERVERS:
            assert f"{name}: running but has answered no probe for" in log

        await stop_and_see_restarted(stack, STUCKS)
        log = (stack.logs_dir / "stack.log").read_text()
        for name in STUCKS:
            assert f"{name}: running but silent for" in log
        renewed_again = time.time()

        async def renewing_again() -> bool:
            return all(renewed(stack, name) > renewed_again for name in STUCKS)

        await wait_for(renewing_again, timeout=2 * RENEW_EVERY_S + 30, what="renewing again")
    finally:
        await asyncio.shield(stack.stop())


async def stop_and_see_restarted(stack: Stack, names: tuple[str, ...]) -> None:
    """SIGSTOP the named parts at once; wait until the stack has killed and restarted each,
    not before it was silent for its threshold."""
    before = {name: stack_part(stack, name) for name in names}
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

    await wait_for(restarted, timeout=STUCK_AFTER_S + 60, what=f"{', '.join(names)} restarted")
    # the last renewal, or answer, came at most one period before the stop
    assert time.monotonic() - stopped_at >= STUCK_AFTER_S - RENEW_EVERY_S
    for name, (_, _, pid) in before.items():
        assert pid is not None and gone(pid), f"the stuck {name} is gone"
