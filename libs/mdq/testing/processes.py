"""Finding the runner process of a job on this machine (fault tests and benchmarks kill it)."""

from __future__ import annotations

import psutil

from mdq.core.runner_task import ENV_JOB_ID


def runner_pid(job_id: str) -> int | None:
    """The pid of the runner process running ``job_id`` here, or None."""
    for process in psutil.process_iter(["cmdline"]):
        try:
            if "services.runner" in " ".join(process.info["cmdline"] or ()) and (
                process.environ().get(ENV_JOB_ID) == job_id
            ):
                return int(process.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return None
