"""Settings of the recovery service (env prefix MDQ_RECOVERY_)."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from mdq.core.recovery import RecoveryPolicy


class RecoverySettings(BaseSettings):
    """The recovery policy's tunables."""

    model_config = SettingsConfigDict(env_prefix="MDQ_RECOVERY_", extra="ignore")

    backoff_base_s: float = Field(default=5.0, description="First delay after a crash.")
    backoff_factor: float = Field(default=2.0, description="Growth of the delay per crash.")
    backoff_max_s: float = Field(default=300.0, description="Longest delay after a crash.")
    oom_memory_factor: float = Field(default=1.5, description="Memory growth after an OOM.")
    oom_memory_cap_mb: int = Field(default=65536, description="Most memory an OOM retry asks.")
    quarantine_after: int = Field(
        default=3, description="Identical failures in a row without progress: a crash loop."
    )
    fence_timeout_s: float = Field(
        default=60.0, description="Longest wait for a lost attempt's pod to be confirmed gone."
    )
    disruption_deadline_s: float = Field(
        default=0.0,
        ge=0.0,
        description=(
            "A job whose latest attempts all failed for reasons not its own (a full or failing "
            "data disk, a pod that could not start, eviction, a lost node or cluster), without "
            "progress, for longer than this fails for good. 0: never (such a job waits for the "
            "nodes to heal; its own retries are never spent on them)."
        ),
    )

    snapshot_interval_s: float = Field(
        default=60.0,
        description=(
            "How often, at most, recovery writes its state (the live jobs, with the jobs-stream "
            "sequence it reflects) to the KV bucket <namespace>_recovery_snapshot, and only when "
            "it changed; a start restores it and folds only the log after it. 0: no snapshot "
            "is written (every start replays the whole log)."
        ),
        ge=0.0,
    )

    def policy(self) -> RecoveryPolicy:
        return RecoveryPolicy(
            backoff_base_s=self.backoff_base_s,
            backoff_factor=self.backoff_factor,
            backoff_max_s=self.backoff_max_s,
            oom_memory_factor=self.oom_memory_factor,
            oom_memory_cap_mb=self.oom_memory_cap_mb,
            quarantine_after=self.quarantine_after,
            fence_timeout_s=self.fence_timeout_s,
            disruption_deadline_s=self.disruption_deadline_s,
        )
