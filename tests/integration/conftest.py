"""Fixtures that several integration test files share (a file's own fixture of the same name
takes precedence)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import asyncpg
import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext

from mdq.bus.publisher import EventPublisher
from mdq.bus.subjects import Subjects
from mdq.store.migrate import upgrade_async
from services.intake.app import Intake
from tests.helpers import RecordingBackend, publisher
from tests.integration.test_intake import settings_for, started


@pytest.fixture
async def intake(nats_url: str, namespace: str, nc: Client) -> AsyncIterator[Intake]:
    """Intake on the test's namespace (once ``nc`` is up), stopped afterwards."""
    service = await started(settings_for(nats_url, namespace))
    yield service
    await service.stop()


@pytest.fixture
def bus(js: JetStreamContext, subjects: Subjects) -> EventPublisher:
    """Publishes the test's events on its namespace, each as the service that owns its kind."""
    return publisher(js, subjects)


@pytest.fixture
def backend() -> RecordingBackend:
    """The cluster backend port in memory, for the services a test runs."""
    return RecordingBackend()


@pytest.fixture
async def connection(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    """The administrator's connection to the test's database, migrated to the latest revision
    first (no roles of the deployment's: the schema's tables, views and functions as the
    migration leaves them); closed afterwards."""
    await upgrade_async(database_url)
    connection = await asyncpg.connect(database_url)
    try:
        yield connection
    finally:
        await connection.close()
