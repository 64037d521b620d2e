"""How a pod's runner is started: the argv and the environment, built here and nowhere else.

A pod record or manifest describes an attempt and never carries a command or free environment
variables, so the node agent, the simulated kubelet and the Kubernetes manifest builder all
start ``<this interpreter> -m services.runner`` with the task's variables and an allowlist of
their own environment: secrets stay with the agent. Design: docs/security.md, "A pod
describes an attempt; it never says what to run".
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping
from pathlib import Path

from mdq.backends.port import PodSpec
from mdq.core import ids
from mdq.core.runner_task import RunnerTask, job_dir
from mdq.core.tenants import TENANT_PATTERN
from mdq.errors import InvalidInput

RUNNER_MODULE = "services.runner"
"""The module every pod runs (``python -m services.runner``)."""

INHERITED_VARIABLES = frozenset(
    {
        # the basics a Python process expects
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
        "LANG",
        "LANGUAGE",
        "LC_ALL",
        "LC_CTYPE",
        "LC_NUMERIC",
        "TZ",
        "TMPDIR",
        "TEMP",
        "TMP",
        "PYTHONUNBUFFERED",
        # OpenMM and its threads
        "OPENMM_CPU_THREADS",
        "OPENMM_DEFAULT_PLATFORM",
        "OPENMM_PLUGIN_DIR",
        "OMP_NUM_THREADS",
        "CUDA_VISIBLE_DEVICES",
        # the operator's force-field folder (mdq.forcefields)
        "MDQ_FORCEFIELD_DIR",
    }
)
"""Variables of the starting process's environment a runner gets, by exact name."""

INHERITED_PREFIXES = ("MDQ_RUNNER_",)
"""...and by prefix: the runner's own settings (services.runner.settings)."""

_SAFE_ID = re.compile(rf"^(?:{TENANT_PATTERN.pattern}\.)?[A-Za-z0-9][A-Za-z0-9_-]{{0,127}}$")
"""A job id that is one plain folder name: intake's ids are "<hex>-<name>", a tenant's
"<tenant>.<hex>-<name>" (one dot, after a name that starts with a letter: never "." or "..")."""


class PodRefused(InvalidInput):
    """A pod description that cannot be run (a job id that is not a folder name, ...)."""


def module_argv(module: str = RUNNER_MODULE) -> list[str]:
    """``<this interpreter> -m <module>``: the runner with the starting process's Python."""
    return [sys.executable, "-m", module]


def inherited_environment(host: Mapping[str, str]) -> dict[str, str]:
    """The part of ``host`` (the starting process's environment) a runner may see."""
    return {
        name: value
        for name, value in host.items()
        if name in INHERITED_VARIABLES or name.startswith(INHERITED_PREFIXES)
    }


def check_pod(pod: PodSpec) -> None:
    """PodRefused unless the pod's ids are plain folder names and its name is the one mdq
    derives from them (so no path built from them leaves the data folder)."""
    for what, value in (("job id", pod.job_id), *(("dependency", dep) for dep in pod.depends_on)):
        if not _SAFE_ID.fullmatch(value):
            raise PodRefused(f"{what} {value!r} is not a plain name")
    if pod.attempt < 1:
        raise PodRefused(f"attempt {pod.attempt} is not a positive number")
    if pod.name != ids.pod_name(pod.job_id, pod.attempt):
        raise PodRefused(f"pod name {pod.name!r} is not {ids.pod_name(pod.job_id, pod.attempt)!r}")


def runner_task(pod: PodSpec, *, data_dir: Path) -> RunnerTask:
    """The runner's task for ``pod``, its folders derived from ``data_dir`` (PodRefused if
    the pod's ids are not plain names)."""
    check_pod(pod)
    return RunnerTask(
        job_id=pod.job_id,
        attempt=pod.attempt,
        spec=pod.spec,
        job_dir=job_dir(data_dir, pod.job_id),
        threads=max(1, pod.threads),
        resume_from=pod.resume_from,
        input_dirs=tuple(job_dir(data_dir, dep) for dep in pod.depends_on),
    )


def bus_environment(*, nats_url: str, namespace: str, data_dir: Path) -> dict[str, str]:
    """Where the runner finds the bus, its namespace and the data folder."""
    return {"NATS_URL": nats_url, "MDQ_NAMESPACE": namespace, "MDQ_DATA_DIR": str(data_dir)}


def runner_environment(
    pod: PodSpec,
    *,
    data_dir: Path,
    nats_url: str,
    namespace: str,
    host: Mapping[str, str],
) -> dict[str, str]:
    """The whole environment of the runner of ``pod``: the allowlisted part of ``host``, the
    task, the bus, and the pod's own name and node."""
    env = inherited_environment(host)
    env.update(runner_task(pod, data_dir=data_dir).to_env())
    env.update(bus_environment(nats_url=nats_url, namespace=namespace, data_dir=data_dir))
    env.update(MDQ_POD_NAME=pod.name, MDQ_NODE_NAME=pod.node)
    return env
