"""What a NATS server that is away looks like to a client, and how a loop says it rode one out.

A server restarting, a lost connection or a JetStream still starting are moments every
service lives through: ``NATS_NOT_READY`` are the errors of a server not there yet (what
``mdq.bus.connect`` waits through), ``LOST_CONNECTION`` those of a connection that went away
(nats-py reconnects by itself), and ``BUS_AWAY`` both, as a request or publish made meanwhile
raises them. ``warn_try_failed`` logs a failed try of a loop that tries again: one line for
these, the traceback for anything else.
"""

from __future__ import annotations

import logging

import nats.errors
import nats.js.errors

NATS_NOT_READY: tuple[type[Exception], ...] = (
    OSError,  # refused, reset, unreachable, and every timeout (nats' own TimeoutError too)
    nats.errors.NoServersError,
    nats.errors.NoRespondersError,  # JetStream not enabled yet
    nats.errors.ConnectionClosedError,
    nats.js.errors.ServiceUnavailableError,  # JetStream starting (503)
    nats.js.errors.NoStreamResponseError,
)
"""Errors that mean "the server is not there yet", retried by ``connect(wait=True)``."""

LOST_CONNECTION: tuple[type[Exception], ...] = (
    OSError,
    nats.errors.UnexpectedEOF,
    nats.errors.StaleConnectionError,
    nats.errors.ConnectionClosedError,
    nats.errors.NoServersError,
)
"""Errors of a connection to a server that went away: nats-py reconnects by itself."""

BUS_AWAY: tuple[type[Exception], ...] = tuple(dict.fromkeys(NATS_NOT_READY + LOST_CONNECTION))
"""Errors of a request or publish made while the server is away or restarting."""


def warn_try_failed(logger: logging.Logger, what: str, error: Exception) -> None:
    """Log a try that failed and is made again later (a heartbeat, a sampling round, a read
    asked again on the next pass): one line when NATS is away for a moment (``BUS_AWAY``),
    which happens and says nothing more, and the traceback for anything else, a bug to see."""
    if isinstance(error, BUS_AWAY):
        logger.warning("%s: %s: %s (NATS away; trying again)", what, type(error).__name__, error)
    else:
        logger.warning("%s", what, exc_info=error)
