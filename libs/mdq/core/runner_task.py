"""What a runner is told to do, as environment variables of its pod (pure).

Placement builds the environment with ``RunnerTask.to_env`` and the runner reads it back with
``RunnerTask.from_env``; nothing else couples the two.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from google.protobuf import json_format

from mdq.contracts import pb

ENV_JOB_ID = "MDQ_JOB_ID"
ENV_ATTEMPT = "MDQ_ATTEMPT"
ENV_SPEC = "MDQ_JOB_SPEC"
ENV_RESUME_FROM = "MDQ_RESUME_FROM"
ENV_JOB_DIR = "MDQ_JOB_DIR"
ENV_INPUT_DIRS = "MDQ_INPUT_DIRS"
ENV_THREADS = "MDQ_CPU_THREADS"


def job_dir(data_dir: Path, job_id: str) -> Path:
    """The folder of a job's outputs and checkpoints under the data root."""
    return data_dir / "jobs" / job_id


@dataclass(frozen=True, slots=True)
class RunnerTask:
    """One attempt of one job, as the runner sees it."""

    job_id: str
    attempt: int
    spec: pb.JobSpec
    job_dir: Path
    """Outputs go here; checkpoints under job_dir/checkpoints."""
    threads: int
    """OpenMM CPU threads."""
    resume_from: pb.Checkpoint | None = None
    """Checkpoint to resume from (verified by sha256 before use)."""
    input_dirs: tuple[Path, ...] = field(default=())
    """Job folders of the dependencies, in depends_on order (read-only inputs)."""

    def to_env(self) -> dict[str, str]:
        env = {
            ENV_JOB_ID: self.job_id,
            ENV_ATTEMPT: str(self.attempt),
            ENV_SPEC: json_format.MessageToJson(self.spec, indent=None),
            ENV_JOB_DIR: str(self.job_dir),
            ENV_THREADS: str(self.threads),
            ENV_INPUT_DIRS: os.pathsep.join(str(path) for path in self.input_dirs),
        }
        if self.resume_from is not None:
            env[ENV_RESUME_FROM] = json_format.MessageToJson(self.resume_from, indent=None)
        return env

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> RunnerTask:
        spec = json_format.Parse(env[ENV_SPEC], pb.JobSpec())
        resume = env.get(ENV_RESUME_FROM)
        inputs = env.get(ENV_INPUT_DIRS, "")
        return cls(
            job_id=env[ENV_JOB_ID],
            attempt=int(env[ENV_ATTEMPT]),
            spec=spec,
            job_dir=Path(env[ENV_JOB_DIR]),
            threads=max(1, int(env.get(ENV_THREADS, "1"))),
            resume_from=json_format.Parse(resume, pb.Checkpoint()) if resume else None,
            input_dirs=tuple(Path(part) for part in inputs.split(os.pathsep) if part),
        )
