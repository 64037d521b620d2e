"""The runner's Prometheus endpoint: the MD step, energies and speed of this attempt, live.

Served only when ``MDQ_RUNNER_METRICS_PORT`` is a port (> 0); scraped in the pod by Prometheus, so
Grafana can chart a job's step and energy next to the node it runs on.
"""

from __future__ import annotations

import logging
import time
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Gauge, start_http_server

from mdq.core.speed import interval_ns_per_day
from services.runner.samples import EnergySample

log = logging.getLogger(__name__)


GAUGES = {
    "md_step": "Current MD step (or minimiser iteration) of the attempt.",
    "md_energy": "Potential energy at the last progress report, kJ/mol.",
    "md_kinetic_energy": "Kinetic energy at the last progress report, kJ/mol.",
    "md_temperature_k": "Instantaneous temperature at the last progress report, K.",
    "md_time_ps": "Simulated time at the last progress report, ps.",
    "md_volume_nm3": "Periodic box volume at the last progress report, nm^3 (0: not periodic).",
    "md_density_g_cm3": "Mass density at the last progress report, g/cm^3 (0: not periodic).",
    "md_ns_per_day": "Speed of the attempt over its last report interval, ns/day.",
    "md_eta_seconds": "Estimated seconds to the step target at the current speed.",
    "md_checkpoint_step": "Step of the attempt's latest checkpoint.",
}
"""Every gauge the runner exports (labels ``job_id``, ``attempt``: not ``job``, which Prometheus
keeps for the scrape job); md_step, md_energy, md_temperature_k and md_ns_per_day are also the
metrics service's, with the same meaning, so a dashboard merges the two."""


class RunnerMetrics:
    """The gauges of :data:`GAUGES` for one attempt, optionally served over HTTP."""

    def __init__(self, *, job_id: str, attempt: int) -> None:
        self.registry = CollectorRegistry()
        labels = {"job_id": job_id, "attempt": str(attempt)}
        self._gauges: dict[str, Gauge] = {
            name: Gauge(name, text, labelnames=tuple(labels), registry=self.registry).labels(
                **labels
            )
            for name, text in GAUGES.items()
        }
        self._server: WSGIServer | None = None
        self._last: tuple[float, float] | None = None
        """(simulated time, monotonic time) of the last report: the interval's speed."""

    def serve(self, *, port: int) -> None:
        """Serve /metrics on ``port`` (all interfaces) in a background thread."""
        self._server, _ = start_http_server(port, registry=self.registry)
        log.info("serving metrics on port %d", port)

    def observe(self, sample: EnergySample, *, ns_per_day: float = 0.0, eta_s: float = 0.0) -> None:
        """Record one progress report; ``ns_per_day`` (the attempt's speed since it started)
        is shown for the first one, the speed over the interval since the report before for
        the others."""
        now = time.monotonic()
        if self._last is not None:
            interval = interval_ns_per_day(
                time_ps=sample.time_ps,
                at_s=now,
                previous_time_ps=self._last[0],
                previous_at_s=self._last[1],
            )
            ns_per_day = ns_per_day if interval is None else interval
        self._last = (sample.time_ps, now)
        values = {
            "md_step": sample.step,
            "md_energy": sample.potential_kj_mol,
            "md_kinetic_energy": sample.kinetic_kj_mol,
            "md_temperature_k": sample.temperature_k,
            "md_time_ps": sample.time_ps,
            "md_volume_nm3": sample.volume_nm3,
            "md_density_g_cm3": sample.density_g_cm3,
            "md_ns_per_day": ns_per_day,
            "md_eta_seconds": eta_s,
        }
        for name, value in values.items():
            self._gauges[name].set(value)

    def checkpointed(self, step: int) -> None:
        """Record a checkpoint."""
        self._gauges["md_checkpoint_step"].set(step)

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
