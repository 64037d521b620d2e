"""The metrics service against real NATS and a real node agent: node_load events, /metrics."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest
from nats.aio.client import Client
from nats.js.errors import NotFoundError

from mdq.bus.codec import decode_event
from mdq.bus.subjects import Subjects
from mdq.contracts import pb
from mdq.embedded import free_port
from services.metrics.app import MetricsService, build
from services.metrics.settings import MetricsSettings
from tests.helpers import OwnersPublisher, agent_running, eventually, running

NODES = ("m1", "m2")


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return str(response.read().decode())


def scrape_until(port: int, *needles: str) -> Callable[[], Awaitable[str | None]]:
    async def probe() -> str | None:
        text = await asyncio.to_thread(scrape, port)
        return text if all(needle in text for needle in needles) else None

    return probe


@pytest.fixture
def agent(nats_url: str, namespace: str, data_dir: Path) -> Iterator[subprocess.Popen[bytes]]:
    settings = {"heartbeat_s": "0.3", "cpu_per_node": "1.5", "memory_mb_per_node": "1024"}
    with agent_running(nats_url, namespace, data_dir, NODES, settings) as process:
        yield process


@pytest.fixture
async def service(
    nc: Client, subjects: Subjects, agent: subprocess.Popen[bytes]
) -> AsyncIterator[MetricsService]:
    settings = MetricsSettings(interval_s=0.3, http_port=0, http_host="127.0.0.1")
    metrics = await build(nc=nc, subjects=subjects, settings=settings)
    async with running(metrics.run()):
        await eventually(lambda: _port_of(metrics), what="the HTTP server")
        yield metrics
    await metrics.close()


async def _port_of(metrics: MetricsService) -> int | None:
    try:
        return metrics.http_port
    except RuntimeError:
        return None


def last_node_load(
    nc: Client, subjects: Subjects, node: str
) -> Callable[[], Awaitable[pb.Event | None]]:
    async def probe() -> pb.Event | None:
        try:
            message = await nc.jetstream().get_last_msg(
                subjects.nodes_stream, subjects.node_load(node)
            )
        except NotFoundError:
            return None
        assert message.data is not None
        return decode_event(message.data)

    return probe


async def test_publishes_node_load_and_serves_node_gauges(
    service: MetricsService, nc: Client, subjects: Subjects
) -> None:
    for node in NODES:
        event = await eventually(last_node_load(nc, subjects, node), what=f"{node}'s load")
        assert event.producer == "metrics" and event.job_id == "" and event.attempt == 0
        load = event.node_load
        assert (load.node, load.cpu_capacity, load.memory_capacity_mb) == (node, 1.5, 1024)
        assert load.ready and 0 <= load.cpu_load <= 1
    first = await last_node_load(nc, subjects, NODES[0])()
    assert first is not None

    async def a_later_report() -> pb.Event | None:
        later = await last_node_load(nc, subjects, NODES[0])()
        return later if later is not None and later.event_id != first.event_id else None

    await eventually(a_later_report, what="a later load report of the same node")
    info = await nc.jetstream().stream_info(subjects.nodes_stream)
    assert info.state.messages == len(NODES), "the nodes stream keeps only the latest per node"

    text = await eventually(
        scrape_until(service.http_port, 'mdq_node_cpu_load_ratio{node="m1"}'),
        what="node gauges",
    )
    assert 'mdq_node_ready{node="m2"} 1.0' in text
    assert 'mdq_node_problem{node="m2"} 0.0' in text, "its data folder passes the agent's probe"
    assert 'mdq_node_memory_capacity_mib{node="m1"} 1024.0' in text


T0 = 1_764_417_600.0


async def publish_report(
    publisher: OwnersPublisher, job: str, *, step: int, energy: float, at: float, attempt: int = 1
) -> None:
    """A progress report of an MD job at 2 fs a step, taken at ``at`` (seconds since the
    epoch); the runner's own speed figure is 40 ns/day, its temperature 301.5 K."""
    report = pb.Progress(
        step=step,
        target_steps=1000,
        time_ps=step * 0.002,
        potential_kj_mol=energy,
        temperature_k=301.5,
        ns_per_day=40.0,
    )
    event = publisher.event("progress", report, job_id=job, attempt=attempt, detail=step)
    event.time.FromNanoseconds(int(at * 1e9))
    await publisher.publish(event)


async def test_an_attempt_that_fails_takes_its_series_with_it(
    service: MetricsService, nc: Client, subjects: Subjects
) -> None:
    """A failed attempt's last figures are not a running job's: its series go when it fails,
    and its job's next attempt has its own; a minimisation has no speed series."""
    publisher = OwnersPublisher(js=nc.jetstream(), subjects=subjects)
    job, minimize = "abc123-retry", "abc123-min"
    for name, task in ((job, pb.TASK_MD), (minimize, pb.TASK_MINIMIZE)):
        spec = pb.JobSpec(name=name.split("-")[1], steps=1000, task=task)
        await publisher.emit(
            "submitted", pb.JobSubmitted(spec=spec, request_id="abc123"), job_id=name, attempt=0
        )
        bound = pb.JobBound(node="m1", pod_name=f"mdq-{name}-1")
        await publisher.emit("bound", bound, job_id=name, attempt=1)
    await publish_report(publisher, job, step=500, energy=-1.0, at=T0)
    minimized = pb.Progress(step=40, potential_kj_mol=-9.0, temperature_k=0.0)
    await publisher.emit("progress", minimized, job_id=minimize, attempt=1, detail=40)
    first = f'attempt="1",job_id="{job}"'
    text = await eventually(
        scrape_until(
            service.http_port,
            f"md_ns_per_day{{{first}}} 40.0",
            f'md_step{{attempt="1",job_id="{minimize}"}} 40.0',
        ),
        what="both jobs' series",
    )
    assert f'md_ns_per_day{{attempt="1",job_id="{minimize}"}}' not in text

    failed = pb.AttemptFailed(reason=pb.FAILURE_OOM_KILLED, node="m1")
    await publisher.emit("attempt_failed", failed, job_id=job, attempt=1)
    await eventually(_without(service.http_port, first), what="the failed attempt's series to go")
    requeued = pb.JobRequeued(after=pb.FAILURE_OOM_KILLED)
    await publisher.emit("requeued", requeued, job_id=job, attempt=2)
    await publisher.emit("bound", pb.JobBound(node="m2"), job_id=job, attempt=2)
    await publish_report(publisher, job, step=700, energy=-2.0, at=T0 + 60, attempt=2)
    text = await eventually(
        scrape_until(service.http_port, f'md_step{{attempt="2",job_id="{job}"}} 700.0'),
        what="the next attempt's series",
    )
    assert first not in text


def _without(port: int, needle: str) -> Callable[[], Awaitable[str | None]]:
    async def probe() -> str | None:
        text = await asyncio.to_thread(scrape, port)
        return text if needle not in text else None

    return probe


async def test_serves_md_progress_and_job_counts(
    nc: Client, subjects: Subjects, agent: subprocess.Popen[bytes]
) -> None:
    publisher = OwnersPublisher(js=nc.jetstream(), subjects=subjects)
    job = "abc123-water"
    await publisher.emit(
        "submitted",
        pb.JobSubmitted(spec=pb.JobSpec(name="water", steps=1000), request_id="abc123"),
        job_id=job,
        attempt=0,
    )
    await publisher.emit(
        "bound", pb.JobBound(node="m1", pod_name=f"mdq-{job}-1"), job_id=job, attempt=1
    )
    await publisher.emit("started", pb.JobStarted(node="m1"), job_id=job, attempt=1)
    await publish_report(publisher, job, step=500, energy=-1234.5, at=T0)

    # Started after the events: the history is folded and the latest progress shown.
    settings = MetricsSettings(interval_s=0.3, http_port=0, http_host="127.0.0.1")
    metrics = await build(nc=nc, subjects=subjects, settings=settings)
    try:
        async with running(metrics.run()):
            port = await eventually(lambda: _port_of(metrics), what="the HTTP server")
            text = await eventually(
                scrape_until(port, f'md_step{{attempt="1",job_id="{job}"}} 500.0'), what="md_step"
            )
            assert f'md_energy{{attempt="1",job_id="{job}"}} -1234.5' in text
            assert f'md_temperature_k{{attempt="1",job_id="{job}"}} 301.5' in text
            # the first report seen: the runner's own figure, since the attempt started
            assert f'md_ns_per_day{{attempt="1",job_id="{job}"}} 40.0' in text
            assert 'mdq_jobs{state="RUNNING"} 1.0' in text
            assert 'mdq_jobs{state="SUCCEEDED"} 0.0' in text

            # 1 ps more in 2 s of the events' time: 43.2 ns/day over that interval, whatever the
            # runner's average since the start says
            await publish_report(publisher, job, step=1000, energy=-1240.0, at=T0 + 2)
            text = await eventually(
                scrape_until(port, f'md_step{{attempt="1",job_id="{job}"}} 1000.0'),
                what="live md_step",
            )
            assert f'md_ns_per_day{{attempt="1",job_id="{job}"}} 43.2' in text
            assert "mdq_progress_events_total 2.0" in text

            succeeded = pb.JobSucceeded(final_step=1000, reason="steps_reached")
            await publisher.emit("succeeded", succeeded, job_id=job, attempt=1)
            text = await eventually(
                scrape_until(port, 'mdq_jobs{state="SUCCEEDED"} 1.0'), what="the job to succeed"
            )
            assert 'mdq_jobs{state="RUNNING"} 0.0' in text
            assert f'job_id="{job}"' not in text, "a finished job's progress series stays"
            for gauge in ("md_step", "md_energy", "md_temperature_k", "md_ns_per_day"):
                assert f"# TYPE {gauge} gauge" in text, gauge
    finally:
        await metrics.close()


async def test_runs_as_a_process_and_stops_on_sigterm(
    nats_url: str, namespace: str, nc: Client, subjects: Subjects, agent: subprocess.Popen[bytes]
) -> None:
    port = free_port()
    env = dict(os.environ)
    env.update(
        NATS_URL=nats_url,
        MDQ_NAMESPACE=namespace,
        MDQ_METRICS_INTERVAL_S="0.3",
        MDQ_METRICS_HTTP_PORT=str(port),
        MDQ_METRICS_HTTP_HOST="127.0.0.1",
    )
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "services.metrics",
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        await eventually(last_node_load(nc, subjects, "m2"), what="node_load from the process")
        await eventually(scrape_until(port, "mdq_node_cpu_load_ratio"), what="/metrics")
        process.send_signal(signal.SIGTERM)
        output, _ = await asyncio.wait_for(process.communicate(), 10)
        assert process.returncode == 0, output.decode(errors="replace")
        assert f"serving /metrics on http://127.0.0.1:{port}" in output.decode()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
