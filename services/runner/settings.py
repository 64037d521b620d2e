"""Settings of the runner (``MDQ_RUNNER_*``); the job itself comes from ``RunnerTask.from_env``."""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from mdq.settings import Count, Seconds


class RunnerSettings(BaseSettings):
    """How the runner behaves, independent of the job it runs."""

    model_config = SettingsConfigDict(env_prefix="MDQ_RUNNER_", extra="ignore")

    metrics_port: int = Field(
        default=0,
        description="Port of the Prometheus endpoint (md_step, md_energy); 0 turns it off.",
    )
    warmup_minimize_iterations: int = Field(
        default=100,
        ge=0,
        description="Minimiser iterations before an MD run that starts from a fresh box.",
    )
    max_chunk_steps: Count = Field(
        default=1000,
        description="Most MD steps run in one go; bounds how long SIGTERM waits for a chunk.",
    )
    chunk_s: Seconds = Field(
        default=2.0,
        description="Longest a chunk of MD steps should take at the speed measured so far (the "
        "first chunk is a few steps, to measure it): a large system's chunks get fewer steps, "
        "so a stop request is honoured well within the pod's grace period.",
    )
    alive_report_s: Seconds = Field(
        default=15.0,
        description="A progress report at least this often while MD runs, between the report "
        "interval's steps when those are further apart: the sign of life the watcher counts "
        "a run's silence from.",
    )
    publish_attempts: Count = Field(
        default=5,
        description="Tries for a checkpoint or final progress event before giving up on it.",
    )
    flush_timeout_s: Seconds = Field(
        default=30.0,
        description="Longest wait for outstanding publishes at checkpoints and before exit.",
    )
    copy_to_shared_store: bool = Field(
        default=True,
        description="Copy each verified checkpoint (in the background) and a successful "
        "attempt's outputs to the store every cluster shares (NS_COPIES), so a retry on "
        "another cluster resumes from the copy; false keeps them on the job's folder only "
        "(one cluster, or a shared file system between clusters).",
    )
    copy_timeout_s: Seconds = Field(
        default=60.0,
        description="Longest wait, as the attempt ends, for the checkpoint copy in progress.",
    )
    usage_source: Literal["auto", "rusage", "cgroup"] = Field(
        default="auto",
        description=(
            "Where the usage report's peak memory comes from: the process (rusage), the "
            "container (cgroup v2 memory.peak), or auto (cgroup under Kubernetes)."
        ),
    )
    absurd_energy_per_atom_kj_mol: float = Field(
        default=1e5,
        gt=0,
        description="|potential| / atoms above this counts as an exploding simulation.",
    )
