"""A simulated kubelet: runs the pods bound to its node as local processes, over the real API.

It registers and heartbeats its Node, watches its pods, runs each container as a process
standing in for the runner image (secret volumes mounted as folders), reports the pods' status,
and fails on demand (``crash``, ``evict``, ``sandbox_broken``).

How it behaves: docs/testing.md, "The simulated kubelet".
"""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import shutil
import signal
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio.client.exceptions import ApiException

from mdq.backends.kubernetes.backend import WatchStats, call_json, list_and_watch
from mdq.backends.kubernetes.objects import parse_quantity
from mdq.backends.kubernetes.settings import KubernetesSettings
from mdq.backends.launch import RUNNER_MODULE, inherited_environment, module_argv
from mdq.backends.local.processes import (
    ProcessTree,
    die_with_parent,
    exit_code_of,
    signal_group,
)
from mdq.testing.kube_api import now_rfc3339
from mdq.testing.tasks import Background

log = logging.getLogger(__name__)

Json = dict[str, Any]
Key = tuple[str, str]
POD_IP_BASE = "10.244"
IMAGE_MODULES = frozenset({RUNNER_MODULE, "mdq.testing.scripted_runner"})
"""The programs of the simulated runner image (the scripted one for the backend's tests)."""


def image_argv(command: list[str]) -> list[str]:
    """The argv of a container command in the simulated image; ValueError if the image has
    no such program."""
    if len(command) == 3 and command[:2] == ["python", "-m"] and command[2] in IMAGE_MODULES:
        return module_argv(command[2])
    raise ValueError(f"the runner image has no program {command!r}")


def runner_statuses(
    state: Json, *, ready: bool, image_id: str, container_id: str = ""
) -> list[Json]:
    """A pod's ``containerStatuses``: its one container, the simulated runner, in ``state``
    (``waiting``, ``running`` or ``terminated``), started and ready alike (it has no probes);
    ``image_id`` is "" until its image is there, ``container_id`` "" until it runs."""
    status: Json = {
        "name": "runner",
        "ready": ready,
        "started": ready,
        "restartCount": 0,
        "image": "simulated",
        "imageID": image_id,
    }
    if container_id:
        status["containerID"] = container_id
    status["state"] = state
    return [status]


@dataclass(slots=True)
class Container:
    """A pod's process, supervised by the kubelet."""

    key: Key
    uid: str
    process: asyncio.subprocess.Process
    tree: ProcessTree
    memory_limit_bytes: int
    started_at: str
    oom_rss_bytes: int = 0
    stopping: bool = False
    evicted_message: str = ""
    killer: asyncio.Task[None] | None = None
    supervisor: asyncio.Task[None] | None = None


class SimulatedKubelet:
    """One node's kubelet; ``start`` registers the node and runs its pods."""

    def __init__(
        self,
        *,
        api_url: str,
        node: str,
        cpu: float,
        memory_mb: int,
        log_dir: Path,
        heartbeat_s: float = 0.5,
        memory_poll_s: float = 0.25,
        labels: dict[str, str] | None = None,
        index: int = 1,
        volumes_dir: Path | None = None,
        volume_poll_s: float = 0.2,
    ) -> None:
        self.node = node
        self._api_url = api_url
        self._cpu = cpu
        self._memory_mb = memory_mb
        self._log_dir = log_dir
        self._heartbeat_s = heartbeat_s
        self._memory_poll_s = memory_poll_s
        self._labels = labels or {}
        self._index = index
        self._volumes_dir = volumes_dir or log_dir.parent / "volumes" / node
        self._volume_poll_s = volume_poll_s
        self.waiting: dict[Key, asyncio.Task[None]] = {}
        """Pods whose volumes are not ready yet (a Secret missing): ContainerCreating."""
        self.mount_tries: Counter[Key] = Counter()
        """How many times each pod's volumes were looked for (for tests: a positive marker
        that a pod waited through that many tries)."""
        self._settings = KubernetesSettings(watch_timeout_s=60, retry_backoff_s=0.2)
        self._api: k8s.ApiClient | None = None
        self._core: k8s.CoreV1Api | None = None
        self._background = Background(f"kubelet {node}")
        """Every task of this kubelet (heartbeat, pod watch, volume waits, supervisors,
        killers): a failure of any is raised by ``check``, ``stop`` and ``crash``."""
        self.running: dict[Key, Container] = {}
        self._handled: set[str] = set()
        """uids of pods this kubelet started (never twice)."""
        self.watch_stats = WatchStats()
        self.alive = False
        self.sandbox_broken = False
        """While True, new pods never get a sandbox (see the module docstring)."""

    @property
    def core(self) -> k8s.CoreV1Api:
        if self._core is None:
            raise RuntimeError("the kubelet is not started")
        return self._core

    # -- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        configuration = k8s.Configuration(host=self._api_url)
        self._api = k8s.ApiClient(configuration=configuration)
        self._api.user_agent = f"mdq-simulated-kubelet/{self.node}"
        self._core = k8s.CoreV1Api(self._api)
        self._log_dir.mkdir(parents=True, exist_ok=True)
        await self._register()
        self.alive = True
        self._background.spawn(self._heartbeat(), name="heartbeat")
        self._background.spawn(
            list_and_watch(
                call=self.core.list_pod_for_all_namespaces,
                field_selector=f"spec.nodeName={self.node}",
                on_list=self._on_list,
                on_event=self._on_event,
                settings=self._settings,
                stats=self.watch_stats,
                what=f"kubelet {self.node} pod",
            ),
            name="pod watch",
        )

    def check(self) -> None:
        """Raise ``BackgroundFailed`` if any task of this kubelet has raised so far."""
        self._background.check()

    async def stop(self) -> None:
        """Stop the kubelet and kill its pods (the test is over)."""
        await self.crash()

    async def crash(self) -> None:
        """The node dies: every process is killed and nothing more is reported. Raises
        ``BackgroundFailed`` when a task of the kubelet had failed before."""
        self.alive = False
        containers = list(self.running.values())
        try:
            await self._background.close()  # every task cancelled and awaited
        finally:
            self.waiting.clear()
            for container in containers:
                signal_group(container.process.pid, signal.SIGKILL)
            for container in containers:
                await container.process.wait()
            self.running.clear()
            if self._api is not None:
                await self._api.close()
                self._api, self._core = None, None

    # -- the node --------------------------------------------------------------------------
    def _ready_condition(self, *, transition: bool) -> Json:
        stamp = now_rfc3339()
        condition = {
            "type": "Ready",
            "status": "True",
            "reason": "KubeletReady",
            "message": "kubelet is posting ready status",
            "lastHeartbeatTime": stamp,
        }
        if transition:
            condition["lastTransitionTime"] = stamp
        return condition

    async def _register(self) -> None:
        resources = {"cpu": f"{self._cpu:g}", "memory": f"{self._memory_mb}Mi", "pods": "110"}
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": self.node,
                "labels": {"kubernetes.io/hostname": self.node, **self._labels},
            },
            "spec": {},
            "status": {
                "capacity": resources,
                "allocatable": resources,
                "conditions": [self._ready_condition(transition=True)],
                "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
                "nodeInfo": {"kubeletVersion": "v1.31.0-mdq-simulated"},
            },
        }
        try:
            await call_json(self.core.create_node, node)
        except ApiException as error:
            if error.status != 409:
                raise
            await self._beat()

    async def _beat(self) -> None:
        current = await call_json(self.core.read_node, self.node)
        conditions = (current.get("status") or {}).get("conditions") or []
        ready: Json = next((c for c in conditions if c.get("type") == "Ready"), {})
        patch = {"status": {"conditions": [
            self._ready_condition(transition=ready.get("status") != "True")
        ]}}  # fmt: skip
        await call_json(self.core.patch_node_status, self.node, patch)

    async def _heartbeat(self) -> None:
        while True:
            await asyncio.sleep(self._heartbeat_s)
            try:
                await self._beat()
            except Exception:
                log.warning("kubelet %s: heartbeat failed", self.node, exc_info=True)

    def usage(self) -> tuple[float, float]:
        """(CPU cores, memory bytes) in use by this node's pods now."""
        trees = [container.tree for container in self.running.values()]
        return (
            sum(tree.cpu_percent() for tree in trees) / 100.0,
            float(sum(tree.rss_bytes() for tree in trees)),
        )

    # -- pods ------------------------------------------------------------------------------
    async def _on_list(self, pods: list[Json]) -> None:
        listed = {(p["metadata"].get("namespace", ""), p["metadata"]["name"]) for p in pods}
        for key, container in list(self.running.items()):
            if key not in listed:
                self._stop(container, grace_s=0)
        for key in [key for key in self.waiting if key not in listed]:
            self._stop_waiting(key)
        for pod in pods:
            await self._reconcile("MODIFIED", pod)

    async def _on_event(self, kind: str, pod: Json) -> None:
        await self._reconcile(kind, pod)

    async def _reconcile(self, kind: str, pod: Json) -> None:
        metadata = pod.get("metadata") or {}
        key = (str(metadata.get("namespace", "")), str(metadata.get("name", "")))
        uid = str(metadata.get("uid", ""))
        container = self.running.get(key)
        if kind == "DELETED":
            self._stop_waiting(key)
            shutil.rmtree(self._pod_volumes(key), ignore_errors=True)
            if container is not None:
                self._stop(container, grace_s=0)
            return
        if metadata.get("deletionTimestamp"):
            if container is not None:
                self._stop(container, grace_s=int(metadata.get("deletionGracePeriodSeconds") or 0))
            elif (
                uid not in self._handled
                or self._stop_waiting(key)
                or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")
            ):
                await self._remove(key)
            return
        phase = (pod.get("status") or {}).get("phase", "Pending")
        if container is None and phase == "Pending" and uid not in self._handled:
            self._handled.add(uid)
            if self.sandbox_broken:
                await self._write_status(key, self._no_sandbox_status)
                return
            try:
                mounts = await self._mount_volumes(key, pod)
            except ApiException:
                mounts = None  # the API answered badly: wait and try again, as below
            if mounts is None:
                self.waiting[key] = self._background.spawn(
                    self._wait_for_volumes(key, uid, pod), name=f"volumes of {key[1]}"
                )
                return
            await self._start(key, uid, pod, mounts)

    # -- volumes ---------------------------------------------------------------------------
    def _pod_volumes(self, key: Key) -> Path:
        return self._volumes_dir / f"{key[0]}_{key[1]}"

    def _stop_waiting(self, key: Key) -> bool:
        """Give up a pod that waits for its volumes; whether one did."""
        waiter = self.waiting.pop(key, None)
        if waiter is not None:
            waiter.cancel()
        return waiter is not None

    async def _mount_volumes(self, key: Key, pod: Json) -> dict[str, Path] | None:
        """Write the pod's ``secret`` volumes into its folder: mountPath -> folder of each
        volume its container mounts, or None while a Secret it needs does not exist."""
        spec = pod.get("spec") or {}
        container_spec = (spec.get("containers") or [{}])[0]
        mount_paths = {m["name"]: m["mountPath"] for m in container_spec.get("volumeMounts") or []}
        files: dict[str, dict[str, tuple[bytes, int]]] = {}
        for volume in spec.get("volumes") or []:
            source = volume.get("secret")
            if source is None:
                continue
            try:
                secret = await call_json(
                    self.core.read_namespaced_secret, source.get("secretName", ""), key[0]
                )
            except ApiException as error:
                if error.status != 404:
                    raise
                if source.get("optional"):
                    files[volume["name"]] = {}
                    continue
                return None
            data = {k: base64.b64decode(v) for k, v in (secret.get("data") or {}).items()}
            default_mode = int(source.get("defaultMode", 0o644))
            items = source.get("items") or [{"key": k, "path": k} for k in sorted(data)]
            if any(item["key"] not in data for item in items) and not source.get("optional"):
                return None  # as a kubelet: a missing key fails the mount, and it retries
            files[volume["name"]] = {
                item["path"]: (data[item["key"]], int(item.get("mode", default_mode)))
                for item in items
                if item["key"] in data
            }
        mounts: dict[str, Path] = {}
        for name, contents in files.items():
            folder = self._pod_volumes(key) / name
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            for path, (content, mode) in contents.items():
                target = folder / path
                partial = target.with_name(target.name + ".partial")
                descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                with os.fdopen(descriptor, "wb") as handle:
                    handle.write(content)
                os.chmod(partial, mode)
                os.replace(partial, target)
            if name in mount_paths:
                mounts[mount_paths[name]] = folder
        return mounts

    async def _wait_for_volumes(self, key: Key, uid: str, pod: Json) -> None:
        """ContainerCreating until every Secret the pod mounts exists; then start it."""
        await self._write_status(key, self._creating_status)
        while True:
            await asyncio.sleep(self._volume_poll_s)
            try:
                mounts = await self._mount_volumes(key, pod)
                self.mount_tries[key] += 1
            except ApiException:
                log.warning("kubelet %s: mounting %s/%s failed", self.node, *key, exc_info=True)
                continue
            if mounts is not None:
                break
        self.waiting.pop(key, None)
        await self._start(key, uid, pod, mounts)

    def _creating_status(self, status: Json) -> Json:
        status.update(
            phase="Pending",
            hostIP="127.0.0.1",
            conditions=self._conditions(status, ready=False),
            containerStatuses=runner_statuses(
                {"waiting": {"reason": "ContainerCreating"}}, ready=False, image_id=""
            ),
        )
        return status

    def _no_sandbox_status(self, status: Json) -> Json:
        status = self._creating_status(status)
        no_sandbox = {
            "type": "PodReadyToStartContainers",
            "status": "False",
            "lastTransitionTime": now_rfc3339(),
        }
        status["conditions"] = [*status["conditions"], no_sandbox]
        return status

    @staticmethod
    def _mapped(value: str, mounts: dict[str, Path]) -> str:
        """``value`` with a path under a mount path rewritten to the host folder behind it."""
        for mount_path in sorted(mounts, key=len, reverse=True):
            if value == mount_path or value.startswith(mount_path.rstrip("/") + "/"):
                return str(mounts[mount_path]) + value[len(mount_path.rstrip("/")) :]
        return value

    # -- containers ------------------------------------------------------------------------
    async def _start(self, key: Key, uid: str, pod: Json, mounts: dict[str, Path]) -> None:
        spec = pod.get("spec") or {}
        container_spec = (spec.get("containers") or [{}])[0]
        try:
            argv = image_argv([*container_spec.get("command", []), *container_spec.get("args", [])])
            own = self._environment(pod, container_spec)
            own = {name: self._mapped(value, mounts) for name, value in own.items()}
            env = {**inherited_environment(os.environ), **own}
            log_path = self._log_dir / f"{key[0]}_{key[1]}.log"
            with log_path.open("ab") as log_file:
                process = await asyncio.create_subprocess_exec(
                    *argv,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=log_file,
                    stderr=asyncio.subprocess.STDOUT,
                    env=env,
                    cwd=container_spec.get("workingDir") or None,
                    start_new_session=True,
                    preexec_fn=die_with_parent(),
                )
        except (OSError, ValueError) as error:
            await self._report_terminated(
                key, code=128, reason="StartError", message=str(error), started_at=now_rfc3339()
            )
            return
        limits = (container_spec.get("resources") or {}).get("limits") or {}
        memory = int(parse_quantity(limits["memory"])) if "memory" in limits else 0
        container = Container(
            key=key,
            uid=uid,
            process=process,
            tree=ProcessTree(pid=process.pid),
            memory_limit_bytes=memory,
            started_at=now_rfc3339(),
        )
        self.running[key] = container
        log.info("kubelet %s: pod %s/%s started, pid %d", self.node, *key, process.pid)
        await self._write_status(key, lambda status: self._running_status(status, container))
        container.supervisor = self._background.spawn(
            self._supervise(container), name=f"supervisor of {key[1]}"
        )

    def _environment(self, pod: Json, container_spec: Json) -> dict[str, str]:
        fields = {
            "metadata.name": pod["metadata"].get("name", ""),
            "metadata.namespace": pod["metadata"].get("namespace", ""),
            "metadata.uid": pod["metadata"].get("uid", ""),
            "spec.nodeName": self.node,
            "status.hostIP": "127.0.0.1",
            "status.podIP": self._pod_ip(),
        }
        env: dict[str, str] = {}
        for variable in container_spec.get("env") or []:
            if "value" in variable:
                env[variable["name"]] = str(variable["value"])
            elif path := ((variable.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath"):
                env[variable["name"]] = str(fields.get(path, ""))
        return env

    def _pod_ip(self) -> str:
        return f"{POD_IP_BASE}.{self._index}.{len(self._handled) % 250 + 2}"

    def _running_status(self, status: Json, container: Container) -> Json:
        status.update(
            phase="Running",
            startTime=status.get("startTime") or container.started_at,
            hostIP="127.0.0.1",
            podIP=self._pod_ip(),
            conditions=self._conditions(status, ready=True),
            containerStatuses=runner_statuses(
                {"running": {"startedAt": container.started_at}},
                ready=True,
                image_id="simulated",
                container_id=f"simulated://{container.process.pid}",
            ),
        )
        return status

    @staticmethod
    def _conditions(status: Json, *, ready: bool, extra: list[Json] | None = None) -> list[Json]:
        stamp = now_rfc3339()
        kept = [
            c
            for c in status.get("conditions") or []
            if c.get("type") not in ("Ready", "ContainersReady", "Initialized")
        ]
        flag = "True" if ready else "False"
        return [
            *kept,
            {"type": "Initialized", "status": "True", "lastTransitionTime": stamp},
            {"type": "ContainersReady", "status": flag, "lastTransitionTime": stamp},
            {"type": "Ready", "status": flag, "lastTransitionTime": stamp},
            *(extra or []),
        ]

    async def _supervise(self, container: Container) -> None:
        exited = asyncio.create_task(container.process.wait())
        try:
            while not exited.done():
                await asyncio.wait({exited}, timeout=self._memory_poll_s)
                if exited.done() or container.oom_rss_bytes or not container.memory_limit_bytes:
                    continue
                rss = container.tree.rss_bytes()
                if rss > container.memory_limit_bytes:
                    container.oom_rss_bytes = rss
                    signal_group(container.process.pid, signal.SIGKILL)
        finally:
            exited.cancel()  # the supervisor was cancelled (the node crashed): stop waiting
        returncode = exited.result()
        signal_group(container.process.pid, signal.SIGKILL)
        if container.killer is not None:
            container.killer.cancel()
        code = exit_code_of(returncode)
        if container.oom_rss_bytes:
            reason, code = "OOMKilled", 137
            message = f"memory {container.oom_rss_bytes // 2**20} MiB over the limit"
        elif code == 0 and not container.stopping:
            reason, message = "Completed", ""
        else:
            reason, message = "Error", ""
        self.running.pop(container.key, None)
        log.info("kubelet %s: pod %s/%s ended: %s %d", self.node, *container.key, reason, code)
        try:
            await self._report_terminated(
                container.key,
                code=code,
                reason=reason,
                message=message,
                started_at=container.started_at,
                evicted=container.evicted_message,
            )
        except (ApiException, aiohttp.ClientError, OSError, TimeoutError):
            # the API server is away (a partition in a test): the pod stays as last reported
            log.warning("kubelet %s: reporting %s failed", self.node, container.key, exc_info=True)
            return
        if container.stopping and not container.evicted_message:
            await self._remove(container.key)

    async def _report_terminated(
        self,
        key: Key,
        *,
        code: int,
        reason: str,
        message: str,
        started_at: str,
        evicted: str = "",
    ) -> None:
        stamp = now_rfc3339()

        def terminated(status: Json) -> Json:
            extra: list[Json] = []
            if evicted:
                status["reason"], status["message"] = "Evicted", evicted
                extra.append(
                    {
                        "type": "DisruptionTarget",
                        "status": "True",
                        "reason": "TerminationByKubelet",
                        "message": evicted,
                        "lastTransitionTime": stamp,
                    }
                )
            succeeded = code == 0 and reason == "Completed" and not evicted
            state: Json = {"exitCode": code, "reason": reason, "startedAt": started_at,
                           "finishedAt": stamp}  # fmt: skip
            if message:
                state["message"] = message
            conditions = [c for c in self._conditions(status, ready=False, extra=extra)]
            status.update(
                phase="Succeeded" if succeeded else "Failed",
                conditions=conditions,
                containerStatuses=runner_statuses(
                    {"terminated": state}, ready=False, image_id="simulated"
                ),
            )
            return status

        await self._write_status(key, terminated)

    async def _write_status(self, key: Key, change: Callable[[Json], Json]) -> None:
        """Read-modify-write of the pod's status (retried on conflicts; gone is fine)."""
        if not self.alive:
            return
        for _ in range(20):
            try:
                pod = await call_json(self.core.read_namespaced_pod_status, key[1], key[0])
                pod["status"] = change(dict(pod.get("status") or {}))
                await call_json(self.core.replace_namespaced_pod_status, key[1], key[0], pod)
                return
            except ApiException as error:
                if error.status == 404:
                    return
                if error.status != 409:
                    raise
        raise RuntimeError(f"status of {key} kept conflicting")

    async def _remove(self, key: Key) -> None:
        if not self.alive:
            return
        try:
            await call_json(self.core.delete_namespaced_pod, key[1], key[0], grace_period_seconds=0)
        except ApiException as error:
            if error.status != 404:
                raise

    def _stop(self, container: Container, *, grace_s: int) -> None:
        """SIGTERM the pod's processes, SIGKILL after ``grace_s``."""
        if container.stopping and grace_s > 0:
            return
        container.stopping = True
        if grace_s <= 0:
            signal_group(container.process.pid, signal.SIGKILL)
            return
        signal_group(container.process.pid, signal.SIGTERM)
        container.killer = self._background.spawn(
            self._kill_after(container, grace_s), name=f"killer of {container.key[1]}"
        )

    async def _kill_after(self, container: Container, grace_s: float) -> None:
        await asyncio.sleep(grace_s)
        signal_group(container.process.pid, signal.SIGKILL)

    async def evict(self, name: str, namespace: str, *, message: str = "") -> None:
        """Node-pressure eviction of a running pod: killed, Failed, reason Evicted."""
        container = self.running.get((namespace, name))
        if container is None:
            raise KeyError(f"pod {namespace}/{name} does not run on {self.node}")
        container.evicted_message = message or "The node was low on resource: memory."
        self._stop(container, grace_s=0)
        if container.supervisor is not None:
            await asyncio.wait({container.supervisor}, timeout=10)

    def pid_of(self, name: str, namespace: str) -> int | None:
        container = self.running.get((namespace, name))
        return container.process.pid if container is not None else None
