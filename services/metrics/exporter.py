"""The Prometheus metrics of mdq, in a registry of their own, and how events set them."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from mdq.core.nodes import NodeSample
from mdq.core.state import JobState
from mdq.core.tenants import TenantUsage
from services.metrics.folding import JobProgress, LifecycleFacts


class Exporter:
    """Gauges and counters served on /metrics."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        node = ["node"]
        # "job_id", not "job": Prometheus gives "job" to the scrape job and renames an exported
        # "job" label to "exported_job", so a dashboard grouping by job would see one series.
        attempt = ["job_id", "attempt"]

        def gauge(name: str, documentation: str, labels: Sequence[str] = ()) -> Gauge:
            return Gauge(name, documentation, labels, registry=self.registry)

        self.node_cpu_load = gauge("mdq_node_cpu_load_ratio", "CPU in use / capacity (0..1).", node)
        self.node_memory_load = gauge(
            "mdq_node_memory_load_ratio", "Memory in use / capacity (0..1).", node
        )
        self.node_ready = gauge("mdq_node_ready", "1 if the node is ready for work.", node)
        self.node_problem = gauge(
            "mdq_node_problem",
            "1 while the node reports that its environment cannot run pods (its data folder "
            "full, read-only, failing or unmounted; pods that could not start): it takes no new "
            "pods, within the cordon budget.",
            node,
        )
        self.node_cluster = gauge(
            "mdq_node_cluster_info",
            '1 for each node of a named execution cluster (node is "<cluster>/<node>"): '
            "join on node to group the node metrics by cluster.",
            ("node", "cluster"),
        )
        self.node_cpu_capacity = gauge(
            "mdq_node_cpu_capacity_cores", "Allocatable CPU cores.", node
        )
        self.node_memory_capacity = gauge(
            "mdq_node_memory_capacity_mib", "Allocatable memory, MiB.", node
        )
        self.jobs = gauge("mdq_jobs", "Jobs by state.", ["state"])
        self.md_step = gauge("md_step", "Latest MD step of a running job.", attempt)
        self.md_energy = gauge(
            "md_energy", "Latest potential energy of a running job, kJ/mol.", attempt
        )
        self.md_temperature = gauge(
            "md_temperature_k",
            "Instantaneous temperature of a running job at its latest report, K.",
            attempt,
        )
        self.md_ns_per_day = gauge(
            "md_ns_per_day",
            "Speed of a running MD job over its latest report interval, ns/day (none for a "
            "minimisation or an analysis).",
            attempt,
        )
        self.progress_events = Counter(
            "mdq_progress_events", "Progress events received.", registry=self.registry
        )
        self.node_load_events = Counter(
            "mdq_node_load_events", "node_load events published.", registry=self.registry
        )
        self.queue_depth = gauge("mdq_queue_depth_jobs", "Jobs waiting for a node (PENDING).")
        self.placement_latency = Histogram(
            "mdq_placement_latency_seconds",
            "Time from a job becoming PENDING (submitted, released, requeued) to bound.",
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600),
            registry=self.registry,
        )
        self.recoveries = Counter(
            "mdq_recoveries",
            "Attempts retried, by the reason the previous attempt failed.",
            ["reason"],
            registry=self.registry,
        )
        self.steps_lost = Counter(
            "mdq_md_steps_lost",
            "MD steps lost by failed attempts (work after the checkpoint a retry resumed from).",
            registry=self.registry,
        )
        self.consumer_lag = gauge(
            "mdq_consumer_lag_messages",
            "Messages of a stream not yet projected by a consumer (pending + unacknowledged).",
            ["consumer", "stream"],
        )
        self.stream_bytes = gauge(
            "mdq_stream_bytes", "Bytes a JetStream stream of the namespace holds.", ["stream"]
        )
        self.stream_limit_bytes = gauge(
            "mdq_stream_limit_bytes",
            "The size limit of a stream (MDQ_STORAGE_*; 0: none). The jobs stream refuses "
            "new submits above MDQ_STORAGE_JOBS_HIGH_WATER of it.",
            ["stream"],
        )
        self.stream_messages = gauge("mdq_stream_messages", "Messages a stream holds.", ["stream"])
        tenant = ["tenant"]
        self.tenant_weight = gauge("mdq_tenant_weight", "Fair-share weight (its policy's).", tenant)
        self.tenant_share = gauge(
            "mdq_tenant_share_ratio",
            "Dominant share of the schedulable capacity its running jobs request (0..1).",
            tenant,
        )
        self.tenant_fair_share = gauge(
            "mdq_tenant_fair_share_ratio",
            "Dominant share it is due while every tenant's queued work competes (0..1).",
            tenant,
        )
        self.tenant_running_jobs = gauge(
            "mdq_tenant_running_jobs", "Jobs bound or running.", tenant
        )
        self.tenant_queued_jobs = gauge("mdq_tenant_queued_jobs", "Jobs not running yet.", tenant)
        self.tenant_running_cpu = gauge(
            "mdq_tenant_running_cpu_cores", "CPU requested by its jobs bound or running.", tenant
        )
        self._nodes: set[str] = set()
        self._clusters: dict[str, str] = {}
        """node -> its cluster, for the nodes of named clusters shown now."""
        self._tenants: set[str] = set()
        self.set_job_counts({})

    def set_tenants(self, usages: Mapping[str, TenantUsage]) -> None:
        """Show these tenants' fair-share figures (placement's count; no longer the tenants
        whose count expired)."""
        gauges = (
            self.tenant_weight,
            self.tenant_share,
            self.tenant_fair_share,
            self.tenant_running_jobs,
            self.tenant_queued_jobs,
            self.tenant_running_cpu,
        )
        for tenant, usage in usages.items():
            self.tenant_weight.labels(tenant).set(usage.weight)
            self.tenant_share.labels(tenant).set(usage.share)
            self.tenant_fair_share.labels(tenant).set(usage.fair_share)
            self.tenant_running_jobs.labels(tenant).set(usage.running_jobs)
            self.tenant_queued_jobs.labels(tenant).set(usage.queued_jobs)
            self.tenant_running_cpu.labels(tenant).set(usage.running_cpu)
        for gone in self._tenants - set(usages):
            for gauge in gauges:
                gauge.remove(gone)
        self._tenants = set(usages)

    def set_nodes(self, samples: Iterable[NodeSample]) -> None:
        """Show these nodes (and no longer the ones missing from them)."""
        seen: set[str] = set()
        for sample in samples:
            seen.add(sample.name)
            self.node_cpu_load.labels(sample.name).set(sample.cpu_load)
            self.node_memory_load.labels(sample.name).set(sample.memory_load)
            self.node_ready.labels(sample.name).set(1 if sample.ready else 0)
            self.node_problem.labels(sample.name).set(1 if sample.problem else 0)
            self.node_cpu_capacity.labels(sample.name).set(sample.cpu_capacity)
            self.node_memory_capacity.labels(sample.name).set(sample.memory_capacity_mb)
            if sample.cluster:
                self.node_cluster.labels(sample.name, sample.cluster).set(1)
                self._clusters[sample.name] = sample.cluster
        for gone in self._nodes - seen:
            if (cluster := self._clusters.pop(gone, None)) is not None:
                self.node_cluster.remove(gone, cluster)
            for gauge in (
                self.node_cpu_load,
                self.node_memory_load,
                self.node_ready,
                self.node_problem,
                self.node_cpu_capacity,
                self.node_memory_capacity,
            ):
                gauge.remove(gone)
        self._nodes = seen

    def set_job_counts(self, counts: Mapping[JobState, int]) -> None:
        """Every state, zero included, so dashboards see a series for each."""
        for state in JobState:
            self.jobs.labels(state.value).set(counts.get(state, 0))
        self.queue_depth.set(counts.get(JobState.PENDING, 0))

    def record_lifecycle(self, facts: LifecycleFacts) -> None:
        if facts.placement_latency_s is not None:
            self.placement_latency.observe(facts.placement_latency_s)
        if facts.recovery_reason is not None:
            self.recoveries.labels(facts.recovery_reason).inc()
        if facts.steps_lost:
            self.steps_lost.inc(facts.steps_lost)

    def show_progress(self, progress: JobProgress) -> None:
        """The series of a running job's attempt: its latest step, energy, temperature and
        speed (no speed series without MD)."""
        labels = (progress.job_id, str(progress.attempt))
        self.md_step.labels(*labels).set(progress.step)
        self.md_energy.labels(*labels).set(progress.potential_kj_mol)
        self.md_temperature.labels(*labels).set(progress.temperature_k)
        if progress.ns_per_day is not None:
            self.md_ns_per_day.labels(*labels).set(progress.ns_per_day)
        else:
            with contextlib.suppress(KeyError):
                self.md_ns_per_day.remove(*labels)

    def hide_progress(self, progress: JobProgress) -> None:
        """No series of this attempt any more (it ended, or its job did)."""
        labels = (progress.job_id, str(progress.attempt))
        for gauge in (self.md_step, self.md_energy, self.md_temperature, self.md_ns_per_day):
            with contextlib.suppress(KeyError):
                gauge.remove(*labels)
