"""Connecting to NATS the same way in every service, and waiting for it when it is not there.

A service connects with ``connect(url, name=..., wait=True)``: while no server accepts a
connection, or JetStream does not answer yet, it probes the servers over plain TCP and waits
with backoff, one log line per try (``mdq.backoff``), instead of exiting; then it checks the
namespace's streams. Clients (the CLI, the SDK) connect once with ``wait=False``. Design:
docs/architecture.md, "When NATS or PostgreSQL is down".
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import os
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from nats.aio.client import Client
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from mdq.backoff import DEFAULT_BACKOFF, Backoff, keep_trying, redact_url
from mdq.bus.outage import LOST_CONNECTION, NATS_NOT_READY
from mdq.bus.security.permissions import inbox_prefix
from mdq.bus.security.runner_creds import RenewableCreds
from mdq.bus.streams import require_streams
from mdq.bus.subjects import Subjects

PROBE_TIMEOUT_S = 5.0
CONNECT_TIMEOUT_S = 5
CLIENT_OPTIONS: dict[str, Any] = {
    "max_reconnect_attempts": -1,  # once connected, reconnect forever
    "reconnect_time_wait": 0.5,  # (nats-py's annotation says int; it sleeps this long)
    "connect_timeout": CONNECT_TIMEOUT_S,
}


class SilenceSettings(BaseSettings):
    """How soon a connection that went silent is given up: the server's host gone without a
    word (a crashed node, a pod moved to another address, a dropped NAT entry) closes nothing,
    and with nats-py's defaults (a ping every 120 s, two unanswered allowed) a client would
    wait about six minutes on it. A client pings every ``ping_interval_s`` and, with
    ``max_outstanding_pings`` pings unanswered at the next one, drops the connection and
    reconnects (docs/architecture.md, "A connection that goes silent"). The server pings its
    clients the same way (``mdq.embedded.nats_config``, deploy/base/nats.conf)."""

    model_config = SettingsConfigDict(env_prefix="MDQ_NATS_", extra="ignore")

    ping_interval_s: float = Field(
        default=10.0, gt=0, description="Seconds between two pings to the NATS server."
    )
    max_outstanding_pings: int = Field(
        default=2,
        ge=1,
        description="Pings left unanswered after which the connection is given up as silent.",
    )

    def client_options(self) -> dict[str, Any]:
        """nats-py's connect options for these settings."""
        return {
            "ping_interval": self.ping_interval_s,  # (annotated int; it sleeps this long)
            "max_outstanding_pings": self.max_outstanding_pings,
        }


DEFAULT_PORTS = {"nats": 4222, "tls": 4222, "ws": 80, "wss": 443}

log = logging.getLogger("mdq.bus")


async def log_client_error(error: Exception) -> None:
    """nats-py's error callback: one line per error. Its own logs a traceback for each
    failed reconnect, which says nothing more than the error and fills every service's log
    while a server restarts."""
    if isinstance(error, LOST_CONNECTION):
        log.warning("NATS connection: %s: %s (reconnecting)", type(error).__name__, error)
    else:
        log.error("NATS: %s: %s", type(error).__name__, error)


CREDS_ENV = "MDQ_NATS_CREDS"
"""The environment variable naming this process's NATS credentials file (``mdq up`` sets it
for each service; the CLI and the SDK find it through ``stack.json``)."""


def identity_of_creds(creds: Path) -> str:
    """The identity a credentials file was issued to (its JWT's ``name``)."""
    text = creds.read_text(encoding="utf-8")
    token = text.split("-----BEGIN NATS USER JWT-----", 1)[1].split("------END", 1)[0].strip()
    body = token.split(".")[1]
    claims = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    return str(claims["name"])


Creds = Path | str | RenewableCreds
"""A credentials file, or credentials held in memory and renewed (a runner's)."""


def auth_options(creds: Creds | None = None) -> dict[str, Any]:
    """The nats-py connect options that authenticate with ``creds`` (default: the file named
    by ``MDQ_NATS_CREDS``; none: connect anonymously, which an mdq server refuses): the
    credentials and this identity's own reply-inbox prefix, the only one it may listen on."""
    if isinstance(creds, RenewableCreds):
        return creds.connect_options()
    chosen = creds or os.environ.get(CREDS_ENV)
    if not chosen:
        return {}
    path = Path(chosen)
    return {"user_credentials": str(path), "inbox_prefix": inbox_prefix(identity_of_creds(path))}


async def probe(url: str, *, timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """Return once one server of ``url`` (a comma-separated list) accepts a TCP connection;
    raise the last ``OSError`` (refused, unreachable, timed out) when none does."""
    last: OSError | None = None
    for one in url.split(","):
        text = one.strip()
        split = urlsplit(text if "://" in text else f"nats://{text}")
        host = split.hostname or "127.0.0.1"
        port = split.port or DEFAULT_PORTS.get(split.scheme, 4222)
        try:
            async with asyncio.timeout(timeout_s):
                _, writer = await asyncio.open_connection(host, port)
        except OSError as error:  # TimeoutError is an OSError
            last = error
            continue
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return
    raise last or OSError(f"no server in {redact_url(url)!r}")


async def _connect_once(
    url: str,
    *,
    name: str,
    subjects: Subjects | None,
    replicas: int = 1,
    timeout_s: float | None = None,
    creds: Creds | None = None,
) -> Client:
    """One nats-py connect (then the streams); with ``timeout_s``, give up after that long:
    nats-py keeps trying on its own when the server went away right after the probe."""
    client = Client()
    try:
        async with asyncio.timeout(timeout_s):
            await client.connect(
                url,
                name=name,
                error_cb=log_client_error,
                **CLIENT_OPTIONS,
                **SilenceSettings().client_options(),
                **auth_options(creds),
            )
        if subjects is not None:
            await require_streams(client.jetstream(), subjects, replicas=replicas)
    except BaseException:
        with contextlib.suppress(Exception):
            await client.close()
        raise
    return client


async def wait_for_nats(url: str, *, backoff: Backoff = DEFAULT_BACKOFF) -> None:
    """Return once a server of ``url`` accepts connections, logging each failed try."""
    await keep_trying(
        lambda: probe(url), what="NATS", where=redact_url(url), retry_on=(OSError,), backoff=backoff
    )


async def connect(
    url: str,
    *,
    name: str,
    subjects: Subjects | None = None,
    replicas: int = 1,
    wait: bool = False,
    backoff: Backoff = DEFAULT_BACKOFF,
    creds: Creds | None = None,
) -> Client:
    """Connect (retrying forever on reconnects) and, if ``subjects`` is given, make sure the
    namespace's streams exist, with at least ``replicas`` copies each.

    With ``wait``, a server that is not there yet (``NATS_NOT_READY``) is waited for, with
    ``backoff`` and one log line per try; other errors propagate. ``creds`` (default: the
    file named by ``MDQ_NATS_CREDS``) authenticates the connection.
    """
    if not wait:
        return await _connect_once(
            url, name=name, subjects=subjects, replicas=replicas, creds=creds
        )

    async def attempt() -> Client:
        await probe(url)
        return await _connect_once(
            url,
            name=name,
            subjects=subjects,
            replicas=replicas,
            timeout_s=2 * CONNECT_TIMEOUT_S,
            creds=creds,
        )

    return await keep_trying(
        attempt, what="NATS", where=redact_url(url), retry_on=NATS_NOT_READY, backoff=backoff
    )
