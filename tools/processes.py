"""Starting a runner process for a task, and finding the runner process of a job on this
machine (fault tests and benchmarks kill it)."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import IO

import psutil

from mdq.core.runner_task import ENV_JOB_ID, RunnerTask

ENV_NAMESPACE = "MDQ_NAMESPACE"


def runner_environments() -> Iterator[tuple[psutil.Process, dict[str, str]]]:
    """Every runner process on this machine (``services.runner`` in its command line) with
    its environment, which names its job and attempt; one that ends or may not be read while
    it is looked at is passed over."""
    for process in psutil.process_iter(["cmdline"]):
        try:
            if "services.runner" not in " ".join(process.info["cmdline"] or ()):
                continue
            env = process.environ()
        except psutil.Error:
            continue
        yield process, env


def runner_pid(job_id: str, namespace: str | None = None) -> int | None:
    """The pid of the runner process running ``job_id`` here, or None. With ``namespace``,
    only a runner of that namespace counts: another stack on the machine (a parallel test
    worker, a second campaign) may run a job of the same id, since ids follow from
    idempotency keys."""
    for process, env in runner_environments():
        if env.get(ENV_JOB_ID) == job_id and namespace in (None, env.get(ENV_NAMESPACE)):
            return int(process.pid)
    return None


async def spawn_runner(
    task: RunnerTask,
    nats_url: str,
    namespace: str,
    *,
    cwd: Path,
    stderr: int | IO[bytes],
    extra_env: Mapping[str, str] | None = None,
) -> asyncio.subprocess.Process:
    """A runner process (``python -m services.runner``, run in ``cwd``: the repository) of
    ``task`` on the bus at ``nats_url``, its stdin and stdout closed. Its environment: this
    process's, the task's, the bus's, its data folder (the runner checks that the task's
    folder is that folder's jobs/<id>), then ``extra_env``."""
    env = {
        **os.environ,
        **task.to_env(),
        "NATS_URL": nats_url,
        ENV_NAMESPACE: namespace,
        "MDQ_DATA_DIR": str(task.job_dir.parent.parent),
        **(extra_env or {}),
    }
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "services.runner",
        env=env,
        cwd=cwd,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=stderr,
    )
