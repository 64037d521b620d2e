"""The metrics service's lifecycle metrics against real NATS: queue depth, placement latency,
recoveries by reason, MD steps lost, and the watcher's consumer lag from JetStream."""

from __future__ import annotations

import asyncio
import urllib.request
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
from nats.aio.client import Client
from nats.js.api import AckPolicy, ConsumerConfig

from mdq.bus.publisher import EventPublisher
from mdq.bus.subjects import Subjects
from mdq.contracts import pb
from mdq.core.events import make_event
from mdq.core.ids import pod_name
from mdq.core.nodes import NodeSample
from mdq.core.producers import owner_of
from mdq.core.tenants import TenantUsage, usage_key
from services.metrics.app import MetricsService, node_load_event, node_summary_event
from services.metrics.folding import LoadSummaries
from services.metrics.settings import MetricsSettings
from tests.helpers import OwnersPublisher, RecordingBackend, running, submitted

T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def at(
    seconds: float, kind: str, body: object, *, job: str, attempt: int, detail: int | None = None
) -> pb.Event:
    return make_event(
        kind,
        body,  # type: ignore[arg-type]
        job_id=job,
        attempt=attempt,
        producer=owner_of(kind),
        at=T0 + timedelta(seconds=seconds),
        detail=detail,
    )


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return str(response.read().decode())


def value(text: str, name: str) -> float | None:
    """The value of an unlabelled sample ``name``."""
    for line in text.splitlines():
        if line.split(" ")[0] == name:
            return float(line.rsplit(" ", 1)[1])
    return None


@pytest.fixture
async def service(nc: Client, subjects: Subjects) -> AsyncIterator[MetricsService]:
    settings = MetricsSettings(interval_s=0.2, http_port=0, http_host="127.0.0.1")
    metrics = MetricsService(
        js=nc.jetstream(), subjects=subjects, backend=RecordingBackend(), settings=settings
    )
    async with running(metrics.run()):
        yield metrics
    await metrics.close()


async def scrape_until(service: MetricsService, *needles: str, within: float = 15.0) -> str:
    deadline = asyncio.get_running_loop().time() + within
    text = ""
    while asyncio.get_running_loop().time() < deadline:
        try:
            text = await asyncio.to_thread(scrape, service.http_port)
        except RuntimeError:
            text = ""
        if all(needle in text for needle in needles):
            return text
        await asyncio.sleep(0.1)
    raise AssertionError(f"{needles} not in /metrics:\n{text}")


async def test_lifecycle_metrics_and_consumer_lag(
    nc: Client, subjects: Subjects, service: MetricsService
) -> None:
    js = nc.jetstream()
    publisher = OwnersPublisher(js=js, subjects=subjects)
    a, b, c = "0123456789ab-a", "0123456789ab-b", "0123456789ab-c"
    events = [submitted(job) for job in (a, b, c)]
    events[0].time.FromDatetime(T0)
    events[1].time.FromDatetime(T0)
    events += [
        at(2.0, "bound", pb.JobBound(node="n1", pod_name=pod_name(a, 1)), job=a, attempt=1),
        at(0.5, "bound", pb.JobBound(node="n2", pod_name=pod_name(b, 1)), job=b, attempt=1),
        at(3.0, "started", pb.JobStarted(node="n1", pod_name=pod_name(a, 1)), job=a, attempt=1),
        at(
            9.0,
            "attempt_failed",
            pb.AttemptFailed(reason=pb.FAILURE_OOM_KILLED, node="n1", last_step=700),
            job=a,
            attempt=1,
        ),
        at(
            10.0,
            "requeued",
            pb.JobRequeued(after=pb.FAILURE_OOM_KILLED, steps_lost=200),
            job=a,
            attempt=2,
        ),
        at(40.0, "bound", pb.JobBound(node="n2", pod_name=pod_name(a, 2)), job=a, attempt=2),
    ]
    for event in events:
        await publisher.publish(event)
    # The watcher's progress consumer exists and is 4 messages behind; its jobs one does not.
    await js.add_consumer(
        subjects.progress_stream,
        config=ConsumerConfig(durable_name="watcher-progress", ack_policy=AckPolicy.ALL),
    )
    for step in (10, 20, 30, 40):
        body = pb.Progress(step=step, target_steps=1000, potential_kj_mol=-5.0)
        await publisher.publish(at(11.0 + step, "progress", body, job=a, attempt=2, detail=step))

    jobs_in_stream = (await js.stream_info(subjects.jobs_stream)).state.messages
    text = await scrape_until(
        service,
        "mdq_placement_latency_seconds_count 3.0",
        'mdq_recoveries_total{reason="FAILURE_OOM_KILLED"} 1.0',
        'mdq_consumer_lag_messages{consumer="watcher-progress",'
        f'stream="{subjects.progress_stream}"}} 4.0',
        'mdq_consumer_lag_messages{consumer="watcher-jobs",'
        f'stream="{subjects.jobs_stream}"}} {float(jobs_in_stream)}',
    )
    assert value(text, "mdq_queue_depth_jobs") == 1.0  # c is still waiting for a node
    assert value(text, "mdq_md_steps_lost_total") == 200.0
    # Latencies 2 s (a), 0.5 s (b) and 30 s (a's retry, from its requeue to its bound).
    assert value(text, "mdq_placement_latency_seconds_sum") == pytest.approx(32.5)
    assert 'mdq_placement_latency_seconds_bucket{le="1.0"} 1.0' in text
    assert 'mdq_placement_latency_seconds_bucket{le="5.0"} 2.0' in text
    lag = {
        line.split('consumer="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("mdq_consumer_lag_messages{")
    }
    assert lag == {"watcher-jobs": float(jobs_in_stream), "watcher-progress": 4.0}


async def test_each_stream_shows_what_it_holds_against_its_size_limit(
    nc: Client, subjects: Subjects, service: MetricsService
) -> None:
    """What an operator alerts on before a full stream refuses events (bounded storage)."""
    js = nc.jetstream()
    await OwnersPublisher(js=js, subjects=subjects).publish(submitted("0123456789ab-a"))
    jobs = await js.stream_info(subjects.jobs_stream)
    limit = jobs.config.max_bytes
    assert limit and limit > 0
    streams = (
        subjects.submit_stream,
        subjects.progress_stream,
        subjects.nodes_stream,
        subjects.node_summaries_stream,
    )
    text = await scrape_until(  # each stream's figures appear as the service reads them
        service,
        f'mdq_stream_messages{{stream="{subjects.jobs_stream}"}} 1.0',
        *(f'mdq_stream_limit_bytes{{stream="{stream}"}}' for stream in streams),
    )
    samples = {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("mdq_stream_")
    }

    def sample(name: str, stream: str) -> float:
        return samples[f'{name}{{stream="{stream}"}}']

    assert sample("mdq_stream_bytes", subjects.jobs_stream) == jobs.state.bytes > 0
    assert sample("mdq_stream_limit_bytes", subjects.jobs_stream) == limit
    for stream in streams:
        configured = (await js.stream_info(stream)).config.max_bytes
        assert sample("mdq_stream_limit_bytes", stream) == configured, stream


@pytest.mark.parametrize("cordoned", [False, True], ids=["schedulable", "cordoned"])
async def test_a_node_sample_becomes_a_node_load_event(
    nc: Client, subjects: Subjects, cordoned: bool
) -> None:
    publisher = EventPublisher(js=nc.jetstream(), subjects=subjects, producer="metrics")
    sample = NodeSample(
        name="node-1",
        cpu_capacity=8.0,
        memory_capacity_mb=16384,
        ready=True,
        cpu_load=0.25,
        memory_load=0.5,
        cordoned=cordoned,
    )
    event = node_load_event(publisher, sample, time_ms=1_700_000_000_000)
    load = event.node_load
    assert (load.node, load.ready, load.cordoned) == ("node-1", True, cordoned)
    assert (load.cpu_capacity, load.memory_capacity_mb, load.cpu_load) == (8.0, 16384, 0.25)
    assert subjects.for_event(event) == subjects.node_load("node-1")


async def test_a_summary_becomes_a_node_summary_event_of_its_node_and_interval(
    nc: Client, subjects: Subjects
) -> None:
    """Its id names the node and the interval, so two metrics replicas' summaries of one
    interval are stored once (the stream's duplicate window)."""
    js = nc.jetstream()
    summaries = LoadSummaries(60.0)
    start = 1_700_000_040.0  # a whole minute
    for seconds, cpu in ((1, 0.25), (31, 0.75)):
        summaries.add([pb.NodeLoad(node="node-1", cpu_load=cpu, cluster="lab")], start + seconds)
    [summary] = summaries.add([pb.NodeLoad(node="node-1")], start + 61)
    replicas = [EventPublisher(js=js, subjects=subjects, producer="metrics") for _ in range(2)]
    events = [node_summary_event(publisher, summary) for publisher in replicas]
    assert events[0].event_id == events[1].event_id
    assert subjects.for_event(events[0]) == subjects.node_summary("node-1")
    acks = [await p.publish(event) for p, event in zip(replicas, events, strict=True)]
    assert acks[0].stream == subjects.node_summaries_stream
    assert acks[1].duplicate and not acks[0].duplicate
    body = events[0].node_summary
    assert (body.cluster, body.samples, body.cpu_load_mean, body.cpu_load_max) == (
        "lab",
        2,
        0.5,
        0.75,
    )
    assert body.start.ToSeconds() == start and body.end.ToSeconds() == start + 60


async def test_each_tenants_fair_share_figures_are_served_and_dropped_when_gone(
    nc: Client, subjects: Subjects, service: MetricsService
) -> None:
    """Placement's count of each tenant (its waiting bucket, ``tenant.<name>``) becomes
    per-tenant gauges; a tenant whose count is gone loses its series."""
    js = nc.jetstream()
    kv = await js.create_key_value(bucket=subjects.waiting_bucket)
    usage = TenantUsage(
        queued_jobs=12,
        running_cpu=6.0,
        as_of=datetime.now(UTC),
        running_jobs=6,
        weight=3.0,
        share=0.75,
        fair_share=0.5,
    )
    await kv.put(usage_key("bob"), usage.to_json())
    await kv.put("0123456789ab-a", b"a job's explanation, not a tenant's count")
    text = await scrape_until(service, 'mdq_tenant_share_ratio{tenant="bob"} 0.75')
    for line in (
        'mdq_tenant_weight{tenant="bob"} 3.0',
        'mdq_tenant_fair_share_ratio{tenant="bob"} 0.5',
        'mdq_tenant_running_jobs{tenant="bob"} 6.0',
        'mdq_tenant_queued_jobs{tenant="bob"} 12.0',
        'mdq_tenant_running_cpu_cores{tenant="bob"} 6.0',
    ):
        assert line in text
    assert text.count("mdq_tenant_weight{") == 1
    await kv.delete(usage_key("bob"))
    deadline = asyncio.get_running_loop().time() + 15
    while 'tenant="bob"' in await asyncio.to_thread(scrape, service.http_port):
        assert asyncio.get_running_loop().time() < deadline, "bob's series outlived his count"
        await asyncio.sleep(0.1)


class DroppingACancel(MetricsService):
    """A metrics service whose first sampling round loses the stop's cancel the way nats-py's
    requests do on Python 3.11 (``asyncio.wait_for`` hands back an answer that landed with the
    cancel, and the cancel is gone)."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.waiting = asyncio.Event()
        self.dropped = False

    async def _sample_round(
        self, summarising: asyncio.Task[None] | None
    ) -> asyncio.Task[None] | None:
        summarising = await super()._sample_round(summarising)
        if not self.dropped:
            self.waiting.set()
            try:
                await asyncio.sleep(3600)  # where the stop's cancel lands
            except asyncio.CancelledError:
                self.dropped = True  # ... and is dropped
        return summarising


async def test_a_stop_whose_cancel_a_request_dropped_still_stops(
    nc: Client, subjects: Subjects
) -> None:
    """The sampling loop checks for a pending cancel each round: without it, the service ran on
    after a stop whose cancel nats-py dropped, and its caller waited for ever (the console's
    nodes-page test hung so, one run in three beside other tests)."""
    metrics = DroppingACancel(
        js=nc.jetstream(),
        subjects=subjects,
        backend=RecordingBackend(),
        settings=MetricsSettings(interval_s=0.05, http_port=0, http_host="127.0.0.1"),
    )
    async with running(metrics.run()):
        await asyncio.wait_for(metrics.waiting.wait(), 10)
    await metrics.close()
    assert metrics.dropped
