"""Waiting for a server that is not there (yet): exponential backoff with one clear log line.

No service may exit because NATS or PostgreSQL does not answer yet. ``keep_trying`` runs an
attempt until it succeeds, retrying only the exception types the caller names and logging one
line per failure with the server, the reason and the next delay; anything else propagates.
Design: docs/architecture.md, "When NATS or PostgreSQL is down".
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar
from urllib.parse import urlsplit, urlunsplit

T = TypeVar("T")

log = logging.getLogger("mdq.backoff")


@dataclass(frozen=True, slots=True)
class Backoff:
    """Delays between tries: ``initial_s``, doubling, never more than ``max_s``."""

    initial_s: float = 0.5
    factor: float = 2.0
    max_s: float = 5.0
    """Bounds how long a service takes to notice that its server is back."""

    def delays(self) -> Iterator[float]:
        delay = self.initial_s
        while True:
            yield delay
            delay = min(delay * self.factor, self.max_s)


DEFAULT_BACKOFF = Backoff()


def describe_error(error: BaseException) -> str:
    """``TypeName: message`` (the type alone when the message is empty), on one line."""
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def redact_url(url: str) -> str:
    """``url`` without its password (``nats://user:***@host:4222``), for log lines."""
    parts = []
    for one in url.split(","):  # NATS accepts a comma-separated list of servers
        split = urlsplit(one.strip())
        if split.password is None:
            parts.append(one.strip())
            continue
        host = split.hostname or ""
        netloc = f"{split.username}:***@{host}" + (f":{split.port}" if split.port else "")
        parts.append(urlunsplit(split._replace(netloc=netloc)))
    return ",".join(parts)


async def keep_trying(
    attempt: Callable[[], Awaitable[T]],
    *,
    what: str,
    where: str,
    retry_on: tuple[type[BaseException], ...],
    backoff: Backoff = DEFAULT_BACKOFF,
    logger: logging.Logger = log,
) -> T:
    """Await ``attempt()`` until it returns; after an error of a ``retry_on`` type, log one line
    ("<what> at <where> not reachable (<error>); retrying in <delay> s") and wait.

    Other errors propagate. When it succeeds after failures, one more line says so.
    """
    delays = backoff.delays()
    failures = 0
    started = time.monotonic()
    while True:
        try:
            result = await attempt()
        except retry_on as error:
            failures += 1
            delay = next(delays)
            logger.warning(
                "%s at %s not reachable (%s); retrying in %.1f s",
                what,
                where,
                describe_error(error),
                delay,
            )
            await asyncio.sleep(delay)
            continue
        if failures:
            logger.info(
                "%s at %s reached after %d failed tries (%.1f s)",
                what,
                where,
                failures,
                time.monotonic() - started,
            )
        return result
