"""Applying the Alembic migrations that ship inside the package.

``upgrade(database_url)`` is what the watcher (on start), the CLI and the tests call. It is
idempotent, and safe to run from several processes at once (an advisory lock serialises them,
see ``migrations/env.py``) or threads (a lock here: Alembic's context is process-global).
No alembic.ini is needed: the configuration is built here.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.util import CommandError

from mdq.errors import Conflict

MIGRATIONS = Path(__file__).with_name("migrations")
HEAD = "head"
_IN_PROCESS = threading.Lock()  # Alembic's ``context`` is process-global, not thread-safe


def alembic_config(database_url: str) -> Config:
    """An Alembic configuration for the packaged migrations and ``database_url``."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["database_url"] = database_url
    return config


class UnknownSchema(Conflict):
    """The database holds a schema revision this mdq does not know: one of an earlier build's
    migrations (mdq's schema is one migration while it is unreleased) or of a newer mdq."""


def _upgrade(database_url: str, revision: str) -> None:
    with _IN_PROCESS:
        try:
            command.upgrade(alembic_config(database_url), revision)
        except CommandError as error:
            if "Can't locate revision" not in str(error):
                raise
            raise UnknownSchema(
                f"the database's schema is not one this mdq knows ({error}): it was made by "
                "another build of mdq. Use a fresh database: remove the stack's state folder "
                "(.mdq, or MDQ_STATE_DIR) for the embedded one, or point DATABASE_URL at an "
                "empty database, then `mdq replay --rebuild` fills it from the log"
            ) from error


def upgrade(database_url: str, revision: str = HEAD) -> None:
    """Bring the database at ``database_url`` (postgresql://...) up to ``revision``.

    Alembic's environment runs its own event loop, so when called from inside a running loop
    the work is done on a helper thread (the caller blocks until it is finished).
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        _upgrade(database_url, revision)
        return
    failure: list[BaseException] = []

    def work() -> None:
        try:
            _upgrade(database_url, revision)
        except BaseException as error:  # re-raised in the caller's thread
            failure.append(error)

    thread = threading.Thread(target=work, name="mdq-migrate")
    thread.start()
    thread.join()
    if failure:
        raise failure[0]


async def upgrade_async(database_url: str, revision: str = HEAD) -> None:
    """``upgrade`` without blocking the running event loop."""
    await asyncio.to_thread(_upgrade, database_url, revision)


def current_revision(database_url: str) -> str | None:
    """The revision the database is at (None for an empty database)."""
    import asyncpg

    from mdq.store.engine import asyncpg_dsn

    async def read() -> str | None:
        connection = await asyncpg.connect(asyncpg_dsn(database_url))
        try:
            exists = await connection.fetchval("SELECT to_regclass('alembic_version')")
            if exists is None:
                return None
            value = await connection.fetchval("SELECT version_num FROM alembic_version")
            return str(value) if value is not None else None
        finally:
            await connection.close()

    return asyncio.run(read())
