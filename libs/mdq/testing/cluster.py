"""A simulated Kubernetes cluster on this machine: the API emulator plus one kubelet per node.

``SimulatedCluster`` starts ``KubeApiEmulator`` on a free port, a ``SimulatedKubelet`` per node
(each registers its Node and runs the pods bound to it as local processes) and writes a
kubeconfig pointing at the emulator, so that mdq's Kubernetes backend — in this process or in
the services of ``mdq up --backend kubernetes`` — runs real jobs through the Kubernetes path.
The emulator's node usage (metrics.k8s.io) is what the kubelets measure of their processes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Self

from mdq.testing.kube_api import KubeApiEmulator
from mdq.testing.kubelet import SimulatedKubelet
from mdq.testing.tasks import BackgroundFailed


class SimulatedCluster:
    """The emulator and its kubelets; an async context manager."""

    def __init__(
        self,
        *,
        work_dir: Path,
        nodes: Sequence[str] = ("node-1", "node-2"),
        cpu_per_node: float = 2.0,
        memory_mb_per_node: int = 4096,
        namespace: str = "mdq",
        heartbeat_s: float = 0.5,
        node_monitor_grace_s: float = 2.0,
        bookmark_interval_s: float = 1.0,
        history_limit: int = 5000,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.work_dir = work_dir
        self.namespace = namespace
        self._node_names = tuple(nodes)
        self._cpu, self._memory_mb = cpu_per_node, memory_mb_per_node
        self._heartbeat_s = heartbeat_s
        self._host, self._port = host, port
        self.api = KubeApiEmulator(
            history_limit=history_limit,
            bookmark_interval_s=bookmark_interval_s,
            node_monitor_grace_s=node_monitor_grace_s,
            node_usage=self._usage,
        )
        self.kubelets: dict[str, SimulatedKubelet] = {}
        self.kubeconfig = work_dir / "kubeconfig"

    def _usage(self) -> Mapping[str, tuple[float, float]]:
        return {name: k.usage() for name, k in self.kubelets.items() if k.alive}

    async def start(self) -> Self:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        url = await self.api.start(self._host, self._port)
        self.kubeconfig.write_text(
            json.dumps(self.api.kubeconfig(namespace=self.namespace), indent=2), encoding="utf-8"
        )
        for index, name in enumerate(self._node_names, start=1):
            kubelet = SimulatedKubelet(
                api_url=url,
                node=name,
                cpu=self._cpu,
                memory_mb=self._memory_mb,
                log_dir=self.work_dir / "pods",
                heartbeat_s=self._heartbeat_s,
                index=index,
            )
            await kubelet.start()
            self.kubelets[name] = kubelet
        return self

    async def stop(self) -> None:
        """Stop every kubelet and the emulator; then raise ``BackgroundFailed`` holding what
        any of them had failed with."""
        failed: list[Exception] = []
        for kubelet in self.kubelets.values():
            try:
                await kubelet.stop()
            except BackgroundFailed as error:
                failed.extend(error.exceptions)
        try:
            await self.api.stop()
        except BackgroundFailed as error:
            failed.extend(error.exceptions)
        if failed:
            raise BackgroundFailed("the simulated cluster's background tasks failed", failed)

    def check(self) -> None:
        """Raise ``BackgroundFailed`` if a kubelet's task or the emulator has failed so far."""
        for kubelet in self.kubelets.values():
            kubelet.check()
        self.api.check()

    async def fail_node(self, name: str) -> None:
        """The node crashes: its processes die, its kubelet goes silent, and the node
        lifecycle controller marks it NotReady after ``node_monitor_grace_s``."""
        await self.kubelets[name].crash()

    def node_of(self, pod_name: str) -> str:
        """The node a pod is bound to ("" when unbound or unknown)."""
        pod = self.api.pod(pod_name, self.namespace) or {}
        return str((pod.get("spec") or {}).get("nodeName", ""))

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(self, *_exc_info: object) -> None:
        await self.stop()
