"""Tenants in intake and in their own streams, against a real NATS JetStream.

The server (``test_bus_permissions``) makes sure only tenant alice publishes on
``<ns>.api.submit.alice``; here intake's side: the tenant comes from the subject, never from
the payload, its ids carry it, its keys and dependencies are its own, and its stream gathers
its events and no one else's.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

import nats.errors
import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig, DeliverPolicy
from typer.testing import CliRunner

from mdq.bus.connect import CREDS_ENV
from mdq.bus.security.auth import generate
from mdq.bus.setup import prepare_bus
from mdq.bus.streams import (
    ensure_streams,
    ensure_tenant_stream,
    ensure_tenant_submit_consumer,
    tenant_stream_config,
)
from mdq.bus.subjects import Subjects
from mdq.bus.tenants import ensure_tenants_bucket, put_policy
from mdq.cli.main import app as cli
from mdq.contracts import pb
from mdq.core.ids import request_id_for_key, request_id_for_sequence
from mdq.core.tenants import TenantPolicy, TenantUsage, usage_key
from mdq.embedded import start_nats
from mdq.sdk.client import MdqClient
from mdq.tenancy import add_tenant
from services.intake.app import Intake
from tests.integration.test_intake import TIMEOUT, eventually, job_log, settings_for, started


async def ask(
    nc: Client, subjects: Subjects, tenant: str, payload: dict[str, object]
) -> pb.SubmitReply:
    """A request-reply submit on ``tenant``'s subject ("" = the operator's)."""
    answer = await nc.request(
        subjects.api_submit_for(tenant), json.dumps(payload).encode(), timeout=TIMEOUT
    )
    return pb.SubmitReply.FromString(answer.data) if answer.data[:1] != b"{" else _json(answer.data)


def _json(data: bytes) -> pb.SubmitReply:
    from google.protobuf import json_format

    reply = pb.SubmitReply()
    json_format.Parse(data, reply)
    return reply


async def submitted_events(js: JetStreamContext, subjects: Subjects) -> dict[str, pb.Event]:
    """Every ``submitted`` event in the jobs stream, by subject."""
    return {
        subject: event
        for subject, event in await job_log(js, subjects)
        if event.WhichOneof("body") == "submitted"
    }


async def test_a_tenants_submit_is_its_own_whatever_the_payload_says(
    intake: Intake, nc: Client, subjects: Subjects
) -> None:
    reply = await ask(
        nc,
        subjects,
        "alice",
        {"idempotency_key": "run-1", "submitted_by": "bob", "jobs": [{"name": "water"}]},
    )
    request_id = request_id_for_key("run-1", "alice")
    assert request_id.startswith("alice.")
    assert not reply.HasField("error"), reply
    assert (reply.request_id, list(reply.job_ids)) == (request_id, [f"{request_id}-water"])
    subject = f"{subjects.namespace}.job.{request_id}-water.submitted"
    await eventually(
        lambda: _has(nc.jetstream(), subjects, subject), "the tenant's submitted event"
    )
    event = (await submitted_events(nc.jetstream(), subjects))[subject]
    assert event.submitted.submitted_by == "alice"  # the subject's tenant, not the payload's
    assert event.submitted.request_id == request_id


async def _has(js: JetStreamContext, subjects: Subjects, subject: str) -> bool:
    return subject in await submitted_events(js, subjects)


async def test_the_same_key_from_two_tenants_and_the_operator_is_three_requests(
    intake: Intake, nc: Client, subjects: Subjects
) -> None:
    replies = {
        tenant: await ask(
            nc, subjects, tenant, {"idempotency_key": "shared", "jobs": [{"name": f"j{steps}"}]}
        )
        for tenant, steps in (("alice", 1), ("bob", 2), ("", 3))
    }
    # different content under one key: no "already used" refusal, nothing learned of another
    assert all(not reply.HasField("error") for reply in replies.values()), replies
    assert len({reply.request_id for reply in replies.values()}) == 3
    assert replies[""].request_id == request_id_for_key("shared")  # the operator's as before


async def test_a_tenant_depends_on_its_own_jobs_only(
    intake: Intake, nc: Client, subjects: Subjects
) -> None:
    bobs = await ask(nc, subjects, "bob", {"idempotency_key": "prep", "jobs": [{"name": "eq"}]})
    alices = await ask(nc, subjects, "alice", {"idempotency_key": "own", "jobs": [{"name": "eq"}]})
    [bob_job], [alice_job] = bobs.job_ids, alices.job_ids
    await eventually(
        lambda: _has(nc.jetstream(), subjects, subjects.job(alice_job, "submitted")),
        "alice's first job",
    )
    await eventually(
        lambda: _has(nc.jetstream(), subjects, subjects.job(bob_job, "submitted")),
        "bob's job",
    )

    async def depending_on(ref: str, key: str) -> pb.SubmitReply:
        job = {"name": "md", "depends_on": [ref]}
        return await ask(nc, subjects, "alice", {"idempotency_key": key, "jobs": [job]})

    on_bobs_id = await depending_on(bob_job, "a1")
    on_bobs_key = await depending_on("prep", "a2")
    on_own_id = await depending_on(alice_job, "a3")
    on_own_key = await depending_on("own", "a4")

    for refused in (on_bobs_id, on_bobs_key):
        assert refused.error.field == "jobs[0].depends_on[0]", refused
        assert "unknown dependency" in refused.error.message
    assert not on_own_id.HasField("error") and not on_own_key.HasField("error")
    # the operator may name any job
    operator = await ask(
        nc,
        subjects,
        "",
        {"idempotency_key": "op", "jobs": [{"name": "md", "depends_on": [bob_job]}]},
    )
    assert not operator.HasField("error"), operator


async def test_a_tenants_stream_submit_is_its_own(
    intake: Intake, nc: Client, subjects: Subjects
) -> None:
    """A keyless submit on carol's subject is stored by her own submit stream (as ``mdq
    tenant add`` makes it, after intake started: it finds the stream), which intake reads
    directly: nothing of hers is copied into the submit stream. Its request id is carol's and
    comes from her stream's sequence, as any keyless stream submit's."""
    js = nc.jetstream()
    shared_before = (await js.stream_info(subjects.submit_stream)).state
    await ensure_tenant_stream(js, subjects, "carol")
    ack = await js.publish(
        subjects.submit_for("carol"),
        json.dumps({"submitted_by": "mallory", "jobs": [{"name": "keyless"}]}).encode(),
    )
    assert ack.stream == subjects.tenant_submit_stream("carol")

    async def carols() -> list[pb.Event]:
        events = (await submitted_events(js, subjects)).values()
        return [event for event in events if event.job_id.startswith("carol.")]

    async def seen() -> bool:
        return bool(await carols())

    await eventually(seen, "carol's keyless submit")
    [event] = await carols()
    assert event.job_id == f"{request_id_for_sequence(ack.seq, 'carol')}-keyless"
    assert event.submitted.submitted_by == "carol"
    shared = (await js.stream_info(subjects.submit_stream)).state
    assert (shared.messages, shared.bytes) == (shared_before.messages, shared_before.bytes)
    assert "carol" in intake.tenant_submits.tenants


async def test_intakes_consumer_follows_its_settings(
    nats_url: str, namespace: str, nc: Client, subjects: Subjects
) -> None:
    """Durable consumers with another ack wait and another most in flight (the submit
    stream's reading the operator's subject alone, a tenant's) are brought in line with
    intake's settings in place: the submits waiting in them are handled once intake starts."""
    from mdq.bus.streams import ensure_streams

    js = nc.jetstream()
    await ensure_streams(js, subjects)
    await js.add_consumer(
        subjects.submit_stream,
        ConsumerConfig(
            durable_name="intake",
            deliver_group="intake",
            deliver_subject="_INBOX.other-intake",
            filter_subject=subjects.submit,
            deliver_policy=DeliverPolicy.ALL,
            ack_wait=5.0,
            max_ack_pending=7,
        ),
    )
    payload = {"idempotency_key": "early", "jobs": [{"name": "waited"}]}
    await js.publish(subjects.submit, json.dumps(payload).encode())
    await ensure_tenant_stream(js, subjects, "dave")
    await ensure_tenant_submit_consumer(
        js, subjects, "dave", name="intake", ack_wait_s=5.0, max_ack_pending=7
    )
    await js.publish(subjects.submit_for("dave"), json.dumps(payload).encode())
    service = await started(settings_for(nats_url, namespace))
    try:
        for tenant in ("", "dave"):
            job = f"{request_id_for_key('early', tenant)}-waited"
            subject = subjects.job(job, "submitted")
            await eventually(partial(_has, js, subjects, subject), f"{tenant!r}'s waiting submit")
    finally:
        await service.stop()
    info = await js.consumer_info(subjects.submit_stream, "intake")
    assert (info.config.filter_subjects or [info.config.filter_subject]) == [subjects.submit]
    assert info.config.ack_wait == service.settings.ack_wait_s
    assert info.config.max_ack_pending == service.settings.max_in_flight
    daves = await js.consumer_info(subjects.tenant_submit_stream("dave"), "intake")
    assert daves.config.ack_wait == service.settings.ack_wait_s
    assert daves.config.max_ack_pending == service.settings.max_in_flight


async def test_a_tenants_stream_holds_its_events_and_no_one_elses(
    intake: Intake, nc: Client, subjects: Subjects
) -> None:
    js = nc.jetstream()
    for tenant in ("erin", "frank"):
        await ensure_tenant_stream(js, subjects, tenant)
    erin = await ask(nc, subjects, "erin", {"idempotency_key": "k", "jobs": [{"name": "a"}]})
    frank = await ask(nc, subjects, "frank", {"idempotency_key": "k", "jobs": [{"name": "a"}]})
    operator = await ask(nc, subjects, "", {"idempotency_key": "k", "jobs": [{"name": "a"}]})
    refused = await ask(nc, subjects, "erin", {"idempotency_key": "bad", "jobs": [{"name": "A"}]})
    assert refused.error.field.startswith("jobs[0].name")
    [erin_job] = erin.job_ids
    await js.publish(subjects.progress(erin_job), pb.Event(job_id=erin_job).SerializeToString())

    stream = subjects.tenant_stream("erin")

    # A marker of erin's on the jobs stream, after every other job's event there: her stream
    # sources each stream in order, so once the marker is in, every earlier event of the
    # jobs stream has been taken or left out.
    marker = subjects.job(erin_job, "held")
    await js.publish(marker, pb.Event(job_id=erin_job).SerializeToString())

    async def erin_has_four() -> bool:  # submitted, rejected, progress, the marker
        return (await js.stream_info(stream)).state.messages >= 4

    await eventually(erin_has_four, "erin's stream to gather her events and the marker")
    info = await js.stream_info(stream, subjects_filter=">")
    held = set((info.state.subjects or {}).keys())
    assert held == {
        subjects.job(erin_job, "submitted"),
        subjects.rejected(refused.request_id),
        subjects.progress(erin_job),
        marker,
    }
    others = {*frank.job_ids, *operator.job_ids}
    assert not any(job in subject for subject in held for job in others)


# -- on a closed bus: `mdq tenant add`, then the SDK as that tenant -----------------------------


@pytest.fixture
def closed_bus(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A nats-server that trusts only what ``mdq.bus.security.auth`` signs, with every identity's
    credentials generated in ``<tmp>/secrets`` as ``mdq up`` does: (url, secrets folder)."""
    secrets = tmp_path / "secrets"
    generated = generate(secrets)
    server = start_nats(tmp_path / "nats", auth=generated.server_block.read_text())
    yield server.url, secrets
    server.stop()


async def test_an_added_tenant_submits_and_follows_its_own_jobs(
    closed_bus: tuple[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, secrets = closed_bus
    admin = secrets / "admin.creds"
    await prepare_bus(url, namespace="mdq", creds=admin)
    added = await add_tenant(
        "alice", secrets=secrets, nats_url=url, namespace="mdq", admin_creds=admin
    )
    assert added.creds == secrets / "tenants" / "alice.creds"
    assert added.creds.stat().st_mode & 0o777 == 0o600
    monkeypatch.setenv(CREDS_ENV, str(secrets / "intake.creds"))  # intake's own identity
    service = await started(settings_for(url, "mdq"))
    monkeypatch.delenv(CREDS_ENV)
    try:
        async with await MdqClient.connect(url, creds=added.creds) as client:
            assert client.tenant == "alice"
            [job] = await client.submit([pb.JobSpec(name="water")], idempotency_key="k1")
            assert job.startswith("alice.")
            async with contextlib.aclosing(client.watch([job])) as updates:
                async with asyncio.timeout(10):
                    first = await anext(updates)
            assert (first.kind, first.job_id) == ("submitted", job)
            assert first.event.submitted.submitted_by == "alice"
            # the operator's stream is not hers to read: the server drops the request (and
            # tells the client of a permissions violation), so no answer comes
            with pytest.raises(nats.errors.TimeoutError):
                await client.nc.request(
                    f"$JS.API.STREAM.INFO.{client.subjects.jobs_stream}", timeout=1
                )
    finally:
        await service.stop()


# -- policies: intake refuses what a tenant's policy does not allow -----------------------------


async def test_intake_enforces_each_tenants_policy(
    nats_url: str, namespace: str, nc: Client, subjects: Subjects
) -> None:
    js = nc.jetstream()
    await ensure_streams(js, subjects)
    await ensure_tenants_bucket(js, subjects)
    gina = TenantPolicy(max_queued_jobs=3, max_running_cpu=4, submits_per_minute=None)
    await put_policy(js, subjects, "gina", gina)
    await put_policy(js, subjects, "hank", TenantPolicy(max_queued_jobs=3, submits_per_minute=None))
    await put_policy(js, subjects, "ivy", TenantPolicy(submits_per_minute=6, submit_burst=1))
    waiting = await js.create_key_value(bucket=subjects.waiting_bucket)
    # placement counted 3 of hank's jobs waiting a moment ago
    await waiting.put(
        usage_key("hank"), TenantUsage(queued_jobs=3, as_of=datetime.now(UTC)).to_json()
    )
    service = await started(settings_for(nats_url, namespace))
    try:

        async def submit(tenant: str, key: str, *jobs: dict[str, object]) -> pb.SubmitReply:
            return await ask(nc, subjects, tenant, {"idempotency_key": key, "jobs": list(jobs)})

        high = await submit("gina", "g1", {"name": "a", "priority_class": "high"})
        wide = await submit("gina", "g2", {"name": "a", "resources": {"cpu": 8}})
        two = await submit("gina", "g3", {"name": "a"}, {"name": "b"})
        two_more = await submit("gina", "g4", {"name": "c"}, {"name": "d"})
        again = await submit("gina", "g3", {"name": "a"}, {"name": "b"})  # a retry
        hanks = await submit("hank", "h1", {"name": "a"})
        ivy_first = await submit("ivy", "i1", {"name": "a"})
        ivy_second = await submit("ivy", "i2", {"name": "a"})
        operator = await submit("", "o1", {"name": "a", "priority_class": "high"})
    finally:
        await service.stop()

    assert high.error.field == "jobs[0].priority_class", high
    assert "may not submit high-priority jobs" in high.error.message
    assert wide.error.field == "jobs[0].resources.cpu", wide
    assert "could never run" in wide.error.message
    assert not two.HasField("error") and len(two.job_ids) == 2
    assert two_more.error.field == "jobs", two_more
    assert "at most 3 jobs waiting; it has 2 and this submit adds 2" in two_more.error.message
    assert again == two  # the retry of an accepted submit gets its reply, quota or not
    assert hanks.error.field == "jobs" and "it has 3" in hanks.error.message, hanks
    assert not ivy_first.HasField("error")
    assert ivy_second.error.field == "" and "rate limit: tenant ivy" in ivy_second.error.message
    assert not operator.HasField("error")  # the operator is never limited
    refused = {high.request_id, wide.request_id, two_more.request_id, hanks.request_id}
    rejected = {
        event.rejected.request_id
        for _, event in await job_log(js, subjects)
        if event.WhichOneof("body") == "rejected"
    }
    assert refused <= rejected  # each refusal is in the log, for the tenant to read


def test_mdq_tenant_add_and_ls(closed_bus: tuple[str, Path]) -> None:
    """The operator's commands: add a tenant with its limits, change them, list them."""
    url, secrets = closed_bus
    asyncio.run(prepare_bus(url, namespace="mdq", creds=secrets / "admin.creds"))
    runner = CliRunner()
    base = ["--nats-url", url, "tenant"]
    added = runner.invoke(
        cli, [*base, "add", "lab-7", "--secrets", str(secrets), "--max-queued-jobs", "5"]
    )
    assert added.exit_code == 0, added.output
    assert (secrets / "tenants" / "lab-7.creds").exists()
    changed = runner.invoke(
        cli, [*base, "add", "lab-7", "--secrets", str(secrets), "--submits-per-minute", "-1"]
    )
    assert changed.exit_code == 0, changed.output
    listed = runner.invoke(
        cli, ["--nats-url", url, "--creds", str(secrets / "admin.creds"), "tenant", "ls"]
    )
    assert listed.exit_code == 0, listed.output
    [line] = [line for line in listed.output.splitlines() if line.startswith("lab-7 ")]
    policy = TenantPolicy.from_json(line.split(" ", 1)[1])
    assert policy.submits_per_minute is None and policy.max_queued_jobs == 1000  # replaced
    refused = runner.invoke(cli, [*base, "add", "intake", "--secrets", str(secrets)])
    assert refused.exit_code == 2 and "reserved" in refused.output


async def test_the_setup_narrows_a_wider_submit_stream_and_gives_tenants_their_own(
    nc: Client, subjects: Subjects
) -> None:
    """A submit stream that captures every tenant's subject too (made by hand, or by another
    build) is narrowed by the setup to the operator's subject, and each tenant gets its own
    submit stream, which the submit stream does not source."""
    from nats.js.api import StreamConfig

    js = nc.jetstream()
    wider = [subjects.submit, subjects.submit_for("*")]
    await js.delete_stream(subjects.submit_stream)
    await js.add_stream(StreamConfig(name=subjects.submit_stream, subjects=wider))
    await js.add_stream(tenant_stream_config(subjects, "olga"))  # its events' stream alone
    await ensure_streams(js, subjects)
    info = await js.stream_info(subjects.submit_stream)
    assert info.config.subjects == [subjects.submit_capture]
    assert not info.config.sources
    ack = await js.publish(subjects.submit_for("olga"), b'{"jobs": []}')
    assert ack.stream == subjects.tenant_submit_stream("olga")
