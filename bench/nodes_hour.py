"""The nodes page's hour at 3,000 nodes: ``make bench-nodes-hour``.

An hour of node summaries is published to an embedded NATS server; the bench measures what the
stream holds, what a console restart costs its ``NodeBoard`` against a bare read, and what
summarising costs the metrics service's pace. One JSON line. Method and keys:
docs/benchmarks.md, "make bench-nodes-hour".
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
import tracemalloc
from collections.abc import AsyncIterator
from pathlib import Path

import nats
from raw_bus import ordered_from_start

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mdq.backends.port import PodSpec, PodUpdate  # noqa: E402
from mdq.bus.publisher import EventPublisher  # noqa: E402
from mdq.bus.storage import StorageSettings  # noqa: E402
from mdq.bus.streams import ensure_streams  # noqa: E402
from mdq.bus.subjects import Subjects  # noqa: E402
from mdq.contracts import pb  # noqa: E402
from mdq.core.nodes import NodeSample  # noqa: E402
from mdq.embedded import start_nats  # noqa: E402
from services.console.live import NodeBoard  # noqa: E402
from services.metrics.app import MetricsService, node_summary_event  # noqa: E402
from services.metrics.settings import MetricsSettings  # noqa: E402

SUBJECTS = Subjects("bench")


def node_names(count: int) -> list[str]:
    """Names as bench-multicluster's: three clusters, ``<cluster>/<node>``."""
    return [f"lab{i % 3 + 1}/node-{i // 3:04d}" for i in range(count)]


def summary(node: str, end: int, index: int) -> pb.NodeLoadSummary:
    made = pb.NodeLoadSummary(
        node=node,
        cluster=node.split("/", 1)[0],
        samples=30,
        cpu_load_mean=(index % 7) / 7,
        cpu_load_max=min(1.0, (index % 7) / 7 + 0.1),
        memory_load_mean=(index % 5) / 5,
        memory_load_max=min(1.0, (index % 5) / 5 + 0.05),
    )
    made.start.FromSeconds(end - 60)
    made.end.FromSeconds(end)
    return made


async def publish_hour(url: str, nodes: list[str], minutes: int) -> float:
    """Publish ``minutes`` summaries of every node; return summaries per second."""
    nc = await nats.connect(url)
    publisher = EventPublisher(js=nc.jetstream(), subjects=SUBJECTS, producer="metrics")
    last = int(time.time()) // 60 * 60
    started = time.perf_counter()
    for minute in range(minutes, 0, -1):  # oldest first, as the service publishes them
        end = last - 60 * (minute - 1)
        await publisher.publish_all(
            node_summary_event(publisher, summary(node, end, i + minute))
            for i, node in enumerate(nodes)
        )
    elapsed = time.perf_counter() - started
    await nc.close()
    return len(nodes) * minutes / elapsed


async def raw_read(url: str, expected: int) -> float:
    """Seconds for a bare ordered consumer to receive ``expected`` messages, undecoded."""
    nc = await nats.connect(url)
    done = asyncio.Event()
    seen = 0

    async def on_message(_message: object) -> None:
        nonlocal seen
        seen += 1
        if seen >= expected:
            done.set()

    started = time.perf_counter()
    subscription = await ordered_from_start(nc.jetstream(), SUBJECTS.node_summary(), on_message)
    await done.wait()
    elapsed = time.perf_counter() - started
    await subscription.unsubscribe()
    await nc.close()
    return elapsed


async def backfill(url: str) -> tuple[float, NodeBoard]:
    """Seconds for the console's board to read the stream from nothing; the board."""
    nc = await nats.connect(url)
    board = NodeBoard()
    started = time.perf_counter()
    following = asyncio.create_task(board.follow(nc, SUBJECTS))
    while not board.history_read:
        if following.done():
            following.result()
        await asyncio.sleep(0.01)
    elapsed = time.perf_counter() - started
    following.cancel()
    await asyncio.gather(following, return_exceptions=True)
    await nc.close()
    return elapsed, board


class ManyNodes:
    """A cluster backend of ``names`` nodes in memory, at a steady load; it runs no pods."""

    def __init__(self, names: list[str]) -> None:
        self.samples = [
            NodeSample(
                name=name,
                cpu_capacity=64,
                memory_capacity_mb=262_144,
                ready=True,
                cpu_load=0.5,
                memory_load=0.25,
                cluster=name.split("/", 1)[0],
            )
            for name in names
        ]

    async def create_pod(self, pod: PodSpec) -> None:
        raise NotImplementedError

    async def delete_pod(self, name: str) -> None:
        raise NotImplementedError

    async def watch_pods(self) -> AsyncIterator[PodUpdate]:
        await asyncio.Event().wait()  # runs no pods: nothing ever changes
        return
        yield

    async def sample_nodes(self) -> list[NodeSample]:
        return self.samples

    async def close(self) -> None:
        return None


async def load_gaps(url: str, names: list[str], summary_s: float, seconds: float) -> list[float]:
    """Seconds between one node's load reports while the metrics service runs for
    ``seconds``, summarising every ``summary_s``."""
    nc = await nats.connect(url)
    listener = await nats.connect(url)
    arrivals: list[float] = []

    async def arrived(_message: object) -> None:
        arrivals.append(time.perf_counter())

    await listener.subscribe(SUBJECTS.node_load(names[-1]), cb=arrived)
    settings = MetricsSettings(
        interval_s=2.0, summary_interval_s=summary_s, http_port=0, http_host="127.0.0.1"
    )
    service = MetricsService(
        js=nc.jetstream(), subjects=SUBJECTS, backend=ManyNodes(names), settings=settings
    )
    running = asyncio.create_task(service.run())
    await asyncio.sleep(seconds)
    running.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await running
    await service.close()
    await listener.close()
    await nc.close()
    return [later - earlier for earlier, later in itertools.pairwise(arrivals)]


async def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--nodes", type=int, default=3000)
    parser.add_argument("--minutes", type=int, default=60)
    parser.add_argument("--metrics-s", type=float, default=40.0)
    parser.add_argument(
        "--quick", action="store_true", help="300 nodes, 12 s of metrics each run: does it work"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.nodes, args.metrics_s = 300, 12.0
    storage = StorageSettings()
    with tempfile.TemporaryDirectory(prefix="mdq-bench-nodes-") as folder:
        server = start_nats(Path(folder) / "nats")
        try:
            nc = await nats.connect(server.url)
            js = nc.jetstream()
            await ensure_streams(js, SUBJECTS, storage=storage)
            nodes = node_names(args.nodes)
            rate = await publish_hour(server.url, nodes, args.minutes)
            state = (await js.stream_info(SUBJECTS.node_summaries_stream)).state
            await nc.close()
            raw_s = await raw_read(server.url, state.messages)
            backfill_s, board = await backfill(server.url)
            started = time.perf_counter()
            charts = [board.history(node).columns() for node in nodes]
            charts_ms = (time.perf_counter() - started) * 1000
            # the oldest minute may have aged out of the hour while the rest was published
            points = min(len(chart["t"]) for chart in charts)
            if points < args.minutes - 2:
                raise SystemExit(f"a node's chart has {points} points, not its hour's")
            del board, charts
            tracemalloc.start()
            _, board = await backfill(server.url)
            board_bytes = tracemalloc.get_traced_memory()[0]
            tracemalloc.stop()
            del board
            gaps = {
                "with": await load_gaps(server.url, nodes, 10.0, args.metrics_s),
                "without": await load_gaps(server.url, nodes, 1e9, args.metrics_s),
            }
            if min(len(values) for values in gaps.values()) < args.metrics_s / 2 - 2:
                raise SystemExit(f"too few load reports to time: {gaps}")
        finally:
            server.stop()
    per_summary = state.bytes / state.messages
    print(
        json.dumps(
            {
                "bench": "nodes_hour",
                "nodes": args.nodes,
                "summaries": state.messages,
                "stream_bytes": state.bytes,
                "bytes_per_summary": round(per_summary, 1),
                "stream_limit_bytes": int(storage.node_summaries_bytes),
                "nodes_the_limit_holds": int(
                    storage.node_summaries_bytes / (per_summary * storage.node_summaries_per_node())
                ),
                "publish_per_s": round(rate),
                "backfill_s": round(backfill_s, 2),
                "raw_read_s": round(raw_s, 2),
                "backfill_ratio_vs_raw": round(backfill_s / raw_s, 2),
                "board_mib": round(board_bytes / 2**20, 1),
                "charts_ms": round(charts_ms, 1),
                "fewest_points_a_node": points,
                **{
                    f"load_gap_{stat}_s_{run}_summaries": round(figure(values), 2)
                    for run, values in gaps.items()
                    for stat, figure in (("p50", statistics.median), ("max", max))
                },
                "load_avg": [round(value, 2) for value in os.getloadavg()],
            }
        )
    )


if __name__ == "__main__":
    asyncio.run(main())
