"""What the local node agent recorded of each pod process that ended, read from its log.

The agent is the runner processes' parent: its line ``pod <name> ended: <reason> <message>
(pid <pid>, returncode <code>)`` (``mdq.backends.local.agent``) carries the exit status the
kernel gave it (Popen style: ``-9`` for a SIGKILL). Benchmarks read it from outside mdq's
events and projection: OOM kills, and how many runs of a job exited 0.
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass
from pathlib import Path

ENDED = re.compile(r"pod (\S+) ended: (\S+) .*\(pid (\d+), returncode (-?\d+)\)")


@dataclass(frozen=True, slots=True)
class PodEnd:
    pod: str
    reason: str
    pid: int
    returncode: int

    @property
    def oom_killed(self) -> bool:
        """The agent killed the process for its memory: its reason, with SIGKILL's status."""
        return self.reason == "OOMKilled" and self.returncode == -signal.SIGKILL


def pod_ends(text: str) -> list[PodEnd]:
    """Every pod end recorded in ``text`` (an agent's log), in order."""
    return [
        PodEnd(pod=pod, reason=reason, pid=int(pid), returncode=int(code))
        for pod, reason, pid, code in ENDED.findall(text)
    ]


def read_pod_ends(log_path: Path, offset: int = 0) -> list[PodEnd]:
    """The pod ends an agent's log records from byte ``offset`` on ([] if no log yet)."""
    if not log_path.is_file():
        return []
    with log_path.open("rb") as log:
        log.seek(offset)
        return pod_ends(log.read().decode(errors="replace"))
