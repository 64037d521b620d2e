"""Opening the database: a SQLAlchemy async engine for readers, an asyncpg pool for the writer.

Both accept the plain ``postgresql://`` URLs of ``DATABASE_URL``, including the unix-socket form
``postgresql://user@/db?host=/socket/dir`` used by the embedded PostgreSQL.
"""

from __future__ import annotations

import asyncpg
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from mdq.embedded import sqlalchemy_url


def asyncpg_dsn(database_url: str) -> str:
    """The libpq form of a URL asyncpg accepts (``postgresql+asyncpg://`` is reduced)."""
    for prefix in ("postgresql+asyncpg://", "postgres://"):
        if database_url.startswith(prefix):
            return "postgresql://" + database_url[len(prefix) :]
    return database_url


def create_engine(database_url: str, *, pool_size: int = 5) -> AsyncEngine:
    """An async engine (asyncpg driver) for ``database_url``."""
    return create_async_engine(
        sqlalchemy_url(database_url), pool_size=pool_size, pool_pre_ping=True
    )


async def create_writer_pool(database_url: str, *, size: int = 2) -> asyncpg.Pool:
    """The watcher's asyncpg pool: a couple of connections, statements cached."""
    pool = await asyncpg.create_pool(
        asyncpg_dsn(database_url), min_size=1, max_size=size, command_timeout=60
    )
    if pool is None:  # pragma: no cover - create_pool only returns None when not awaited
        raise RuntimeError("asyncpg.create_pool returned no pool")
    return pool
