"""How long a stopping stack waits for each child before SIGKILL: the stack's grace, and for
a node agent at least its own worst case (its pods' grace, the wait to reap them, the report
of its nodes), so a stop never kills an agent that is still stopping its pods."""

from __future__ import annotations

from pathlib import Path

import pytest

from mdq.backends.local.agent import REAP_AFTER_KILL_S
from mdq.stack.supervisor import AGENT_REPORT_S, Stack

AGENT_OVERHEAD = REAP_AFTER_KILL_S + AGENT_REPORT_S

CASES = {
    "a service gets the stack's grace": ("placement", 10.0, {}, 10.0),
    "an agent, its pods' default grace": ("local-backend", 10.0, {}, 10.0 + AGENT_OVERHEAD),
    "an agent whose worst case fits the grace": (
        "local-backend",
        15.0,
        {"MDQ_LOCAL_GRACE_S": "2"},
        15.0,
    ),
    "a named cluster's agent with a long pod grace": (
        "local-backend-lab1",
        10.0,
        {"MDQ_LOCAL_GRACE_S": "20"},
        20.0 + AGENT_OVERHEAD,
    ),
    "an unreadable pod grace counts as the default": (
        "local-backend",
        1.0,
        {"MDQ_LOCAL_GRACE_S": "soon"},
        10.0 + AGENT_OVERHEAD,
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_stop_grace(case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    name, grace_s, extra_env, expected = CASES[case]
    monkeypatch.delenv("MDQ_LOCAL_GRACE_S", raising=False)
    stack = Stack(state_dir=tmp_path, grace_s=grace_s, extra_env=extra_env)
    stack._env = stack._child_env(metrics_port=0)  # what start() gives every child
    assert stack._stop_grace_s(name) == expected
