"""``python -m mdq.backends.local``: run a node agent (the composition root).

Reads ``CommonSettings`` (NATS_URL, MDQ_NAMESPACE, MDQ_DATA_DIR) and ``LocalAgentSettings``
(MDQ_LOCAL_*), connects to NATS (waiting for it, with backoff, while it is not there) and runs
``NodeAgent`` until SIGTERM or SIGINT.
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

from nats.js import JetStreamContext

from mdq.backends.local.agent import NodeAgent
from mdq.backends.local.settings import LocalAgentSettings
from mdq.bus.connect import CREDS_ENV, connect
from mdq.bus.runtime import LEVEL_FORMAT, configure_logging, run_service
from mdq.bus.subjects import Subjects
from mdq.health import renewed_while
from mdq.settings import CommonSettings


def runner_creds_dir(settings: LocalAgentSettings) -> Path | None:
    """Where the runners' credentials go: None when the agent itself connects without
    credentials (an open server: runners need none), else ``MDQ_LOCAL_RUNNER_CREDS_DIR`` or
    ``runners/`` beside the agent's own file."""
    own = os.environ.get(CREDS_ENV)
    if not own:
        return None
    return (
        Path(settings.runner_creds_dir)
        if settings.runner_creds_dir
        else Path(own).parent / "runners"
    )


def build(
    *, js: JetStreamContext, common: CommonSettings, settings: LocalAgentSettings
) -> NodeAgent:
    """The agent for these settings."""
    return NodeAgent(
        js=js,
        subjects=Subjects(common.namespace).for_local_cluster(settings.cluster),
        nodes=settings.node_configs(),
        data_dir=common.data_dir,
        heartbeat_s=settings.heartbeat_s,
        grace_s=settings.grace_s,
        memory_poll_s=settings.memory_poll_s,
        replicas=common.stream_replicas,
        runner_creds_dir=runner_creds_dir(settings),
        runner_creds_wait_s=settings.runner_creds_wait_s,
        nats_url=common.nats_url,
        runner_module=settings.runner_module,
        min_free_mb=settings.data_min_free_mb,
        start_error_hold_s=settings.start_error_hold_s,
        probe_stall_s=settings.probe_stall_s,
    )


async def serve(common: CommonSettings, settings: LocalAgentSettings) -> None:
    """Connect, run the agent, stop it cleanly on SIGTERM/SIGINT (before it is connected,
    ``run_service`` cancels the wait for NATS; afterwards the agent's own stop runs). The
    liveness file (``MDQ_HEALTH_FILE``) is renewed from the start, as a service's is."""
    async with renewed_while(common.health_file):
        nc = await connect(
            common.nats_url, name=f"mdq-local-agent-{'+'.join(settings.names())}", wait=True
        )
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        try:
            await build(js=nc.jetstream(), common=common, settings=settings).run(stop)
        finally:
            await nc.drain()


def main() -> None:
    configure_logging(fmt=LEVEL_FORMAT)
    run_service(lambda: serve(CommonSettings(), LocalAgentSettings()))


if __name__ == "__main__":
    main()
