"""Intake's request-reply entrances take requests only: a message without a reply subject is
dropped unread. Such messages are what lands there when a client names an entrance as the
reply subject of another request (a JetStream API answer, aimed by one tenant at another's
entrance), and nobody would hear an answer to them anyway."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest
from nats.aio.client import Client
from nats.js.errors import NotFoundError

from mdq.bus.subjects import Subjects
from mdq.core.ids import request_id_for_key
from services.intake.app import Intake
from tests.integration.test_intake import eventually, settings_for, started


@pytest.fixture
async def intake(nats_url: str, namespace: str, nc: Client) -> AsyncIterator[Intake]:
    service = await started(settings_for(nats_url, namespace))
    yield service
    await service.stop()


def submit(key: str) -> bytes:
    return json.dumps({"idempotency_key": key, "jobs": [{"name": "w", "steps": 100}]}).encode()


async def test_a_message_without_a_reply_subject_is_not_a_submit(
    intake: Intake, nc: Client, subjects: Subjects
) -> None:
    """Red while intake parsed them: each made a job."""
    await nc.publish(subjects.api_submit, submit("unasked"))
    await nc.publish(subjects.api_submit_for("bob"), submit("unasked"))

    async def both_dropped() -> bool:
        return intake.ignored_without_reply == 2

    await eventually(both_dropped, "the two messages without a reply subject dropped")
    answer = await nc.request(subjects.api_submit, submit("asked"), timeout=10)
    assert json.loads(answer.data)["job_ids"]  # a request is still a request
    js = nc.jetstream()
    for tenant in ("", "bob"):
        job = f"{request_id_for_key('unasked', tenant)}-w"
        with pytest.raises(NotFoundError):
            await js.get_last_msg(subjects.jobs_stream, subjects.job(job, "submitted"))
