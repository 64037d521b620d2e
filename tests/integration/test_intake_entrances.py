"""Intake's request-reply entrances take requests only: a message without a reply subject is
dropped unread. Such messages are what lands there when a client names an entrance as the
reply subject of another request (a JetStream API answer, aimed by one tenant at another's
entrance), and nobody would hear an answer to them anyway. And a tenant flooding them past its
rate is answered, not recorded: its refusals cost no storage."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator

import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from mdq.bus.runtime import LineBudgetFilter
from mdq.bus.streams import ensure_streams, ensure_tenant_stream
from mdq.bus.subjects import Subjects
from mdq.bus.tenants import ensure_tenants_bucket, put_policy
from mdq.contracts import pb
from mdq.core.ids import request_id_for_key
from mdq.core.line_budget import LineBudget
from mdq.core.tenants import TenantPolicy
from services.intake.app import Intake
from tests.integration.test_intake import eventually, job_log, settings_for, started
from tests.integration.test_tenants import ask


@pytest.fixture
async def intake(nats_url: str, namespace: str, nc: Client) -> AsyncIterator[Intake]:
    service = await started(settings_for(nats_url, namespace))
    yield service
    await service.stop()


async def one_a_minute(nc: Client, subjects: Subjects, tenant: str) -> JetStreamContext:
    """The namespace's streams, and ``tenant`` allowed one submit a minute, in a burst of one."""
    js = nc.jetstream()
    await ensure_streams(js, subjects)
    await ensure_tenants_bucket(js, subjects)
    await put_policy(js, subjects, tenant, TenantPolicy(submits_per_minute=1, submit_burst=1))
    return js


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


async def test_a_tenants_refusals_for_its_rate_are_answered_not_stored(
    nats_url: str, namespace: str, nc: Client, subjects: Subjects
) -> None:
    """Forty request-reply submits at once from a tenant allowed one: one accepted, the rest
    told "rate limit", and not one ``rejected`` event in the jobs log (the history's
    ``rejections`` rows come from them). Red while each refusal was stored."""
    js = await one_a_minute(nc, subjects, "flood")
    service = await started(settings_for(nats_url, namespace))
    try:
        replies = await asyncio.gather(
            *(
                ask(nc, subjects, "flood", {"idempotency_key": f"k{n}", "jobs": [{"name": "w"}]})
                for n in range(40)
            )
        )
    finally:
        await service.stop()
    accepted = [reply for reply in replies if not reply.HasField("error")]
    refused = [reply for reply in replies if reply.HasField("error")]
    assert len(accepted) == 1 and len(refused) == 39
    assert all("rate limit: tenant flood" in reply.error.message for reply in refused)
    kinds = [event.WhichOneof("body") for _, event in await job_log(js, subjects)]
    assert kinds.count("submitted") == 1 and kinds.count("rejected") == 0, kinds


async def test_a_tenant_past_its_rate_is_refused_before_its_submit_is_validated(
    nats_url: str, namespace: str, nc: Client, subjects: Subjects
) -> None:
    """The rate is asked first: past it, a submit that would not validate is told "rate
    limit" (validating a flood was most of what it cost intake), and an invalid submit takes
    a token as a valid one does."""
    await one_a_minute(nc, subjects, "eager")
    invalid: dict[str, object] = {"idempotency_key": "bad", "jobs": [{"name": "w", "steps": -5}]}
    service = await started(settings_for(nats_url, namespace))
    try:
        first = await ask(nc, subjects, "eager", invalid)
        second = await ask(
            nc, subjects, "eager", {"idempotency_key": "ok", "jobs": [{"name": "w"}]}
        )
        third = await ask(nc, subjects, "eager", invalid | {"idempotency_key": "bad2"})
    finally:
        await service.stop()
    assert first.error.field == "jobs[0].steps", first.error  # its token: the burst of one
    assert "rate limit: tenant eager" in second.error.message, second.error
    assert "rate limit: tenant eager" in third.error.message, third.error


async def test_a_tenant_past_its_rate_is_answered_before_its_request_is_read(
    nats_url: str,
    namespace: str,
    nc: Client,
    subjects: Subjects,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Past its rate, a tenant's request is refused "rate limit" as it arrives: what it holds
    is never read (bytes that are no submit at all get the same answer, in JSON when they look
    like JSON, in protobuf otherwise), and the registry is not asked, so a retry of a submit
    accepted before hears "rate limit" too, and its answer once within the rate. The answer is
    sent when the tenant may submit again, at most ``MDQ_INTAKE_RATE_HOLD_S`` later: a client
    that waits for its answers is paced. Another tenant's submit goes on."""
    monkeypatch.setenv("MDQ_INTAKE_RATE_HOLD_S", "0.3")
    await one_a_minute(nc, subjects, "eager")
    service = await started(settings_for(nats_url, namespace))
    try:
        accepted = await ask(
            nc, subjects, "eager", {"idempotency_key": "a", "jobs": [{"name": "w"}]}
        )
        assert accepted.job_ids, accepted
        asked_at = time.monotonic()
        unread = await nc.request(subjects.api_submit_for("eager"), b"\x00not a submit", timeout=10)
        assert time.monotonic() - asked_at >= 0.3, "answered once the hold is over"
        as_json = await nc.request(subjects.api_submit_for("eager"), b"{not json", timeout=10)
        again = await ask(nc, subjects, "eager", {"idempotency_key": "a", "jobs": [{"name": "w"}]})
        other = await ask(nc, subjects, "calm", {"idempotency_key": "a", "jobs": [{"name": "w"}]})
        assert service.refused_unread == 3
    finally:
        await service.stop()
    refused = pb.SubmitReply.FromString(unread.data)
    assert refused.error.field == "" and "rate limit: tenant eager" in refused.error.message
    assert unread.headers and unread.headers["content-type"] == "application/x-protobuf"
    assert json.loads(as_json.data)["error"]["message"].startswith("rate limit: tenant eager")
    assert "rate limit: tenant eager" in again.error.message, again
    assert other.job_ids and not other.HasField("error"), other


async def test_a_tenants_flood_of_refused_submits_logs_a_few_lines_a_second(
    nats_url: str, namespace: str, nc: Client, subjects: Subjects, caplog: pytest.LogCaptureFixture
) -> None:
    """Three hundred fire-and-forget submits that do not validate, of a tenant with no rate
    limit: each refused with its ``rejected`` event, but intake's log holds the budget of that
    tenant's refusals (the burst, then a few a second, a line saying how many were held back),
    and another tenant's refusal in the middle of it is logged all the same (the filter every
    service installs, ``mdq.bus.runtime.configure_logging``)."""
    js = nc.jetstream()
    await ensure_streams(js, subjects)
    await ensure_tenants_bucket(js, subjects)
    await put_policy(js, subjects, "flood", TenantPolicy(submits_per_minute=None))
    for tenant in ("flood", "calm"):
        await ensure_tenant_stream(js, subjects, tenant)
    budget = LineBudget()
    caplog.handler.addFilter(LineBudgetFilter(budget))
    service = await started(settings_for(nats_url, namespace))
    started_at = time.monotonic()
    invalid = b'{"jobs": [{"name": "w", "steps": -1}]}'
    try:
        with caplog.at_level(logging.INFO, logger="services.intake"):
            for number in range(300):
                await js.publish(subjects.submit_for("flood"), invalid)
                if number == 150:
                    await js.publish(subjects.submit_for("calm"), invalid)

            async def all_answered() -> bool:
                kinds = [event.WhichOneof("body") for _, event in await job_log(js, subjects)]
                return kinds.count("rejected") == 301

            await eventually(all_answered, "every fire-and-forget submit refused")
    finally:
        await service.stop()
    elapsed = time.monotonic() - started_at
    lines = [record.getMessage() for record in caplog.records]
    flood = [line for line in lines if line.startswith("refused flood.")]
    assert len(flood) <= 50 + 5 * elapsed + 1, (len(flood), elapsed)
    assert any("more like this held back" in line for line in flood) or len(flood) == 50
    assert [line for line in lines if line.startswith("refused calm.")], lines[-5:]
