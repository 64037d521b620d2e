"""Composition root of the metrics service: wire NATS, the backend and the exporter, then run.

Three loops share one ``Exporter``: sampling nodes (and publishing ``node_load``, and once per
summary interval each node's ``node_summary``), folding the jobs log into job counts, following
progress (the latest per job first, then live). The Prometheus HTTP server runs in its own
thread and only reads the exporter's registry.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from threading import Thread
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import DeliverPolicy
from nats.js.errors import NotFoundError
from prometheus_client import make_wsgi_app, start_http_server
from prometheus_client.exposition import ThreadingWSGIServer

from mdq.backends.factory import make_backend
from mdq.backends.port import ClusterBackend
from mdq.bus.log import follow_log, raise_if_cancelling
from mdq.bus.outage import warn_try_failed
from mdq.bus.publisher import EventPublisher
from mdq.bus.runtime import LEVEL_FORMAT, Service, run_parts, serve
from mdq.bus.security.auth import WsgiApp, bearer_guard
from mdq.bus.subjects import Subjects
from mdq.bus.tenants import read_tenant_usages
from mdq.contracts import pb
from mdq.core.nodes import NodeSample
from services.metrics.exporter import Exporter
from services.metrics.folding import JobCounts, LifecycleClock, LoadSummaries, ProgressBoard
from services.metrics.settings import MetricsSettings

log = logging.getLogger("mdq.metrics")

PRODUCER = "metrics"


def node_load_event(publisher: EventPublisher, sample: NodeSample, *, time_ms: int) -> pb.Event:
    """The ``node_load`` event of one sample (its id is unique per node and millisecond)."""
    body = pb.NodeLoad(
        node=sample.name,
        cpu_load=sample.cpu_load,
        memory_load=sample.memory_load,
        cpu_capacity=sample.cpu_capacity,
        memory_capacity_mb=sample.memory_capacity_mb,
        ready=sample.ready,
        cordoned=sample.cordoned,
        cluster=sample.cluster,
        cluster_labels=sample.cluster_labels,
        problem=sample.problem,
    )
    return publisher.event(
        "node_load", body, job_id="", attempt=0, detail=f"{sample.name}:{time_ms}"
    )


def node_summary_event(publisher: EventPublisher, summary: pb.NodeLoadSummary) -> pb.Event:
    """The ``node_summary`` event of one node's interval: its id is the node's and the
    interval's, so two metrics replicas' summaries of one interval are stored once."""
    start_ms = summary.start.ToMilliseconds()
    return publisher.event(
        "node_summary", summary, job_id="", attempt=0, detail=f"{summary.node}:{start_ms}"
    )


async def sample_nodes_once(
    *,
    backend: ClusterBackend,
    publisher: EventPublisher,
    exporter: Exporter,
    summaries: LoadSummaries,
) -> list[pb.NodeLoadSummary]:
    """Sample every node, show it on /metrics and publish its load; fold the loads into
    ``summaries`` and return the summaries of the interval this closes, if it closes one (the
    caller publishes them)."""
    samples = await backend.sample_nodes()
    exporter.set_nodes(samples)
    now = time.time()
    time_ms = int(now * 1000)
    loads = [node_load_event(publisher, s, time_ms=time_ms) for s in samples]
    closed = summaries.add((event.node_load for event in loads), now)
    await publisher.publish_all(loads)
    exporter.node_load_events.inc(len(samples))
    return closed


async def publish_summaries(publisher: EventPublisher, closed: list[pb.NodeLoadSummary]) -> None:
    """Publish the summaries of a closed interval; on failure they are lost (a gap of one
    interval in the nodes' hour), which is said in the log."""
    try:
        await publisher.publish_all(node_summary_event(publisher, s) for s in closed)
    except Exception as error:
        warn_try_failed(log, f"publishing {len(closed)} node summaries failed", error)


@dataclass
class Followers:
    """The jobs-log and progress bookkeeping, applied to the exporter as events arrive."""

    exporter: Exporter
    jobs: JobCounts
    progress: ProgressBoard
    clock: LifecycleClock = field(default_factory=LifecycleClock)

    async def on_job_event(self, sequence: int, event: pb.Event) -> None:
        view = self.jobs.apply(sequence, event)
        if view is None:
            return
        shown = self.progress.jobs.get(view.job_id)
        if shown is not None and self.jobs.is_over(view.job_id, shown.attempt):
            # its attempt is over (the job ended, failed over, or was requeued): its series
            # go first, so no scrape sees the job counted as done and its series still there
            self.progress.forget(view.job_id)
            self.exporter.hide_progress(shown)
        self.exporter.set_job_counts(self.jobs.counts)
        self.exporter.record_lifecycle(self.clock.apply(event, view))

    async def on_progress(self, _sequence: int, event: pb.Event) -> None:
        if event.WhichOneof("body") != "progress":
            return
        self.exporter.progress_events.inc()
        if self.jobs.is_over(event.job_id, event.attempt):
            return
        replaced, entry = self.progress.apply(event)
        if replaced is not None:
            self.exporter.hide_progress(replaced)
        if entry is not None:
            self.exporter.show_progress(entry)


WATCHER_CONSUMERS = ("watcher-jobs", "watcher-progress")


async def sample_consumer_lag(js: JetStreamContext, subjects: Subjects, exporter: Exporter) -> None:
    """The watcher's projection lag, from JetStream's info on its durable consumers."""
    streams = (subjects.jobs_stream, subjects.progress_stream)
    for consumer, stream in zip(WATCHER_CONSUMERS, streams, strict=True):
        try:
            info = await js.consumer_info(stream, consumer)
        except NotFoundError:  # no watcher yet: everything in the stream is pending
            state = (await js.stream_info(stream)).state
            lag = state.messages
        else:
            lag = (info.num_pending or 0) + (info.num_ack_pending or 0)
        exporter.consumer_lag.labels(consumer, stream).set(lag)


async def sample_streams(js: JetStreamContext, subjects: Subjects, exporter: Exporter) -> None:
    """How full each stream of the namespace is: what it holds against its size limit, so an
    alert can fire long before a full stream refuses events (deploy/prometheus/alerts.yml)."""
    for stream in (
        subjects.submit_stream,
        subjects.jobs_stream,
        subjects.progress_stream,
        subjects.nodes_stream,
        subjects.node_summaries_stream,
    ):
        info = await js.stream_info(stream)
        exporter.stream_bytes.labels(stream).set(info.state.bytes)
        exporter.stream_messages.labels(stream).set(info.state.messages)
        exporter.stream_limit_bytes.labels(stream).set(max(0, info.config.max_bytes or 0))


async def _nothing() -> None:
    return None


class MetricsService:
    """The running service; ``run`` until cancelled."""

    def __init__(
        self,
        *,
        js: JetStreamContext,
        subjects: Subjects,
        backend: ClusterBackend,
        settings: MetricsSettings,
        exporter: Exporter | None = None,
    ) -> None:
        self._js = js
        self._subjects = subjects
        self._backend = backend
        self._settings = settings
        self.exporter = exporter or Exporter()
        self._publisher = EventPublisher(js=js, subjects=subjects, producer=PRODUCER)
        self._followers = Followers(
            exporter=self.exporter, jobs=JobCounts(), progress=ProgressBoard()
        )
        self._summaries = LoadSummaries(settings.summary_interval_s)
        self._http: tuple[WSGIServer, Thread] | None = None

    @property
    def http_port(self) -> int:
        """The port /metrics listens on (known once the service runs)."""
        if self._http is None:
            raise RuntimeError("the HTTP server is not started")
        return int(self._http[0].server_port)

    def start_http(self) -> int:
        """Serve /metrics (in a thread); return the port."""
        if self._http is None:
            if self._settings.token_file:
                self._http = _serve_guarded(
                    make_wsgi_app(self.exporter.registry),
                    host=self._settings.http_host,
                    port=self._settings.http_port,
                    token_file=Path(self._settings.token_file),
                )
            else:
                self._http = start_http_server(
                    self._settings.http_port,
                    addr=self._settings.http_host,
                    registry=self.exporter.registry,
                )
            guarded = " (token required)" if self._settings.token_file else ""
            log.info(
                "serving /metrics on http://%s:%d%s",
                self._settings.http_host,
                self.http_port,
                guarded,
            )
        return self.http_port

    def stop_http(self) -> None:
        if self._http is not None:
            server, thread = self._http
            server.shutdown()
            server.server_close()
            thread.join(timeout=5)
            self._http = None

    async def run(self) -> None:
        """Serve /metrics, sample the nodes and follow the jobs and progress logs until
        cancelled (or until one of them fails, with its error)."""
        self.start_http()
        try:
            await run_parts(
                {
                    "sample-nodes": self._sample_forever(),
                    "jobs-log": follow_log(
                        self._js,
                        self._subjects.job_all("*"),
                        on_event=self._followers.on_job_event,
                        on_caught_up=_nothing,
                    ),
                    "progress": follow_log(
                        self._js,
                        self._subjects.progress_all,
                        on_event=self._followers.on_progress,
                        on_caught_up=_nothing,
                        deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
                    ),
                }
            )
        finally:
            self.stop_http()

    async def close(self) -> None:
        """Release the backend (the NATS connection belongs to the caller)."""
        self.stop_http()
        with contextlib.suppress(Exception):
            await self._backend.close()

    async def _sample_forever(self) -> None:
        # A closed interval's summaries (one per node, once a minute) are published beside
        # the sampling, not in its round: at 3,000 nodes they take as long as a round's loads,
        # and placement's loads keep their pace.
        summarising: asyncio.Task[None] | None = None
        try:
            while True:
                summarising = await self._sample_round(summarising)
                # a stop that landed as a stream-info answer came back is not lost (the loop
                # ran on, and MetricsService.run's stop waited for ever: test_console, 1 in 3
                # runs beside other tests)
                raise_if_cancelling()
        finally:
            if summarising is not None:
                summarising.cancel()

    async def _sample_round(
        self, summarising: asyncio.Task[None] | None
    ) -> asyncio.Task[None] | None:
        """One sampling round; return the task publishing summaries, if one runs."""
        started = time.monotonic()
        try:
            closed = await sample_nodes_once(
                backend=self._backend,
                publisher=self._publisher,
                exporter=self.exporter,
                summaries=self._summaries,
            )
        except Exception as error:  # NATS away for a moment: sample again next time
            warn_try_failed(log, "sampling nodes failed", error)
            closed = []
        if closed:
            if summarising is not None:
                await summarising  # the previous interval's, long done at a minute
            summarising = asyncio.create_task(
                publish_summaries(self._publisher, closed), name="node-summaries"
            )
        try:
            await sample_consumer_lag(self._js, self._subjects, self.exporter)
        except Exception as error:
            warn_try_failed(log, "reading the watcher's consumer lag failed", error)
        try:
            await sample_streams(self._js, self._subjects, self.exporter)
        except Exception as error:
            warn_try_failed(log, "reading the streams' sizes failed", error)
        try:
            self.exporter.set_tenants(await read_tenant_usages(self._js, self._subjects))
        except Exception as error:
            warn_try_failed(log, "reading the tenants' shares failed", error)
        elapsed = time.monotonic() - started
        await asyncio.sleep(max(0.0, self._settings.interval_s - elapsed))
        return summarising


async def build(
    *, nc: Client, subjects: Subjects, settings: MetricsSettings, replicas: int = 1
) -> MetricsService:
    """The service on this connection, with the backend the settings name."""
    backend = await make_backend(kind=settings.backend, nc=nc, subjects=subjects, replicas=replicas)
    return MetricsService(js=nc.jetstream(), subjects=subjects, backend=backend, settings=settings)


def _serve_guarded(
    app: WsgiApp, *, host: str, port: int, token_file: Path
) -> tuple[WSGIServer, Thread]:
    """``app`` behind ``bearer_guard``, served in a thread as prometheus_client serves it."""
    server = make_server(
        host, port, bearer_guard(app, token_file), ThreadingWSGIServer, handler_class=_Quiet
    )
    thread = Thread(target=server.serve_forever, daemon=True, name="metrics-http")
    thread.start()
    return server, thread


class _Quiet(WSGIRequestHandler):
    """No line per request on stderr."""

    def log_message(self, format: str, *args: object) -> None:
        return None


async def compose(service: Service) -> None:
    """The metrics service on a connection of its own, as a part of ``service``."""
    nc = await service.connect()
    metrics = await build(
        nc=nc,
        subjects=service.subjects,
        settings=MetricsSettings(),
        replicas=service.common.stream_replicas,
    )
    service.on_stop(metrics.close)
    service.part("metrics", metrics.run)


def main() -> None:
    serve("metrics", compose, fmt=LEVEL_FORMAT)
