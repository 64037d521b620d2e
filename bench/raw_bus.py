"""Bench-only raw baseline: the messaging shape of submit → bound with no mdq logic.

``python bench/raw_bus.py responder URL`` answers requests after publishing a ``submitted``
event to JetStream; ``python bench/raw_bus.py consumer URL`` publishes a ``bound`` event for
each. Both run until killed, group-committing or message by message per job. What it does and
why: docs/benchmarks.md, "make bench-placement".
"""

from __future__ import annotations

import asyncio
import itertools
import os
import sys
from collections.abc import Awaitable, Callable

import nats
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import DeliverPolicy

CONCURRENCY = 128
"""Requests handled at once by the plain loop, as ``MDQ_INTAKE_CONCURRENCY`` defaults to."""
MAX_BATCH = 1000
"""nats-server's limit of messages in one atomic batch."""
PLAIN_UP_TO = 8
"""A batch of this many messages or fewer is published plainly, side by side: sooner than an
atomic batch, which nats-server acknowledges about 2 ms after it is sent on a stream of one
replica (as mdq's group commits do, docs/durability.md, "Group commit")."""
PLAIN = "p-"
"""Job ids with this prefix are published one by one, the others in atomic batches."""


async def ordered_from_start(
    js: JetStreamContext, subject: str, cb: Callable[[Msg], Awaitable[None]]
) -> JetStreamContext.PushSubscription:
    """An ordered consumer of all that ``subject`` holds, from its start, buffering up to a
    million messages (1 GiB) before the callback: reads as fast as the client can."""
    return await js.subscribe(
        subject,
        cb=cb,
        ordered_consumer=True,
        deliver_policy=DeliverPolicy.ALL,
        pending_msgs_limit=1_000_000,
        pending_bytes_limit=1 << 30,
    )


class Batcher:
    """Publishes what was queued meanwhile as one atomic batch at a time (a few messages
    plainly), then runs each message's callback (an answer to send)."""

    def __init__(self, nc: Client) -> None:
        self._nc = nc
        self._queued: list[tuple[str, bytes, Msg | None]] = []
        self._wake = asyncio.Event()
        self._ids = itertools.count()
        self._prefix = nc.new_inbox().rsplit(".", 1)[-1]

    def put(self, subject: str, data: bytes, answer: Msg | None) -> None:
        self._queued.append((subject, data, answer))
        self._wake.set()

    async def run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._queued:
                batch, self._queued = self._queued[:MAX_BATCH], self._queued[MAX_BATCH:]
                await self._commit(batch)

    async def _commit(self, batch: list[tuple[str, bytes, Msg | None]]) -> None:
        if len(batch) <= PLAIN_UP_TO:
            js = self._nc.jetstream()
            await asyncio.gather(*(js.publish(subject, data) for subject, data, _ in batch))
        else:
            await self._atomic(batch)
        for subject, _, answer in batch:
            if answer is not None:
                await answer.respond(subject.split(".")[2].encode())

    async def _atomic(self, batch: list[tuple[str, bytes, Msg | None]]) -> None:
        batch_id = f"{self._prefix}.{next(self._ids)}"
        last = len(batch) - 1
        for index, (subject, data, _) in enumerate(batch):
            headers = {"Nats-Batch-Id": batch_id, "Nats-Batch-Sequence": str(index + 1)}
            if index < last:
                await self._nc.publish(subject, data, headers=headers)
            else:
                headers["Nats-Batch-Commit"] = "1"
                ack = await self._nc.request(subject, data, headers=headers, timeout=10)
                if b'"error"' in ack.data:
                    raise RuntimeError(ack.data.decode())


async def responder(url: str) -> None:
    nc = await nats.connect(url, user_credentials=os.environ.get("MDQ_NATS_CREDS"))
    js = nc.jetstream()
    batcher = Batcher(nc)
    slots = asyncio.Semaphore(CONCURRENCY)
    tasks: set[asyncio.Task[None]] = set()

    async def answer(message: Msg) -> None:
        async with slots:
            job = message.data[:40].decode(errors="replace").split("\n", 1)[0]
            await js.publish(f"raw.job.{job}.submitted", message.data)
            await message.respond(job.encode())

    async def on_request(message: Msg) -> None:  # a callback, as intake's: no task per wait
        job = message.data[:40].decode(errors="replace").split("\n", 1)[0]
        if not job.startswith(PLAIN):
            batcher.put(f"raw.job.{job}.submitted", message.data, message)
            return
        task = asyncio.create_task(answer(message))
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    await nc.subscribe("raw.api.submit", queue="raw", cb=on_request, pending_msgs_limit=65_536)
    await batcher.run()


async def consumer(url: str) -> None:
    nc = await nats.connect(url, user_credentials=os.environ.get("MDQ_NATS_CREDS"))
    js = nc.jetstream()
    batcher = Batcher(nc)
    slots = asyncio.Semaphore(512)
    tasks: set[asyncio.Task[None]] = set()

    async def bind(subject: str, data: bytes) -> None:
        async with slots:
            await js.publish(subject.replace(".submitted", ".bound"), data[:64])

    async def on_submitted(message: Msg) -> None:  # a callback, as mdq.bus.log.follow_log
        if not message.subject.startswith(f"raw.job.{PLAIN}"):
            batcher.put(message.subject.replace(".submitted", ".bound"), message.data[:64], None)
            return
        task = asyncio.create_task(bind(message.subject, message.data))
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    await ordered_from_start(js, "raw.job.*.submitted", on_submitted)
    await batcher.run()


if __name__ == "__main__":
    role, url = sys.argv[1], sys.argv[2]
    asyncio.run(responder(url) if role == "responder" else consumer(url))
