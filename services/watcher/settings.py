"""Settings of the watcher service (env prefix MDQ_WATCHER_)."""

from __future__ import annotations

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from mdq.settings import BackendSetting, Count
from mdq.store.projection import BATCH_SIZE, BATCH_WAIT_S


class WatcherSettings(BaseSettings):
    """Batching of the projection and the lost-run rule."""

    model_config = SettingsConfigDict(env_prefix="MDQ_WATCHER_", extra="ignore")

    backend: BackendSetting = "local"
    batch_size: Count = Field(
        default=BATCH_SIZE, description="Most events applied in one transaction."
    )
    batch_wait_s: float = Field(
        default=BATCH_WAIT_S, ge=0, description="Longest wait to fill a batch."
    )
    lost_min_silence_s: float = Field(
        default=60.0, description="A running job is never lost sooner than this after progress."
    )
    lost_interval_factor: float = Field(
        default=5.0, description="... nor sooner than this many of its own progress intervals."
    )
    lost_first_report_s: float = Field(
        default=300.0,
        description="An attempt that has not reported yet (its inputs fetched, its system "
        "built and minimised, its speed measured) is never lost sooner than this after it "
        "started.",
    )
    pool_size: int = Field(default=4, description="PostgreSQL connections.")
    partition_months_ahead: int = Field(
        default=2,
        ge=1,
        le=24,
        description="Monthly partitions of progress and job_events made ahead of time.",
    )
    history_retention_days: int = Field(
        default=0,
        ge=0,
        description=(
            "Detach the months of progress and job_events that ended more than this many days "
            "ago (0: keep everything; at least 31 otherwise). Detached months stay in the "
            "database as plain tables for the owner to archive and drop."
        ),
    )

    progress_rollup_days: int = Field(
        default=0,
        ge=0,
        description=(
            "Roll the months of progress that ended more than this many days ago up into a "
            "summary per job and month (progress_rollups) plus every KEEP_EVERY-th report of "
            "each attempt (0, the default: keep every report; at least 31 otherwise). The full "
            "series stays in the NS_PROGRESS stream for as long as the log keeps it."
        ),
    )
    progress_rollup_keep_every: Count = Field(
        default=10,
        description="Of a rolled-up month, each attempt's first report and every N-th after it.",
    )

    @field_validator("history_retention_days", "progress_rollup_days")
    @classmethod
    def _whole_months(cls, days: int) -> int:
        if 0 < days < 31:
            raise ValueError("at least a month (31 days), or 0 for never")
        return days
