"""The Grafana dashboard's queries against what a real Prometheus stores.

A stock Prometheus (Debian's ``prometheus`` package; ``.ci/run`` installs it) scrapes, with the
scrape config of ``deploy/prometheus/prometheus.yml`` (no ``honor_labels``), the real metrics
service fed with real job events over NATS (node gauges from a real local node agent) and the
runner's own endpoints of two attempts. Every query of every panel of
``deploy/grafana/dashboards/mdq.json`` then runs through Prometheus' HTTP API, with Grafana's
variables given the values Grafana would give them. Each must succeed and return data; a panel
about jobs must return exactly one series per job (the metrics service's and a runner's series
of the same attempt merged), and every label a legend names must be on every series.

Before the per-job label was ``job_id``, Prometheus stored it as ``exported_job`` (``job`` is the
scrape job's) and ``by (job)`` drew one line for all jobs: this test is what shows that.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from nats.aio.client import Client

from mdq.bus.subjects import Subjects
from mdq.contracts import pb
from mdq.core.ids import pod_name
from mdq.embedded import end_process, free_port
from services.metrics.app import MetricsService, build
from services.metrics.settings import MetricsSettings
from services.runner.metrics import RunnerMetrics
from services.runner.samples import EnergySample
from tests.helpers import OwnersPublisher, agent_running, running, wait_for

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "mdq.json"
SCRAPE_CONFIG = ROOT / "deploy" / "prometheus" / "prometheus.yml"
ALERT_RULES = ROOT / "deploy" / "prometheus" / "alerts.yml"
ALERT_CASES = ROOT / "deploy" / "prometheus" / "alerts.test.yml"
NODES = ("p1", "p2")
SCRAPE_INTERVAL = "1s"

# Grafana's built-in variables, as Grafana would substitute them for a 1 s scrape interval
# ($__rate_interval is at least four scrape intervals; a minute holds many samples here).
BUILTINS = {"$__rate_interval": "1m", "$__interval": "15s", "$__range": "1h"}


@dataclass(frozen=True)
class Job:
    job_id: str
    attempt: int
    step: int
    energy: float
    runner_endpoint: bool  # whether this attempt's runner serves its own /metrics too


JOBS = (
    # a: failed once (OOM-killed, 200 steps lost) and runs again as attempt 2.
    Job("0123456789ab-a", attempt=2, step=700, energy=-1500.0, runner_endpoint=True),
    Job("0123456789ab-b", attempt=1, step=300, energy=-1200.5, runner_endpoint=True),
    Job("0123456789ab-c", attempt=1, step=50, energy=-900.25, runner_endpoint=False),
)
JOB_IDS = {job.job_id for job in JOBS}
TEMPERATURE_K = 300.25
NS_PER_DAY = 30.0
"""Every job's latest report: its temperature, and its speed (one report: the runner's own
figure, in both exporters)."""


# -- a real Prometheus --------------------------------------------------------------------------
@dataclass
class Prometheus:
    url: str
    process: subprocess.Popen[bytes]
    log: Path

    def get(self, path: str, **params: str) -> Any:
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}{path}?{query}", timeout=10) as reply:
            return json.loads(reply.read())

    def query(self, expr: str) -> dict[str, Any]:
        """``/api/v1/query`` now; the whole answer (status, data or error)."""
        try:
            answer: dict[str, Any] = self.get("/api/v1/query", query=expr)
        except urllib.error.HTTPError as error:  # 400/422: a bad query, with Prometheus' reason
            answer = json.loads(error.read())
        return answer

    def over_last_minute(self, expr: str) -> list[dict[str, Any]]:
        """``/api/v1/query_range`` over the last minute, as a Grafana time series panel asks."""
        end = time.time()
        answer = self.get(
            "/api/v1/query_range", query=expr, start=str(end - 60), end=str(end), step="1"
        )
        assert answer["status"] == "success", (expr, answer)
        result: list[dict[str, Any]] = answer["data"]["result"]
        return result

    def vector(self, expr: str) -> list[dict[str, Any]]:
        answer = self.query(expr)
        assert answer["status"] == "success", (expr, answer)
        result: list[dict[str, Any]] = answer["data"]["result"]
        return result


def scrape_config(*, metrics_port: int, runner_ports: list[int], prometheus_port: int) -> str:
    """deploy/prometheus/prometheus.yml with its targets pointed at this test's exporters."""
    config = yaml.safe_load(SCRAPE_CONFIG.read_text())
    config["global"]["scrape_interval"] = SCRAPE_INTERVAL
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert not any(job.get("honor_labels") for job in jobs.values()), "test the default"
    jobs["mdq-metrics"]["static_configs"][0]["targets"] = [f"127.0.0.1:{metrics_port}"]
    jobs["prometheus"]["static_configs"][0]["targets"] = [f"127.0.0.1:{prometheus_port}"]
    # The runners' endpoints, as the pods' prometheus.io annotations expose them on Kubernetes.
    config["scrape_configs"].append(
        {
            "job_name": "mdq-runner",
            "static_configs": [{"targets": [f"127.0.0.1:{port}" for port in runner_ports]}],
        }
    )
    return yaml.safe_dump(config)


def start_prometheus(folder: Path, config: str, port: int) -> Prometheus:
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("prometheus not installed: apt-get install prometheus")
    (folder / "prometheus.yml").write_text(config)
    shutil.copy(ALERT_RULES, folder / "alerts.yml")  # rule_files is relative to the config
    log = folder / "prometheus.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [
                binary,
                f"--config.file={folder / 'prometheus.yml'}",
                f"--storage.tsdb.path={folder / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    return Prometheus(url=f"http://127.0.0.1:{port}", process=process, log=log)


# -- the exporters --------------------------------------------------------------------------------
@pytest.fixture
def agent(nats_url: str, namespace: str, data_dir: Path) -> Iterator[subprocess.Popen[bytes]]:
    settings = {"heartbeat_s": "0.3", "cpu_per_node": "2", "memory_mb_per_node": "2048"}
    with agent_running(nats_url, namespace, data_dir, NODES, settings) as process:
        yield process


@pytest.fixture
async def metrics(
    nc: Client, subjects: Subjects, agent: subprocess.Popen[bytes]
) -> AsyncIterator[MetricsService]:
    settings = MetricsSettings(interval_s=0.5, http_port=0, http_host="127.0.0.1")
    service = await build(nc=nc, subjects=subjects, settings=settings)
    service.start_http()
    async with running(service.run()):
        yield service
    await service.close()


@pytest.fixture
def runners() -> Iterator[list[int]]:
    """The runner endpoints of the attempts that serve one, with their latest report."""
    served: list[RunnerMetrics] = []
    ports: list[int] = []
    for job in JOBS:
        if not job.runner_endpoint:
            continue
        runner = RunnerMetrics(job_id=job.job_id, attempt=job.attempt)
        port = free_port()
        runner.serve(port=port)
        sample = EnergySample(
            step=job.step,
            time_ps=job.step * 0.002,
            potential_kj_mol=job.energy,
            kinetic_kj_mol=400.0,
            temperature_k=TEMPERATURE_K,
            volume_nm3=27.0,
            density_g_cm3=1.0,
        )
        runner.observe(sample, ns_per_day=NS_PER_DAY, eta_s=60.0)
        runner.checkpointed(job.step)
        served.append(runner)
        ports.append(port)
    yield ports
    for runner in served:
        runner.close()


@pytest.fixture
def prometheus(tmp_path: Path, metrics: MetricsService, runners: list[int]) -> Iterator[Prometheus]:
    port = free_port()
    config = scrape_config(
        metrics_port=metrics.http_port, runner_ports=runners, prometheus_port=port
    )
    server = start_prometheus(tmp_path, config, port)
    yield server
    end_process(server.process, timeout=20)


async def feed_job_events(nc: Client, subjects: Subjects) -> None:
    """Each job's life so far, through the bus, as intake, placement and runners publish it."""
    publisher = OwnersPublisher(js=nc.jetstream(), subjects=subjects)
    for job in JOBS:
        name = job.job_id.split("-", 1)[1]
        submitted = pb.JobSubmitted(spec=pb.JobSpec(name=name, steps=10_000), request_id="r")
        await publisher.emit("submitted", submitted, job_id=job.job_id, attempt=0)
        for attempt in range(1, job.attempt + 1):
            bound = pb.JobBound(node=NODES[0], pod_name=pod_name(job.job_id, attempt))
            await publisher.emit("bound", bound, job_id=job.job_id, attempt=attempt)
            started = pb.JobStarted(node=NODES[0], pod_name=pod_name(job.job_id, attempt))
            await publisher.emit("started", started, job_id=job.job_id, attempt=attempt)
            if attempt < job.attempt:
                failed = pb.AttemptFailed(reason=pb.FAILURE_OOM_KILLED, node=NODES[0])
                await publisher.emit("attempt_failed", failed, job_id=job.job_id, attempt=attempt)
                requeued = pb.JobRequeued(after=pb.FAILURE_OOM_KILLED, steps_lost=200)
                await publisher.emit("requeued", requeued, job_id=job.job_id, attempt=attempt + 1)
        progress = pb.Progress(
            step=job.step,
            target_steps=10_000,
            time_ps=job.step * 0.002,
            potential_kj_mol=job.energy,
            temperature_k=TEMPERATURE_K,
            ns_per_day=NS_PER_DAY,
        )
        await publisher.emit(
            "progress", progress, job_id=job.job_id, attempt=job.attempt, detail=job.step
        )


# -- the dashboard --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Query:
    panel: str
    ref: str
    expr: str
    legend: str
    repeat: str | None  # the variable the panel repeats over, if any
    instant: bool  # one value (a table, a stat), not a time series


def dashboard_queries() -> list[Query]:
    dashboard = json.loads(DASHBOARD.read_text())
    panels = list(dashboard["panels"])
    for panel in dashboard["panels"]:  # a collapsed row keeps its panels inside it
        panels += panel.get("panels", [])
    return [
        Query(
            panel=panel["title"],
            ref=target["refId"],
            expr=target["expr"],
            legend=target.get("legendFormat", ""),
            repeat=panel.get("repeat"),
            instant=bool(target.get("instant")),
        )
        for panel in panels
        for target in panel.get("targets", [])
    ]


def grafana_regex(values: list[str]) -> str:
    """A multi-value variable inside ``=~`` as Grafana writes it for Prometheus."""
    escaped = [re.sub(r"([\\^$.|?*+()\[\]{}])", r"\\\\\1", value) for value in values]
    return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"


def substitute(expr: str, variables: dict[str, str]) -> str:
    for name, value in {**BUILTINS, **variables}.items():
        expr = expr.replace("${" + name.lstrip("$") + "}", value).replace(name, value)
    assert "$" not in expr, f"a Grafana variable this test does not know: {expr}"
    return expr


def legend_labels(legend: str) -> set[str]:
    return set(re.findall(r"\{\{\s*(\w+)\s*\}\}", legend))


PER_JOB_GAUGES = ("md_step", "md_energy", "md_temperature_k", "md_ns_per_day")
"""The metrics service's series of every running job, each with a panel of the dashboard."""


def is_per_job(expr: str) -> bool:
    return bool(re.search(r"\bmd_\w+", expr))


async def test_every_panel_query_returns_data_and_one_series_per_job(
    nc: Client, subjects: Subjects, metrics: MetricsService, prometheus: Prometheus
) -> None:
    await feed_job_events(nc, subjects)

    def scraped_thrice(expr: str, series: int) -> bool:
        seen = prometheus.vector(f"count_over_time({expr}[1m])")
        return len(seen) == series and all(float(s["value"][1]) >= 3 for s in seen)

    def ready() -> bool:
        # Every target up, and scraped a few times since the metrics service folded every
        # event and sampled the nodes: its jobs log (recoveries, job counts), its progress
        # log (md_step) and the node agent (a process of its own) are followed apart, so
        # wait for each; rate() and increase() then have samples.
        targets = prometheus.get("/api/v1/targets")["data"]["activeTargets"]
        if len(targets) != 2 + sum(job.runner_endpoint for job in JOBS):
            return False
        if any(target["health"] != "up" for target in targets):
            return False
        running = prometheus.vector('mdq_jobs{state="RUNNING"}')
        return (
            [float(s["value"][1]) for s in running] == [float(len(JOBS))]
            and all(
                scraped_thrice(f'{gauge}{{job="mdq-metrics"}}', len(JOBS))
                for gauge in PER_JOB_GAUGES
            )
            and scraped_thrice("mdq_recoveries_total", 1)
            and scraped_thrice("mdq_node_ready", len(NODES))
            and scraped_thrice("mdq_consumer_lag_messages", 2)
        )

    async def prometheus_ready() -> bool:
        if prometheus.process.poll() is not None:
            raise AssertionError(f"prometheus exited:\n{prometheus.log.read_text()}")
        try:
            return await asyncio.to_thread(ready)
        except OSError:  # not listening yet
            return False

    await wait_for(prometheus_ready, timeout=60, what="Prometheus to scrape every exporter")

    # The label is stored as exported: nothing renamed to exported_job.
    renamed = prometheus.get("/api/v1/series", **{"match[]": '{exported_job!=""}'})["data"]
    assert renamed == [], renamed
    # The dashboard's variable query, label_values(md_step, job_id), finds every job.
    values = prometheus.get("/api/v1/label/job_id/values", **{"match[]": "md_step"})["data"]
    assert set(values) == JOB_IDS

    queries = dashboard_queries()
    assert len(queries) >= 10
    checked: list[str] = []
    for query in queries:
        where = f"panel {query.panel!r} {query.ref}"
        if query.repeat is not None:
            # One panel per job, each with the variable set to that one job.
            assert query.repeat == "job_id", where
            for job in JOBS:
                expr = substitute(query.expr, {"$job_id": grafana_regex([job.job_id])})
                series = prometheus.vector(expr)
                assert [s["metric"].get("job_id") for s in series] == [job.job_id], (where, series)
                checked.append(expr)
            continue
        expr = substitute(query.expr, {"$job_id": grafana_regex(sorted(JOB_IDS))})
        series = prometheus.vector(expr)
        assert series, f"{where}: {expr} returned nothing"
        for needed in legend_labels(query.legend):
            missing = [s["metric"] for s in series if needed not in s["metric"]]
            assert not missing, f"{where}: legend {query.legend!r} needs {needed}: {missing}"
        if is_per_job(expr):
            per_job = [str(s["metric"].get("job_id")) for s in series]
            assert sorted(per_job) == sorted(JOB_IDS), f"{where}: {expr} gave {series}"
            attempts = {s["metric"]["job_id"]: s["metric"].get("attempt") for s in series}
            if "attempt" in legend_labels(query.legend):
                assert attempts == {job.job_id: str(job.attempt) for job in JOBS}, where
        if not query.instant:  # a time series panel: the same series over its time range
            labels = sorted(json.dumps(s["metric"], sort_keys=True) for s in series)
            ranged = prometheus.over_last_minute(expr)
            assert sorted(json.dumps(s["metric"], sort_keys=True) for s in ranged) == labels, where
        checked.append(expr)

    # Every per-job gauge has a panel that draws it.
    drawn = {
        gauge for gauge in PER_JOB_GAUGES for q in queries if re.search(rf"\b{gauge}\b", q.expr)
    }
    assert drawn == set(PER_JOB_GAUGES)
    # The values are the jobs' own, whichever exporter Prometheus read them from.
    for gauge, expected in (
        ("md_step", {job.job_id: float(job.step) for job in JOBS}),
        ("md_energy", {job.job_id: job.energy for job in JOBS}),
        ("md_temperature_k", {job.job_id: TEMPERATURE_K for job in JOBS}),
        ("md_ns_per_day", {job.job_id: NS_PER_DAY for job in JOBS}),
    ):
        values = prometheus.vector(f"max by (job_id, attempt) ({gauge})")
        assert {s["metric"]["job_id"]: float(s["value"][1]) for s in values} == expected, gauge
    # The alert rules of compose's Prometheus load, and their inputs are scraped.
    groups = prometheus.get("/api/v1/rules")["data"]["groups"]
    alerts = {rule["name"] for group in groups for rule in group["rules"]}
    assert alerts == {"MdqStreamNearlyFull", "MdqJobsLogRefusingSubmits"}, groups
    assert prometheus.vector("mdq_stream_bytes / (mdq_stream_limit_bytes > 0)")
    lost = prometheus.vector("mdq_md_steps_lost_total")
    assert [float(s["value"][1]) for s in lost] == [200.0]
    recoveries = prometheus.vector("mdq_recoveries_total")
    assert [s["metric"]["reason"] for s in recoveries] == ["FAILURE_OOM_KILLED"]
    assert len(checked) >= len(queries)

    # A job that ends takes its series with it: the metrics service no longer serves them,
    # and Prometheus marks them stale at its next scrape (c has no runner endpoint of its own).
    ended = JOBS[2]
    assert not ended.runner_endpoint
    publisher = OwnersPublisher(js=nc.jetstream(), subjects=subjects)
    succeeded = pb.JobSucceeded(final_step=ended.step, reason="steps_reached")
    await publisher.emit("succeeded", succeeded, job_id=ended.job_id, attempt=ended.attempt)

    def gone() -> bool:
        return all(
            {s["metric"]["job_id"] for s in prometheus.vector(gauge)} == JOB_IDS - {ended.job_id}
            for gauge in PER_JOB_GAUGES
        )

    async def gone_from_prometheus() -> bool:
        return await asyncio.to_thread(gone)

    await wait_for(gone_from_prometheus, timeout=30, what="the ended job's series to go stale")


def test_the_storage_alerts_fire_when_and_only_when_they_should() -> None:
    """promtool's rule tests (deploy/prometheus/alerts.test.yml): a stream above 80 % for 10
    minutes, the jobs log at its 90 % mark, and a stream without a limit never."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed: apt-get install prometheus")
    done = subprocess.run(
        [promtool, "test", "rules", ALERT_CASES.name],
        cwd=ALERT_CASES.parent,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_grafana_variables_are_substituted_as_grafana_does() -> None:
    assert grafana_regex(["a.b", "c"]) == "(a\\\\.b|c)"
    assert substitute('md_step{job_id=~"$job_id"}', {"$job_id": "(x|y)"}) == (
        'md_step{job_id=~"(x|y)"}'
    )
    assert substitute("rate(x[$__rate_interval])", {}) == "rate(x[1m])"
    with pytest.raises(AssertionError, match="does not know"):
        substitute("rate(x[$__unknown])", {})
    assert legend_labels("{{job_id}} #{{ attempt }}") == {"job_id", "attempt"}
