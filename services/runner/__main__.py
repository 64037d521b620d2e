"""``python -m services.runner``: run one attempt of the job described by the environment.

The NATS client imports ``aiohttp`` at start-up when it is installed, only for its WebSocket
transport; loading it is a sizable share of the runner's start-up. Unless the runner's NATS
URL is a WebSocket one (``ws://``, ``wss://``), it is kept out (the client then goes without
that transport, as where ``aiohttp`` is not installed).
"""

import os
import sys
from collections.abc import Mapping

WEBSOCKET_SCHEMES = ("ws://", "wss://")
URL_VARIABLES = ("NATS_URL", "MDQ_NATS_URL")


def speaks_websocket(env: Mapping[str, str]) -> bool:
    """Whether any NATS server URL the runner may be given is a WebSocket one."""
    urls = (url.strip().lower() for name in URL_VARIABLES for url in env.get(name, "").split(","))
    return any(url.startswith(WEBSOCKET_SCHEMES) for url in urls)


if not speaks_websocket(os.environ):
    sys.modules.setdefault("aiohttp", None)  # type: ignore[arg-type]

from services.runner.app import main  # noqa: E402

raise SystemExit(main())
