"""``mdq status``: how a running stack is — every supervised part, and whether the servers answer.

The parts are read from ``<state>/status.json``, which a running ``mdq up`` rewrites on every
change (a start, an exit, a restart); uptimes are computed here from each part's start time.
Whether NATS and PostgreSQL answer is asked of them directly, with short timeouts, so the
answer is the servers' own and not the stack's opinion of them.
"""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass

import asyncpg
import nats
from rich.console import Console
from rich.table import Table

from mdq.bus.connect import auth_options
from mdq.stack import ChildStatus

PROBE_TIMEOUT_S = 3.0


@dataclass(frozen=True, slots=True)
class Probe:
    """Whether a server answered, and what it said if it did not."""

    name: str
    url: str
    ok: bool
    detail: str
    seconds: float


async def probe_nats(url: str, *, limit_s: float = PROBE_TIMEOUT_S, creds: str = "") -> Probe:
    """Connect once (no reconnects) and round-trip a flush, within ``limit_s``."""
    started = time.monotonic()
    try:
        async with asyncio.timeout(limit_s):
            client = await nats.connect(
                url,
                connect_timeout=limit_s,
                allow_reconnect=False,
                max_reconnect_attempts=0,
                name="mdq-status",
                **auth_options(creds or None),
            )
            try:
                await client.flush()
            finally:
                await client.close()
    except Exception as error:  # any failure to answer is the answer
        return Probe("NATS", url, False, f"{type(error).__name__}: {error}", _since(started))
    return Probe("NATS", url, True, "answers", _since(started))


def without_password(text: str) -> str:
    """``text`` with the password of every URL in it taken out (``user:secret@`` ->
    ``user@``): what ``mdq status`` may print."""
    return _PASSWORD_IN_URL.sub(r"\1@", text)


_PASSWORD_IN_URL = re.compile(r"(//[^:/@\s]+):[^@\s]*@")


async def probe_postgres(
    url: str, *, limit_s: float = PROBE_TIMEOUT_S, shown: str = "", password_file: str = ""
) -> Probe:
    """Connect once and run ``SELECT 1``, within ``limit_s``. The probe names ``shown`` (or
    ``url`` without its password) and the file the password is in, never the password."""
    started = time.monotonic()
    name = without_password(shown or url) + (
        f" (password in {password_file})" if password_file else ""
    )
    try:
        async with asyncio.timeout(limit_s):
            connection = await asyncpg.connect(url, timeout=limit_s)
            try:
                await connection.fetchval("SELECT 1")
            finally:
                await connection.close()
    except Exception as error:  # any failure to answer is the answer
        detail = without_password(f"{type(error).__name__}: {error}")
        return Probe("PostgreSQL", name, False, detail, _since(started))
    return Probe("PostgreSQL", name, True, "answers", _since(started))


async def probe_servers(
    nats_url: str,
    database_url: str,
    *,
    creds: str = "",
    shown_database_url: str = "",
    password_file: str = "",
) -> list[Probe]:
    """Both probes side by side (PostgreSQL only when a URL is known); ``creds``: the NATS
    credentials to connect with; ``database_url`` may hold a password, which no probe shows
    (``shown_database_url`` and ``password_file`` say where it is instead)."""
    probes = [probe_nats(nats_url, creds=creds)]
    if database_url:
        probes.append(
            probe_postgres(database_url, shown=shown_database_url, password_file=password_file)
        )
    return list(await asyncio.gather(*probes))


def _since(started: float) -> float:
    return time.monotonic() - started


def format_uptime(seconds: float | None) -> str:
    """``3 s``, ``4 min 05 s``, ``2 h 03 min``; ``-`` while down."""
    if seconds is None:
        return "-"
    whole = int(seconds)
    if whole < 60:
        return f"{whole} s"
    if whole < 3600:
        return f"{whole // 60} min {whole % 60:02d} s"
    return f"{whole // 3600} h {(whole % 3600) // 60:02d} min"


def render(console: Console, parts: list[ChildStatus], probes: list[Probe], *, now: float) -> None:
    """The parts table, then one line per server probe."""
    table = Table(title="mdq stack", expand=False)
    for column in ("part", "kind", "pid", "state", "restarts", "uptime", "last exit"):
        table.add_column(column)
    for part in parts:
        table.add_row(
            part.name,
            part.kind,
            str(part.pid) if part.pid is not None and part.running else "-",
            "[green]running[/]" if part.running else "[red]down[/]",
            str(part.restarts),
            format_uptime(part.uptime_s(now)),
            part.last_exit or "-",
        )
    console.print(table)
    for probe in probes:
        verdict = "[green]answers[/]" if probe.ok else f"[red]does not answer[/] ({probe.detail})"
        console.print(f"{probe.name:<11} {probe.url}  {verdict}")


def healthy(parts: list[ChildStatus], probes: list[Probe]) -> bool:
    """Every part running and every server answering."""
    return all(part.running for part in parts) and all(probe.ok for probe in probes)
