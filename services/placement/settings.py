"""Settings of the placement service (env prefix MDQ_PLACEMENT_)."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class PlacementSettings(BaseSettings):
    """How placement scores nodes and starts runners."""

    model_config = SettingsConfigDict(env_prefix="MDQ_PLACEMENT_", extra="ignore")

    backend: str = Field(default="local", description="Cluster backend: local or kubernetes.")
    runner_command: tuple[str, ...] = Field(
        default=("python", "-m", "services.runner"),
        description="Argv of the runner in each pod (JSON list in the environment).",
    )
    runner_nats_url: str = Field(
        default="", description="NATS URL as seen from inside a pod; default: NATS_URL."
    )
    reconcile_interval_s: float = Field(
        default=1.0, description="Reconcile at least this often, even with no new events."
    )
    overload_threshold: float = Field(
        default=0.8, description="Live load above which a node lowers a job's priority there."
    )
    overload_penalty: float = Field(default=50.0, description="Score points that costs.")
    load_timeout_s: float = Field(
        default=15.0, description="Nodes whose load went silent this long are not chosen."
    )
    fail_on_dependency_failure: bool = Field(
        default=True, description="A job fails when a job it depends on fails for good."
    )
