"""Settings of the console, env prefix ``MDQ_CONSOLE_`` (bus, database, data folder from
``mdq.settings.CommonSettings``)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from mdq.settings import Port, Seconds


class ConsoleSettings(BaseSettings):
    """Where the console listens."""

    model_config = SettingsConfigDict(
        env_prefix="MDQ_CONSOLE_", extra="ignore", populate_by_name=True
    )

    host: str = Field(
        default="127.0.0.1",
        description=(
            "Address the console listens on. It submits as the operator: keep it on loopback "
            "with an access token, or behind an authenticating proxy (docs/console.md)."
        ),
    )
    port: Port = Field(default=8089, description="Port; 0 picks a free one.")
    access_token_file: Path | None = Field(
        default=None,
        description=(
            "A file holding the console's access token (at least 32 characters): every page "
            "then asks for it once (the link `mdq up` prints, ?token=...) and keeps a session "
            "cookie. Unset: no gate (behind an authenticating proxy only)."
        ),
    )
    simulation_time_limit_s: Seconds = Field(
        default=120.0,
        le=3600,
        description=(
            "The simulation page's comparisons run in a process of their own, one at a time; "
            "one still running after this long is killed and the page says so."
        ),
    )
