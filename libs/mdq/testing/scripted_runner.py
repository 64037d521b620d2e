"""A stand-in runner for the execution backends' own tests: runs its job's script.

The node agent and the simulated kubelet only ever start ``<python> -m <module>``; the
backends' tests point them (through the agent's ``runner_module`` setting, or the Kubernetes
``runner_command``) at this module so that a pod can be a tiny program. The program is the
``script`` label of the pod's job spec (``scripted_spec``), read back from the task the pod
was given (``RunnerTask.from_env``): it runs with the pod's environment and working folder,
exactly as the runner would. Only tests configure it; production agents run services.runner.
"""

from __future__ import annotations

import os

from mdq.contracts import pb
from mdq.core.runner_task import RunnerTask

SCRIPT_LABEL = "script"


def scripted_spec(code: str) -> pb.JobSpec:
    """A job spec whose pod, run by this module, executes ``code``."""
    return pb.JobSpec(name="scripted", labels={SCRIPT_LABEL: code})


def main() -> None:
    task = RunnerTask.from_env(os.environ)
    code = compile(task.spec.labels[SCRIPT_LABEL], f"<script of {task.job_id}>", "exec")
    exec(code, {"__name__": "__main__"})


if __name__ == "__main__":
    main()
