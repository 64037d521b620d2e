"""Settings of the node agent (``python -m mdq.backends.local``), env prefix ``MDQ_LOCAL_``.

NATS, the namespace and the data folder come from ``mdq.settings.CommonSettings``.
"""

from __future__ import annotations

import os
import re
from typing import Annotated

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from mdq.backends.local.agent import NodeConfig
from mdq.settings import Seconds

_NODE_NAME = re.compile(r"^[A-Za-z0-9_-]+$")


class LocalAgentSettings(BaseSettings):
    """Which virtual nodes one agent serves, their capacity, and how it watches its pods."""

    model_config = SettingsConfigDict(env_prefix="MDQ_LOCAL_", extra="ignore")

    cluster: str = Field(
        default="",
        pattern=r"^([a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?)?$",
        description="The local cluster these nodes belong to (a multi-cluster deployment, "
        "MDQ_CLUSTERS_FILE); empty: the one unnamed cluster. Its pods and nodes buckets are "
        "its own.",
    )
    nodes: int = Field(default=2, ge=1, le=256, description="How many nodes (without node_names).")
    node_prefix: str = Field(
        default="local", description='Nodes are named "<prefix>-1" ... "<prefix>-<nodes>".'
    )
    node_names: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Explicit node names, comma-separated (e.g. one agent per node for fault "
        "tests); overrides nodes and node_prefix.",
    )
    cpu_per_node: float | None = Field(
        default=None, gt=0, description="CPU cores per node; default host cores / nodes, min 1."
    )
    memory_mb_per_node: int = Field(default=4096, ge=64, description="Memory per node, MiB.")
    heartbeat_s: Seconds = Field(
        default=2.0, description="Seconds between node heartbeats (with live usage)."
    )
    grace_s: float = Field(
        default=10.0, ge=0, description="Seconds between SIGTERM and SIGKILL when stopping a pod."
    )
    memory_poll_s: Seconds = Field(
        default=0.5, description="Seconds between memory-limit checks of each pod."
    )
    data_min_free_mb: int = Field(
        default=0,
        ge=0,
        description="Free space the data folder must keep for the nodes to take new pods "
        "(checked every heartbeat with a small write, fsync and delete, which a full, "
        "read-only, failing or unmounted data disk fails anyway).",
    )
    probe_stall_s: Seconds = Field(
        default=20.0,
        description="A probe of the data folder still running after this long means the disk "
        "is not answering (a hung network volume): the nodes take no new pods. Heartbeats never "
        "wait for the probe.",
    )
    start_error_hold_s: float = Field(
        default=30.0,
        ge=0,
        description="After a pod could not start, the nodes take no new pods for this long.",
    )

    runner_creds_dir: str = Field(
        default="",
        description="Where each pod's NATS credentials are written (0600) while it runs, on "
        "an authenticating server (the agent connects with MDQ_NATS_CREDS); empty: "
        "'runners/' beside the agent's own credentials file.",
    )
    runner_creds_wait_s: Seconds = Field(
        default=30.0,
        description="How long a pod's start waits for placement to answer with its runner's "
        "credentials (the agent holds no key to mint them) before the pod fails (StartError).",
    )

    runner_module: str = Field(
        default="services.runner",
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$",
        description="The module every pod runs with the agent's interpreter (python -m). Only "
        "the backend's own tests change it (mdq.testing.scripted_runner); a pod record never "
        "chooses what runs.",
    )

    @field_validator("node_names", mode="before")
    @classmethod
    def _split_names(cls, value: object) -> object:
        if isinstance(value, str):
            return [name.strip() for name in value.split(",") if name.strip()]
        return value

    @field_validator("node_names")
    @classmethod
    def _check_names(cls, names: list[str]) -> list[str]:
        for name in names:
            if not _NODE_NAME.match(name):
                raise ValueError(f"node name must match {_NODE_NAME.pattern}: {name!r}")
        if len(set(names)) != len(names):
            raise ValueError(f"node names repeat: {names}")
        return names

    @field_validator("node_prefix")
    @classmethod
    def _check_prefix(cls, prefix: str) -> str:
        if not _NODE_NAME.match(prefix):
            raise ValueError(f"node prefix must match {_NODE_NAME.pattern}: {prefix!r}")
        return prefix

    def names(self) -> list[str]:
        """The names of the nodes this agent serves."""
        if self.node_names:
            return list(self.node_names)
        return [f"{self.node_prefix}-{index}" for index in range(1, self.nodes + 1)]

    def node_configs(self, *, host_cores: int | None = None) -> list[NodeConfig]:
        """The nodes with their capacity."""
        names = self.names()
        cores = host_cores or os.cpu_count() or 1
        cpu = self.cpu_per_node or max(1.0, cores / len(names))
        return [
            NodeConfig(name=name, cpu_capacity=cpu, memory_capacity_mb=self.memory_mb_per_node)
            for name in names
        ]
