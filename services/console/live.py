"""The console's live view of the nodes: ``NodeBoard`` follows the nodes stream (the latest
load of every node first, then live) and keeps the last hour of each node's samples for the
nodes page (bounded: one sample per ``NODE_SAMPLE_EVERY_S``). It writes nothing. A job's live
events are read per page (``services.console.app.job_live``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from dataclasses import dataclass, field

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.api import DeliverPolicy

from mdq.bus.codec import decode_event
from mdq.bus.subjects import Subjects
from mdq.contracts import pb

log = logging.getLogger("mdq.console.live")

NODE_HISTORY_S = 3_600.0
"""How far back the nodes page shows each node's load."""
NODE_SAMPLE_EVERY_S = 10.0
"""Samples closer together than this are folded into one (an hour is at most 360 points)."""


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
