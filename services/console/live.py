"""The console's live view of the nodes: ``NodeBoard`` keeps every node's latest load (the nodes
stream, latest per node, then live) and its last hour, read from the node summaries stream
(``NS_NODE_SUMMARIES``: the metrics service's summary of each node's load, one a minute by
default, kept an hour and a quarter). It reads that stream from its start when the console
starts, then live, so the nodes page shows the same real hour whenever the console started and
whichever replica answers. It writes nothing. A job's live events are read per page
(``services.console.app.job_live``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.api import DeliverPolicy

from mdq.bus.codec import decode_event
from mdq.bus.log import follow_log
from mdq.bus.outage import warn_try_failed
from mdq.bus.subjects import Subjects
from mdq.contracts import pb

log = logging.getLogger("mdq.console.live")

NODE_HISTORY_S = 3_600.0
"""How far back the nodes page shows each node's load."""
NODE_MAX_POINTS = 90
"""The most summaries kept of one node (an hour of them is 60 at the default minute, and the
stream keeps 80 at most; a shorter summary interval keeps the newest of them)."""


@dataclass(frozen=True, slots=True)
class LoadPoint:
    """One node's load over one summarised interval, at the interval's end."""

    at: float
    cpu_mean: float
    cpu_max: float
    memory_mean: float
    memory_max: float


@dataclass
class NodeView:
    """What the nodes page knows of one node."""

    latest: pb.NodeLoad | None = None
    latest_at: float = 0.0
    points: deque[LoadPoint] = field(default_factory=lambda: deque(maxlen=NODE_MAX_POINTS))


@dataclass(frozen=True, slots=True)
class NodeHistory:
    """A node's last hour as the page's chart takes it: one column per series, the summaries
    in time order and the latest report as the last point."""

    t: list[float]
    cpu: list[float]
    cpu_max: list[float]
    memory: list[float]
    memory_max: list[float]

    def columns(self) -> dict[str, list[float]]:
        return {
            "t": self.t,
            "cpu": self.cpu,
            "cpu_max": self.cpu_max,
            "memory": self.memory,
            "memory_max": self.memory_max,
        }


class NodeBoard:
    """Every node's latest load and its last hour, from the nodes and node summaries streams."""

    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        self.nodes: dict[str, NodeView] = {}
        self.history_read = False
        """Whether the summaries the stream held when the console started have all been read
        (until then the page says that the hour is still being read)."""
        self._clock = clock

    def _view(self, node: str) -> NodeView:
        view = self.nodes.get(node)
        if view is None:
            view = self.nodes[node] = NodeView()
        return view

    def apply_load(self, load: pb.NodeLoad, at: float) -> None:
        """A node's latest load report, taken at ``at``."""
        view = self._view(load.node)
        if at >= view.latest_at:
            view.latest, view.latest_at = load, at

    def apply_summary(self, summary: pb.NodeLoadSummary) -> None:
        """A node's summarised interval; one of an interval the node already has replaces it,
        one older than the hour is dropped."""
        end = summary.end.ToMilliseconds() / 1000
        if end < self._clock() - NODE_HISTORY_S:
            return
        point = LoadPoint(
            at=end,
            cpu_mean=summary.cpu_load_mean,
            cpu_max=summary.cpu_load_max,
            memory_mean=summary.memory_load_mean,
            memory_max=summary.memory_load_max,
        )
        points = self._view(summary.node).points
        if not points or points[-1].at < end:
            points.append(point)
            return
        # out of order (two metrics replicas): put it in its place
        ordered = sorted({p.at: p for p in (*points, point)}.values(), key=lambda p: p.at)
        points.clear()
        points.extend(ordered[-NODE_MAX_POINTS:])

    def history(self, node: str) -> NodeHistory:
        """``node``'s last hour (summaries older than it dropped), then its latest report."""
        view = self.nodes.get(node)
        if view is None:
            return NodeHistory([], [], [], [], [])
        since = self._clock() - NODE_HISTORY_S
        while view.points and view.points[0].at < since:
            view.points.popleft()
        points = list(view.points)
        t = [p.at for p in points]
        cpu, cpu_max = [p.cpu_mean for p in points], [p.cpu_max for p in points]
        memory, memory_max = [p.memory_mean for p in points], [p.memory_max for p in points]
        latest = view.latest
        if latest is not None and view.latest_at >= since and (not t or view.latest_at > t[-1]):
            t.append(view.latest_at)
            cpu.append(latest.cpu_load)
            cpu_max.append(latest.cpu_load)
            memory.append(latest.memory_load)
            memory_max.append(latest.memory_load)
        return NodeHistory(t, cpu, cpu_max, memory, memory_max)

    async def follow(self, nc: Client, subjects: Subjects) -> None:
        """Apply the nodes stream's latest load of every node and every summary the summaries
        stream holds, then every new one of each, until cancelled."""
        js = nc.jetstream()

        async def on_summary(_sequence: int, event: pb.Event) -> None:
            if event.WhichOneof("body") == "node_summary":
                self.apply_summary(event.node_summary)

        async def on_history_read() -> None:
            self.history_read = True

        async def on_load(message: Msg) -> None:
            try:
                event = decode_event(message.data)
            except ValueError:
                return
            if event.WhichOneof("body") == "node_load":
                at = event.time.ToMilliseconds() / 1000 if event.HasField("time") else time.time()
                self.apply_load(event.node_load, at)

        loads = await js.subscribe(
            subjects.node_load(),
            stream=subjects.nodes_stream,
            cb=on_load,
            ordered_consumer=True,
            deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
        )
        try:
            # The whole stream (it keeps an hour and a quarter): what is older than the hour
            # is dropped as it is read.
            await follow_log(
                js,
                subjects.node_summary(),
                on_event=on_summary,
                on_caught_up=on_history_read,
            )
        finally:
            with contextlib.suppress(Exception):
                await loads.unsubscribe()


async def follow_nodes(board: NodeBoard, nc: Client, subjects: Subjects) -> None:
    """``board.follow`` for the console's lifetime: a failure is logged and the board
    follows again a moment later (the page keeps what it had meanwhile)."""
    while True:
        try:
            await board.follow(nc, subjects)
        except asyncio.CancelledError:
            raise
        except Exception as error:
            warn_try_failed(log, "following the nodes failed; again in 2 s", error)
            await asyncio.sleep(2.0)
