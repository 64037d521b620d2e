"""Typed settings shared by every service, read from the environment.

``NATS_URL`` and ``DATABASE_URL`` are honoured as they are commonly spelled; everything else
is ``MDQ_*``. Each service adds its own group with its own prefix (``MDQ_PLACEMENT_*`` ...).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from mdq.bus.subjects import Subjects


class CommonSettings(BaseSettings):
    """Where the bus and the database are, and which namespace this deployment uses."""

    model_config = SettingsConfigDict(env_prefix="MDQ_", extra="ignore", populate_by_name=True)

    nats_url: str = Field(
        default="nats://127.0.0.1:4222",
        validation_alias=AliasChoices("NATS_URL", "MDQ_NATS_URL"),
        description="NATS server with JetStream.",
    )
    database_url: str = Field(
        default="",
        validation_alias=AliasChoices("DATABASE_URL", "MDQ_DATABASE_URL"),
        description="PostgreSQL URL (postgresql://...); only the watcher writes to it.",
    )
    namespace: str = Field(
        default="mdq",
        description="Prefix of every subject, stream and bucket; lets several mdq share a NATS.",
    )
    stream_replicas: int = Field(
        default=1,
        ge=1,
        le=5,
        description=(
            "Copies JetStream keeps of every mdq stream and KV bucket: 1 on a single NATS "
            "server, 3 on a three-node cluster (the production overlay), so that losing one "
            "server loses no acknowledged event. Raised on existing streams, never lowered."
        ),
    )
    data_dir: Path = Field(
        default=Path(".mdq/data"),
        description="Root of job outputs and checkpoints (a shared volume on Kubernetes).",
    )
    runner_creds_ttl_s: float = Field(
        default=3600.0,
        ge=2.0,
        validation_alias=AliasChoices("MDQ_NATS_RUNNER_CREDS_TTL_S"),
        description=(
            "Lifetime of each runner's NATS credentials; a runner renews them at half-life "
            "while its attempt runs, so an ended pod's (or a copied) file stops working within "
            "this long. On Kubernetes it must exceed the longest time a pod waits to start "
            "(image pull): the Secret is minted when the pod is made."
        ),
    )

    @property
    def subjects(self) -> Subjects:
        return Subjects(self.namespace)
