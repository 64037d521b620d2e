"""Finding the runner process of a job on this machine (fault tests and benchmarks kill it)."""

from __future__ import annotations

import psutil

from mdq.core.runner_task import ENV_JOB_ID

ENV_NAMESPACE = "MDQ_NAMESPACE"


def runner_pid(job_id: str, namespace: str | None = None) -> int | None:
    """The pid of the runner process running ``job_id`` here, or None. With ``namespace``,
    only a runner of that namespace counts: another stack on the machine (a parallel test
    worker, a second campaign) may run a job of the same id, since ids follow from
    idempotency keys."""
    for process in psutil.process_iter(["cmdline"]):
        try:
            if "services.runner" not in " ".join(process.info["cmdline"] or ()):
                continue
            env = process.environ()
            if env.get(ENV_JOB_ID) == job_id and namespace in (None, env.get(ENV_NAMESPACE)):
                return int(process.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return None
