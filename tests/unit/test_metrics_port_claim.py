"""Two stacks started at once never pick the same /metrics port (a claim held by a lock file)."""

from __future__ import annotations

import subprocess
import sys

from mdq.stack import claim_port

START = 19464  # below the ephemeral range, away from a running stack's 9464

HOLD_A_CLAIM = f"""
import sys
from mdq.stack import claim_port
port, claim = claim_port({START})
print(port, flush=True)
sys.stdin.read()  # hold the claim until the parent closes our stdin
"""


def test_a_claimed_port_is_skipped_until_released_by_another_process() -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_A_CLAIM],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        held = int(holder.stdout.readline())
        port, claim = claim_port(START)
        claim.close()
        assert port != held, "two stacks got the same /metrics port"
    finally:
        holder.communicate("", timeout=30)
    port, claim = claim_port(START)
    claim.close()
    assert port == held, "a released claim should be free again"
