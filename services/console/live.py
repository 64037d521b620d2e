"""The console's live view of the bus: a job's events as they happen, and every node's load.

``LiveJobs`` holds one NATS subscription per job somebody watches (its progress and its
lifecycle events), however many browsers watch it, and fans each event out to every watcher's
queue; the subscription goes when the last watcher leaves. A watcher too slow to keep up loses
its oldest points, never the bus's or another watcher's (its queue is bounded).

``NodeBoard`` follows the nodes stream (the latest load of every node first, then live) and
keeps the last hour of each node's samples for the nodes page. Neither writes anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js.api import DeliverPolicy

from mdq.bus.codec import decode_event
from mdq.bus.subjects import Subjects
from mdq.contracts import pb

log = logging.getLogger("mdq.console.live")

WATCHER_QUEUE = 2_048
"""Events one watcher may have waiting before its oldest are dropped."""
NODE_HISTORY_S = 3_600.0
"""How far back the nodes page shows each node's load."""
NODE_SAMPLE_EVERY_S = 10.0
"""Samples closer together than this are folded into one (an hour is at most 360 points)."""


@dataclass
class _Watched:
    subscriptions: list[Subscription]
    queues: set[asyncio.Queue[pb.Event]] = field(default_factory=set)


class LiveJobs:
    """Fan-out of each watched job's events from NATS to the browsers that watch it."""

    def __init__(self, nc: Client, subjects: Subjects) -> None:
        self._nc = nc
        self._subjects = subjects
        self._watched: dict[str, _Watched] = {}
        self._lock = asyncio.Lock()

    @property
    def watched_jobs(self) -> int:
        return len(self._watched)

    def _deliver(self, job_id: str, message: Msg) -> None:
        try:
            event = decode_event(message.data)
        except ValueError:
            log.warning("an undecodable message on %s", message.subject)
            return
        if event.job_id != job_id:  # the subject names the job; the event must agree
            return
        watched = self._watched.get(job_id)
        for queue in watched.queues if watched else ():
            if queue.full():
                queue.get_nowait()
            queue.put_nowait(event)

    @contextlib.asynccontextmanager
    async def watch(self, job_id: str) -> AsyncIterator[asyncio.Queue[pb.Event]]:
        """A queue of ``job_id``'s events from now on, for as long as the context lasts."""
        queue: asyncio.Queue[pb.Event] = asyncio.Queue(WATCHER_QUEUE)
        async with self._lock:
            watched = self._watched.get(job_id)
            if watched is None:

                async def on_message(message: Msg) -> None:
                    self._deliver(job_id, message)

                subscriptions = [
                    await self._nc.subscribe(self._subjects.progress(job_id), cb=on_message),
                    await self._nc.subscribe(self._subjects.job_all(job_id), cb=on_message),
                ]
                await self._nc.flush()  # the server has them before the page reads history
                watched = self._watched[job_id] = _Watched(subscriptions)
            watched.queues.add(queue)
        try:
            yield queue
        finally:
            async with self._lock:
                watched.queues.discard(queue)
                if not watched.queues:
                    del self._watched[job_id]
                    for subscription in watched.subscriptions:
                        with contextlib.suppress(Exception):
                            await subscription.unsubscribe()


@dataclass(frozen=True, slots=True)
class NodeSample:
    """One node's load at one time."""

    at: float
    cpu_load: float
    memory_load: float


@dataclass
class NodeView:
    """What the nodes page knows of one node."""

    latest: pb.NodeLoad
    samples: deque[NodeSample] = field(default_factory=deque)


class NodeBoard:
    """Every node's latest load and its last hour, from the nodes stream."""

    def __init__(self) -> None:
        self.nodes: dict[str, NodeView] = {}

    def apply(self, load: pb.NodeLoad, at: float) -> None:
        view = self.nodes.get(load.node)
        if view is None:
            view = self.nodes[load.node] = NodeView(latest=load)
        view.latest = load
        sample = NodeSample(at=at, cpu_load=load.cpu_load, memory_load=load.memory_load)
        if view.samples and at - view.samples[-1].at < NODE_SAMPLE_EVERY_S:
            view.samples[-1] = sample
        else:
            view.samples.append(sample)
        while view.samples and view.samples[0].at < at - NODE_HISTORY_S:
            view.samples.popleft()

    async def follow(self, nc: Client, subjects: Subjects) -> None:
        """Apply the nodes stream's latest load of every node, then every new one, until
        cancelled."""

        async def on_message(message: Msg) -> None:
            try:
                event = decode_event(message.data)
            except ValueError:
                return
            if event.WhichOneof("body") == "node_load":
                at = event.time.ToDatetime().timestamp() if event.HasField("time") else time.time()
                self.apply(event.node_load, at)

        subscription = await nc.jetstream().subscribe(
            subjects.node_load(),
            stream=subjects.nodes_stream,
            cb=on_message,
            ordered_consumer=True,
            deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
        )
        try:
            await asyncio.Event().wait()
        finally:
            with contextlib.suppress(Exception):
                await subscription.unsubscribe()
