"""Bench-only raw baseline: the messaging shape of submit → bound with no mdq logic.

``python bench/raw_bus.py responder URL`` answers requests on ``raw.api.submit`` after
publishing ``raw.job.<id>.submitted`` to JetStream (what intake does, minus validation and the
idempotency record), up to ``CONCURRENCY`` requests at once like intake's default;
``python bench/raw_bus.py consumer URL`` follows ``raw.job.*.submitted`` with an ordered
consumer and publishes ``raw.job.<id>.bound`` to JetStream for each (what placement does,
minus deciding). Both run until killed.
"""

from __future__ import annotations

import asyncio
import os
import sys

import nats
from nats.aio.msg import Msg
from nats.js.api import DeliverPolicy, StreamConfig

STREAM = "RAWBENCH"


CONCURRENCY = 128
"""Requests handled at once, as ``MDQ_INTAKE_CONCURRENCY`` defaults to."""


async def responder(url: str) -> None:
    nc = await nats.connect(url, user_credentials=os.environ.get("MDQ_NATS_CREDS"))
    js = nc.jetstream()
    slots = asyncio.Semaphore(CONCURRENCY)
    tasks: set[asyncio.Task[None]] = set()

    async def answer(message: Msg) -> None:
        async with slots:
            job = message.data[:40].decode(errors="replace").split("\n", 1)[0]
            await js.publish(f"raw.job.{job}.submitted", message.data)
            await message.respond(job.encode())

    async def on_request(message: Msg) -> None:  # a callback, as intake's: no task per wait
        task = asyncio.create_task(answer(message))
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    await nc.subscribe("raw.api.submit", queue="raw", cb=on_request, pending_msgs_limit=65_536)
    await asyncio.Event().wait()


async def consumer(url: str) -> None:
    nc = await nats.connect(url, user_credentials=os.environ.get("MDQ_NATS_CREDS"))
    js = nc.jetstream()
    slots = asyncio.Semaphore(512)
    tasks: set[asyncio.Task[None]] = set()

    async def bind(subject: str, data: bytes) -> None:
        async with slots:
            await js.publish(subject.replace(".submitted", ".bound"), data[:64])

    async def on_submitted(message: Msg) -> None:  # a callback, as mdq.bus.log.follow_log
        task = asyncio.create_task(bind(message.subject, message.data))
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    await js.subscribe(
        "raw.job.*.submitted",
        cb=on_submitted,
        ordered_consumer=True,
        deliver_policy=DeliverPolicy.ALL,
        pending_msgs_limit=1_000_000,
        pending_bytes_limit=1 << 30,
    )
    await asyncio.Event().wait()


async def ensure_stream(url: str) -> None:
    nc = await nats.connect(url, user_credentials=os.environ.get("MDQ_NATS_CREDS"))
    js = nc.jetstream()
    await js.add_stream(StreamConfig(name=STREAM, subjects=["raw.job.>"]))
    await nc.drain()


if __name__ == "__main__":
    role, url = sys.argv[1], sys.argv[2]
    asyncio.run(responder(url) if role == "responder" else consumer(url))
