"""Typed settings shared by every service, read from the environment.

``NATS_URL`` and ``DATABASE_URL`` are honoured as they are commonly spelled; everything else
is ``MDQ_*``. Each service adds its own group with its own prefix (``MDQ_PLACEMENT_*`` ...).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from mdq.core.tenants import RunawayLimits

BackendSetting = Annotated[str, Field(description="Cluster backend: local or kubernetes.")]
"""The ``backend`` setting of the services that drive or sample the cluster (placement, the
watcher, metrics): the kind of backend ``mdq.backends.factory.make_backend`` makes."""
Seconds = Annotated[float, Field(gt=0)]
"""A duration, an interval or a timeout of a setting, in seconds (fractions allowed); never 0."""
Count = Annotated[int, Field(ge=1)]
"""How many of something a setting allows or asks for (tries, steps, events, consumers); at
least 1."""
Port = Annotated[int, Field(ge=0, le=65535)]
"""A TCP port a service listens on; 0 picks a free one."""


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
    health_file: Path | None = Field(
        default=None,
        description=(
            "A file the service renews every few seconds while its loop runs (``mdq.health``); "
            "a liveness probe runs ``python -m mdq.health FILE`` against it. Unset: none."
        ),
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


class LimitSettings(BaseSettings):
    """The operator's default runaway limits of a job (``MDQ_LIMITS_*``, docs/control.md): what
    a tenant whose policy sets none is held to, and the operator's own jobs. 0: no limit."""

    model_config = SettingsConfigDict(env_prefix="MDQ_LIMITS_", extra="ignore")

    max_steps_per_job: int = Field(
        default=1_000_000_000,
        ge=0,
        description="A job's step target at most, at submit and after an extend (a typo of "
        "10^10 steps is refused naming the field).",
    )
    max_wall_s: float = Field(
        default=7 * 86_400.0,
        ge=0,
        description="Seconds a job may run (its attempts together), and the max_wall_s of a "
        "job that states none; a job running longer stops at a checkpoint and fails "
        "(FAILURE_LIMIT_EXCEEDED), never retried.",
    )
    max_disk_mb: int = Field(
        default=100 * 1024,
        ge=0,
        description="MiB a job's folder may hold (trajectory, checkpoints, outputs), and the "
        "max_disk_mb of a job that states none; a job writing more stops at a checkpoint and "
        "fails (FAILURE_LIMIT_EXCEEDED), never retried.",
    )

    def defaults(self) -> RunawayLimits:
        """These limits as ``RunawayLimits`` (0 is none)."""
        return RunawayLimits(
            max_steps=self.max_steps_per_job or None,
            max_wall_s=self.max_wall_s or None,
            max_disk_mb=self.max_disk_mb or None,
        )
