"""Runner processes of the node agent: start them like containers, measure them, stop them.

A pod's process runs in its own process group (so the whole tree is signalled at once) and
gets PR_SET_PDEATHSIG=SIGKILL, so it dies with its agent the way a container dies with its
node. Usage is measured over the whole process tree with psutil. Linux is the target; where
prctl or CPU affinity is missing, that part is skipped (best effort).
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import os
import signal
from collections.abc import Callable

import psutil

from mdq.core.exit_codes import describe

PR_SET_PDEATHSIG = 1
MIB = 1024 * 1024

try:  # resolved once in the agent, so the forked child only makes the call
    _prctl: Callable[..., int] | None = ctypes.CDLL(None, use_errno=True).prctl
except (AttributeError, OSError):
    _prctl = None


def die_with_parent() -> Callable[[], None]:
    """A preexec_fn for the child: SIGKILL it when the agent dies (even by kill -9)."""
    parent = os.getpid()

    def arrange() -> None:
        if _prctl is not None:
            _prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the agent died before prctl took effect
            os.kill(os.getpid(), signal.SIGKILL)

    return arrange


def exit_code_of(returncode: int) -> int:
    """A container-style exit code: death by signal N is 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def describe_exit(returncode: int) -> str:
    """Words for people: "exited with 3: invalid input", "killed by SIGKILL"."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"killed by {name}"
    meaning = describe(returncode)
    return f"exited with {returncode}: {meaning}" if meaning else f"exited with {returncode}"


def signal_group(pid: int, sig: signal.Signals) -> None:
    """Send ``sig`` to the process group led by ``pid`` (the pod); gone already is fine."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


class ProcessTree:
    """A pod's process and its descendants, measured together."""

    def __init__(self, *, pid: int) -> None:
        self.pid = pid
        self._known: dict[int, psutil.Process] = {}

    def _members(self) -> list[psutil.Process]:
        try:
            root = self._known.get(self.pid) or psutil.Process(self.pid)
            members = [root, *root.children(recursive=True)]
        except psutil.Error:
            return []
        # Keep the same Process objects between calls: cpu_percent measures since the last call.
        current = {member.pid: self._known.get(member.pid, member) for member in members}
        self._known = current
        return list(current.values())

    def rss_bytes(self) -> int:
        """Resident memory of the whole tree."""
        total = 0
        for member in self._members():
            with contextlib.suppress(psutil.Error):
                total += member.memory_info().rss
        return total

    def cpu_percent(self) -> float:
        """CPU use of the whole tree since the previous call, in percent of one core."""
        total = 0.0
        for member in self._members():
            with contextlib.suppress(psutil.Error):
                total += member.cpu_percent(interval=None)
        return total


class CorePicker:
    """Spreads pinned pods over the cores this agent may use."""

    def __init__(self) -> None:
        self._next = 0

    def pin(self, pid: int, cpu: float) -> list[int]:
        """Pin ``pid`` to ceil(cpu) cores when that is fewer than all of them; return them."""
        try:
            allowed = sorted(psutil.Process().cpu_affinity() or [])
            wanted = max(1, math.ceil(cpu))
            if wanted >= len(allowed):
                return []
            cores = [allowed[(self._next + i) % len(allowed)] for i in range(wanted)]
            psutil.Process(pid).cpu_affinity(cores)
        except (AttributeError, psutil.Error, OSError, ValueError):
            return []
        self._next = (self._next + wanted) % len(allowed)
        return cores
