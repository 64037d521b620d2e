"""A stand-in runner for the execution backends' own tests: runs its job's script.

The node agent and the simulated kubelet only ever start ``<python> -m <module>``; the
backends' tests point them (through the agent's ``runner_module`` setting, or the Kubernetes
``runner_command``) at this module so a pod can be a tiny program: a test writes the Python
script of job J to ``<MDQ_DATA_DIR>/scripts/J.py`` and creates J's pod. The script runs with
the pod's environment and working directory, as the runner would.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def script_path(data_dir: Path, job_id: str) -> Path:
    """Where the script of ``job_id`` lives."""
    return data_dir / "scripts" / f"{job_id}.py"


def write_script(data_dir: Path, job_id: str, code: str) -> Path:
    """Write the script of ``job_id``; return its path."""
    path = script_path(data_dir, job_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(code)
    return path


def main() -> None:
    path = script_path(Path(os.environ["MDQ_DATA_DIR"]), os.environ["MDQ_JOB_ID"])
    code = compile(path.read_text(), str(path), "exec")
    sys.argv = [str(path)]
    exec(code, {"__name__": "__main__", "__file__": str(path)})


if __name__ == "__main__":
    main()
