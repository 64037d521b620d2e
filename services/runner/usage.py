"""What an attempt used, measured by its runner as it ends: the ``usage`` event's body.

Memory is the kernel's peak resident set: ``getrusage`` of the runner itself and of any child
it waited for (the runner is one process; OpenMM's threads are in it), or, where the runner is
the whole of a container (``MDQ_RUNNER_USAGE_SOURCE=cgroup``, or ``auto`` under Kubernetes),
the cgroup's ``memory.peak`` (cgroup v2), which also counts page cache the container charged.
CPU seconds are user + system time of the process and its waited-for children; wall time runs
from the runner's start. The local node agent enforces the same limits on the same process, so
the figures are what a limit has to cover. The resource recommender (``mdq.core.recommend``)
learns from them; docs/requests.md.
"""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Mapping
from pathlib import Path

from mdq.contracts import pb

CGROUP_MEMORY_PEAK = Path("/sys/fs/cgroup/memory.peak")
MIB = 1024 * 1024
STARTED = time.monotonic()
"""When this process imported the module (the runner imports it at start)."""


def _cgroup_peak_mb(path: Path) -> float | None:
    try:
        return int(path.read_text().strip()) / MIB
    except (OSError, ValueError):
        return None


def use_cgroup(source: str, environ: Mapping[str, str]) -> bool:
    """Whether the memory figure comes from the cgroup: ``cgroup``, or ``auto`` in a pod."""
    if source == "cgroup":
        return True
    return source == "auto" and "KUBERNETES_SERVICE_HOST" in environ


def measure(
    spec: pb.JobSpec,
    *,
    exit_code: int,
    steps: int,
    ns_per_day: float,
    source: str = "auto",
    environ: Mapping[str, str] | None = None,
    cgroup_peak: Path = CGROUP_MEMORY_PEAK,
    now: float | None = None,
) -> pb.AttemptUsage:
    """The usage of this process so far, with the limits the attempt ran under."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    # ru_maxrss is in KiB on Linux; the largest of the runner and its children (not their sum:
    # the children's figure is the peak of the largest one)
    peak_mb = max(own.ru_maxrss, children.ru_maxrss) / 1024
    figure = "rusage"
    if use_cgroup(source, os.environ if environ is None else environ):
        cgroup = _cgroup_peak_mb(cgroup_peak)
        if cgroup is not None:
            peak_mb, figure = cgroup, "cgroup"
    cpu_seconds = own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime
    wall_seconds = max(1e-6, (time.monotonic() if now is None else now) - STARTED)
    return pb.AttemptUsage(
        peak_memory_mb=peak_mb,
        cpu_seconds=cpu_seconds,
        wall_seconds=wall_seconds,
        mean_cores=cpu_seconds / wall_seconds,
        ns_per_day=ns_per_day,
        source=figure,
        memory_limit_mb=spec.resources.memory_mb,
        cpu_limit=spec.resources.cpu,
        exit_code=exit_code,
        steps=steps,
    )
