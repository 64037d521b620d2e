"""Starting a node agent as a child process (for ``mdq up``, end-to-end and fault tests)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from mdq.bus.connect import CREDS_ENV


def agent_environment(
    *,
    nats_url: str,
    namespace: str,
    data_dir: Path,
    node_names: Sequence[str] = (),
    settings: Mapping[str, str] | None = None,
    creds: Path | None = None,
) -> dict[str, str]:
    """The environment of an agent: this one plus the bus, namespace, data folder,
    ``settings`` (LocalAgentSettings field names, e.g. {"heartbeat_s": "0.5"}) and, on an
    authenticating server, the agent's own credentials file."""
    env = dict(os.environ)
    env.update(NATS_URL=nats_url, MDQ_NAMESPACE=namespace, MDQ_DATA_DIR=str(data_dir))
    if creds is not None:
        env[CREDS_ENV] = str(creds)
    if node_names:
        env["MDQ_LOCAL_NODE_NAMES"] = ",".join(node_names)
    for name, value in (settings or {}).items():
        env[f"MDQ_LOCAL_{name.upper()}"] = value
    return env


def start_agent(
    *,
    nats_url: str,
    namespace: str,
    data_dir: Path,
    node_names: Sequence[str] = (),
    settings: Mapping[str, str] | None = None,
    log_file: Path | None = None,
    creds: Path | None = None,
) -> subprocess.Popen[bytes]:
    """Start ``python -m mdq.backends.local``; its output goes to ``log_file`` (default
    <data_dir>/local-agent.log), appended so restarts keep the history."""
    data_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_file or data_dir / "local-agent.log"
    env = agent_environment(
        nats_url=nats_url,
        namespace=namespace,
        data_dir=data_dir,
        node_names=node_names,
        settings=settings,
        creds=creds,
    )
    with log_path.open("ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "mdq.backends.local"],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
