"""The node agent (the local backend's "kubelet"): runs the pods bound to its nodes.

One agent process serves one or more virtual nodes: it heartbeats their capacity, live usage
and health into the nodes bucket, claims each pending pod bound to one of them with a
conditional write before it starts it (so a pod never starts twice), runs it as a subprocess
with its limits, and writes its status back. How, and why: docs/backends.md, "The node agent".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import nats.errors
from nats.js import JetStreamContext
from nats.js.errors import APIError

from mdq import datadisk
from mdq.backends.launch import (
    RUNNER_MODULE,
    PodRefused,
    module_argv,
    runner_environment,
    runner_task,
)
from mdq.backends.local.processes import (
    MIB,
    CorePicker,
    ProcessTree,
    describe_exit,
    die_with_parent,
    exit_code_of,
    signal_group,
)
from mdq.backends.local.records import (
    Buckets,
    NodeRecord,
    PodRecord,
    PodStatus,
    ensure_buckets,
    update_pod,
)
from mdq.backends.port import PodSpec
from mdq.bus.connect import CREDS_ENV
from mdq.bus.fetch import connection_of
from mdq.bus.outage import warn_try_failed
from mdq.bus.requests import is_wrong_last_sequence
from mdq.bus.security.auth import write_secret
from mdq.bus.security.runner_creds import CredsRefused, request_runner_creds
from mdq.bus.subjects import Subjects
from mdq.contracts import pb
from mdq.core.nodes import NodeSample
from mdq.core.recovery import START_ERROR_REASON as START_ERROR
from mdq.files import UMASK, open_log, private_folder

log = logging.getLogger(__name__)
ENDED_LINE = "pod %s ended: %s %s (pid %d, returncode %d)"
"""How a pod's end is logged: name, reason, message, pid, and the process's return code as
Popen gives it (-9: SIGKILL); benchmarks read it (``mdq.testing.agent_log``)."""

EXIT_KILLED = 137
STATUS_RETRY_MAX_S = 5.0
"""The longest wait between two tries of writing a pod's status while NATS does not answer."""
REAP_AFTER_KILL_S = 5.0
"""How long a stop waits for its pods' processes past their grace period (SIGKILLed by then),
for the status of a pod whose start it cut short, and for its nodes' last report: a stopping
agent's own worst case is its grace plus three times this, and the close of its connection."""
PROBE_WAIT_S = 1.0
"""How long a heartbeat waits for the data folder's probe before it goes out without news."""
STOPPED_BEFORE_START = PodStatus(
    pb.POD_FAILED, 0, "Evicted", "node agent shut down before the pod's process started"
)
"""The status of a pod claimed as RUNNING whose start the agent's own stop cut short."""


@dataclass(frozen=True, slots=True)
class NodeConfig:
    """A virtual node served by this agent."""

    name: str
    cpu_capacity: float
    memory_capacity_mb: int


@dataclass(slots=True)
class RunningPod:
    """A pod whose process this agent started and still supervises."""

    spec: PodSpec
    process: asyncio.subprocess.Process
    tree: ProcessTree
    stop_reason: str = ""
    stop_message: str = ""
    oom_rss_mb: int = 0
    killer: asyncio.Task[None] | None = None
    supervisor: asyncio.Task[None] | None = field(default=None, repr=False)


def _close_late_file(future: asyncio.Future[BinaryIO]) -> None:
    """Close what a preparation that was given up on opened after all."""
    if not future.cancelled() and future.exception() is None:
        future.result().close()


def final_status(
    returncode: int, *, oom_rss_mb: int, memory_mb: int, stop_reason: str, stop_message: str
) -> PodStatus:
    """The terminal status of a pod whose process ended with ``returncode`` (Popen style)."""
    code = exit_code_of(returncode)
    if oom_rss_mb:
        message = f"memory {oom_rss_mb} MiB above the limit of {memory_mb} MiB"
        return PodStatus(pb.POD_FAILED, EXIT_KILLED, "OOMKilled", message)
    if stop_reason:
        message = f"{stop_message}; {describe_exit(returncode)}"
        return PodStatus(pb.POD_FAILED, code, stop_reason, message)
    if code == 0:
        return PodStatus(pb.POD_SUCCEEDED, 0, "Completed", "exited with 0")
    return PodStatus(pb.POD_FAILED, code, "Error", describe_exit(returncode))


class NodeAgent:
    """Runs the pods of ``nodes``; ``run`` until asked to stop."""

    def __init__(
        self,
        *,
        js: JetStreamContext,
        subjects: Subjects,
        nodes: Sequence[NodeConfig],
        data_dir: Path,
        heartbeat_s: float = 2.0,
        grace_s: float = 10.0,
        memory_poll_s: float = 0.5,
        replicas: int = 1,
        nats_url: str,
        runner_module: str = RUNNER_MODULE,
        host_env: Mapping[str, str] | None = None,
        runner_creds_dir: Path | None = None,
        runner_creds_wait_s: float = 30.0,
        min_free_mb: int = 0,
        start_error_hold_s: float = 30.0,
        probe_stall_s: float = 20.0,
    ) -> None:
        """``runner_creds_dir``: on an authenticating server, where each runner's own NATS
        credentials are written (0600) while its pod lives, asked of placement's desk at the
        pod's start (``runner_creds_wait_s`` at most; None: runners need none)."""
        if not nodes:
            raise ValueError("a node agent needs at least one node")
        self._js = js
        self._subjects = subjects
        self._nodes = {node.name: node for node in nodes}
        self._data_dir = data_dir
        self._log_dir = data_dir / "pods"
        self._nats_url = nats_url
        self._runner_module = runner_module
        self._host_env = dict(os.environ if host_env is None else host_env)
        self._heartbeat_s = heartbeat_s
        self._grace_s = grace_s
        self._memory_poll_s = memory_poll_s
        self._replicas = replicas
        self._buckets: Buckets | None = None
        self._running: dict[str, RunningPod] = {}
        self._claimed: set[str] = set()
        self._cores = CorePicker()
        self._runner_creds_dir = runner_creds_dir
        self._runner_creds_wait_s = runner_creds_wait_s
        self._min_free_bytes = max(0, min_free_mb) * 2**20
        self._start_error_hold_s = start_error_hold_s
        self._probe_stall_s = probe_stall_s
        self._start_failure: tuple[str, float] | None = None
        self._probe: asyncio.Future[str] | None = None
        self._probe_started = 0.0
        self.problem = ""
        """Why this agent's nodes cannot run pods now ("" when they can)."""

    @property
    def _kv(self) -> Buckets:
        if self._buckets is None:
            raise RuntimeError("the agent is not running")
        return self._buckets

    async def run(self, stop: asyncio.Event) -> None:
        """Register the nodes, heartbeat them and run their pods until ``stop`` is set; then
        stop the pods (SIGTERM, SIGKILL after the grace period) and report them Evicted."""
        self._buckets = await ensure_buckets(self._js, self._subjects, replicas=self._replicas)
        try:
            if datadisk.claim(self._data_dir):
                log.info("data folder %s marked as mdq's volume", self._data_dir)
            private_folder(self._log_dir)
        except OSError as error:  # a sick disk is reported, not a reason to stay away
            log.warning("data folder %s: %s", self._data_dir, error)
        await self.check_health()
        await self._publish_nodes(ready=True)
        log.info("node agent serving %s", ", ".join(self._nodes))
        tasks = {
            asyncio.create_task(self._heartbeat_forever(), name="heartbeat"),
            asyncio.create_task(self._watch_pods(), name="watch-pods"),
        }
        stopping = asyncio.create_task(stop.wait(), name="stop")
        try:
            done, _ = await asyncio.wait({*tasks, stopping}, return_when=asyncio.FIRST_COMPLETED)
            for task in done - {stopping}:
                task.result()  # a loop that ended on its own failed: let the error out
        finally:
            stopping.cancel()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self._stop_all(reason="Evicted", message="node agent shut down")
            with contextlib.suppress(Exception):  # the nodes go lost without it, later
                await asyncio.wait_for(self._publish_nodes(ready=False), REAP_AFTER_KILL_S)
            log.info("node agent stopped")

    # -- nodes ---------------------------------------------------------------------------
    async def _heartbeat_forever(self) -> None:
        while True:
            await asyncio.sleep(self._heartbeat_s)
            try:
                await self.check_health()
                await self._publish_nodes(ready=True)
            except Exception as error:  # NATS away for a moment: beat again later
                warn_try_failed(log, "heartbeat failed", error)

    async def check_health(self) -> str:
        """Probe the data folder (``mdq.datadisk.probe``) and weigh recent start failures;
        set and return ``problem``, logging each change once.

        The probe runs in a thread of its own and is waited for briefly: a data disk that
        hangs (a dead network volume) never holds up the heartbeat, which would make the
        node look lost and fail its running pods; a probe still running after
        ``probe_stall_s`` is itself the problem."""
        if self._probe is None:
            self._probe = asyncio.ensure_future(
                asyncio.to_thread(
                    datadisk.probe, self._data_dir, min_free_bytes=self._min_free_bytes
                )
            )
            self._probe_started = time.monotonic()
        await asyncio.wait({self._probe}, timeout=PROBE_WAIT_S)
        if self._probe.done():
            probe, self._probe = self._probe, None
            try:
                problem = probe.result()
            except Exception as error:  # the probe's own failure says the folder is unusable
                problem = f"data folder unusable: {error!r}"
        elif (running := time.monotonic() - self._probe_started) > self._probe_stall_s:
            problem = (
                f"data disk not answering: a probe of {self._data_dir} has run {running:.0f} s"
            )
        else:
            problem = self.problem  # no news yet
        failure = self._start_failure
        if not problem and failure is not None:
            if time.monotonic() - failure[1] < self._start_error_hold_s:
                problem = f"pods could not start: {failure[0]}"
            else:
                self._start_failure = None
        if problem != self.problem:
            if problem:
                log.warning("nodes %s take no new pods: %s", ", ".join(self._nodes), problem)
            else:
                log.info("nodes %s healthy again: %s passed its probe", ", ".join(self._nodes),
                         self._data_dir)  # fmt: skip
            self.problem = problem
        return problem

    def _node_record(self, node: NodeConfig, *, ready: bool) -> NodeRecord:
        trees = [pod.tree for pod in self._running.values() if pod.spec.node == node.name]
        cpu_percent = sum(tree.cpu_percent() for tree in trees)
        rss = sum(tree.rss_bytes() for tree in trees)
        return NodeRecord(
            NodeSample(
                name=node.name,
                cpu_capacity=node.cpu_capacity,
                memory_capacity_mb=node.memory_capacity_mb,
                ready=ready,
                cpu_load=min(1.0, cpu_percent / (node.cpu_capacity * 100.0)),
                memory_load=min(1.0, rss / (node.memory_capacity_mb * MIB)),
                problem=self.problem,
            ),
            heartbeat_unix=time.time(),
        )

    async def _publish_nodes(self, *, ready: bool) -> None:
        nodes_bucket = self._kv.nodes
        for node in self._nodes.values():
            await nodes_bucket.put(node.name, self._node_record(node, ready=ready).to_json())

    # -- pods ----------------------------------------------------------------------------
    async def _watch_pods(self) -> None:
        watcher = await self._kv.pods.watchall()
        try:
            async for entry in watcher:
                if entry is None or not entry.value or entry.operation is not None:
                    continue
                try:
                    record = PodRecord.from_json(entry.value)
                except (ValueError, KeyError, TypeError):
                    log.warning("ignoring malformed pod record %r", entry.key)
                    continue
                if record.spec.name != entry.key:
                    log.warning(
                        "ignoring pod record %r: it names pod %r", entry.key, record.spec.name
                    )
                    continue
                if record.spec.node in self._nodes:
                    await self._reconcile(record, int(entry.revision or 0))
        finally:
            with contextlib.suppress(Exception):
                await watcher.stop()  # type: ignore[no-untyped-call]

    async def _reconcile(self, record: PodRecord, revision: int) -> None:
        """Act on the latest record of one of our pods (idempotent: redeliveries are fine)."""
        name = record.spec.name
        running = self._running.get(name)
        if running is not None:
            if record.deletion_requested:
                self._request_stop(running, reason="Deleted", message="pod deleted")
            elif record.terminal:
                # Declared lost while this agent was away (paused, partitioned): the job
                # runs elsewhere now, so this copy must stop (fencing).
                # SIGKILL at once: its checkpoints would only race the new attempt's.
                self._request_stop(running, reason=record.status.reason, message="fenced")
                signal_group(running.process.pid, signal.SIGKILL)
            return
        phase = record.status.phase
        if name in self._claimed:
            if record.terminal and record.deletion_requested:
                await self._remove(name)
            return
        if phase == pb.POD_PENDING and not record.deletion_requested:
            await self._start(record, revision)
        elif phase == pb.POD_RUNNING:
            await self._report_lost(name)
        elif record.deletion_requested:
            await self._remove(name)

    async def _report_lost(self, name: str) -> None:
        """A pod a previous incarnation of this agent was running: its process died with it."""
        status = PodStatus(
            pb.POD_FAILED,
            0,
            "NodeLost",
            "the node agent restarted; the pod's process died with the previous one",
        )

        def lose(record: PodRecord) -> PodRecord | None:
            if record.status.phase != pb.POD_RUNNING:
                return None
            return record.with_status(status)

        record = await update_pod(self._kv.pods, name, lose)
        log.warning("pod %s lost with the previous agent", name)
        if record is not None and record.deletion_requested:
            await self._remove(name)

    async def _remove(self, name: str) -> None:
        await self._kv.pods.delete(name)

    async def _start(self, record: PodRecord, revision: int) -> None:
        spec = record.spec
        self._claimed.add(spec.name)
        claim = record.with_status(PodStatus(pb.POD_RUNNING, 0, "", f"running on {spec.node}"))
        try:
            await self._kv.pods.update(spec.name, claim.to_json(), last=revision)
        except APIError as error:
            self._claimed.discard(spec.name)  # changed meanwhile: the watch brings the news
            if is_wrong_last_sequence(error):
                return
            raise
        try:
            process = await self._spawn(spec)
        except asyncio.CancelledError:
            # The agent stops while the pod starts (waiting for its credentials, say): the
            # pod, claimed RUNNING, never runs here; say so before the process ends.
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(
                    self._set_status(spec.name, STOPPED_BEFORE_START), REAP_AFTER_KILL_S
                )
            raise
        except (
            OSError,
            ValueError,
            CredsRefused,
            TimeoutError,
        ) as error:  # PodRefused: a ValueError
            code = 127 if isinstance(error, FileNotFoundError) else 126
            disk = datadisk.disk_error(error)
            message = f"on {spec.node}: {datadisk.describe(disk) if disk else error}"
            failed = PodStatus(pb.POD_FAILED, code, START_ERROR, message)
            await self._set_status(spec.name, failed)
            log.warning("pod %s could not start %s", spec.name, message)
            # a forged record, or an attempt placement says does not live (cancelled, ended,
            # replaced meanwhile), says nothing of the node: only the node's own failures
            # keep it from taking pods
            if not isinstance(error, PodRefused | CredsRefused):
                self._start_failure = (message, time.monotonic())
                with contextlib.suppress(Exception):  # placement hears of it at once
                    await self.check_health()
                    await asyncio.wait_for(self._publish_nodes(ready=True), PROBE_WAIT_S)
            return
        pod = RunningPod(spec=spec, process=process, tree=ProcessTree(pid=process.pid))
        self._running[spec.name] = pod
        cores = self._cores.pin(process.pid, spec.cpu)
        log.info("pod %s started on %s: pid %d, cores %s", spec.name, spec.node, process.pid, cores)
        pod.supervisor = asyncio.create_task(self._supervise(pod), name=f"pod-{spec.name}")

    async def _spawn(self, spec: PodSpec) -> asyncio.subprocess.Process:
        """Start the runner of ``spec``: this agent's argv, the allowlisted environment, the
        job's own folder as working directory, and (on an authenticating server) credentials
        of its own job, given by placement's desk now and removed when the pod ends
        (``CredsRefused`` when the desk says the attempt does not live, ``TimeoutError``
        when no desk answers)."""
        env = runner_environment(
            spec,
            data_dir=self._data_dir,
            nats_url=self._nats_url,
            namespace=self._subjects.namespace,
            host=self._host_env,
        )
        if self._runner_creds_dir is not None:
            text = await request_runner_creds(
                connection_of(self._js),
                self._subjects,
                job_id=spec.job_id,
                attempt=spec.attempt,
                wait_s=self._runner_creds_wait_s,
            )
            creds = write_secret(self._runner_creds_dir / f"{spec.name}.creds", text)
            env[CREDS_ENV] = str(creds)
        workdir = runner_task(spec, data_dir=self._data_dir).job_dir
        log_path = self._log_dir / f"{spec.name}.log"

        def prepare() -> BinaryIO:
            datadisk.check_mounted(self._data_dir)  # never a job's folder on the disk under it
            private_folder(workdir)
            return open_log(log_path)

        # in a thread, and not for ever: a hung data disk must not freeze the agent's loop
        # (its heartbeats, its other pods)
        preparing = asyncio.ensure_future(asyncio.to_thread(prepare))
        done, _ = await asyncio.wait({preparing}, timeout=self._probe_stall_s)
        if not done:
            preparing.add_done_callback(_close_late_file)
            raise datadisk.NotAnswering(
                self._data_dir, "making the pod's folder", self._probe_stall_s
            )
        with preparing.result() as log_file:
            return await asyncio.create_subprocess_exec(
                *module_argv(self._runner_module),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log_file,
                stderr=asyncio.subprocess.STDOUT,
                env=env,
                cwd=workdir,
                start_new_session=True,
                preexec_fn=die_with_parent(),
                umask=UMASK,  # its outputs and checkpoints: no other account reads them
            )

    async def _supervise(self, pod: RunningPod) -> None:
        """Wait for the pod's process, killing it when its tree exceeds the memory limit."""
        limit = pod.spec.memory_mb * MIB
        exited = asyncio.create_task(pod.process.wait())
        while not exited.done():
            await asyncio.wait({exited}, timeout=self._memory_poll_s)
            if exited.done() or pod.oom_rss_mb:
                continue
            rss = pod.tree.rss_bytes()
            if rss > limit:
                pod.oom_rss_mb = rss // MIB
                signal_group(pod.process.pid, signal.SIGKILL)
        returncode = exited.result()
        signal_group(pod.process.pid, signal.SIGKILL)  # whatever it left behind in its group
        if pod.killer is not None:
            pod.killer.cancel()
        status = final_status(
            returncode,
            oom_rss_mb=pod.oom_rss_mb,
            memory_mb=pod.spec.memory_mb,
            stop_reason=pod.stop_reason,
            stop_message=pod.stop_message,
        )
        log.info(
            ENDED_LINE,
            pod.spec.name,
            status.reason,
            status.message,
            pod.process.pid,
            returncode,
        )
        if self._runner_creds_dir is not None:
            (self._runner_creds_dir / f"{pod.spec.name}.creds").unlink(missing_ok=True)
        try:
            record = await self._set_status(pod.spec.name, status)
            if record is not None and record.deletion_requested:
                await self._remove(pod.spec.name)
        finally:
            self._running.pop(pod.spec.name, None)

    async def _set_status(self, name: str, status: PodStatus) -> PodRecord | None:
        """Write a pod's status, retrying for as long as NATS does not answer: a terminal
        status given up on would leave the pod RUNNING with no process, until the watcher's
        silence rule charged its job with a lost run; an agent that cannot report its pods
        yet is the node's trouble, and the status goes out when NATS is back (an agent
        killed meanwhile has its successor report the pod NodeLost)."""
        attempt = 0
        while True:
            try:
                return await update_pod(self._kv.pods, name, lambda r: r.with_status(status))
            except (nats.errors.TimeoutError, nats.errors.NoRespondersError) as error:
                attempt += 1
                delay = min(STATUS_RETRY_MAX_S, 0.2 * 2 ** min(attempt, 10))
                log.warning(
                    "writing the status of %s failed (%s, try %d); trying again in %.1f s",
                    name,
                    type(error).__name__,
                    attempt,
                    delay,
                )
                await asyncio.sleep(delay)

    def _request_stop(self, pod: RunningPod, *, reason: str, message: str) -> None:
        """SIGTERM the pod's group now, SIGKILL after the grace period."""
        if pod.stop_reason:
            return
        pod.stop_reason, pod.stop_message = reason, message
        signal_group(pod.process.pid, signal.SIGTERM)
        pod.killer = asyncio.create_task(self._kill_after_grace(pod))

    async def _kill_after_grace(self, pod: RunningPod) -> None:
        await asyncio.sleep(self._grace_s)
        if pod.process.returncode is None:
            log.warning("pod %s ignored SIGTERM for %.0f s: SIGKILL", pod.spec.name, self._grace_s)
            signal_group(pod.process.pid, signal.SIGKILL)

    async def _stop_all(self, *, reason: str, message: str) -> None:
        pods = list(self._running.values())
        for pod in pods:
            self._request_stop(pod, reason=reason, message=message)
        supervisors = [pod.supervisor for pod in pods if pod.supervisor is not None]
        if supervisors:
            await asyncio.wait(supervisors, timeout=self._grace_s + REAP_AFTER_KILL_S)
