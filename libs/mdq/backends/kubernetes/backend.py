"""The Kubernetes backend: ``ClusterBackend`` over the Kubernetes API (kubernetes-asyncio).

``create_pod`` creates, gives credentials to and binds an attempt's pod, every step idempotent;
``watch_pods`` reports every pod transition once, whatever the re-lists, and fails the pods of
a node lost for good; ``sample_nodes`` reads the nodes and their usage. The API is spoken in
raw JSON, mapped by ``mdq.backends.kubernetes.objects``. How each step works:
docs/backends.md, "Kubernetes".
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio import config as k8s_config
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.watch import Watch

from mdq.backends.kubernetes.objects import (
    Json,
    NodeView,
    PodTracker,
    binding,
    mounted_creds_secret,
    node_usage,
    node_view,
    pod_manifest,
    pod_update,
    runner_secret,
    runner_secret_name,
    selector,
    start_problems,
)
from mdq.backends.kubernetes.settings import KubernetesSettings
from mdq.backends.port import PodExists, PodSpec, PodUpdate
from mdq.bus.security.auth import RunnerIssuer
from mdq.core.nodes import NodeSample
from mdq.core.timestamps import utc_now

log = logging.getLogger(__name__)

USER_AGENT = "mdq-kubernetes-backend"
METRICS_GROUP, METRICS_VERSION = "metrics.k8s.io", "v1beta1"
RETRYABLE = (aiohttp.ClientError, asyncio.TimeoutError, OSError)


async def api_client(settings: KubernetesSettings) -> k8s.ApiClient:
    """An API client for the kubeconfig in the settings, or the in-cluster service account."""
    configuration = k8s.Configuration()
    if not settings.kubeconfig and os.environ.get("KUBERNETES_SERVICE_HOST"):
        k8s_config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    else:
        await k8s_config.load_kube_config(
            config_file=settings.kubeconfig or None,
            context=settings.context or None,
            client_configuration=configuration,
            persist_config=False,
        )
    api = k8s.ApiClient(configuration=configuration)
    api.user_agent = USER_AGENT
    return api


async def read_json(response: aiohttp.ClientResponse) -> Json:
    """The JSON body of a raw response; ApiException for any status but 2xx."""
    try:
        body = await response.read()
        if not 200 <= response.status <= 299:
            error = ApiException(status=response.status, reason=response.reason)
            error.body = body
            raise error
        document = json.loads(body) if body else {}
        return document if isinstance(document, dict) else {}
    finally:
        response.release()


async def call_json(call: Callable[..., Awaitable[Any]], *args: Any, **kwargs: Any) -> Json:
    """Call an API method of kubernetes-asyncio in raw mode: the JSON body as a dict (the
    objects stay the API's own; no model classes), ApiException for any status but 2xx."""
    response: aiohttp.ClientResponse = await call(*args, _preload_content=False, **kwargs)
    return await read_json(response)


@dataclass(slots=True)
class WatchStats:
    """Counters of one list-and-watch loop (read by tests and logs)."""

    lists: int = 0
    watches: int = 0
    expired: int = 0
    bookmarks: int = 0
    errors: int = 0
    resource_version: str = ""


ListCall = Callable[..., Awaitable[Any]]


async def list_and_watch(
    *,
    call: ListCall,
    on_list: Callable[[list[Json]], Awaitable[None]],
    on_event: Callable[[str, Json], Awaitable[None]],
    settings: KubernetesSettings,
    stats: WatchStats,
    what: str,
    on_broken: Callable[[], None] | None = None,
    **kwargs: Any,
) -> None:
    """List, then watch from the list's resourceVersion with bookmarks, forever: resume from
    the last version after a watch ends or breaks, re-list after 410 Gone (expired). With
    ``on_broken``, a watch that breaks (the API does not answer) calls it and is re-listed
    once the API answers again: what was seen before is not taken as current meanwhile."""
    version = ""
    while True:
        try:
            if not version:
                listing = await call_json(
                    call, **kwargs, _request_timeout=settings.request_timeout_s
                )
                stats.lists += 1
                version = str((listing.get("metadata") or {}).get("resourceVersion", ""))
                await on_list(list(listing.get("items") or []))
            stats.watches += 1
            watch = Watch(return_type="object")
            try:
                stream = watch.stream(
                    call,
                    **kwargs,
                    resource_version=version,
                    allow_watch_bookmarks=True,
                    timeout_seconds=settings.watch_timeout_s,
                    _request_timeout=aiohttp.ClientTimeout(
                        sock_connect=settings.request_timeout_s,
                        sock_read=settings.watch_timeout_s + settings.request_timeout_s,
                    ),
                )
                async for event in stream:
                    kind = str(event.get("type", ""))
                    obj = event.get("raw_object") or {}
                    new_version = str((obj.get("metadata") or {}).get("resourceVersion", ""))
                    if kind == "BOOKMARK":
                        stats.bookmarks += 1
                    elif kind in ("ADDED", "MODIFIED", "DELETED"):
                        await on_event(kind, obj)
                    version = new_version or version
                    stats.resource_version = version
            finally:
                await watch.close()
        except ApiException as error:
            if error.status == 410:
                stats.expired += 1
                log.info("%s watch expired at %s (410 Gone): re-listing", what, version)
                version = ""
                continue
            stats.errors += 1
            log.warning("%s watch failed (%s %s); retrying", what, error.status, error.reason)
            if error.status in (400, 422):
                version = ""
            if on_broken is not None:
                on_broken()
                version = ""
            await asyncio.sleep(settings.retry_backoff_s)
        except RETRYABLE as error:
            stats.errors += 1
            log.warning("%s watch broke (%r); retrying", what, error)
            if on_broken is not None:
                on_broken()
                version = ""
            await asyncio.sleep(settings.retry_backoff_s)


@dataclass(slots=True)
class _NodeWatch:
    """The nodes as last seen by the watch, and since when each one is missing."""

    nodes: dict[str, NodeView] = field(default_factory=dict)
    missing_since: dict[str, datetime] = field(default_factory=dict)
    synced: bool = False
    """Whether ``nodes`` is what a live watch says: no node is judged lost otherwise (while
    the API does not answer, the cluster's own loss applies: ``mdq.backends.clusters``)."""

    def unsynced(self) -> None:
        """The watch broke: judge nothing until the nodes are listed again."""
        self.synced = False


DEFAULT_DATA_DIR = Path("/data")
"""The data folder of runner pods when nobody says otherwise (deploy/: MDQ_DATA_DIR=/data)."""


class KubernetesBackend:
    """``ClusterBackend`` on a Kubernetes cluster."""

    def __init__(
        self,
        *,
        api: k8s.ApiClient,
        settings: KubernetesSettings,
        mdq_namespace: str,
        clock: Callable[[], datetime] = utc_now,
        runner_nats_url: str = "",
        data_dir: Path = DEFAULT_DATA_DIR,
        runner_issuer: RunnerIssuer | None = None,
    ) -> None:
        self._runner_nats_url = runner_nats_url
        self._data_dir = data_dir
        self._issuer = runner_issuer
        self._warned_shared = False
        self._api = api
        self._core = k8s.CoreV1Api(api)
        self._custom = k8s.CustomObjectsApi(api)
        self._settings = settings
        self._mdq_namespace = mdq_namespace
        self._clock = clock
        self._selector = selector(mdq_namespace)
        self.pod_stats = WatchStats()
        self.node_stats = WatchStats()

    @classmethod
    async def connect(
        cls,
        *,
        settings: KubernetesSettings | None = None,
        mdq_namespace: str,
        runner_nats_url: str = "",
        data_dir: Path = DEFAULT_DATA_DIR,
        runner_issuer: RunnerIssuer | None = None,
    ) -> KubernetesBackend:
        """The backend for ``settings`` (default: from MDQ_K8S_*); its pods' runners reach
        NATS at ``runner_nats_url``, find the data folder at ``data_dir`` and authenticate
        with credentials ``runner_issuer`` mints for each pod's job (None: the shared
        ``runner_creds_secret``)."""
        settings = settings or KubernetesSettings()
        return cls(
            api=await api_client(settings),
            settings=settings,
            mdq_namespace=mdq_namespace,
            runner_nats_url=runner_nats_url,
            data_dir=data_dir,
            runner_issuer=runner_issuer,
        )

    @property
    def namespace(self) -> str:
        return self._settings.namespace

    # -- pods ------------------------------------------------------------------------------
    async def create_pod(self, pod: PodSpec) -> None:
        if not self._runner_nats_url:
            raise RuntimeError("the backend was not told the runners' NATS URL: it makes no pods")
        creds_secret = None
        if self._issuer is not None:
            creds_secret = runner_secret_name(pod.name, secrets.token_hex(4))
        else:
            self._warn_shared_creds()
        manifest = pod_manifest(
            pod,
            settings=self._settings,
            mdq_namespace=self._mdq_namespace,
            nats_url=self._runner_nats_url,
            data_dir=self._data_dir,
            creds_secret=creds_secret,
        )
        existed = False
        created: Json | None = None
        try:
            created = await call_json(
                self._core.create_namespaced_pod,
                self.namespace,
                manifest,
                _request_timeout=self._settings.request_timeout_s,
            )
        except ApiException as error:
            if error.status != 409:
                raise
            existed = True
        if self._issuer is not None:
            await self._ensure_creds_secret(pod, created or await self.read_pod(pod.name))
        await self._bind(pod.name, pod.node)
        if existed:
            raise PodExists(pod.name)

    def _warn_shared_creds(self) -> None:
        if self._warned_shared:
            return
        self._warned_shared = True
        if self._settings.runner_creds_secret:
            log.warning(
                "no runner issuer (MDQ_NATS_RUNNER_ISSUER): every runner pod mounts the shared "
                "Secret %s, so one job's runner can report for another's",
                self._settings.runner_creds_secret,
            )
        else:
            log.warning(
                "no runner issuer (MDQ_NATS_RUNNER_ISSUER) and no MDQ_K8S_RUNNER_CREDS_SECRET: "
                "runner pods get no NATS credentials (a server without authentication only)"
            )

    async def _ensure_creds_secret(self, pod: PodSpec, current: Json | None) -> None:
        """Create the Secret the pod object ``current`` mounts, owned by it, with credentials
        for ``pod``'s job alone; one that exists is this pod's (its name is new for each pod
        object). Nothing for a pod that is gone (binding it fails) or mounts no Secret of its
        own (made before the issuer was configured)."""
        assert self._issuer is not None
        if current is None:
            return
        metadata = current.get("metadata") or {}
        name = mounted_creds_secret(current)
        if not name or name == self._settings.runner_creds_secret:
            log.info("pod %s mounts no credentials of its own", pod.name)
            return
        secret = runner_secret(
            pod,
            name=name,
            mdq_namespace=self._mdq_namespace,
            creds=self._issuer.creds(pod.job_id),
            owner_uid=str(metadata.get("uid", "")),
        )
        try:
            await call_json(
                self._core.create_namespaced_secret,
                self.namespace,
                secret,
                _request_timeout=self._settings.request_timeout_s,
            )
        except ApiException as error:
            if error.status != 409:
                raise

    async def _bind(self, name: str, node: str) -> None:
        try:
            await call_json(
                self._core.create_namespaced_pod_binding,
                name,
                self.namespace,
                binding(name, node),
                _request_timeout=self._settings.request_timeout_s,
            )
        except ApiException as error:
            if error.status != 409:
                raise
            current = await self.read_pod(name)
            assigned = str(((current or {}).get("spec") or {}).get("nodeName", ""))
            if assigned != node:
                log.warning("pod %s is bound to %r, not %r", name, assigned, node)

    async def read_pod(self, name: str) -> Json | None:
        """The pod object, or None."""
        try:
            return await call_json(
                self._core.read_namespaced_pod,
                name,
                self.namespace,
                _request_timeout=self._settings.request_timeout_s,
            )
        except ApiException as error:
            if error.status == 404:
                return None
            raise

    async def delete_pod(self, name: str) -> None:
        await self._delete(name, grace_s=self._settings.termination_grace_s)

    async def _delete(self, name: str, *, grace_s: int) -> None:
        try:
            await call_json(
                self._core.delete_namespaced_pod,
                name,
                self.namespace,
                grace_period_seconds=grace_s,
                _request_timeout=self._settings.request_timeout_s,
            )
        except ApiException as error:
            if error.status != 404:
                raise

    async def watch_pods(self) -> AsyncIterator[PodUpdate]:
        """Every pod's state, then every change, forever; pods of a lost node end NodeLost."""
        queue: asyncio.Queue[PodUpdate] = asyncio.Queue()
        tracker = PodTracker()
        nodes = _NodeWatch()

        def report(update: PodUpdate | None) -> None:
            if update is not None:
                queue.put_nowait(update)
                if update.reason == "StartError":
                    asyncio.get_running_loop().create_task(self._delete(update.pod_name, grace_s=0))

        async def pods_listed(items: list[Json]) -> None:
            for update in tracker.resync(items):
                report(update)

        async def pod_event(kind: str, pod: Json) -> None:
            report(tracker.observe(kind, pod))

        async def nodes_listed(items: list[Json]) -> None:
            nodes.nodes = {view.name: view for view in map(self._node_view, items)}
            nodes.synced = True

        async def node_event(kind: str, node: Json) -> None:
            view = self._node_view(node)
            if kind == "DELETED":
                nodes.nodes.pop(view.name, None)
            else:
                nodes.nodes[view.name] = view

        async def check_nodes() -> None:
            interval = max(
                0.2,
                min(
                    2.0, self._settings.node_lost_after_s / 4, self._settings.sandbox_timeout_s / 4
                ),
            )
            while True:
                await asyncio.sleep(interval)
                for update in tracker.start_timeouts(
                    self._clock(), self._settings.sandbox_timeout_s
                ):
                    log.warning("pod %s could not start: %s", update.pod_name, update.message)
                    report(update)
                if nodes.synced:
                    for update in await self._lose_pods(tracker, nodes):
                        queue.put_nowait(update)

        tasks = [
            asyncio.create_task(
                list_and_watch(
                    call=self._core.list_namespaced_pod,
                    namespace=self.namespace,
                    label_selector=self._selector,
                    on_list=pods_listed,
                    on_event=pod_event,
                    settings=self._settings,
                    stats=self.pod_stats,
                    what="pod",
                ),
                name="k8s-pods",
            ),
            asyncio.create_task(
                list_and_watch(
                    call=self._core.list_node,
                    on_list=nodes_listed,
                    on_event=node_event,
                    settings=self._settings,
                    stats=self.node_stats,
                    what="node",
                    on_broken=nodes.unsynced,
                    **self._node_selector(),
                ),
                name="k8s-nodes",
            ),
            asyncio.create_task(check_nodes(), name="k8s-node-lost"),
        ]
        getter: asyncio.Task[PodUpdate] | None = None
        try:
            while True:
                getter = asyncio.create_task(queue.get())
                done, _ = await asyncio.wait({getter, *tasks}, return_when=asyncio.FIRST_COMPLETED)
                if getter in done:
                    yield getter.result()
                    continue
                for task in tasks:
                    if task.done():
                        task.result()  # a loop ended: let its error out
        finally:
            if getter is not None:
                getter.cancel()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _lose_pods(self, tracker: PodTracker, nodes: _NodeWatch) -> list[PodUpdate]:
        """Report and delete the unfinished pods of every node lost for long enough."""
        now = self._clock()
        limit = self._settings.node_lost_after_s
        on_nodes = {update.node for update in tracker.last.values() if update.node}
        for name in list(nodes.missing_since):
            if name in nodes.nodes:
                del nodes.missing_since[name]
        lost: list[PodUpdate] = []
        for name in on_nodes:
            view = nodes.nodes.get(name)
            if view is None:
                since = nodes.missing_since.setdefault(name, now)
                why = "the node is gone"
            elif not view.ready:
                since = view.ready_since or now
                why = "the node is not ready"
            else:
                continue
            if (now - since).total_seconds() < limit:
                continue
            message = f"{why} since {since.isoformat(timespec='seconds')}"
            updates = tracker.lose_node(name, message)
            for update in updates:
                log.warning("pod %s lost with node %s: %s", update.pod_name, name, message)
                with contextlib.suppress(ApiException, *RETRYABLE):
                    await self.delete_pod(update.pod_name)
            lost.extend(updates)
        return lost

    # -- nodes -----------------------------------------------------------------------------
    def _node_selector(self) -> dict[str, str]:
        return (
            {"label_selector": self._settings.node_selector} if self._settings.node_selector else {}
        )

    def _node_view(self, node: Json) -> NodeView:
        return node_view(node, tolerated_taints=self._settings.tolerated_taints)

    async def list_nodes(self) -> list[NodeView]:
        """Every node mdq may use, as it is now."""
        listing = await call_json(
            self._core.list_node,
            **self._node_selector(),
            _request_timeout=self._settings.request_timeout_s,
        )
        return [self._node_view(node) for node in listing.get("items") or []]

    async def node_usage(self) -> dict[str, tuple[float, float]]:
        """metrics.k8s.io: {node: (cores in use, bytes in use)}; empty when it is not served."""
        try:
            metrics = await call_json(
                self._custom.list_cluster_custom_object,
                METRICS_GROUP,
                METRICS_VERSION,
                "nodes",
                _request_timeout=self._settings.request_timeout_s,
            )
        except ApiException as error:
            if error.status in (403, 404, 503):
                log.warning("no node metrics (%s): load counts as 0", error.status)
                return {}
            raise
        return node_usage(metrics)

    async def start_problems(self) -> dict[str, str]:
        """node -> why mdq's pods cannot start there (``objects.start_problems``), from the
        namespace's Pending pods: the node says nothing itself of a broken sandbox or image."""
        pending = await call_json(
            self._core.list_namespaced_pod,
            self.namespace,
            label_selector=self._selector,
            field_selector="status.phase=Pending",
        )
        return start_problems(
            pending.get("items") or [],
            now=self._clock(),
            stalled_after_s=self._settings.sandbox_timeout_s / 2,
        )

    async def sample_nodes(self) -> list[NodeSample]:
        views, usage, starts = await asyncio.gather(
            self.list_nodes(), self.node_usage(), self.start_problems()
        )
        samples: list[NodeSample] = []
        for view in sorted(views, key=lambda v: v.name):
            cpu_used, memory_used = usage.get(view.name, (0.0, 0.0))
            memory_bytes = view.memory_capacity_mb * 2**20
            samples.append(
                NodeSample(
                    name=view.name,
                    cpu_capacity=view.cpu_capacity,
                    memory_capacity_mb=view.memory_capacity_mb,
                    ready=view.ready,
                    cordoned=not view.schedulable,
                    problem=view.problem or starts.get(view.name, ""),
                    cpu_load=min(1.0, cpu_used / view.cpu_capacity) if view.cpu_capacity else 0.0,
                    memory_load=min(1.0, memory_used / memory_bytes) if memory_bytes else 0.0,
                )
            )
        return samples

    async def get_pod(self, name: str) -> PodUpdate | None:
        """The current state of one pod, or None."""
        pod = await self.read_pod(name)
        return None if pod is None else pod_update(pod)

    async def close(self) -> None:
        await self._api.close()


__all__ = ["KubernetesBackend", "WatchStats", "api_client", "call_json", "list_and_watch"]
