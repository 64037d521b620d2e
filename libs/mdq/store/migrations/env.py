"""Alembic environment of the mdq store: async (asyncpg) engine, one locked transaction.

The URL comes from ``config.attributes["database_url"]`` (set by ``mdq.store.migrate``) or,
for the ``alembic`` command line, from ``DATABASE_URL``. Only asyncpg is installed, so the
migrations run through SQLAlchemy's async engine with ``connection.run_sync``. A transaction
level advisory lock makes concurrent upgrades (several services starting at once) wait for
each other instead of racing to create the same tables.
"""

from __future__ import annotations

import asyncio
import os

from alembic import context
from sqlalchemy import pool, text
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import create_async_engine

from mdq.store.engine import sqlalchemy_url
from mdq.store.models import Base

MIGRATION_LOCK_KEY = 0x6D6471  # "mdq"

config = context.config
target_metadata = Base.metadata


def _database_url() -> str:
    url = config.attributes.get("database_url") or os.environ.get("DATABASE_URL", "")
    if not url:
        raise RuntimeError("no database URL: set DATABASE_URL or use mdq.store.migrate.upgrade")
    return sqlalchemy_url(str(url))


def run_migrations_offline() -> None:
    """Emit the SQL instead of running it (``alembic upgrade --sql``)."""
    context.configure(
        url=_database_url(),
        target_metadata=target_metadata,
        literal_binds=True,
        dialect_opts={"paramstyle": "named"},
    )
    with context.begin_transaction():
        context.run_migrations()


def do_run_migrations(connection: Connection) -> None:
    context.configure(connection=connection, target_metadata=target_metadata)
    with context.begin_transaction():
        connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK_KEY})
        context.run_migrations()


async def run_async_migrations() -> None:
    engine = create_async_engine(_database_url(), poolclass=pool.NullPool)
    try:
        async with engine.connect() as connection:
            await connection.run_sync(do_run_migrations)
            await connection.commit()
    finally:
        await engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    asyncio.run(run_async_migrations())
