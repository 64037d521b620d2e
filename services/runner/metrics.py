"""The runner's Prometheus endpoint: the MD step and energy of this attempt, live.

Served only when ``MDQ_RUNNER_METRICS_PORT`` is a port (> 0); scraped in the pod by Prometheus, so
Grafana can chart a job's step and energy next to the node it runs on.
"""

from __future__ import annotations

import logging
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Gauge, start_http_server

from services.runner.system import EnergySample

log = logging.getLogger(__name__)


class RunnerMetrics:
    """``md_step`` and ``md_energy`` (labels job, attempt), optionally served over HTTP."""

    def __init__(self, *, job_id: str, attempt: int) -> None:
        self.registry = CollectorRegistry()
        labels = {"job": job_id, "attempt": str(attempt)}
        self._step = Gauge(
            "md_step",
            "Current MD step (or minimiser iteration) of the attempt.",
            labelnames=tuple(labels),
            registry=self.registry,
        ).labels(**labels)
        self._energy = Gauge(
            "md_energy",
            "Potential energy at the last progress report, kJ/mol.",
            labelnames=tuple(labels),
            registry=self.registry,
        ).labels(**labels)
        self._server: WSGIServer | None = None

    def serve(self, *, port: int) -> None:
        """Serve /metrics on ``port`` (all interfaces) in a background thread."""
        self._server, _ = start_http_server(port, registry=self.registry)
        log.info("serving metrics on port %d", port)

    def observe(self, sample: EnergySample) -> None:
        self._step.set(sample.step)
        self._energy.set(sample.potential_kj_mol)

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
