"""Where a client command finds mdq: options and environment first, then a running stack.

``--nats-url`` / ``NATS_URL``, ``--database-url`` / ``DATABASE_URL`` and ``--namespace`` /
``MDQ_NAMESPACE`` win; what is not given is read from ``<state>/stack.json``, written by a
running ``mdq up`` (state folder: ``--state-dir`` / ``MDQ_STATE_DIR``, default ``.mdq``). The
database URL found there is the read-only role's (``mdq_reader``), its password read from the
secret file stack.json names (``StackInfo.database_dsn``). NATS credentials come with the
stack's URL (the CLI identity's file, ``stack.json``'s ``nats_creds``); with a URL of your
own, ``MDQ_NATS_CREDS`` names yours; ``--creds`` / ``MDQ_NATS_CREDS`` (a tenant's, say) win
over the stack's.
"""

from __future__ import annotations

import getpass
import os
from dataclasses import dataclass
from pathlib import Path

from mdq.errors import Unavailable
from mdq.stack import StackInfo, read_stack_info


class NoEndpoint(Unavailable, RuntimeError):
    """Neither an option/environment variable nor a running stack says where to connect."""


@dataclass(frozen=True, slots=True)
class GlobalOptions:
    """The options every command shares."""

    nats_url: str | None
    database_url: str | None
    namespace: str | None
    state_dir: Path
    nats_creds: str | None = None
    """``--creds`` / ``MDQ_NATS_CREDS``: wins over the stack's CLI identity."""


@dataclass(frozen=True, slots=True)
class Endpoints:
    """Resolved connection targets of a client command."""

    nats_url: str
    database_url: str
    namespace: str
    stack: StackInfo | None
    """The running stack the URLs came from, if any."""
    nats_creds: str = ""
    """The NATS credentials file to connect with ("" = ``MDQ_NATS_CREDS``, or none)."""
    nats_admin_creds: str = ""
    """Credentials that may manage streams, for ``mdq replay --rebuild`` ("" = ``nats_creds``)."""

    def require_database(self) -> str:
        if not self.database_url:
            raise NoEndpoint(
                "no database: set DATABASE_URL (or --database-url), or start a stack with `mdq up`"
            )
        return self.database_url


def resolve_endpoints(options: GlobalOptions, *, need_nats: bool = True) -> Endpoints:
    """URLs and namespace for a client command (see the module docstring); ``need_nats``:
    False for the commands that read PostgreSQL only (``mdq ls``, a tenant's history)."""
    stack = None
    if not options.nats_url or not options.database_url:
        stack = read_stack_info(options.state_dir)
    nats_url = options.nats_url or (stack.nats_url if stack else "")
    if not nats_url and need_nats:
        raise NoEndpoint(
            f"no NATS: set NATS_URL (or --nats-url), or start a stack with `mdq up` "
            f"(no running stack found in {options.state_dir})"
        )
    from_stack = stack is not None and not options.nats_url
    return Endpoints(
        nats_url=nats_url,
        database_url=options.database_url or (stack.database_dsn() if stack else ""),
        namespace=options.namespace or (stack.namespace if stack else "mdq"),
        stack=stack,
        nats_creds=options.nats_creds or (stack.nats_creds if from_stack and stack else ""),
        nats_admin_creds=stack.nats_admin_creds if from_stack and stack else "",
    )


def user_name() -> str:
    """The account running the command, as a request names who asked (``submitted_by``,
    ``requested_by``); ``$USER`` where the system has no name for it."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return os.environ.get("USER", "")
