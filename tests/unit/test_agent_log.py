"""mdq.testing.agent_log reads the node agent's own record of each pod process's end."""

from __future__ import annotations

import logging

import pytest

from mdq.backends.local import agent
from mdq.testing.agent_log import PodEnd, pod_ends


def test_the_agents_end_line_is_read_with_its_exit_status(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The line the agent logs (its own format string, formatted by logging) is read back."""
    caplog.set_level(logging.INFO, logger=agent.__name__)
    status = agent.final_status(-9, oom_rss_mb=700, memory_mb=512, stop_reason="", stop_message="")
    agent.log.info(agent.ENDED_LINE, "mdq-a-1", status.reason, status.message, 4242, -9)
    done = agent.final_status(0, oom_rss_mb=0, memory_mb=512, stop_reason="", stop_message="")
    agent.log.info(agent.ENDED_LINE, "mdq-b-2", done.reason, done.message, 4343, 0)
    assert pod_ends(caplog.text) == [
        PodEnd("mdq-a-1", "OOMKilled", 4242, -9),
        PodEnd("mdq-b-2", "Completed", 4343, 0),
    ]
