"""Claiming a free TCP port for a stack's /metrics or web console, with a lock file, so that two
stacks started at once never pick the same one."""

from __future__ import annotations

import contextlib
import fcntl
import socket
import tempfile
from pathlib import Path
from typing import IO

from mdq.stack.files import StackError

DEFAULT_METRICS_PORT = 9464
DEFAULT_CONSOLE_PORT = 8089


def _port_free(port: int) -> bool:
    """Whether a server could listen on ``port`` on every interface (as /metrics does)."""
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        try:
            sock.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def claim_port(
    start: int = DEFAULT_METRICS_PORT, *, tries: int = 100, purpose: str = "metrics"
) -> tuple[int, IO[str]]:
    """The first port from ``start`` on that is free and not claimed by another stack (for
    /metrics, or for the console: ``purpose``), and the open lock file that claims it (held
    until closed, released by the kernel if the stack dies).

    Ports are taken below the ephemeral range on purpose: a port picked there can be taken by
    an outgoing connection (a service's NATS client) before the metrics server binds it. The
    claim closes the other race: two stacks started at once both saw 9464 free, and the
    second's metrics service failed to bind it, restart after restart."""
    lock_dir = Path(tempfile.gettempdir())
    for port in range(start, start + tries):
        try:
            claim = (lock_dir / f"mdq-{purpose}-port-{port}.lock").open("a", encoding="utf-8")
        except OSError:  # another user's claim
            continue
        try:
            fcntl.flock(claim, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            claim.close()
            continue
        if _port_free(port):
            return port, claim
        claim.close()
    raise StackError(f"no free port for {purpose} in {start}..{start + tries - 1}")
