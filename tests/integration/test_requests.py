"""``mdq.bus.requests.Requests`` against a real NATS JetStream: the same acks and errors as
nats-py's ``JetStreamContext.publish`` and ``KeyValue``, over one reply subscription."""

from __future__ import annotations

from collections.abc import AsyncIterator

import nats.errors
import pytest
from nats.aio.client import Client
from nats.js.api import KeyValueConfig
from nats.js.errors import APIError, NoStreamResponseError

from mdq.bus.requests import Requests
from mdq.bus.subjects import Subjects


@pytest.fixture
async def requests(nc: Client) -> AsyncIterator[Requests]:
    client = await Requests(nc, timeout_s=2.0).start()
    yield client
    await client.close()


async def test_publish_is_acknowledged_like_jetstream_publish(
    requests: Requests, nc: Client, subjects: Subjects
) -> None:
    subject = subjects.job("0123456789ab-a", "submitted")
    first = await requests.publish(subject, b"one", headers={"Nats-Msg-Id": "m1"})
    again = await requests.publish(subject, b"one", headers={"Nats-Msg-Id": "m1"})
    stored = await nc.jetstream().get_msg(subjects.jobs_stream, first.seq)

    assert first.stream == subjects.jobs_stream and not first.duplicate
    assert again.duplicate and again.seq == first.seq
    assert stored.data == b"one"


async def test_a_failed_expectation_is_an_api_error(requests: Requests, subjects: Subjects) -> None:
    subject = subjects.job("0123456789ab-a", "bound")
    await requests.publish(subject, b"first", headers={"Nats-Expected-Last-Subject-Sequence": "0"})
    with pytest.raises(APIError) as refused:
        await requests.publish(
            subject, b"second", headers={"Nats-Expected-Last-Subject-Sequence": "0"}
        )
    assert refused.value.err_code == 10071  # wrong last sequence


async def test_no_stream_for_the_subject(requests: Requests, namespace: str) -> None:
    with pytest.raises(NoStreamResponseError):
        await requests.publish(f"{namespace}.nowhere", b"x")


async def test_key_value_reads_and_writes(requests: Requests, nc: Client, namespace: str) -> None:
    bucket = f"{namespace}_requests"
    kv = await nc.jetstream().create_key_value(
        config=KeyValueConfig(bucket=bucket, history=1, direct=True)
    )
    await requests.kv_put(bucket, "req.a", b"reply-a")
    await kv.put("req.b", b"reply-b")
    await kv.put("req.c", b"gone")
    await kv.delete("req.c")

    assert await requests.kv_get(bucket, "req.a") == b"reply-a"
    assert (await kv.get("req.a")).value == b"reply-a"
    assert await requests.kv_get(bucket, "req.b") == b"reply-b"
    assert await requests.kv_get(bucket, "req.c") is None  # deleted
    assert await requests.kv_get(bucket, "req.never") is None


async def test_a_request_nobody_answers_times_out(
    requests: Requests, nc: Client, namespace: str
) -> None:
    sink = await nc.subscribe(f"{namespace}.silent")  # listens, never answers
    with pytest.raises(nats.errors.TimeoutError):
        await requests.request(f"{namespace}.silent", b"hello", timeout_s=0.2)
    await sink.unsubscribe()


async def test_a_request_to_nobody_has_no_responders(requests: Requests, namespace: str) -> None:
    with pytest.raises(nats.errors.NoRespondersError):
        await requests.request(f"{namespace}.nobody", b"hello")
