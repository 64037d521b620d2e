"""What a runner is told to do, as environment variables of its pod (pure).

Placement builds the environment with ``RunnerTask.to_env`` and the runner reads it back with
``RunnerTask.from_env``; nothing else couples the two. The job spec and the checkpoint travel as
base64 of their protobuf encoding (``proto/mdq/v1/mdq.proto`` is the contract), the cheapest
form to build for placement, which builds one environment per binding.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from google.protobuf.message import Message

from mdq.contracts import pb
from mdq.core.ids import tenant_of

ENV_JOB_ID = "MDQ_JOB_ID"
ENV_ATTEMPT = "MDQ_ATTEMPT"
ENV_SPEC = "MDQ_JOB_SPEC"
ENV_RESUME_FROM = "MDQ_RESUME_FROM"
ENV_JOB_DIR = "MDQ_JOB_DIR"
ENV_INPUT_DIRS = "MDQ_INPUT_DIRS"
ENV_THREADS = "MDQ_CPU_THREADS"

MessageT = TypeVar("MessageT", bound=Message)


def _encode(message: Message) -> str:
    return base64.b64encode(message.SerializeToString(deterministic=True)).decode("ascii")


def _decode(text: str, message: MessageT) -> MessageT:
    """A message from base64 protobuf (``ValueError`` for anything else)."""
    message.ParseFromString(base64.b64decode(text, validate=True))
    return message


def jobs_root(data_dir: Path) -> Path:
    """The folder holding every job's folder under the data root."""
    return data_dir / "jobs"


def job_dir(data_dir: Path, job_id: str) -> Path:
    """The folder of a job's outputs and checkpoints under the data root."""
    return jobs_root(data_dir) / job_id


TENANTS_FOLDER = "tenants"
"""Under the data root, one folder per tenant (``tenants/<tenant>/inputs``: its structures)."""


def inputs_home(data_dir: Path, job_id: str) -> Path:
    """The folder a job's ``inputs/...`` paths are named from: the data root for the
    operator's jobs (``<data>/inputs``), ``<data>/tenants/<tenant>`` for a tenant's, so a
    tenant's job reads its own tenant's inputs and never another's (nor the operator's)."""
    tenant = tenant_of(job_id)
    return data_dir / TENANTS_FOLDER / tenant if tenant else data_dir


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
            ENV_SPEC: _encode(self.spec),
            ENV_JOB_DIR: str(self.job_dir),
            ENV_THREADS: str(self.threads),
            ENV_INPUT_DIRS: os.pathsep.join(str(path) for path in self.input_dirs),
        }
        if self.resume_from is not None:
            env[ENV_RESUME_FROM] = _encode(self.resume_from)
        return env

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> RunnerTask:
        spec = _decode(env[ENV_SPEC], pb.JobSpec())
        resume = env.get(ENV_RESUME_FROM)
        inputs = env.get(ENV_INPUT_DIRS, "")
        return cls(
            job_id=env[ENV_JOB_ID],
            attempt=int(env[ENV_ATTEMPT]),
            spec=spec,
            job_dir=Path(env[ENV_JOB_DIR]),
            threads=max(1, int(env.get(ENV_THREADS, "1"))),
            resume_from=_decode(resume, pb.Checkpoint()) if resume else None,
            input_dirs=tuple(Path(part) for part in inputs.split(os.pathsep) if part),
        )
