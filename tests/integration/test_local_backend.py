"""The local execution backend against real NATS, with its node agent as a real subprocess.

Pods are tiny Python scripts (the agent's runner module is mdq.testing.scripted_runner, which
runs the script in the pod's job spec: a record never names a command); the agent runs them,
enforces their memory limit, stops them on deletion, dies with its runners on kill -9 and
reports them NodeLost after a restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from nats.aio.client import Client

from mdq.backends.factory import UnknownBackend, make_backend
from mdq.backends.launch import inherited_environment
from mdq.backends.local.agent import REAP_AFTER_KILL_S
from mdq.backends.local.api import LocalBackend
from mdq.backends.local.launcher import start_agent
from mdq.backends.local.records import NodeRecord, PodRecord, ensure_buckets
from mdq.backends.port import PodExists, PodSpec, PodUpdate
from mdq.bus.connect import connect
from mdq.bus.security.auth import issue
from mdq.bus.security.permissions import service_permissions
from mdq.bus.streams import ensure_streams
from mdq.bus.subjects import Subjects
from mdq.contracts import pb
from mdq.core.nodes import NodeSample
from mdq.core.runner_task import RunnerTask
from mdq.embedded import start_nats
from mdq.testing.scripted_runner import scripted_spec
from mdq.testing.tasks import Background
from tests.helpers import agent_running, closed_nats, eventually, reconnected

NODES = ("n1", "n2")
FAST = {
    "heartbeat_s": "0.3",
    "grace_s": "2",
    "memory_poll_s": "0.2",
    "cpu_per_node": "1",
    "memory_mb_per_node": "2048",
    "runner_module": "mdq.testing.scripted_runner",
}
STOPS_WITHIN_S = float(FAST["grace_s"]) + 3 * REAP_AFTER_KILL_S + 2.0
"""The agent's own worst case for a stop (``agent.REAP_AFTER_KILL_S``), and 2 s to close."""


class Agents:
    """Node agent processes of one test (killed at the end whatever happens)."""

    def __init__(self, *, nats_url: str, namespace: str, data_dir: Path) -> None:
        self._nats_url, self._namespace, self.data_dir = nats_url, namespace, data_dir
        self.processes: list[subprocess.Popen[bytes]] = []

    def start(self, nodes: tuple[str, ...] = NODES, **settings: str) -> subprocess.Popen[bytes]:
        process = start_agent(
            nats_url=self._nats_url,
            namespace=self._namespace,
            data_dir=self.data_dir,
            node_names=nodes,
            settings={**FAST, **settings},
        )
        self.processes.append(process)
        return process

    def log(self) -> str:
        path = self.data_dir / "local-agent.log"
        return path.read_text(errors="replace") if path.exists() else ""


@pytest.fixture
def agents(nats_url: str, namespace: str, data_dir: Path) -> Iterator[Agents]:
    launched = Agents(nats_url=nats_url, namespace=namespace, data_dir=data_dir)
    yield launched
    for process in launched.processes:
        if process.poll() is None:
            process.kill()
            process.wait()


@pytest.fixture
async def backend(nc: Client, subjects: Subjects) -> AsyncIterator[LocalBackend]:
    local = LocalBackend(nc=nc, subjects=subjects, heartbeat_timeout_s=1.5)
    yield local
    await local.close()


def pod(name: str, code: str, *, node: str = "n1", memory_mb: int = 256) -> PodSpec:
    return PodSpec(
        name=name,
        job_id=name.removeprefix("mdq-").rsplit("-", 1)[0],
        attempt=int(name.rsplit("-", 1)[1]),
        node=node,
        cpu=1.0,
        memory_mb=memory_mb,
        priority_class="normal",
        spec=scripted_spec(code),
    )


async def until_terminal(backend: LocalBackend, name: str, within: float = 15.0) -> PodUpdate:
    async def probe() -> PodUpdate | None:
        update = await backend.get_pod(name)
        if update and update.phase in (pb.POD_SUCCEEDED, pb.POD_FAILED):
            return update
        return None

    return await eventually(probe, within=within, what=f"{name} to end")


async def until_phase(backend: LocalBackend, name: str, phase: int) -> PodUpdate:
    async def probe() -> PodUpdate | None:
        update = await backend.get_pod(name)
        return update if update and update.phase == phase else None

    return await eventually(probe, what=f"{name} in phase {pb.PodPhase.Name(phase)}")


async def ready_nodes(backend: LocalBackend) -> list[NodeSample]:
    async def probe() -> list[NodeSample] | None:
        samples = await backend.sample_nodes()
        return samples if [s.name for s in samples if s.ready] == list(NODES) else None

    return await eventually(probe, what="the nodes to be ready")


def is_dead(pid: int) -> bool:
    """Whether ``pid`` is gone (or a zombie)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


async def dies(pid: int) -> bool:
    async def probe() -> bool:
        return is_dead(pid)

    return await eventually(probe, within=5, what=f"process {pid} to die")


def watching_pods(backend: LocalBackend) -> tuple[list[PodUpdate], Background]:
    """Every pod update ``backend`` reports from now on, collected in the list by a task of the
    Background (which the caller closes)."""
    seen: list[PodUpdate] = []

    async def watch() -> None:
        async for update in backend.watch_pods():
            seen.append(update)

    background = Background("the pods watch")
    background.spawn(watch(), name="watch_pods")
    return seen, background


async def test_pods_run_on_their_node_and_report_their_exit(
    agents: Agents, backend: LocalBackend, data_dir: Path
) -> None:
    runs = data_dir / "runs.txt"
    agents.start()
    seen, background = watching_pods(backend)
    ok = pod(
        "mdq-job-ok-1",
        "import os, time; time.sleep(0.5); "
        f"open({str(runs)!r}, 'a').write(os.environ['MDQ_NODE_NAME'] + ' ' "
        "+ os.environ['MDQ_POD_NAME'] + chr(10))",
        node="n2",
    )
    bad = pod("mdq-job-bad-1", "import sys; sys.exit(3)")
    await backend.create_pod(ok)
    await backend.create_pod(bad)
    with pytest.raises(PodExists):
        await backend.create_pod(ok)

    done = await until_terminal(backend, ok.name)
    assert (done.phase, done.reason, done.exit_code) == (pb.POD_SUCCEEDED, "Completed", 0)
    assert (done.job_id, done.attempt, done.node) == ("job-ok", 1, "n2")
    failed = await until_terminal(backend, bad.name)
    assert (failed.phase, failed.reason, failed.exit_code) == (pb.POD_FAILED, "Error", 3)

    # A wrong second run would need a second claim (a write of POD_RUNNING) of a record the
    # agent handles before one written later: once a marker pod on the same node has run,
    # such a claim would be in ``seen``, and its run ended.
    marker = pod("mdq-job-marker-1", "pass", node="n2")
    await backend.create_pod(marker)

    async def marker_ran_and_ok_ended() -> bool:
        ok_last = [u.phase for u in seen if u.pod_name == ok.name][-1:]
        return pb.POD_SUCCEEDED in [u.phase for u in seen if u.pod_name == marker.name] and (
            ok_last == [pb.POD_SUCCEEDED]
        )

    await eventually(marker_ran_and_ok_ended, what="the marker pod to run after ok")
    assert runs.read_text() == "n2 mdq-job-ok-1\n"
    assert (data_dir / "pods" / "mdq-job-ok-1.log").exists()
    phases = [u.phase for u in seen if u.pod_name == ok.name]
    assert phases == [pb.POD_PENDING, pb.POD_RUNNING, pb.POD_SUCCEEDED] or phases == [
        pb.POD_RUNNING,
        pb.POD_SUCCEEDED,
    ], phases
    await background.close()  # raises what the watch failed with, if it did

    # A watch started now reports the current state of every pod first.
    current: dict[str, PodUpdate] = {}
    async for update in backend.watch_pods():
        current[update.pod_name] = update
        if len(current) == 3:
            break
    assert current[ok.name].phase == pb.POD_SUCCEEDED
    assert current[bad.name].phase == pb.POD_FAILED


async def test_a_pod_above_its_memory_limit_is_oom_killed(
    agents: Agents, backend: LocalBackend
) -> None:
    agents.start()
    hog = pod(
        "mdq-job-hog-1",
        "import time; block = bytearray(b'x') * (400 * 1024 * 1024); time.sleep(30)",
        memory_mb=96,
    )
    await backend.create_pod(hog)
    ended = await until_terminal(backend, hog.name, within=20)
    assert (ended.phase, ended.reason, ended.exit_code) == (pb.POD_FAILED, "OOMKilled", 137)
    assert "96 MiB" in ended.message


async def test_delete_pod_stops_a_running_pod(
    agents: Agents, backend: LocalBackend, data_dir: Path
) -> None:
    pid_file = data_dir / "sleeper.pid"
    agents.start()
    sleeper = pod(
        "mdq-job-sleep-1",
        f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(60)",
    )
    await backend.create_pod(sleeper)
    await until_phase(backend, sleeper.name, pb.POD_RUNNING)
    pid = int(await eventually(_read_text(pid_file), what="the pod's pid"))

    await backend.delete_pod(sleeper.name)
    assert await dies(pid), "the deleted pod's process is still alive"
    await eventually(_gone(backend, sleeper.name), what="the deleted pod to be removed")
    await backend.delete_pod(sleeper.name)  # deleting again is a no-op
    await backend.delete_pod("mdq-never-existed-1")


async def test_kill_9_of_the_agent_kills_its_runners_and_restart_reports_node_lost(
    agents: Agents, backend: LocalBackend, data_dir: Path, nc: Client, subjects: Subjects
) -> None:
    runs = data_dir / "runs.txt"
    pid_file = data_dir / "victim.pid"
    agent = agents.start()
    finished = pod("mdq-job-done-1", f"open({str(runs)!r}, 'a').write('done' + chr(10))", node="n2")
    victim = pod(
        "mdq-job-victim-1",
        f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(60)",
    )
    await backend.create_pod(finished)
    await backend.create_pod(victim)
    await until_terminal(backend, finished.name)
    pods = await nc.jetstream().key_value(subjects.pods_bucket)
    finished_revision = (await pods.get(finished.name)).revision
    await until_phase(backend, victim.name, pb.POD_RUNNING)
    pid = int(await eventually(_read_text(pid_file), what="the victim's pid"))

    agent.kill()
    agent.wait()
    assert await dies(pid), "a runner outlived its agent's kill -9"
    assert (await backend.get_pod(victim.name)) is not None

    agents.start()
    lost = await until_terminal(backend, victim.name)
    assert (lost.phase, lost.reason) == (pb.POD_FAILED, "NodeLost")
    await ready_nodes(backend)
    # The restarted agent handles the records it finds before one written now: once a marker
    # pod has run on the same node, a rerun of the finished pod would have claimed it (a
    # write of POD_RUNNING), and its record would have a newer revision.
    marker = pod("mdq-job-marker-1", "pass", node="n2")
    await backend.create_pod(marker)
    assert (await until_terminal(backend, marker.name)).phase == pb.POD_SUCCEEDED
    done = await backend.get_pod(finished.name)
    assert done is not None and done.phase == pb.POD_SUCCEEDED
    assert (await pods.get(finished.name)).revision == finished_revision, "claimed again"
    assert runs.read_text() == "done\n", "the restarted agent ran a finished pod again"


async def test_nodes_heartbeat_capacity_and_turn_not_ready_when_their_agent_dies(
    agents: Agents, backend: LocalBackend
) -> None:
    agent = agents.start()
    samples = await ready_nodes(backend)
    capacities = [(s.name, s.cpu_capacity, s.memory_capacity_mb) for s in samples]
    assert capacities == [("n1", 1.0, 2048), ("n2", 1.0, 2048)]
    assert all(0 <= s.cpu_load <= 1 and 0 <= s.memory_load <= 1 for s in samples)

    busy = pod(
        "mdq-job-busy-1", "import time\nend = time.time() + 60\nwhile time.time() < end: pass"
    )
    await backend.create_pod(busy)

    async def loaded() -> NodeSample | None:
        # An idle node reports no load; how much a busy loop shows depends on how much CPU
        # the machine gives it (little on a loaded 2-core CI machine), so any clear load will do.
        n1 = next(s for s in await backend.sample_nodes() if s.name == "n1")
        return n1 if n1.cpu_load > 0.05 else None

    busy_node = await eventually(loaded, what="n1 to show the busy pod's CPU load")
    assert busy_node.memory_load > 0

    agent.kill()
    agent.wait()

    async def not_ready() -> list[NodeSample] | None:
        samples = await backend.sample_nodes()
        return samples if samples and not any(s.ready for s in samples) else None

    gone = await eventually(not_ready, within=5, what="the nodes to turn not ready")
    assert [s.name for s in gone] == list(NODES)


async def test_sigterm_stops_the_agent_cleanly_and_evicts_its_pods(
    agents: Agents, backend: LocalBackend
) -> None:
    agent = agents.start()
    sleeper = pod("mdq-job-evict-1", "import time; time.sleep(60)")
    await backend.create_pod(sleeper)
    await until_phase(backend, sleeper.name, pb.POD_RUNNING)
    agent.terminate()
    assert agent.wait(timeout=STOPS_WITHIN_S) == 0, agents.log()
    evicted = await backend.get_pod(sleeper.name)
    assert evicted is not None
    assert (evicted.phase, evicted.reason) == (pb.POD_FAILED, "Evicted")
    assert not any(s.ready for s in await backend.sample_nodes())


async def test_sigterm_while_a_pod_waits_for_its_credentials_reports_it_evicted(
    tmp_path: Path,
) -> None:
    """A pod the agent has claimed (RUNNING) but whose process it has not started yet, here
    because no placement desk answers for its runner's credentials, is reported Evicted when
    the agent stops: never left RUNNING with no process behind it."""
    subjects = Subjects("mdq")
    with closed_nats("mdq-agent-stop-") as (server, trust, folder):

        def creds(identity: str) -> Path:
            permissions = service_permissions(identity, subjects)
            return issue(trust, permissions, folder / f"{identity}.creds")

        admin = await connect(server.url, name="admin", creds=creds("admin"))
        await ensure_streams(admin.jetstream(), subjects)
        await ensure_buckets(admin.jetstream(), subjects)
        await admin.close()
        placement = await connect(server.url, name="placement", creds=creds("placement"))
        backend = LocalBackend(nc=placement, subjects=subjects, heartbeat_timeout_s=1.5)
        settings = {**FAST, "runner_creds_wait_s": "60"}
        agent_log = tmp_path / "agent.log"
        with agent_running(
            server.url,
            "mdq",
            tmp_path / "data",
            NODES,
            settings,
            creds=creds("agent"),
            log_file=agent_log,
        ) as agent:
            await ready_nodes(backend)
            waiting = pod("mdq-job-nocreds-1", "import time; time.sleep(60)")
            await backend.create_pod(waiting)
            await until_phase(backend, waiting.name, pb.POD_RUNNING)  # claimed, not started
            agent.terminate()
            stopped_in_time = await asyncio.to_thread(agent.wait, STOPS_WITHIN_S)
            assert stopped_in_time == 0, agent_log.read_text()
            stopped = await backend.get_pod(waiting.name)
        await backend.close()
        await placement.close()
    assert stopped is not None
    assert (stopped.phase, stopped.reason) == (pb.POD_FAILED, "Evicted")
    assert "before the pod's process started" in stopped.message


async def test_the_factory_makes_the_local_backend_and_refuses_unknown_kinds(
    nc: Client, subjects: Subjects
) -> None:
    local = await make_backend(kind="local", nc=nc, subjects=subjects)
    assert isinstance(local, LocalBackend)
    assert await local.sample_nodes() == []
    await local.close()
    with pytest.raises(UnknownBackend, match="nomad"):
        await make_backend(kind="nomad", nc=nc, subjects=subjects)


def _read_text(path: Path) -> Callable[[], Awaitable[str | None]]:
    def read() -> str | None:
        return path.read_text() if path.exists() else None

    async def probe() -> str | None:
        return await asyncio.to_thread(read)

    return probe


def _gone(backend: LocalBackend, name: str) -> Callable[[], Awaitable[bool]]:
    async def probe() -> bool:
        return await backend.get_pod(name) is None

    return probe


def marked_alive(name: str) -> bool:
    """Whether a process of pod ``name`` (by its MDQ_POD_NAME) is still alive."""
    for process in psutil.process_iter():
        try:
            if process.environ().get("MDQ_POD_NAME") == name and process.status() != "zombie":
                return True
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return False


async def test_silent_node_is_lost_and_its_pods_fenced_when_it_returns(
    agents: Agents, backend: LocalBackend
) -> None:
    import os
    import signal

    agent = agents.start(("n1",))
    await eventually(lambda: _ready(backend, "n1"), what="n1 ready")
    name = "mdq-paused-1"
    await backend.create_pod(pod(name, "import time; time.sleep(120)"))
    await until_phase(backend, name, pb.POD_RUNNING)

    async def alive() -> bool:
        return marked_alive(name)

    await eventually(alive, what="the pod's process")
    seen, background = watching_pods(backend)
    try:
        os.kill(agent.pid, signal.SIGSTOP)  # the node stops answering, its pod keeps running
        lost = await until_terminal(backend, name, within=20)
        assert (lost.phase, lost.reason) == (pb.POD_FAILED, "NodeLost")
        assert any(u.pod_name == name and u.reason == "NodeLost" for u in seen)
        assert marked_alive(name)
        os.kill(agent.pid, signal.SIGCONT)  # the node comes back: the stale copy must stop

        async def gone() -> bool:
            return not marked_alive(name)

        await eventually(gone, within=15, what="the fenced pod's process to stop")
    finally:
        os.kill(agent.pid, signal.SIGCONT)
        await background.close()  # raises what the watch failed with, if it did


async def _ready(backend: LocalBackend, node: str) -> bool:
    return any(s.name == node and s.ready for s in await backend.sample_nodes())


async def test_nodes_that_keep_heartbeating_stay_ready_across_a_nats_server_restart(
    tmp_path: Path,
) -> None:
    """After a NATS server restart a KV watch can stay silent for many seconds while the
    heartbeats go on being written; the backend must not take that silence for dead nodes
    (which marked every running pod NodeLost in the chaos campaign)."""
    server = start_nats(tmp_path / "nats")
    subjects = Subjects("heartbeat")
    client = await connect(server.url, name="test-heartbeat", subjects=subjects)
    backend = LocalBackend(nc=client, subjects=subjects, heartbeat_timeout_s=1.5)
    nodes = (await backend.buckets()).nodes
    stop = asyncio.Event()

    async def heartbeat() -> None:  # what a node agent writes
        while not stop.is_set():
            record = NodeRecord(
                NodeSample(
                    name="n1",
                    cpu_capacity=1.0,
                    memory_capacity_mb=1024,
                    ready=True,
                    cpu_load=0.0,
                    memory_load=0.0,
                ),
                heartbeat_unix=time.time(),
            )
            with contextlib.suppress(Exception):  # NATS away for a moment: beat again
                await nodes.put("n1", record.to_json())
            await asyncio.sleep(0.3)

    beating = asyncio.create_task(heartbeat())
    try:
        assert [s.ready for s in await ready_nodes_of(backend)] == [True]
        server.kill()
        await asyncio.sleep(1.0)
        server = start_nats(tmp_path / "nats", port=server.port)
        await reconnected(client)
        await asyncio.sleep(2.0)  # the heartbeats resume; the outage itself is over
        verdicts = []
        for _ in range(30):  # ten seconds of samples
            verdicts.append([s.ready for s in await backend.sample_nodes()])
            await asyncio.sleep(1 / 3)
        assert verdicts == [[True]] * 30
    finally:
        stop.set()
        await beating
        await backend.close()
        await client.close()
        server.stop()


async def ready_nodes_of(backend: LocalBackend) -> list[NodeSample]:
    async def ready() -> list[NodeSample] | None:
        samples = await backend.sample_nodes()
        return samples if samples and all(s.ready for s in samples) else None

    return await eventually(ready, what="the node to be ready")


def environ_names(pid: int) -> set[bytes]:
    """The variable names of a live process, read from outside (/proc/<pid>/environ)."""
    entries = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return {entry.split(b"=", 1)[0] for entry in entries if entry}


async def test_a_runner_sees_only_the_allowlisted_environment_in_its_job_folder(
    agents: Agents, backend: LocalBackend, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The agent's secrets stay with the agent: its pods see the allowlist
    (mdq.backends.launch), the task, the bus and their own name, nothing else; they run in
    their job's own folder. Read from inside the pod and, from outside, /proc/<pid>/environ."""
    monkeypatch.setenv("DATABASE_URL", "postgresql://mdq:hunter2@127.0.0.1/mdq")
    monkeypatch.setenv("MDQ_TEST_API_TOKEN", "s3cret")
    monkeypatch.setenv("PYTHONSTARTUP", "/tmp/not-for-runners.py")
    monkeypatch.setenv("MDQ_RUNNER_MAX_CHUNK_STEPS", "77")
    agents.start()
    seen_file = data_dir / "seen.json"
    code = (
        "import json, os, time; json.dump({'env': dict(os.environ), 'cwd': os.getcwd(), "
        f"'pid': os.getpid()}}, open({str(seen_file)!r}, 'w')); time.sleep(60)"
    )
    spy = pod("mdq-job-env-1", code)
    await backend.create_pod(spy)

    async def seen() -> dict[str, Any] | None:
        try:
            return dict(json.loads(seen_file.read_text()))
        except (OSError, ValueError):
            return None

    report = await eventually(seen, what="the pod to report its environment")
    env: dict[str, str] = report["env"]
    for secret in ("DATABASE_URL", "MDQ_TEST_API_TOKEN", "PYTHONSTARTUP"):
        assert secret not in env
    assert env["MDQ_RUNNER_MAX_CHUNK_STEPS"] == "77"
    assert (env["MDQ_JOB_ID"], env["MDQ_ATTEMPT"], env["MDQ_POD_NAME"]) == (
        "job-env",
        "1",
        "mdq-job-env-1",
    )
    assert env["MDQ_JOB_DIR"] == str(data_dir / "jobs" / "job-env")
    task_and_bus = set(RunnerTask.from_env(env).to_env()) | {
        "NATS_URL",
        "MDQ_NAMESPACE",
        "MDQ_DATA_DIR",
        "MDQ_POD_NAME",
        "MDQ_NODE_NAME",
    }
    assert set(env) - task_and_bus == set(inherited_environment(env))
    assert Path(report["cwd"]) == (data_dir / "jobs" / "job-env").resolve()
    names = environ_names(int(report["pid"]))
    assert b"DATABASE_URL" not in names and b"MDQ_TEST_API_TOKEN" not in names
    assert b"MDQ_JOB_ID" in names
    await backend.delete_pod(spy.name)


async def test_a_forged_pod_record_runs_no_command_and_no_environment_of_its_own(
    agents: Agents,
    backend: LocalBackend,
    data_dir: Path,
    nc: Client,
    subjects: Subjects,
    tmp_path: Path,
) -> None:
    """Whoever writes the pods bucket cannot run a program: a record's "command" and "env"
    are ignored (and logged), the agent starts the real runner, which validates the spec
    again and refuses it (INVALID_INPUT); a record whose job id is a path fails to start."""
    agents.start(runner_module="services.runner")
    await ready_nodes(backend)
    pods = await nc.jetstream().key_value(subjects.pods_bucket)
    pwned = tmp_path / "pwned"
    invalid = pb.JobSpec(name="forged", temperature_k=-5.0)
    record = PodRecord(
        spec=PodSpec(
            name="mdq-forged-1",
            job_id="forged",
            attempt=1,
            node="n1",
            cpu=1.0,
            memory_mb=512,
            priority_class="normal",
            spec=invalid,
        )
    )
    document = json.loads(record.to_json())
    document["command"] = ["sh", "-c", f"touch {pwned}"]
    document["env"] = {"PYTHONSTARTUP": str(tmp_path / "x.py"), "LD_PRELOAD": "/no/such.so"}
    await pods.put("mdq-forged-1", json.dumps(document).encode())
    escaping = dict(document, name="mdq-esc-1", job_id="../../esc")
    await pods.put("mdq-esc-1", json.dumps(escaping).encode())

    forged = await until_terminal(backend, "mdq-forged-1", within=60)
    assert (forged.phase, forged.exit_code) == (pb.POD_FAILED, 3)
    assert not pwned.exists()
    runner_log = (data_dir / "pods" / "mdq-forged-1.log").read_text()
    assert "INVALID_INPUT: the job spec is invalid: spec.temperature_k" in runner_log
    assert "fields mdq never writes (command, env)" in agents.log()
    escaped = await until_terminal(backend, "mdq-esc-1")
    assert (escaped.phase, escaped.reason) == (pb.POD_FAILED, "StartError")
    assert "is not a plain name" in escaped.message
    assert not (data_dir.parent / "esc").exists() and not pwned.exists()
