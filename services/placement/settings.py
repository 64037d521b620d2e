"""Settings of the placement service (env prefix MDQ_PLACEMENT_). The scoring tunables are the
pure core's ``PlacementConfig``: their defaults come from it, and ``placement_config`` hands every
one set here back to it."""

from __future__ import annotations

from dataclasses import fields

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from mdq.core.placement import PlacementConfig
from mdq.core.placement_state import ENDED_MEMORY
from mdq.settings import BackendSetting

CORE_DEFAULTS = PlacementConfig()
"""The core's defaults: the tunables' defaults here."""
TUNABLES = frozenset(field.name for field in fields(PlacementConfig))
"""The core's tunables; those of them this service's settings hold can be set from the
environment."""


class PlacementSettings(BaseSettings):
    """How placement scores nodes and starts runners."""

    model_config = SettingsConfigDict(env_prefix="MDQ_PLACEMENT_", extra="ignore")

    backend: BackendSetting = "local"
    runner_nats_url: str = Field(
        default="",
        description="NATS URL as seen from inside a Kubernetes pod; default: NATS_URL (the "
        "local backend's runners use their node agent's).",
    )
    reconcile_interval_s: float = Field(
        default=1.0, description="Reconcile at least this often, even with no new events."
    )
    overload_threshold: float = Field(
        default=CORE_DEFAULTS.overload_threshold,
        description="Live load above which a node lowers a job's priority there.",
    )
    overload_penalty: float = Field(
        default=CORE_DEFAULTS.overload_penalty, description="Score points that costs."
    )
    load_timeout_s: float = Field(
        default=CORE_DEFAULTS.load_timeout_s,
        description="Nodes whose load went silent this long are not chosen.",
    )
    fail_on_dependency_failure: bool = Field(
        default=True,
        description="A job fails when a job it depends on fails for good; if false, it is "
        "released once every dependency ended (succeeded or failed).",
    )
    target_load: float = Field(
        default=CORE_DEFAULTS.target_load,
        ge=0.0,
        le=1.0,
        description="TargetLoadPacking target utilisation; 0 spreads (least loaded first).",
    )
    hard_load_threshold: float = Field(
        default=CORE_DEFAULTS.hard_load_threshold,
        description="Live load (with in-flight bindings) above which a node is out.",
    )
    balance_weight: float = Field(
        default=CORE_DEFAULTS.balance_weight,
        description="Score points lost per unit of CPU/memory imbalance.",
    )
    aging_per_minute: float = Field(
        default=CORE_DEFAULTS.aging_per_minute,
        description="Priority points a pending job gains per minute of waiting.",
    )
    cluster_preference_weight: float = Field(
        default=CORE_DEFAULTS.cluster_preference_weight,
        ge=0.0,
        description="Score points for a node whose cluster has every label the job's "
        "clusters.prefer names (pro rata).",
    )
    locality_weight: float = Field(
        default=CORE_DEFAULTS.locality_weight,
        ge=0.0,
        description="Score points for a node on the cluster holding all of a chain job's "
        "dependencies' outputs (pro rata).",
    )
    cluster_load_weight: float = Field(
        default=CORE_DEFAULTS.cluster_load_weight,
        ge=0.0,
        description="With several clusters: score points a node loses per unit of its "
        "cluster's reserved CPU share.",
    )
    load_settle_s: float = Field(
        default=10.0,
        description="A binding counts on top of a node's live load until a load report this "
        "long after it (the herd guard).",
    )
    full_scan_nodes: int = Field(
        default=CORE_DEFAULTS.full_scan_nodes,
        description="Up to this many eligible nodes, every node is scored per job.",
    )
    sample_size: int = Field(
        default=CORE_DEFAULTS.sample_size,
        description="Larger clusters: fitting best-ranked nodes scored per job.",
    )
    leader_election: bool = Field(
        default=True, description="Only the holder of the KV leader lease places jobs."
    )
    lease_ttl_s: float = Field(
        default=6.0, description="The lease expires this long after its holder last renewed it."
    )
    fair_share: bool = Field(
        default=True,
        description="When more work waits than fits, bind the next job of the tenant with the "
        "smallest weighted dominant share (each tenant's weight is its policy's, "
        "docs/placement.md); off: queue order (priority class and age) across all tenants.",
    )
    fair_share_reclaim: bool = Field(
        default=True,
        description="With fair_share: a tenant below its fair share whose job fits nowhere "
        "gets room back from tenants above theirs by checkpoint-first preemption.",
    )
    fair_share_min_run_s: float = Field(
        default=120.0,
        ge=0,
        description="Work younger than this is never stopped to give a tenant its share.",
    )
    preemption: bool = Field(
        default=True,
        description="A job that fits nowhere may preempt running work of a lower priority class.",
    )
    preemption_timeout_s: float = Field(
        default=120.0,
        description="How long a preemptor's room stays held for it on the node it preempted.",
    )
    bind_concurrency: int = Field(
        default=512, description="Bindings (publish + pod creation) in flight at once."
    )
    explain_waiting_interval_s: float = Field(
        default=5.0,
        description="At most this often, write why the first waiting jobs fit nowhere (each "
        "node's filter or score) to the KV bucket <namespace>_waiting for `mdq explain`; 0 "
        "turns it off.",
    )
    tenant_usage_interval_s: float = Field(
        default=1.0,
        description="At most this often, write each tenant's usage (queued jobs, running CPU) "
        "to the KV bucket <namespace>_waiting under tenant.<name>, where it changed (intake "
        "checks the queued-jobs quota against it); 0 turns it off.",
    )
    node_failures_to_cordon: int = Field(
        default=3,
        description="Distinct jobs crashing on one node within the window that make it suspect "
        "(cordoned for a while, within max_cordoned_fraction); node lost, silence, evictions, "
        "OOM and the jobs' own errors do not count; 0 disables.",
    )
    node_failure_window_s: float = Field(
        default=600.0, description="The window in which those failures count."
    )
    node_cordon_s: float = Field(
        default=300.0, description="How long such a cordon lasts after its last failure."
    )
    max_cordoned_fraction: float = Field(
        default=1 / 3,
        ge=0.0,
        le=1.0,
        description="Failure cordons never take the cordoned share of ready nodes' CPU capacity "
        "(operator cordons included) above this; worst suspects first. Exception: one node of at "
        "most half the capacity when no other is cordoned. Never the last schedulable node.",
    )
    snapshot_interval_s: float = Field(
        default=60.0,
        ge=0.0,
        description="The leader writes a snapshot of placement's state (with the jobs stream's "
        "sequence it reflects) to the KV bucket <namespace>_placement_snapshot at most this "
        "often, when the state changed; a restart restores it and replays only the log after "
        "it (docs/placement.md). 0: none is written (a restart replays the whole log).",
    )
    ended_memory: int = Field(
        default=ENDED_MEMORY,
        ge=0,
        description="How many ended jobs' final states placement keeps in memory (and in its "
        "snapshot), the newest: a chain asks whether its dependency succeeded. A job that "
        "depends on an older one has it read from the jobs log (its succeeded or failed "
        "event), so memory does not grow with the history (docs/placement.md).",
    )

    def placement_config(self) -> PlacementConfig:
        """The core's tunables as these settings set them (its own default for any tunable they
        do not hold)."""
        held = TUNABLES & set(type(self).model_fields)
        return PlacementConfig(**{name: getattr(self, name) for name in held})
