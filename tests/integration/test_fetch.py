"""``mdq.bus.fetch.BatchFetcher`` against a real NATS JetStream: batches of a durable pull
consumer, the same messages nats-py's fetch would give, with one wait per batch."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import nats.errors
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig
from nats.js.errors import APIError

from mdq.bus.fetch import BatchFetcher


@pytest.fixture
async def stream(nc: Client, namespace: str) -> AsyncIterator[str]:
    js = nc.jetstream()
    name = f"{namespace}_FETCH"
    await js.add_stream(name=name, subjects=[f"{namespace}.fetch.>"])
    await js.add_consumer(
        name, config=ConsumerConfig(durable_name="reader", ack_policy=AckPolicy.ALL)
    )
    yield name
    await js.delete_stream(name)


@pytest.fixture
async def fetcher(nc: Client, stream: str) -> AsyncIterator[BatchFetcher]:
    reader = await BatchFetcher(nc.jetstream(), stream=stream, consumer="reader").start()
    yield reader
    await reader.close()


async def publish(js: JetStreamContext, namespace: str, count: int, start: int = 0) -> None:
    for number in range(start, start + count):
        await js.publish(f"{namespace}.fetch.{number}", str(number).encode())


def numbers(messages: list[Msg]) -> list[int]:
    return [int(message.data) for message in messages]


async def test_batches_in_order_up_to_the_batch_size(
    fetcher: BatchFetcher, nc: Client, namespace: str
) -> None:
    await publish(nc.jetstream(), namespace, 25)

    first = await fetcher.fetch(10, 1.0)
    second = await fetcher.fetch(10, 1.0)
    third = await fetcher.fetch(10, 1.0)  # only 5 left: returned at once, not after 1 s

    assert numbers(first) == list(range(10))
    assert numbers(second) == list(range(10, 20))
    assert numbers(third) == list(range(20, 25))
    assert [m.metadata.sequence.stream for m in third] == list(range(21, 26))


async def test_nothing_there_returns_empty_after_the_timeout(fetcher: BatchFetcher) -> None:
    started = time.monotonic()
    assert await fetcher.fetch(10, 0.3) == []
    assert 0.25 <= time.monotonic() - started < 2.0


async def test_messages_published_while_waiting_are_returned(
    fetcher: BatchFetcher, nc: Client, namespace: str
) -> None:
    waiting = asyncio.create_task(fetcher.fetch(3, 2.0))
    await asyncio.sleep(0.1)
    await publish(nc.jetstream(), namespace, 3)
    assert numbers(await waiting) == [0, 1, 2]


async def test_ack_of_the_last_message_acknowledges_the_batch(
    fetcher: BatchFetcher, nc: Client, namespace: str, stream: str
) -> None:
    js = nc.jetstream()
    await publish(js, namespace, 8)
    batch = await fetcher.fetch(8, 1.0)
    await batch[-1].ack_sync()  # the server has processed it when this returns
    info = await js.consumer_info(stream, "reader")
    assert info.ack_floor.stream_seq == 8 and info.num_ack_pending == 0


async def test_late_deliveries_are_kept_for_the_next_fetch(
    fetcher: BatchFetcher, nc: Client, namespace: str
) -> None:
    """A fetch that gives up (cancelled, or timed out) loses nothing that arrives later."""
    js = nc.jetstream()
    waiting = asyncio.create_task(fetcher.fetch(5, 5.0))
    await asyncio.sleep(0.1)  # time for its lingering request to reach the server
    waiting.cancel()
    await publish(js, namespace, 5)  # delivered to that request, after its fetch is gone
    assert numbers(await fetcher.fetch(5, 1.0)) == [0, 1, 2, 3, 4]


async def test_a_deleted_consumer_is_an_error(
    fetcher: BatchFetcher, nc: Client, stream: str
) -> None:
    await nc.jetstream().delete_consumer(stream, "reader")
    with pytest.raises(nats.errors.Error) as raised:
        for _ in range(3):
            await fetcher.fetch(5, 0.3)
    # 409 "Consumer Deleted" for the open request, or 503 for a request made afterwards
    assert isinstance(raised.value, nats.errors.NoRespondersError | APIError)
