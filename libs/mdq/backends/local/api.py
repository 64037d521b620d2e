"""The local backend as seen by mdq's services: ``ClusterBackend`` over two JetStream KV buckets.

Creating a pod writes its record (status POD_PENDING) into the pods bucket; the node agent of
the pod's node (``python -m mdq.backends.local``) sees it, runs it as a subprocess and writes
its status back. Deleting asks that agent to stop it. Watching pods is a KV watch; sampling
nodes reads what the agents heartbeat into the nodes bucket. Nothing here runs processes, so
any number of services on any machine that reaches the NATS server can share the backend.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import replace

from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.errors import APIError, KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KV_DEL, KV_PURGE, KeyValue

from mdq.backends.local.records import (
    Buckets,
    NodeRecord,
    PodRecord,
    PodStatus,
    ensure_buckets,
    read_pod,
    update_pod,
)
from mdq.backends.port import PodExists, PodSpec, PodUpdate
from mdq.bus.kv import watch_through
from mdq.bus.outage import warn_try_failed
from mdq.bus.requests import is_wrong_last_sequence
from mdq.bus.subjects import Subjects
from mdq.contracts import pb
from mdq.core.nodes import NodeSample
from mdq.core.recovery import CLUSTER_LOST_REASON

log = logging.getLogger(__name__)

DEFAULT_HEARTBEAT_TIMEOUT_S = 10.0


def _is_removal(entry: KeyValue.Entry) -> bool:
    return entry.operation in (KV_DEL, KV_PURGE) or not entry.value


def removal_update(last_seen: PodUpdate | None) -> PodUpdate | None:
    """What a pod's removal tells a watch whose last update of it was ``last_seen``: nothing
    when that was its end, else that it ended, deleted. The bucket keeps one revision per pod,
    so a watch that was behind reads the removal of a pod deleted while it ran (its agent
    stopped it, wrote its end and removed it) without the end it overwrote; its attempt must
    still end now, not when its silence makes it look lost."""
    if last_seen is None or last_seen.phase not in (pb.POD_PENDING, pb.POD_RUNNING):
        return None
    return replace(
        last_seen,
        phase=pb.POD_FAILED,
        reason="Deleted",
        message="pod deleted; its end was not seen before its removal",
    )


def node_sample(record: NodeRecord, *, now_unix: float, heartbeat_timeout_s: float) -> NodeSample:
    """What a node record means now, as a copy of its report: a node whose agent stopped
    heartbeating is not ready."""
    fresh = now_unix - record.heartbeat_unix <= heartbeat_timeout_s
    return replace(record.node, ready=record.node.ready and fresh)


class _NodeTable:
    """The nodes bucket mirrored in memory by one long-lived KV watch."""

    def __init__(self, *, nodes: KeyValue) -> None:
        self._bucket = nodes
        self._records: dict[str, NodeRecord] = {}
        self._synced = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def records(self) -> list[NodeRecord]:
        if self._task is None or self._task.done():
            if self._task is not None and not self._task.cancelled() and self._task.exception():
                log.warning("node watch ended; restarting it", exc_info=self._task.exception())
            self._records, self._synced = {}, asyncio.Event()
            self._task = asyncio.create_task(self._follow(), name="local-backend-nodes")
        synced = asyncio.create_task(self._synced.wait())
        await asyncio.wait({synced, self._task}, return_when=asyncio.FIRST_COMPLETED)
        if not synced.done():
            synced.cancel()
            self._task.result()  # the watch failed: raise its error
        return [self._records[name] for name in sorted(self._records)]

    async def _follow(self) -> None:
        watcher = await self._bucket.watchall()
        try:
            async for entry in watch_through(watcher):
                if entry is None:
                    self._synced.set()
                elif _is_removal(entry):
                    self._records.pop(entry.key, None)
                else:
                    try:
                        self._records[entry.key] = NodeRecord.from_json(
                            entry.key, entry.value or b""
                        )
                    except (ValueError, KeyError, TypeError):
                        log.warning("ignoring malformed node record %r", entry.key)
        finally:
            with contextlib.suppress(Exception):
                await watcher.stop()  # type: ignore[no-untyped-call]

    async def confirm(self, record: NodeRecord) -> NodeRecord:
        """``record`` as the bucket holds it now (a direct read), for a node whose mirrored
        heartbeat looks old. After a NATS server restart a KV watch can stay silent for
        many seconds while the heartbeats it should deliver keep being written (seen with
        nats-py 2.16: about 16 s), which made every node look lost at once; a newer record
        read directly means the watch is behind, so it is started again."""
        name = record.node.name
        try:
            entry = await self._bucket.get(name)
            current = NodeRecord.from_json(name, entry.value or b"")
        except (KeyNotFoundError, ValueError, KeyError, TypeError):
            return record
        if current.heartbeat_unix > record.heartbeat_unix:
            self._records[name] = current
            log.warning("node watch missed heartbeats of %s; restarting it", name)
            await self.close()
        return current

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task


class LocalBackend:
    """``ClusterBackend`` of the local execution backend (pods run by node agents)."""

    def __init__(
        self,
        *,
        nc: Client | JetStreamContext,
        subjects: Subjects,
        heartbeat_timeout_s: float = DEFAULT_HEARTBEAT_TIMEOUT_S,
        replicas: int = 1,
    ) -> None:
        self._js = nc.jetstream() if isinstance(nc, Client) else nc
        self._replicas = replicas
        self._subjects = subjects
        self._heartbeat_timeout_s = heartbeat_timeout_s
        self._buckets: Buckets | None = None
        self._opening = asyncio.Lock()
        self._nodes: _NodeTable | None = None

    async def buckets(self) -> Buckets:
        """The pods and nodes buckets (created on first use)."""
        async with self._opening:
            if self._buckets is None:
                self._buckets = await ensure_buckets(
                    self._js, self._subjects, replicas=self._replicas
                )
                self._nodes = _NodeTable(nodes=self._buckets.nodes)
            return self._buckets

    async def create_pod(self, pod: PodSpec) -> None:
        pods = (await self.buckets()).pods
        try:
            await pods.create(pod.name, PodRecord(spec=pod).to_json())
        except KeyWrongLastSequenceError:
            raise PodExists(pod.name) from None

    async def delete_pod(self, name: str) -> None:
        """A running pod is marked for deletion (its agent stops it, then removes it); a pod
        that never started ends FAILED "Deleted" (as Kubernetes reports a pod deleted before it
        ran, so its attempt ends; its node's agent removes the record); a finished pod is
        removed at once."""
        pods = (await self.buckets()).pods
        while True:
            current = await read_pod(pods, name)
            if current is None:
                return
            record, revision = current
            try:
                if record.status.phase == pb.POD_RUNNING:
                    if record.deletion_requested:
                        return
                    marked = replace(record, deletion_requested=True)
                    await pods.update(name, marked.to_json(), last=revision)
                elif record.status.phase == pb.POD_PENDING:
                    status = PodStatus(pb.POD_FAILED, 0, "Deleted", "pod deleted before it started")
                    ended = replace(record.with_status(status), deletion_requested=True)
                    await pods.update(name, ended.to_json(), last=revision)
                else:
                    await pods.delete(name, last=revision)
                return
            except APIError as error:
                if not is_wrong_last_sequence(error):
                    raise

    async def watch_pods(self) -> AsyncIterator[PodUpdate]:
        """Every pod's current state, then every change of status, forever (removals of
        deleted pods are not reported when their last status was seen; a pod removed while the
        watch last saw it live ends FAILED "Deleted", ``removal_update``).

        While watching, pods on a node whose agent stopped heartbeating are marked FAILED
        "NodeLost" (as Kubernetes' node lifecycle controller does), so their jobs are
        recovered elsewhere; the agent, should it come back, stops them.
        """
        pods = (await self.buckets()).pods
        watcher = await pods.watchall()
        last: dict[str, PodUpdate] = {}
        marker = asyncio.create_task(self._mark_pods_of_lost_nodes(last), name="node-lost")
        try:
            async for entry in watcher:
                if entry is None:
                    continue
                if _is_removal(entry):
                    ended = removal_update(last.pop(entry.key, None))
                    if ended is not None:
                        yield ended
                    continue
                try:
                    update = PodRecord.from_json(entry.value).to_update()
                except (ValueError, KeyError, TypeError):
                    log.warning("ignoring malformed pod record %r", entry.key)
                    continue
                if last.get(entry.key) != update:
                    last[entry.key] = update
                    yield update
        finally:
            marker.cancel()
            with contextlib.suppress(Exception):
                await watcher.stop()  # type: ignore[no-untyped-call]

    async def _mark_pods_of_lost_nodes(self, pods_seen: dict[str, PodUpdate]) -> None:
        """Every few seconds: live pods on a node that is no longer ready → FAILED NodeLost."""
        interval = max(0.2, self._heartbeat_timeout_s / 4)
        while True:
            await asyncio.sleep(interval)
            try:
                samples = await self.sample_nodes()
                lost_nodes = {node.name for node in samples if not node.ready}
                # a named cluster none of whose agents answers is lost as a whole: its jobs
                # resume elsewhere from their copied checkpoints (its files are out of reach)
                whole = bool(self._subjects.local_cluster) and len(lost_nodes) == len(samples)
                for name, update in list(pods_seen.items()):
                    if update.node in lost_nodes and update.phase in (
                        pb.POD_PENDING,
                        pb.POD_RUNNING,
                    ):
                        await self.mark_node_lost(name, update.node, cluster_lost=whole)
            except Exception as error:  # retried on the next round
                warn_try_failed(log, "marking pods of lost nodes failed", error)

    async def mark_node_lost(self, name: str, node: str, *, cluster_lost: bool = False) -> None:
        """Mark one live pod FAILED "NodeLost" (compare-and-set; a no-op if it ended), or
        "ClusterLost" when every node of its named cluster stopped answering."""
        status = PodStatus(
            pb.POD_FAILED, 0, "NodeLost", f"node {node} stopped answering (no heartbeat)"
        )
        if cluster_lost:
            cluster = self._subjects.local_cluster
            status = PodStatus(
                pb.POD_FAILED,
                0,
                CLUSTER_LOST_REASON,
                f"cluster {cluster} lost: none of its node agents answers (no heartbeat)",
            )

        def lose(record: PodRecord) -> PodRecord | None:
            return None if record.terminal else record.with_status(status)

        if await update_pod((await self.buckets()).pods, name, lose) is not None:
            log.warning("pod %s marked %s: node %s stopped heartbeating", name, status.reason, node)

    async def get_pod(self, name: str) -> PodUpdate | None:
        """The current state of one pod, or None if there is none."""
        current = await read_pod((await self.buckets()).pods, name)
        return None if current is None else current[0].to_update()

    async def sample_nodes(self) -> list[NodeSample]:
        await self.buckets()
        assert self._nodes is not None
        now = time.time()
        samples: list[NodeSample] = []
        for record in await self._nodes.records():
            sample = node_sample(
                record, now_unix=now, heartbeat_timeout_s=self._heartbeat_timeout_s
            )
            if not sample.ready:  # silent, or only our view of it is? ask the bucket
                confirmed = await self._nodes.confirm(record)
                sample = node_sample(
                    confirmed, now_unix=now, heartbeat_timeout_s=self._heartbeat_timeout_s
                )
            samples.append(sample)
        return samples

    async def close(self) -> None:
        if self._nodes is not None:
            await self._nodes.close()


__all__ = ["LocalBackend", "node_sample"]
