"""Settings of the metrics service, env prefix ``MDQ_METRICS_`` (bus from CommonSettings)."""

from __future__ import annotations

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from mdq.settings import BackendSetting, Port, Seconds


class MetricsSettings(BaseSettings):
    """How often nodes are sampled and summarised, where /metrics is served, which backend to
    ask."""

    model_config = SettingsConfigDict(
        env_prefix="MDQ_METRICS_", extra="ignore", populate_by_name=True
    )

    interval_s: Seconds = Field(
        default=2.0, description="Seconds between node samples (and node_load events)."
    )
    summary_interval_s: Seconds = Field(
        default=60.0,
        description="Seconds of samples each node_summary event summarises (mean and peak "
        "load per node; the console's nodes page draws its last hour from them). The "
        "summaries stream keeps one a minute per node (MDQ_STORAGE_NODE_SUMMARIES_MINUTES): "
        "a shorter interval shows a shorter past there.",
    )
    http_port: Port = Field(
        default=9464,
        validation_alias=AliasChoices("MDQ_METRICS_HTTP_PORT", "MDQ_METRICS_PORT"),
        description="Port of /metrics; 0 picks a free one (logged).",
    )
    http_host: str = Field(default="0.0.0.0", description="Address /metrics listens on.")
    token_file: str = Field(
        default="",
        description="A file holding the token /metrics asks for (Authorization: Bearer "
        "<token>; 401 without it); empty: none (a deployment whose network lets only "
        "Prometheus reach the port). mdq up gives it the console's token: every account of "
        "the machine reaches its loopback.",
    )
    backend: BackendSetting = "local"
