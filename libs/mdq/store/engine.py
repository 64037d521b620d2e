"""Opening the database: a SQLAlchemy async engine for readers, an asyncpg pool for the writer.

Both accept the plain ``postgresql://`` URLs of ``DATABASE_URL``, including the unix-socket form
``postgresql://user@/db?host=/socket/dir`` used by the embedded PostgreSQL.

PostgreSQL may be away when the writer starts or go away while it runs (a restart, a failover,
a full disk). ``create_writer_pool(..., connect_now=False)`` opens a pool without connecting, so
the watcher starts without the database; ``DATABASE_NOT_READY`` are the errors that mean "the
server is not there (yet)", after which the writer waits and tries again
(``mdq.store.projection``; ``connection_lost`` also sees one behind the error it caused), and
``database_location`` names the server in those log lines.
"""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

import asyncpg
import asyncpg.exceptions
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

DATABASE_NOT_READY: tuple[type[Exception], ...] = (
    OSError,  # refused, reset, no socket file, and every timeout
    asyncpg.PostgresConnectionError,  # 08xxx, "connection was closed in the middle of operation"
    asyncpg.OperatorInterventionError,  # 57xxx: starting up, shutting down, crashed
    asyncpg.InsufficientResourcesError,  # 53xxx: disk full, out of memory, too many connections
    asyncpg.exceptions.InternalClientError,  # asyncpg's state after the server died under it
)
"""Connection-class errors: the server is unreachable, restarting or out of resources. A
writer that meets one waits and retries; any other error is not retried as transient."""


def sqlalchemy_url(database_url: str) -> str:
    """The SQLAlchemy (asyncpg driver) form of a postgresql:// URL."""
    for prefix in ("postgresql+asyncpg://", "postgresql://", "postgres://"):
        if database_url.startswith(prefix):
            return "postgresql+asyncpg://" + database_url[len(prefix) :]
    raise ValueError(f"not a PostgreSQL URL: {database_url!r}")


def connection_lost(error: BaseException) -> bool:
    """Whether ``error``, or an error it was raised while handling, is connection-class.

    A connection that dies inside a transaction first raises ``ConnectionDoesNotExistError``;
    leaving the transaction block then raises ``InterfaceError`` ("the underlying connection is
    closed") with the first one as its context, and that is the one the caller sees.
    """
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        if isinstance(current, DATABASE_NOT_READY):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


def out_of_space(error: BaseException) -> bool:
    """Whether ``error``, or one it was raised while handling, is PostgreSQL's full disk
    (SQLSTATE 53100: "could not extend file ...: No space left on device")."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        if isinstance(current, asyncpg.exceptions.DiskFullError) or (
            isinstance(current, asyncpg.PostgresError) and "No space left" in str(current)
        ):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


SCHEMA_NOT_READY: tuple[type[Exception], ...] = (asyncpg.UndefinedTableError,)
"""The database answers but has no mdq tables yet: the migrations (``mdq.store.migrate``, the
``mdq-migrate`` Job) may run beside the watcher, so the watcher waits for them on start."""


def database_location(database_url: str) -> str:
    """Where ``database_url`` points, without credentials, for log lines:
    ``host:port (database db)``, the host being a socket folder in the unix-socket form."""
    split = urlsplit(asyncpg_dsn(database_url))
    hosts = parse_qs(split.query).get("host")
    host = hosts[0] if hosts else (split.hostname or "localhost")
    port = f":{split.port}" if split.port else ""
    database = split.path.lstrip("/")
    return f"{host}{port}" + (f" (database {database})" if database else "")


def asyncpg_dsn(database_url: str) -> str:
    """The libpq form of a URL asyncpg accepts (``postgresql+asyncpg://`` is reduced)."""
    for prefix in ("postgresql+asyncpg://", "postgres://"):
        if database_url.startswith(prefix):
            return "postgresql://" + database_url[len(prefix) :]
    return database_url


COMMAND_TIMEOUT_S = 60.0
"""How long one statement may take before its connection is given up (asyncpg's
``command_timeout``, on every pool and engine): a connection whose server went silent (its host
gone without a reset) answers nothing, and without it a query, or the pool's pre-ping, would
wait on it for as long as the kernel keeps the socket, holding its pool slot. The next use
opens a new connection (docs/architecture.md, "A connection that goes silent")."""


def create_engine(
    database_url: str, *, pool_size: int = 5, command_timeout_s: float = COMMAND_TIMEOUT_S
) -> AsyncEngine:
    """An async engine (asyncpg driver) for ``database_url``; a statement that gets no answer
    for ``command_timeout_s`` fails with ``TimeoutError`` and its connection is dropped."""
    return create_async_engine(
        sqlalchemy_url(database_url),
        pool_size=pool_size,
        pool_pre_ping=True,
        connect_args={"command_timeout": command_timeout_s},
    )


async def keep_session(connection: asyncpg.Connection) -> None:
    """A pool's reset that leaves the session as it is (see ``create_writer_pool``)."""


async def create_writer_pool(
    database_url: str, *, size: int = 2, connect_now: bool = True
) -> asyncpg.Pool:
    """The watcher's asyncpg pool: a couple of connections, statements cached.

    With ``connect_now`` one connection is opened at once (so a wrong URL fails here);
    without, the pool connects on first use and creating it needs no server.

    A connection goes back to the pool as it is (``keep_session``): the writer's statements
    leave no session state behind (no ``SET``, ``LISTEN``, open cursor or session-level lock:
    the partition functions' locks are the transaction's), and asyncpg's default reset would
    cost a round trip after every batch. An open transaction is still rolled back on release.
    """
    pool = await asyncpg.create_pool(
        asyncpg_dsn(database_url),
        min_size=1 if connect_now else 0,
        max_size=size,
        command_timeout=COMMAND_TIMEOUT_S,
        reset=keep_session,
    )
    if pool is None:  # pragma: no cover - create_pool only returns None when not awaited
        raise RuntimeError("asyncpg.create_pool returned no pool")
    return pool
