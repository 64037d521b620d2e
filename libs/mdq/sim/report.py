"""What a comparison reports: the JSON line of ``mdq simulate``, the metrics its plot and the
console's simulation page draw, and which configuration did best on each (docs/simulate.md,
"Metrics")."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from mdq.sim.engine import Metrics
from mdq.sim.model import Workload


@dataclass(frozen=True, slots=True)
class Panel:
    """One metric as the plot and the console draw it."""

    key: str
    """The metric's key in a configuration's figures (``Metrics.summary``)."""
    title: str
    """Its title, with the unit drawn."""
    factor: float
    """From the figure's unit to the drawn one (seconds to hours, ...)."""
    higher_is_better: bool = False
    """Utilisation is better high; every other metric is better low."""


PANELS = (
    Panel("makespan_s", "makespan (h)", 1 / 3600),
    Panel("mean_wait_s", "mean wait (min)", 1 / 60),
    Panel("p95_wait_s", "p95 wait (min)", 1 / 60),
    Panel("utilisation", "CPU utilisation", 1.0, higher_is_better=True),
    Panel("memory_slack", "memory slack", 1.0),
    Panel("cpu_slack", "CPU slack", 1.0),
    Panel("oom_kills", "OOM kills", 1.0),
    Panel("share_error_max", "max tenant share error", 1.0),
    Panel("preemptions", "preemptions", 1.0),
    Panel("steps_lost", "steps lost", 1.0),
)
"""The metrics a comparison is read by, in the order they are drawn."""


def report(workload: Workload, results: Sequence[Metrics]) -> dict[str, object]:
    """The JSON line: the workload and every configuration's figures."""
    return {
        "workload": {
            "name": workload.name,
            "nodes": len(workload.nodes),
            "cores": sum(node.cpu for node in workload.nodes),
            "jobs": len(workload.jobs),
            "tenants": len({job.tenant for job in workload.jobs}),
            "outages": len(workload.outages),
            **workload.notes,
        },
        "configs": [result.summary() for result in results],
    }


def best_by_panel(configs: Sequence[Mapping[str, object]]) -> dict[str, list[str]]:
    """Per panel key, the configurations with the best figure (all of them on a tie)."""
    best: dict[str, list[str]] = {}
    for panel in PANELS:
        values = [(float(str(figures[panel.key])), str(figures["config"])) for figures in configs]
        if not values:
            continue
        pick = max if panel.higher_is_better else min
        top = pick(value for value, _ in values)
        best[panel.key] = [name for value, name in values if value == top]
    return best
