"""A tenant's fire-and-forget submits, read by intake from the tenant's own submit stream at
the tenant's rate (``services.intake.paced``), against a real NATS JetStream.

The tenant's stream is a work queue: a submit intake has handled leaves it, so it holds the
submits waiting, at most ``MDQ_STORAGE_TENANT_SUBMIT_MSGS``; past that the server refuses the
tenant's publishes, storing nothing, and nobody else's. A flood waits there and is read no
faster than the tenant may submit: nothing is copied into a shared stream, no submit is refused
for the rate, and the others' submits go on. Intake finds tenants' streams as they are made and
removed, and its replicas share each tenant's durable consumer.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import AsyncIterator

import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import RetentionPolicy
from nats.js.errors import NotFoundError

from mdq.bus.storage import StorageSettings
from mdq.bus.streams import (
    StreamRetentionDiffers,
    ensure_streams,
    ensure_tenant_stream,
    remove_tenant_streams,
    tenant_submit_stream_config,
)
from mdq.bus.subjects import Subjects
from mdq.bus.tenants import ensure_tenants_bucket, put_policy
from mdq.contracts import pb
from mdq.core.ids import request_id_for_key, request_id_for_sequence
from mdq.core.tenants import TenantPolicy
from mdq.sdk import MdqClient, SubmitRefused
from services.intake.app import Intake, IntakeSettings, build_intake
from tests.integration.test_intake import eventually, job_log, settings_for, started


async def with_policy(
    nc: Client,
    subjects: Subjects,
    tenant: str,
    policy: TenantPolicy,
    storage: StorageSettings | None = None,
) -> JetStreamContext:
    """The namespace's streams, ``tenant``'s streams (as ``mdq tenant add`` makes them, with
    the limits of ``storage``) and its ``policy``."""
    js = nc.jetstream()
    await ensure_streams(js, subjects)
    await ensure_tenants_bucket(js, subjects)
    await ensure_tenant_stream(js, subjects, tenant, storage=storage)
    await put_policy(js, subjects, tenant, policy)
    return js


def submit(key: str, name: str = "w", **job: object) -> bytes:
    body: dict[str, object] = {"jobs": [{"name": name, "steps": 100, **job}]}
    if key:
        body["idempotency_key"] = key
    return json.dumps(body).encode()


async def events_of(js: JetStreamContext, subjects: Subjects, kind: str) -> list[pb.Event]:
    return [event for _, event in await job_log(js, subjects) if event.WhichOneof("body") == kind]


@pytest.fixture
async def intake(nats_url: str, namespace: str, nc: Client) -> AsyncIterator[Intake]:
    service = await started(settings_for(nats_url, namespace))
    yield service
    await service.stop()


async def test_a_tenants_flood_waits_in_its_own_stream_and_grows_no_shared_one(
    nats_url: str, namespace: str, nc: Client, subjects: Subjects
) -> None:
    """Fifty fire-and-forget submits of a tenant allowed one a minute: one is handled (and
    leaves the tenant's stream), the other 49 wait in its own stream, unread; the submit
    stream holds none of them and the jobs log no ``rejected`` event."""
    js = await with_policy(
        nc, subjects, "flood", TenantPolicy(submits_per_minute=1, submit_burst=1)
    )
    shared = await js.stream_info(subjects.submit_stream)
    service = await started(settings_for(nats_url, namespace))
    try:
        for number in range(50):
            await js.publish(subjects.submit_for("flood"), submit(f"f{number}"))

        async def one_handled() -> bool:
            return len(await events_of(js, subjects, "submitted")) == 1

        await eventually(one_handled, "the flood's first submit handled")
        await asyncio.sleep(1.0)  # another one handled, or refused, would show by now
        info = await js.consumer_info(subjects.tenant_submit_stream("flood"), "intake")
    finally:
        await service.stop()
    [first] = await events_of(js, subjects, "submitted")
    assert first.job_id == f"{request_id_for_key('f0', 'flood')}-w"  # the first published
    assert await events_of(js, subjects, "rejected") == []
    assert (info.num_pending, info.num_ack_pending) == (49, 0)
    after = await js.stream_info(subjects.submit_stream)
    assert (after.state.messages, after.state.bytes) == (shared.state.messages, shared.state.bytes)
    assert (await js.stream_info(subjects.tenant_submit_stream("flood"))).state.messages == 49


async def test_a_handled_submit_leaves_the_tenants_stream_and_its_id_stays_taken(
    intake: Intake, nc: Client, subjects: Subjects
) -> None:
    """A submit intake has handled and acked leaves the tenant's stream (a work queue), and its
    message id is still deduplicated there after it left, within the duplicate window: the
    same publish again is acknowledged as a duplicate, stores nothing and starts nothing."""
    js = await with_policy(nc, subjects, "tidy", TenantPolicy(submits_per_minute=None))
    stream = subjects.tenant_submit_stream("tidy")
    headers = {"Nats-Msg-Id": "submit:once"}
    first = await js.publish(subjects.submit_for("tidy"), submit("once"), headers=headers)
    keyless = await js.publish(subjects.submit_for("tidy"), submit(""))

    async def both_acked() -> bool:
        try:
            info = await js.consumer_info(stream, "intake")
        except NotFoundError:  # intake has not found the stream yet
            return False
        return bool(info.delivered.stream_seq == keyless.seq and info.num_ack_pending == 0)

    await eventually(both_acked, "both submits handled and acked")
    state = (await js.stream_info(stream)).state
    assert (state.messages, state.bytes, state.last_seq) == (0, 0, keyless.seq)
    again = await js.publish(subjects.submit_for("tidy"), submit("once"), headers=headers)
    assert again.duplicate and again.seq == first.seq, again
    state = (await js.stream_info(stream)).state
    assert (state.messages, state.last_seq) == (0, keyless.seq)
    consumer = await js.consumer_info(stream, "intake")  # nothing more for intake to handle
    assert (consumer.num_pending, consumer.delivered.stream_seq) == (0, keyless.seq)
    jobs = sorted(event.job_id for event in await events_of(js, subjects, "submitted"))
    assert jobs == sorted(
        [
            f"{request_id_for_key('once', 'tidy')}-w",
            f"{request_id_for_sequence(keyless.seq, 'tidy')}-w",  # a keyless id: its sequence
        ]
    )


async def test_a_flood_past_the_queue_cap_is_refused_storing_nothing_and_others_go_on(
    nats_url: str, namespace: str, nc: Client, subjects: Subjects
) -> None:
    """A tenant's stream holds at most ``tenant_submit_msgs`` waiting submits (five here):
    the sixth publish is refused by the server, and the SDK says the tenant's queue is full
    and how many wait; a flood of plain publishes past it stores nothing (the stream's count,
    size and last sequence stay). Another tenant's submits are stored and handled meanwhile;
    once intake has handled the queue, the tenant publishes again."""
    storage = StorageSettings(tenant_submit_msgs=5)
    for tenant in ("calm", "full"):
        js = await with_policy(nc, subjects, tenant, TenantPolicy(submits_per_minute=None), storage)
    stream = subjects.tenant_submit_stream("full")
    client = MdqClient(nc=nc, subjects=subjects, tenant="full")
    stored = [
        await client.publish_submit([pb.JobSpec(name="w", steps=100)], idempotency_key=f"q{n}")
        for n in range(5)
    ]
    with pytest.raises(SubmitRefused) as refused:
        await client.publish_submit([pb.JobSpec(name="w", steps=100)], idempotency_key="q5")
    message = refused.value.message
    assert "tenant full's submit queue" in message and "is full" in message, message
    assert "5 submits waiting for intake" in message, message
    assert "MDQ_STORAGE_TENANT_SUBMIT_MSGS" in message and "nothing was stored" in message
    at_cap = (await js.stream_info(stream)).state
    for number in range(200):
        await nc.publish(subjects.submit_for("full"), submit(f"flood{number}"))
    await nc.flush()
    calm = await js.publish(subjects.submit_for("calm"), submit("calm-1"))
    assert calm.stream == subjects.tenant_submit_stream("calm")
    state = (await js.stream_info(stream)).state
    assert (state.messages, state.bytes, state.last_seq) == (5, at_cap.bytes, at_cap.last_seq)

    service = await started(settings_for(nats_url, namespace))
    try:
        expected = {job for [job] in stored} | {f"{request_id_for_key('calm-1', 'calm')}-w"}

        async def all_handled() -> bool:
            jobs = {event.job_id for event in await events_of(js, subjects, "submitted")}
            return jobs == expected

        await eventually(all_handled, "the five queued submits and calm's")

        async def emptied() -> bool:
            return (await js.stream_info(stream)).state.messages == 0

        await eventually(emptied, "the queue emptied")
        [later] = await client.publish_submit(
            [pb.JobSpec(name="w", steps=100)], idempotency_key="q5"
        )

        async def later_handled() -> bool:
            jobs = {event.job_id for event in await events_of(js, subjects, "submitted")}
            return later in jobs

        await eventually(later_handled, "the submit published once there was room")
    finally:
        await service.stop()
    assert await events_of(js, subjects, "rejected") == []


async def test_a_tenants_submit_stream_of_other_retention_is_refused_saying_what_to_do(
    nc: Client, subjects: Subjects
) -> None:
    """A tenant's submit stream with limits retention (another build of mdq made it) is
    neither updated nor dropped: the setup refuses it naming the stream and what to do, and
    the stream keeps what it holds."""
    js = nc.jetstream()
    await ensure_streams(js, subjects)
    made = tenant_submit_stream_config(subjects, "old", closed=False)
    made.retention, made.max_msgs = RetentionPolicy.LIMITS, None
    await js.add_stream(config=made)
    await js.publish(subjects.submit_for("old"), submit("kept"))
    with pytest.raises(StreamRetentionDiffers) as refused:
        await ensure_tenant_stream(js, subjects, "old")
    stream = subjects.tenant_submit_stream("old")
    assert f"stream {stream} has limits retention" in str(refused.value), refused.value
    assert f"nats stream rm {stream}" in str(refused.value), refused.value
    info = await js.stream_info(stream)
    assert (info.config.retention, info.state.messages) == (RetentionPolicy.LIMITS, 1)


async def test_a_tenants_submits_past_its_rate_wait_and_are_handled_in_order(
    nats_url: str, namespace: str, nc: Client, subjects: Subjects
) -> None:
    """Four submits at once of a tenant allowed two a second, one at a time: the first at
    once, each of the others when the tenant may submit again, in the order published, none
    refused; the operator's submit meanwhile is not held up."""
    js = await with_policy(
        nc, subjects, "steady", TenantPolicy(submits_per_minute=120, submit_burst=1)
    )
    service = await started(settings_for(nats_url, namespace))
    try:
        published = time.monotonic()
        for number in range(4):
            await js.publish(subjects.submit_for("steady"), submit(f"s{number}"))
        await js.publish(subjects.submit, submit("op"))

        async def operators() -> bool:
            job = f"{request_id_for_key('op')}-w"
            return any(event.job_id == job for event in await events_of(js, subjects, "submitted"))

        await eventually(operators, "the operator's submit")
        assert time.monotonic() - published < 1.0

        async def all_four() -> bool:
            return len(await events_of(js, subjects, "submitted")) == 5

        await eventually(all_four, "the tenant's four submits")
        took = time.monotonic() - published
    finally:
        await service.stop()
    assert took >= 1.3, took  # three waited half a second each
    order = [
        event.job_id
        for event in await events_of(js, subjects, "submitted")
        if event.job_id[:7] == "steady."
    ]
    assert order == [f"{request_id_for_key(f's{n}', 'steady')}-w" for n in range(4)]
    assert await events_of(js, subjects, "rejected") == []


async def test_a_new_tenants_stream_is_followed_and_a_removed_ones_let_go(
    intake: Intake, nc: Client, subjects: Subjects
) -> None:
    """Intake, running, finds a tenant's submit stream once it is made (no restart), makes
    its consumer there, and lets go of it once the tenant is removed (its stream deleted with
    the consumer: nothing is made again); a tenant added anew is followed anew, and its first
    keyless submit is a submit of its own, not taken for the earlier stream's first (a keyless
    submit's id is its sequence: the new stream starts past the old one's)."""
    js = nc.jetstream()
    stream = subjects.tenant_submit_stream("newbie")
    for round_ in range(2):
        await ensure_tenant_stream(js, subjects, "newbie")
        ack = await js.publish(subjects.submit_for("newbie"), submit(""))

        async def handled(count: int = round_ + 1) -> bool:
            return len(await events_of(js, subjects, "submitted")) == count

        await eventually(handled, f"newbie's keyless submit of round {round_}")
        assert "newbie" in intake.tenant_submits.tenants
        assert (await js.consumer_info(stream, "intake")).num_ack_pending == 0
        [job] = [event.job_id for event in await events_of(js, subjects, "submitted")][round_:]
        assert job == f"{request_id_for_sequence(ack.seq, 'newbie')}-w"

        await remove_tenant_streams(js, subjects, "newbie")

        async def let_go() -> bool:
            return "newbie" not in intake.tenant_submits.tenants

        await eventually(let_go, "intake to let go of newbie's stream")
        with pytest.raises(NotFoundError):
            await js.consumer_info(stream, "intake")
    assert await events_of(js, subjects, "rejected") == []


async def test_two_intakes_share_a_tenants_consumer_and_handle_each_submit_once(
    nats_url: str, namespace: str, nc: Client, subjects: Subjects
) -> None:
    """Two intake replicas read one tenant's stream through one durable consumer: forty
    keyless submits (a keyless submit's id is its sequence) become forty jobs, each submit
    handled by one replica once."""
    js = await with_policy(nc, subjects, "busy", TenantPolicy(submits_per_minute=None))
    handled: Counter[int] = Counter()
    replicas: list[Intake] = []
    for _ in range(2):
        replica = build_intake(common=settings_for(nats_url, namespace), settings=IntakeSettings())
        consume = replica.consume_paced

        async def counted(raw: Msg, tenant: str, consume=consume) -> None:  # type: ignore[no-untyped-def]
            handled[raw.metadata.sequence.stream] += 1
            await consume(raw, tenant)

        replica.consume_paced = counted  # type: ignore[method-assign]
        await replica.start()
        replicas.append(replica)
    try:
        for number in range(40):
            await js.publish(subjects.submit_for("busy"), submit("", f"k{number}"))

        async def forty() -> bool:
            return len(await events_of(js, subjects, "submitted")) >= 40

        await eventually(forty, "forty jobs")

        async def all_acked() -> bool:
            info = await js.consumer_info(subjects.tenant_submit_stream("busy"), "intake")
            return (info.num_pending, info.num_ack_pending) == (0, 0)

        await eventually(all_acked, "every submit acked")
    finally:
        for replica in replicas:
            await replica.stop()
    jobs = [event.job_id for event in await events_of(js, subjects, "submitted")]
    assert len(jobs) == len(set(jobs)) == 40
    first = min(handled)
    assert sorted(handled) == list(range(first, first + 40)), handled
    assert set(handled.values()) == {1}, handled


async def test_a_bad_submit_in_a_tenants_stream_is_refused_naming_the_field(
    intake: Intake, nc: Client, subjects: Subjects
) -> None:
    js = nc.jetstream()
    await ensure_tenant_stream(js, subjects, "sloppy")
    await js.publish(subjects.submit_for("sloppy"), submit("bad", steps=-1))
    await js.publish(subjects.submit_for("sloppy"), b"{not json")

    async def both() -> bool:
        return len(await events_of(js, subjects, "rejected")) == 2

    await eventually(both, "both refusals")
    bad, garbled = (event.rejected for event in await events_of(js, subjects, "rejected"))
    assert bad.request_id == request_id_for_key("bad", "sloppy")
    assert bad.error.field == "jobs[0].steps", bad.error
    assert garbled.request_id.startswith("sloppy.") and garbled.error.message, garbled.error


async def test_a_submit_a_dead_replica_held_unacked_is_handled_by_another(
    nats_url: str, namespace: str, nc: Client, subjects: Subjects
) -> None:
    """A replica pulls a tenant's submit and dies before handling it (as under kill -9: no
    ack, no nak, its connections gone); the stream keeps the submit, and once its ack wait is
    over the other replica is given it and handles it: once, nothing acknowledged lost."""
    js = await with_policy(nc, subjects, "kept", TenantPolicy(submits_per_minute=None))
    settings = IntakeSettings(ack_wait_s=1.0)
    doomed = build_intake(common=settings_for(nats_url, namespace), settings=settings)
    pulled = asyncio.Event()
    never = asyncio.Event()

    async def dies_holding_it(raw: Msg, tenant: str) -> None:
        pulled.set()
        await never.wait()  # handled never, acked never

    doomed.consume_paced = dies_holding_it  # type: ignore[method-assign]
    await doomed.start()
    await js.publish(subjects.submit_for("kept"), submit("held"))
    async with asyncio.timeout(10):
        await pulled.wait()
    # kill -9: the process's connections go at once, nothing is stopped in order
    for connection in (doomed._entrances, doomed._writes):
        assert connection is not None
        await connection.close()
    survivor = build_intake(common=settings_for(nats_url, namespace), settings=settings)
    await survivor.start()
    try:
        job = f"{request_id_for_key('held', 'kept')}-w"

        async def handled() -> bool:
            events = await events_of(js, subjects, "submitted")
            return [event.job_id for event in events] == [job]

        await eventually(handled, "the held submit handled by the other replica")
        info = await js.consumer_info(subjects.tenant_submit_stream("kept"), "intake")
        assert (info.num_pending, info.num_ack_pending) == (0, 0)
        assert info.delivered.consumer_seq >= 2  # given to the dead replica, then again
    finally:
        await survivor.stop()
        never.set()
        await doomed.stop_tenants()
        if doomed._tenants is not None:
            await doomed._tenants.close()
