"""How much JetStream keeps, and for how long: the size and age limit of every stream and bucket.

Every limit comes from one settings group (``StorageSettings``, ``MDQ_STORAGE_*``), read by
whoever creates or updates a stream or a bucket; ``server_bytes`` is the file store a server
that holds mdq needs. Which stream drops what when full, and why: docs/durability.md,
"Bounded storage".
"""

from __future__ import annotations

import math
from typing import Annotated, ClassVar

from pydantic import ByteSize, Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from mdq.settings import Count, Seconds

DAY_S = 24 * 3600.0
MIN_JOBS_DAYS = 30.0
"""The jobs log keeps at least a month: no job lives longer than its own log."""
NODE_SUMMARIES_SPARE = 5
"""Summaries of one node kept beyond one a minute over the age limit."""
MiB = 1024 * 1024
GiB = 1024 * MiB

SizeLimit = Annotated[ByteSize, Field(gt=0)]
"""A stream's or a bucket's size limit: bytes, or a size with its unit; never 0."""
Days = Annotated[float, Field(gt=0)]
"""How long a stream keeps a message, in days (fractions allowed); never 0."""


class StorageSettings(BaseSettings):
    """Size and age limits of the namespace's streams and buckets (``MDQ_STORAGE_*``).

    Sizes take units (``8GiB``, ``512MiB``, or bytes); ages are in days (fractions allowed)."""

    model_config = SettingsConfigDict(env_prefix="MDQ_STORAGE_", extra="ignore")

    submit_bytes: SizeLimit = Field(
        default=ByteSize(1 * GiB),
        description="Submit stream (fire-and-forget submits as they arrived): size limit; "
        "when full, a new submit is refused to its publisher.",
    )
    submit_days: Days = Field(
        default=7.0, description="Submit stream: how long a submit is kept (for replay)."
    )
    jobs_bytes: SizeLimit = Field(
        default=ByteSize(8 * GiB),
        description="Jobs stream (every job's lifecycle, the log of record): size limit.",
    )
    jobs_days: float = Field(
        default=365.0,
        ge=MIN_JOBS_DAYS,
        description="Jobs stream: how long an event is kept; longer than any job lives.",
    )
    jobs_high_water: float = Field(
        default=0.9,
        gt=0,
        lt=1,
        description="Share of the jobs stream's size limit above which intake refuses new "
        "submits, keeping the rest for the lifecycle events of jobs already accepted.",
    )
    progress_bytes: SizeLimit = Field(
        default=ByteSize(8 * GiB), description="Progress stream: size limit (oldest go)."
    )
    progress_days: Days = Field(
        default=90.0, description="Progress stream: how long a report is kept."
    )
    nodes_bytes: SizeLimit = Field(
        default=ByteSize(64 * MiB),
        description="Node load stream (the last report of each node): size limit.",
    )
    nodes_days: Days = Field(
        default=1.0, description="Node load stream: how long a node's last report lasts."
    )
    node_summaries_bytes: SizeLimit = Field(
        default=ByteSize(128 * MiB),
        description="Node load summaries stream (each node's load a minute at a time, the "
        "console's last hour): size limit (oldest go).",
    )
    node_summaries_minutes: float = Field(
        default=75.0,
        ge=61.0,
        description="Node load summaries stream: how long a summary is kept; more than the "
        "hour the console shows, so the hour's first minute is still there. Each node keeps "
        "at most one summary per minute of it (node_summaries_per_node).",
    )
    copies_bytes: SizeLimit = Field(
        default=ByteSize(2 * GiB),
        description="Copies stream (each job's latest two checkpoints per attempt and its "
        "outputs, in the store every cluster shares): size limit; the oldest copies go first.",
    )
    copies_days: Days = Field(
        default=14.0,
        description="Copies stream: how long a copy is kept. A running job copies each new "
        "checkpoint, so only ended jobs' copies (their outputs) age out.",
    )
    tenant_bytes: SizeLimit = Field(
        default=ByteSize(512 * MiB),
        description="Each tenant's own stream (a copy of its events): size limit (oldest go).",
    )
    tenant_days: Days = Field(
        default=30.0, description="Each tenant's stream: how long an event is kept."
    )
    tenant_submit_bytes: SizeLimit = Field(
        default=ByteSize(64 * MiB),
        description="Each tenant's submit stream (its fire-and-forget submits, deduplicated "
        "among its own): size limit; full, it refuses that tenant's publishes alone.",
    )
    tenant_submit_msgs: Count = Field(
        default=1000,
        description="Each tenant's submit stream (a work queue: a submit intake has handled "
        "leaves it): the most submits it holds waiting for intake; past it the server refuses "
        "that tenant's publishes before writing anything. 1,000 is a campaign's burst: the "
        "default max_queued_jobs, and about 17 minutes of submits at the default rate (60 a "
        "minute), which intake reads them at; a tenant whose rate is raised may need more.",
    )
    tenant_consumers: Count = Field(
        default=16,
        description="Each tenant's stream: the most consumers a tenant may keep on it at once "
        "(its clients' ordered and pull consumers; the server refuses more).",
    )
    tenant_consumer_idle_s: Seconds = Field(
        default=600.0,
        description="Each tenant's stream: a consumer no client used for this long is deleted "
        "by the server, durable or not (so a tenant cannot keep one for ever).",
    )
    inputs_bytes: SizeLimit = Field(
        default=ByteSize(1 * GiB),
        description="The operator's inputs bucket (the input files of its jobs, an object "
        "store, mdq.bus.inputs): size limit; when full, an upload is refused.",
    )
    tenant_inputs_bytes: SizeLimit = Field(
        default=ByteSize(256 * MiB),
        description="Each tenant's inputs bucket (made by mdq tenant add): size limit, the "
        "tenant's quota of input files; when full, the tenant's upload is refused.",
    )
    registry_bytes: SizeLimit = Field(
        default=ByteSize(512 * MiB),
        description="Job control's answers (one record per control request key): size limit.",
    )
    registry_days: Days = Field(
        default=30.0,
        description="Intake's duplicate window: a submit's key is remembered this long (the "
        "same key and content get the same reply); after it, the key is refused as used "
        "while the jobs log still holds its jobs. Shorter than jobs_days.",
    )
    bucket_bytes: SizeLimit = Field(
        default=ByteSize(256 * MiB),
        description="Every other bucket (placement's queue view, the snapshots, the leader "
        "lease, the tenants' policies, the local backend's tables): size limit of each.",
    )
    expected_tenants: int = Field(
        default=8,
        ge=0,
        description="Tenants whose streams server_bytes() makes room for (the embedded server).",
    )

    @model_validator(mode="after")
    def _registry_inside_the_log(self) -> StorageSettings:
        if self.registry_days >= self.jobs_days:
            raise ValueError(
                f"MDQ_STORAGE_REGISTRY_DAYS ({self.registry_days:g}) must be shorter than "
                f"MDQ_STORAGE_JOBS_DAYS ({self.jobs_days:g}): a key reused after the duplicate "
                "window is refused only while the jobs log still holds its jobs"
            )
        return self

    BUCKETS_PER_NAMESPACE: ClassVar[int] = 8
    """Buckets of one namespace sized ``bucket_bytes``: waiting, two snapshots, lease,
    tenants, the local backend's pods and nodes, and one to spare."""

    def node_summaries_per_node(self) -> int:
        """The most summaries the stream keeps of one node: one a minute over its age limit,
        and a few more (a node summarised twice in a minute by two metrics replicas whose
        clocks differ): a summary interval shorter than a minute shows a shorter past, and
        no node can push the others' summaries out."""
        return math.ceil(self.node_summaries_minutes) + NODE_SUMMARIES_SPARE

    def streams_bytes(self) -> int:
        """The shared streams' size limits together."""
        return int(
            self.submit_bytes
            + self.jobs_bytes
            + self.progress_bytes
            + self.nodes_bytes
            + self.node_summaries_bytes
            + self.copies_bytes
        )

    def _per_tenant_bytes(self) -> int:
        """One tenant's streams (events, submits) and inputs bucket."""
        return (
            int(self.tenant_bytes) + int(self.tenant_submit_bytes) + int(self.tenant_inputs_bytes)
        )

    def server_bytes(self) -> int:
        """File store one namespace's streams and buckets reserve on a server, with room for
        ``expected_tenants`` tenants' streams (events and submits) and inputs buckets: the least
        ``max_file_store`` a server that holds this namespace needs."""
        return (
            self.streams_bytes()
            + int(self.registry_bytes)
            + self.BUCKETS_PER_NAMESPACE * int(self.bucket_bytes)
            + int(self.inputs_bytes)
            + self.expected_tenants * self._per_tenant_bytes()
        )
