"""Several execution clusters behind the one backend port: the clusters file and ``ClusterRouter``.

A deployment that runs jobs on more than one cluster lists them in a *clusters file*
(``MDQ_CLUSTERS_FILE``, YAML or JSON, followed at run time; ``ClustersFile`` is its schema,
``deploy/components/clusters/clusters.yaml`` an example). ``ClusterRouter`` is the
``ClusterBackend`` of such a deployment: one backend per cluster, nodes named
``<cluster>/<node>``, and a lost cluster recorded in ``NS_clusters_lost`` and fenced when it
answers again. What it does with pods, watches, samples and a lost cluster: docs/placement.md,
"The router".
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, Protocol

import yaml
from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig
from nats.js.errors import BucketNotFoundError
from nats.js.kv import KV_DEL, KV_PURGE, KeyValue
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from mdq.backends.port import ClusterBackend, PodSpec, PodUpdate
from mdq.bus.kv import watch_through
from mdq.bus.streams import open_bucket
from mdq.bus.subjects import Subjects
from mdq.contracts import pb
from mdq.core.clusters import (
    CLUSTER_NAME_PATTERN,
    LABEL_PATTERN,
    Reachability,
    cluster_of,
    local_name,
    qualified,
)
from mdq.core.nodes import NodeSample
from mdq.core.recovery import CLUSTER_LOST_REASON
from mdq.errors import InvalidInput, NotFound, Unavailable

log = logging.getLogger(__name__)

SAMPLE_TIMEOUT_S = 5.0
"""How long one cluster's node sample may take before its nodes are left out of the round."""
WATCH_RETRY_S = (0.5, 10.0)
"""First and longest wait before a failed pod watch of one cluster is opened again."""


LOST_AFTER_S = 60.0
"""How long a cluster may not answer before it is lost (its jobs move to other clusters)."""
LIVE_PHASES = (pb.POD_PENDING, pb.POD_RUNNING)


class UnknownCluster(NotFound):
    """A pod names a node of a cluster the router does not hold (removed, or never added)."""


class ClusterLost(Unavailable, RuntimeError):
    """A pod names a node of a cluster that is lost and not fenced yet: nothing runs there."""


class LostClusters(Protocol):
    """Where the lost and not yet fenced clusters are recorded, for every process's router
    (``KvLostClusters``; tests may keep it in memory)."""

    def names(self) -> set[str]:
        """The clusters recorded lost now."""
        ...

    def pods(self, cluster: str) -> list[str]:
        """The pods recorded lost with ``cluster`` (deleted when it is fenced)."""
        ...

    async def mark(self, cluster: str, pods: list[str]) -> None:
        """Record ``cluster`` lost, with the pods it had running."""
        ...

    async def clear(self, cluster: str) -> None:
        """``cluster`` is fenced."""
        ...


class ClusterEntry(BaseModel):
    """One execution cluster of the clusters file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="DNS label of at most 32 characters; nodes are <name>/<node>.")
    kind: Literal["kubernetes", "local"] = Field(description="Which backend runs its pods.")
    labels: dict[str, str] = Field(
        default_factory=dict, description="What jobs' clusters.require / prefer match."
    )
    kubernetes: dict[str, Any] = Field(
        default_factory=dict,
        description="MDQ_K8S_* settings of this cluster (field names in lower case), over the "
        "process's own; kind kubernetes only.",
    )
    runner_nats_url: str = Field(
        default="",
        description="The NATS URL this cluster's runner pods reach (another cluster's pods "
        "reach the bus from outside: a LoadBalancer or public address); empty: the one "
        "placement gives every cluster (MDQ_PLACEMENT_RUNNER_NATS_URL). Kind kubernetes only.",
    )

    @field_validator("name")
    @classmethod
    def _dns_label(cls, name: str) -> str:
        if not CLUSTER_NAME_PATTERN.fullmatch(name):
            raise ValueError("must be a DNS label of 1 to 32 lower-case letters, digits or '-'")
        return name

    @field_validator("labels")
    @classmethod
    def _labels(cls, labels: dict[str, str]) -> dict[str, str]:
        for key, value in labels.items():
            if not LABEL_PATTERN.fullmatch(key) or not LABEL_PATTERN.fullmatch(value):
                raise ValueError(f"label {key!r}: keys and values are 1 to 63 letters or digits")
        return labels


class ClustersFile(BaseModel):
    """The clusters file's content."""

    model_config = ConfigDict(extra="forbid")

    clusters: list[ClusterEntry]

    @field_validator("clusters")
    @classmethod
    def _unique(cls, clusters: list[ClusterEntry]) -> list[ClusterEntry]:
        names = [cluster.name for cluster in clusters]
        if len(set(names)) != len(names):
            raise ValueError("cluster names must be unique")
        return clusters


class BadClustersFile(InvalidInput):
    """The clusters file cannot be read or does not validate (the message names the field)."""


def parse_clusters(text: str) -> list[ClusterEntry]:
    """The clusters of a clusters file's text (YAML, of which JSON is a subset)."""
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise BadClustersFile(f"not YAML: {error}") from None
    try:
        return ClustersFile.model_validate(document).clusters
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise BadClustersFile(f"{where}: {first['msg']}") from None


def read_clusters(path: Path) -> list[ClusterEntry]:
    try:
        return parse_clusters(path.read_text())
    except OSError as error:
        raise BadClustersFile(f"{path}: {error.strerror}") from None


def _connection(entry: ClusterEntry) -> tuple[object, ...]:
    """What the backend of ``entry`` is made from (a change reconnects; labels do not)."""
    return (entry.kind, entry.kubernetes, entry.runner_nats_url)


class KvLostClusters:
    """``LostClusters`` in the KV bucket ``NS_clusters_lost`` (key: the cluster; value: JSON
    ``{"since": unix time, "pods": [...]}``), followed by a watch. Only the watcher may write
    it (``mdq.bus.security.permissions``); its first ``mark`` makes the bucket, and a reader whose
    bucket does not exist yet looks again every few seconds (nothing is lost until then)."""

    RETRY_S = 5.0

    def __init__(self, js: JetStreamContext, subjects: Subjects) -> None:
        self._js = js
        self._bucket_name = subjects.clusters_lost_bucket
        self._records: dict[str, list[str]] = {}
        self._kv: KeyValue | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self) -> KvLostClusters:
        self._task = asyncio.create_task(self._follow(), name="clusters-lost")
        return self

    def names(self) -> set[str]:
        return set(self._records)

    def pods(self, cluster: str) -> list[str]:
        return list(self._records.get(cluster, ()))

    async def _bucket(self) -> KeyValue:
        if self._kv is None:
            self._kv = await open_bucket(
                self._js, KeyValueConfig(bucket=self._bucket_name, history=1)
            )
        return self._kv

    async def mark(self, cluster: str, pods: list[str]) -> None:
        record = {"since": time.time(), "pods": pods}
        await (await self._bucket()).put(cluster, json.dumps(record).encode())
        self._records[cluster] = list(pods)

    async def clear(self, cluster: str) -> None:
        await (await self._bucket()).delete(cluster)
        self._records.pop(cluster, None)

    async def _follow(self) -> None:
        while True:
            try:
                kv = self._kv or await self._js.key_value(self._bucket_name)
                watcher = await kv.watchall()
                async for entry in watch_through(watcher):
                    if entry is None:
                        continue
                    if entry.operation in (KV_DEL, KV_PURGE) or not entry.value:
                        self._records.pop(entry.key, None)
                        continue
                    try:
                        self._records[entry.key] = list(json.loads(entry.value)["pods"])
                    except (ValueError, KeyError, TypeError):
                        log.warning("ignoring a malformed lost-cluster record %r", entry.key)
            except asyncio.CancelledError:
                raise
            except BucketNotFoundError:
                pass  # no cluster was ever lost
            except Exception as error:
                log.warning("following %s failed (%s); again soon", self._bucket_name, error)
            await asyncio.sleep(self.RETRY_S)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)


Connect = Callable[[ClusterEntry], Awaitable[ClusterBackend]]
"""Makes the backend of one cluster (the composition root knows how, per kind)."""


@dataclass
class _Member:
    entry: ClusterEntry
    backend: ClusterBackend
    watch: asyncio.Task[None] | None = None


@dataclass
class ClusterRouter:
    """``ClusterBackend`` over several clusters (the module docstring)."""

    connect: Connect
    lost: LostClusters | None = None
    """The shared record of lost clusters; None: losses are not detected nor heeded."""
    lost_after_s: float = LOST_AFTER_S
    probe_interval_s: float = 2.0
    sample_timeout_s: float = SAMPLE_TIMEOUT_S
    _members: dict[str, _Member] = field(default_factory=dict)
    _updates: asyncio.Queue[PodUpdate] | None = None
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    _follower: asyncio.Task[None] | None = None
    _live: dict[str, dict[str, PodUpdate]] = field(default_factory=dict)
    """cluster -> pod -> its last update, for its pods pending or running (watched only)."""
    _fenced_pods: dict[str, set[str]] = field(default_factory=dict)
    """cluster -> the pods reported lost with it (deleted when it answers again)."""
    _stale: set[str] = field(default_factory=set)
    """Pods reported lost whose end their cluster has not reported yet: their updates are not
    news (their attempt ended NodeLost), so they are not passed on."""
    _reach: Reachability | None = None
    file_errors: int = 0
    """Times the followed clusters file changed into one that did not read or validate."""

    @property
    def clusters(self) -> dict[str, ClusterEntry]:
        """The clusters held now, by name."""
        return {name: member.entry for name, member in self._members.items()}

    async def sync(self, entries: list[ClusterEntry]) -> None:
        """Hold exactly ``entries``: connect the new, close the removed, relabel the rest (a
        cluster whose connection settings changed is reconnected). A cluster that fails to
        connect is left out (and logged) until the next sync; the others are kept."""
        async with self._lock:
            wanted = {entry.name: entry for entry in entries}
            for name in [name for name in self._members if name not in wanted]:
                await self._drop(name)
            for name, entry in wanted.items():
                member = self._members.get(name)
                if member is not None and _connection(member.entry) == _connection(entry):
                    member.entry = entry  # labels only: the backend stays
                    continue
                if member is not None:
                    await self._drop(name)
                try:
                    backend = await self.connect(entry)
                except Exception:
                    log.exception("cluster %s: could not connect; left out until next time", name)
                    continue
                self._members[name] = _Member(entry, backend)
                if self._updates is not None:
                    self._start_watch(self._members[name])
                log.info("cluster %s (%s) added, labels %s", name, entry.kind, entry.labels)

    async def _drop(self, name: str) -> None:
        member = self._members.pop(name)
        self._live.pop(name, None)
        if self._reach is not None:
            self._reach.forget(name)
        if member.watch is not None:
            member.watch.cancel()
            await asyncio.gather(member.watch, return_exceptions=True)
        with contextlib.suppress(Exception):
            await member.backend.close()
        log.info("cluster %s removed", name)

    def _member(self, node: str) -> _Member:
        cluster = cluster_of(node)
        member = self._members.get(cluster)
        if member is None:
            raise UnknownCluster(f"no cluster {cluster!r} (node {node!r})")
        return member

    # -- the port ----------------------------------------------------------------------------
    def lost_now(self) -> set[str]:
        """The clusters lost and not fenced yet (as recorded, and as this router found)."""
        found = set(self.lost.names()) if self.lost is not None else set()
        if self._reach is not None:
            found |= self._reach.lost
        return found

    async def create_pod(self, pod: PodSpec) -> None:
        member = self._member(pod.node)
        if member.entry.name in self.lost_now():
            raise ClusterLost(f"cluster {member.entry.name} is lost: no pod is created there")
        await member.backend.create_pod(replace(pod, node=local_name(pod.node)))

    async def delete_pod(self, name: str) -> None:
        """Delete ``name`` wherever it is. Raises the first error only when no cluster could
        be asked (a pod on a cluster that cannot be reached now is stopped when it is fenced)."""
        members = list(self._members.values())
        results = await asyncio.gather(
            *(member.backend.delete_pod(name) for member in members), return_exceptions=True
        )
        errors = [
            (member.entry.name, result)
            for member, result in zip(members, results, strict=True)
            if isinstance(result, BaseException)
        ]
        for cluster, error in errors:
            log.warning("cluster %s: deleting pod %s failed: %s", cluster, name, error)
        if errors and len(errors) == len(members):
            raise errors[0][1]

    async def watch_pods(self) -> AsyncIterator[PodUpdate]:
        """Every cluster's pods (current state, then changes), nodes qualified; clusters added
        later join the stream."""
        if self._updates is not None:
            raise RuntimeError("the router's pods are watched once")
        self._updates = asyncio.Queue()
        for member in self._members.values():
            self._start_watch(member)
        prober = None
        if self.lost is not None:
            self._reach = Reachability(lost_after_s=self.lost_after_s)
            for cluster in self.lost.names():  # lost before a restart: still to be fenced
                self._reach.lost.add(cluster)
            prober = asyncio.create_task(self._probe_forever(), name="clusters-probe")
        try:
            while True:
                yield await self._updates.get()
        finally:
            if prober is not None:
                prober.cancel()
            for member in self._members.values():
                if member.watch is not None:
                    member.watch.cancel()
            self._updates = None

    def _start_watch(self, member: _Member) -> None:
        member.watch = asyncio.create_task(
            self._pump(member), name=f"cluster-{member.entry.name}-pods"
        )

    async def _pump(self, member: _Member) -> None:
        cluster = member.entry.name
        delay = WATCH_RETRY_S[0]
        while True:
            try:
                async for update in member.backend.watch_pods():
                    delay = WATCH_RETRY_S[0]
                    if update.pod_name in self._stale:
                        if update.phase not in LIVE_PHASES:
                            self._stale.discard(update.pod_name)  # its end, at last
                        continue  # reported lost already; deleted when the cluster is fenced
                    live = self._live.setdefault(cluster, {})
                    if update.phase in LIVE_PHASES:
                        live[update.pod_name] = update
                    else:
                        live.pop(update.pod_name, None)
                    assert self._updates is not None
                    self._updates.put_nowait(replace(update, node=qualified(cluster, update.node)))
                log.warning("cluster %s: pod watch ended; opening it again", cluster)
            except asyncio.CancelledError:
                raise
            except Exception as error:
                log.warning(
                    "cluster %s: pod watch failed (%s); again in %.1f s", cluster, error, delay
                )
            await asyncio.sleep(delay)
            delay = min(WATCH_RETRY_S[1], delay * 2)

    # -- losing and fencing a cluster --------------------------------------------------------
    async def _probe_forever(self) -> None:
        while True:
            await asyncio.sleep(self.probe_interval_s)
            for member in list(self._members.values()):
                try:
                    await self._probe(member)
                except asyncio.CancelledError:
                    raise
                except Exception:  # the next round tries again
                    log.exception("cluster %s: probing failed", member.entry.name)

    async def _probe(self, member: _Member) -> None:
        assert self._reach is not None and self.lost is not None
        cluster, now = member.entry.name, asyncio.get_running_loop().time()
        try:
            async with asyncio.timeout(self.sample_timeout_s):
                await member.backend.sample_nodes()
        except (Exception, TimeoutError) as error:
            if self._reach.silent(cluster, now):
                await self._declare_lost(member, error)
            return
        if self._reach.answered(cluster, now):
            await self._fence(member)

    async def _declare_lost(self, member: _Member, error: BaseException) -> None:
        assert self.lost is not None and self._updates is not None
        cluster = member.entry.name
        pods = list(self._live.pop(cluster, {}).values())
        self._fenced_pods.setdefault(cluster, set()).update(p.pod_name for p in pods)
        self._stale.update(p.pod_name for p in pods)
        await self.lost.mark(cluster, sorted(self._fenced_pods[cluster]))
        log.error(
            "cluster %s lost: no answer for %.0f s (%s); its %d running pods end NodeLost",
            cluster,
            self.lost_after_s,
            error,
            len(pods),
        )
        message = f"cluster {cluster} lost: its API did not answer for {self.lost_after_s:.0f} s"
        for update in pods:
            self._updates.put_nowait(
                replace(
                    update,
                    node=qualified(cluster, update.node),
                    phase=pb.POD_FAILED,
                    exit_code=0,
                    reason=CLUSTER_LOST_REASON,
                    message=message,
                )
            )

    async def _fence(self, member: _Member) -> None:
        """Delete the pods reported lost with ``member``'s cluster; then it is usable again
        (a delete that fails leaves it lost until the next probe)."""
        assert self.lost is not None and self._reach is not None
        cluster = member.entry.name
        stale = sorted(self._fenced_pods.get(cluster, set()) | set(self.lost.pods(cluster)))
        for name in stale:
            await member.backend.delete_pod(name)
        await self.lost.clear(cluster)
        self._reach.fenced(cluster)
        self._fenced_pods.pop(cluster, None)
        log.warning("cluster %s answers again: fenced, %d stale pods deleted", cluster, len(stale))

    async def sample_nodes(self) -> list[NodeSample]:
        members = list(self._members.values())
        results = await asyncio.gather(
            *(self._sample(member) for member in members), return_exceptions=True
        )
        samples: list[NodeSample] = []
        for member, result in zip(members, results, strict=True):
            if isinstance(result, BaseException):
                log.warning("cluster %s: no node sample this round: %s", member.entry.name, result)
                continue
            samples.extend(result)
        return samples

    async def _sample(self, member: _Member) -> list[NodeSample]:
        entry = member.entry
        async with asyncio.timeout(self.sample_timeout_s):
            found = await member.backend.sample_nodes()
        labels: Mapping[str, str] = dict(entry.labels)
        usable = entry.name not in self.lost_now()  # a lost cluster's nodes wait for fencing
        return [
            replace(
                sample,
                name=qualified(entry.name, sample.name),
                cluster=entry.name,
                cluster_labels=labels,
                ready=sample.ready and usable,
            )
            for sample in found
        ]

    async def close(self) -> None:
        if self._follower is not None:
            self._follower.cancel()
            await asyncio.gather(self._follower, return_exceptions=True)
        if isinstance(self.lost, KvLostClusters):
            await self.lost.close()
        async with self._lock:
            for name in list(self._members):
                await self._drop(name)

    # -- following the file ------------------------------------------------------------------
    def follow_in_background(self, path: Path, *, interval_s: float = 2.0) -> None:
        """``follow`` ``path`` until ``close``."""
        self._follower = asyncio.create_task(
            self.follow(path, interval_s=interval_s), name="clusters-file"
        )

    async def follow(self, path: Path, *, interval_s: float = 2.0) -> None:
        """Re-read ``path`` whenever its content changes, forever; a file that does not read
        or validate keeps the clusters as they are (and is logged once per change)."""
        last: str | None = None
        while True:
            try:
                text = await asyncio.to_thread(path.read_text)
            except OSError as error:
                text = f"unreadable: {error}"
            if text != last:
                last = text
                try:
                    await self.sync(parse_clusters(text))
                except BadClustersFile as error:
                    self.file_errors += 1
                    log.error("clusters file %s: %s; clusters unchanged", path, error)
            await asyncio.sleep(interval_s)


def clusters_json(entries: list[ClusterEntry]) -> str:
    """A clusters file's text for ``entries`` (what ``mdq up --clusters`` writes)."""
    return json.dumps(
        {"clusters": [entry.model_dump(exclude_defaults=True) for entry in entries]}, indent=2
    )
