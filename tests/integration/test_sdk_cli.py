"""The SDK, the CLI and the stack against real NATS JetStream, real PostgreSQL and the real
intake service (``python -m services.intake`` as a subprocess).

Nothing here answers in intake's place: submits go through the intake process, refusals are
its refusals. Node loads and the lifecycle events that placement/watcher would publish are
written to the log with the shared EventPublisher, because the SDK's job is to read the log.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import nats
import nats.errors
import psutil
import pytest
from nats.js.api import KeyValueConfig
from nats.js.errors import NotFoundError
from typer.testing import CliRunner, Result

from mdq.bus.connect import auth_options, connect
from mdq.bus.publisher import EventPublisher
from mdq.bus.subjects import Subjects
from mdq.cli.main import app
from mdq.contracts import pb
from mdq.core.ids import job_id, request_id_for_key
from mdq.core.producers import owner_of
from mdq.core.spec import validate_submit
from mdq.core.state import JobState
from mdq.embedded import end_process
from mdq.errors import InvalidInput, NotFound
from mdq.sdk import MdqClient, SubmitRefused, WaitTimeout, load_job_file
from mdq.stack import STACK_FILE, Stack, read_stack_info
from tests.helpers import intake_answering, wait_for

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "examples" / "demo.yaml"
INVALID = REPO / "examples" / "invalid-cpu.yaml"
INTAKE_NAMESPACE = "sdkcli" + os.urandom(3).hex()


# -- fixtures ------------------------------------------------------------------------------
async def _intake_answers(
    nats_url: str, subjects: Subjects, timeout: float = 30.0, *, creds: str = ""
) -> None:
    """Wait until intake answers request-reply submits (any answer will do)."""
    nc = await nats.connect(nats_url, **auth_options(creds or None))
    try:
        await intake_answering(nc, subjects.api_submit, within=timeout)
    finally:
        await nc.close()


@pytest.fixture(scope="module")
def intake(nats_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Subjects]:
    """The real intake service, as its own process, on a namespace of this module."""
    subjects = Subjects(INTAKE_NAMESPACE)
    log = tmp_path_factory.mktemp("intake") / "intake.log"
    env = {**os.environ, "NATS_URL": nats_url, "MDQ_NAMESPACE": subjects.namespace}
    with log.open("wb") as output:
        process = subprocess.Popen(
            [sys.executable, "-m", "services.intake"],
            env=env,
            cwd=REPO,
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    try:
        asyncio.run(_intake_answers(nats_url, subjects))
        yield subjects
    finally:
        end_process(process, timeout=10)


@pytest.fixture
async def client(nats_url: str, intake: Subjects) -> AsyncIterator[MdqClient]:
    async with await MdqClient.connect(nats_url, intake.namespace) as the_client:
        yield the_client


def _cli(nats_url: str, namespace: str, *args: str, state_dir: Path | None = None) -> Result:
    env = {"NATS_URL": nats_url, "MDQ_NAMESPACE": namespace, "DATABASE_URL": ""}
    if state_dir is not None:
        env = {"NATS_URL": "", "MDQ_NAMESPACE": "", "DATABASE_URL": ""}
        args = ("--state-dir", str(state_dir), *args)
    return CliRunner().invoke(app, list(args), env=env, catch_exceptions=False)


# -- the job file of the demo --------------------------------------------------------------
def test_the_demo_campaign_is_a_valid_submit() -> None:
    request = load_job_file(DEMO)
    accepted = validate_submit(
        request,
        request_id=request_id_for_key(request.idempotency_key),
        resolve_external=lambda _ref: None,
        key_required=True,
    )
    by_name = {job.name: job for job in accepted}
    md = [job for job in accepted if job.spec.task == pb.TASK_MD and not job.depends_on_names]
    assert len(md) >= 3
    assert len({job.spec.temperature_k for job in md}) == len(md)
    for job in md:
        assert 1000 <= job.spec.steps <= 5000
        assert job.spec.report_interval_steps == 250
        assert job.spec.checkpoint_interval_steps == 1000
        assert job.spec.system.water_box.box_nm <= 2.5
    # The chain minimize → run → analyze, in dependency order.
    tasks = [by_name[name].spec.task for name in ("chain-minimize", "chain-run", "chain-analyze")]
    assert tasks == [pb.TASK_MINIMIZE, pb.TASK_MD, pb.TASK_ANALYZE]
    assert by_name["chain-run"].depends_on_names == ("chain-minimize",)
    assert by_name["chain-analyze"].depends_on_names == ("chain-run",)
    order = [job.name for job in accepted]
    assert order.index("chain-minimize") < order.index("chain-run") < order.index("chain-analyze")


# -- mdq submit through the real intake ----------------------------------------------------
def test_mdq_submit_prints_the_job_ids_intake_assigned(nats_url: str, intake: Subjects) -> None:
    result = _cli(nats_url, intake.namespace, "submit", str(DEMO))
    assert result.exit_code == 0, result.output
    request = load_job_file(DEMO)
    expected = [job_id(request_id_for_key("demo"), job.name) for job in request.jobs]
    assert result.stdout.split() == expected

    async def submitted_events() -> list[pb.Event]:
        nc = await connect(nats_url, name="test")
        try:
            js = nc.jetstream()
            events = []
            for job in expected:
                raw = await js.get_last_msg(intake.jobs_stream, intake.job(job, "submitted"))
                event = pb.Event()
                event.ParseFromString(raw.data or b"")
                events.append(event)
            return events
        finally:
            await nc.close()

    events = asyncio.run(submitted_events())
    assert [event.job_id for event in events] == expected
    assert events[0].submitted.spec.temperature_k == 280
    # Same key again: the same ids, nothing new.
    again = _cli(nats_url, intake.namespace, "submit", str(DEMO))
    assert again.exit_code == 0 and again.stdout.split() == expected


def test_mdq_submit_refused_by_intake_exits_2_naming_the_field(
    nats_url: str, intake: Subjects
) -> None:
    result = _cli(nats_url, intake.namespace, "submit", str(INVALID))
    assert result.exit_code == InvalidInput.exit_code
    assert "jobs[0].resources.cpu" in result.output
    assert "between 0.1 and 256" in result.output

    async def created() -> bool:
        nc = await connect(nats_url, name="test")
        try:
            key_id = request_id_for_key("invalid-cpu-example")
            await nc.jetstream().get_last_msg(
                intake.jobs_stream, intake.job(job_id(key_id, "too-greedy"), "submitted")
            )
            return True
        except NotFoundError:
            return False
        finally:
            await nc.close()

    assert not asyncio.run(created())


def test_a_bad_job_file_exits_2_before_anything_is_sent(
    nats_url: str, intake: Subjects, tmp_path: Path
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("jobs:\n  - name: a\n    temprature_k: 300\n")
    result = _cli(nats_url, intake.namespace, "submit", str(bad))
    assert result.exit_code == InvalidInput.exit_code
    assert "jobs[0].temprature_k" in result.output


def test_mdq_submit_without_a_stack_or_nats_url_says_so(tmp_path: Path) -> None:
    result = _cli("", "", "submit", str(DEMO), state_dir=tmp_path)
    assert result.exit_code == 3
    assert "mdq up" in result.output


# -- mdq nodes ------------------------------------------------------------------------------
def report_loads(nats_url: str, namespace: str, loads: list[tuple[pb.NodeLoad, str]]) -> None:
    """Publish each node load, with its detail, as the metrics service does."""
    subjects = Subjects(namespace)

    async def publish() -> None:
        nc = await connect(nats_url, name="test", subjects=subjects)
        try:
            publisher = EventPublisher(js=nc.jetstream(), subjects=subjects, producer="metrics")
            for body, detail in loads:
                await publisher.emit("node_load", body, job_id="", attempt=0, detail=detail)
        finally:
            await nc.close()

    asyncio.run(publish())


def test_mdq_nodes_shows_the_latest_load_of_each_node(nats_url: str, namespace: str) -> None:
    loads = []
    for node, cpu_load, detail in (
        ("node-a", 0.10, 1),
        ("node-b", 0.55, 1),
        ("node-a", 0.73, 2),  # the latest of node-a
    ):
        body = pb.NodeLoad(
            node=node,
            cpu_load=cpu_load,
            memory_load=0.25,
            cpu_capacity=4,
            memory_capacity_mb=8192,
            ready=node == "node-a",
        )
        loads.append((body, f"{node}:{detail}"))
    report_loads(nats_url, namespace, loads)
    result = _cli(nats_url, namespace, "nodes")
    assert result.exit_code == 0, result.output
    lines = {line.split()[1]: line for line in result.stdout.splitlines() if "node-" in line}
    assert set(lines) == {"node-a", "node-b"}
    assert "73%" in lines["node-a"] and "10%" not in lines["node-a"]
    assert "55%" in lines["node-b"]
    assert "yes" in lines["node-a"] and "no" in lines["node-b"]


def test_mdq_nodes_names_each_node_within_its_cluster(nats_url: str, namespace: str) -> None:
    loads = [
        (
            pb.NodeLoad(
                node=f"{cluster}/local-1",
                cpu_capacity=2,
                memory_capacity_mb=2048,
                ready=True,
                cluster=cluster,
                cluster_labels=labels,
            ),
            f"{cluster}:1",
        )
        for cluster, labels in (("lab1", {"site": "lab1"}), ("hpc", {"gpu": "true"}))
    ]
    report_loads(nats_url, namespace, loads)
    result = _cli(nats_url, namespace, "nodes")
    assert result.exit_code == 0, result.output
    rows = {
        cells[0]: cells
        for line in result.stdout.splitlines()
        if "/" in line and (cells := [c.strip() for c in line.strip("│ ").split("│")])
    }
    assert rows["lab1/local-1"][1:3] == ["lab1", "site=lab1"]
    assert rows["hpc/local-1"][1:3] == ["hpc", "gpu=true"]


def test_mdq_nodes_says_why_a_node_takes_no_new_pods(nats_url: str, namespace: str) -> None:
    full = "data disk full (ENOSPC): No space left on device"
    loads = [
        (
            pb.NodeLoad(
                node=node, cpu_capacity=2, memory_capacity_mb=2048, ready=True, problem=problem
            ),
            f"{node}:1",
        )
        for node, problem in (("node-a", full), ("node-b", ""))
    ]
    report_loads(nats_url, namespace, loads)
    result = _cli(nats_url, namespace, "nodes")
    assert result.exit_code == 0, result.output
    assert "takes no new pods" in result.stdout
    lines = {line.split()[1]: line for line in result.stdout.splitlines() if "node-" in line}
    assert full in lines["node-a"] and "ENOSPC" not in lines["node-b"]


def test_mdq_nodes_with_no_node_yet(nats_url: str, namespace: str) -> None:
    result = _cli(nats_url, namespace, "nodes")
    assert result.exit_code == 0
    assert "no node has reported" in result.output


# -- the SDK ------------------------------------------------------------------------------
async def test_wait_and_progress_fold_the_log_of_accepted_jobs(
    client: MdqClient, nats_url: str
) -> None:
    request = load_job_file(DEMO)
    key = f"sdk-{os.urandom(4).hex()}"
    job_ids = await client.submit(request, idempotency_key=key)
    assert job_ids == [job_id(request_id_for_key(key), job.name) for job in request.jobs]
    first, second = job_ids[0], job_ids[1]

    # Nothing has run them: wait times out and says where they are.
    with pytest.raises(WaitTimeout) as timed_out:
        await client.wait([first], timeout=1.0)
    assert timed_out.value.states == {first: JobState.PENDING}

    # What placement, the runner and the watcher would log for the first two jobs.
    js = client.nc.jetstream()
    by = {
        producer: EventPublisher(js=js, subjects=client.subjects, producer=producer)
        for producer in ("placement", "watcher", "runner")
    }
    for job in (first, second):
        await by[owner_of("bound")].emit(
            "bound", pb.JobBound(node="local-0", pod_name=f"mdq-{job}-1"), job_id=job, attempt=1
        )
        await by[owner_of("started")].emit(
            "started", pb.JobStarted(node="local-0"), job_id=job, attempt=1
        )
        for step in (250, 500):
            report = pb.Progress(step=step, target_steps=500, potential_kj_mol=-1000.0 - step)
            await by[owner_of("progress")].emit(
                "progress", report, job_id=job, attempt=1, detail=step
            )
    await by[owner_of("succeeded")].emit(
        "succeeded",
        pb.JobSucceeded(final_step=500, reason="steps_reached"),
        job_id=first,
        attempt=1,
    )
    await by[owner_of("failed")].emit(
        "failed", pb.JobFailed(reason=pb.FAILURE_UNSTABLE, message="NaN"), job_id=second, attempt=1
    )

    states = await client.wait([first, second], timeout=10.0)
    assert states == {first: JobState.SUCCEEDED, second: JobState.FAILED}
    views = await client.wait_views([first], timeout=10.0)
    assert views[first].last_step == 500 and views[first].node == "local-0"

    reports = [(job, report.step) async for job, report in client.progress([first, second])]
    assert sorted(reports) == sorted((job, step) for job in (first, second) for step in (250, 500))

    # `mdq watch` draws the same history: one bar per job, exit 1 as one job failed.
    watched = await asyncio.to_thread(
        _cli, nats_url, client.subjects.namespace, "watch", first, second
    )
    assert watched.exit_code == 1
    assert "bound to local-0" in watched.stdout and "FAILURE_UNSTABLE NaN" in watched.stdout
    [first_bar] = [line for line in watched.stdout.splitlines() if line.startswith(f"{first} ")]
    assert "SUCCEEDED" in first_bar and "500/500" in first_bar and "-1,500.0 kJ/mol" in first_bar


async def test_submit_refused_raises_with_the_field(client: MdqClient) -> None:
    with pytest.raises(SubmitRefused) as refused:
        await client.submit(load_job_file(INVALID), idempotency_key=f"bad-{os.urandom(4).hex()}")
    assert refused.value.field == "jobs[0].resources.cpu"
    assert "256" in refused.value.message


async def test_publish_submit_goes_through_the_stream_and_a_refusal_reaches_wait(
    client: MdqClient,
) -> None:
    good = pb.JobSpec(name="later", steps=1000)
    good_ids = await client.publish_submit([good], idempotency_key=f"pub-{os.urandom(4).hex()}")
    bad = pb.JobSpec(name="bad", steps=1000)
    bad.resources.memory_mb = 10
    bad_ids = await client.publish_submit([bad])  # keyless: the id comes from the sequence
    with pytest.raises(WaitTimeout) as timed_out:
        await client.wait(good_ids, timeout=3.0)
    assert timed_out.value.states == {good_ids[0]: JobState.PENDING}  # intake accepted it
    with pytest.raises(SubmitRefused) as refused:
        await client.wait(bad_ids, timeout=10.0)
    assert refused.value.field == "jobs[0].resources.memory_mb"


# -- the stack ---------------------------------------------------------------------------
def block_until_zombie(pid: int, timeout_s: float = 10.0) -> None:
    """Block, without yielding to the event loop, until ``pid`` is dead and not yet reaped."""
    process = psutil.Process(pid)
    deadline = time.monotonic() + timeout_s
    while process.status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
        time.sleep(0.001)


@pytest.mark.expected_crashes({"intake": 1})
async def test_stack_supervises_and_client_commands_find_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, database_url: str
) -> None:
    """Embedded NATS, a given PostgreSQL, intake supervised: killed, it comes back; the CLI
    finds the stack through stack.json; stopping leaves nothing behind."""
    monkeypatch.delenv("NATS_URL", raising=False)
    state = tmp_path / "state"
    stack = Stack(
        state_dir=state,
        namespace="stk",
        database_url=database_url,
        services=("intake",),
        backend="kubernetes",  # no node agent: only intake is under test here
        metrics_port=0,
        grace_s=15.0,
        max_backoff_s=1.0,
    )
    info = await stack.start()
    try:
        assert info.embedded_nats and not info.embedded_postgres
        assert read_stack_info(state) == info
        with pytest.raises(nats.errors.Error, match="Authorization Violation"):
            await nats.connect(info.nats_url, allow_reconnect=False, max_reconnect_attempts=0)
        assert (state / "logs" / "intake.log").exists()
        await _intake_answers(info.nats_url, Subjects("stk"), creds=info.nats_creds)

        result = await asyncio.to_thread(_cli, "", "", "submit", str(DEMO), state_dir=state)
        assert result.exit_code == 0, result.output
        assert len(result.stdout.split()) == 6

        first_pid = stack.child_pid("intake")
        assert first_pid is not None
        os.kill(first_pid, signal.SIGKILL)
        block_until_zombie(first_pid)  # no await: the supervision cannot notice the exit
        # dead, and not yet seen dead by the supervision: no pid that a second kill would hit
        assert stack.child_pid("intake") is None

        async def noticed() -> bool:
            return stack.child_pid("intake") is None

        await wait_for(noticed, timeout=10, what="the stack noticed that intake died")
        async with await MdqClient.connect(info.nats_url, "stk", creds=info.nats_creds) as client:
            # Published while intake is down: the submit stream keeps it for the next intake.
            queued = await client.publish_submit(
                [pb.JobSpec(name="while-down")], idempotency_key="while-down"
            )

        async def restarted() -> bool:
            return stack.child_pid("intake") is not None

        await wait_for(restarted, timeout=20, what="intake restarted by the stack")
        assert stack.child_pid("intake") not in (None, first_pid)
        [status] = [part for part in stack.status() if part.name == "intake"]
        assert status.restarts == 1 and status.last_exit_code == -signal.SIGKILL
        await _intake_answers(info.nats_url, Subjects("stk"), creds=info.nats_creds)
        async with await MdqClient.connect(info.nats_url, "stk", creds=info.nats_creds) as client:
            ids = await client.submit([pb.JobSpec(name="after-restart")])
            with pytest.raises(WaitTimeout) as timed_out:  # accepted, and nothing runs it
                await client.wait(queued, timeout=3.0)
        assert ids[0].endswith("-after-restart")
        assert timed_out.value.states == {queued[0]: JobState.PENDING}
        second_pid = stack.child_pid("intake")
    finally:
        await stack.stop()
    assert not (state / STACK_FILE).exists()
    assert second_pid is not None
    with pytest.raises(ProcessLookupError):
        os.kill(second_pid, 0)
    port = int(info.nats_url.rsplit(":", 1)[1])
    with pytest.raises(OSError):  # the embedded NATS is gone too
        socket.create_connection(("127.0.0.1", port), timeout=1).close()


async def test_a_second_stack_on_the_same_state_folder_is_refused(
    tmp_path: Path, nats_url: str, database_url: str
) -> None:
    def stack() -> Stack:
        """No services of its own: only the state folder is at stake."""
        return Stack(
            state_dir=tmp_path,
            nats_url=nats_url,
            database_url=database_url,
            services=(),
            backend="kubernetes",
        )

    first = stack()
    await first.start()
    try:
        (tmp_path / STACK_FILE).write_text(
            first.info.to_json().replace(f'"pid": {os.getpid()}', f'"pid": {os.getppid()}')
        )
        with pytest.raises(Exception, match="already runs"):
            await stack().start()
    finally:
        await first.stop()


async def test_mdq_ls_and_show_read_the_history_from_postgresql(
    tmp_path: Path, nats_url: str, database_url: str, namespace: str
) -> None:
    """intake + watcher (+ the local node agent) in a stack on the test servers: what `mdq
    submit` sent shows up in `mdq ls` and `mdq show`, read from the watcher's tables."""
    stack = Stack(
        state_dir=tmp_path,
        namespace=namespace,
        nats_url=nats_url,
        database_url=database_url,
        services=("intake", "watcher"),
        metrics_port=0,
        grace_s=15.0,
    )
    await stack.start()
    try:
        await _intake_answers(nats_url, Subjects(namespace))
        submitted = await asyncio.to_thread(_cli, "", "", "submit", str(DEMO), state_dir=tmp_path)
        assert submitted.exit_code == 0, submitted.output
        job_ids = submitted.stdout.split()

        async def listed() -> bool:
            result = await asyncio.to_thread(_cli, "", "", "ls", state_dir=tmp_path)
            return result.exit_code == 0 and all(job in result.stdout for job in job_ids)

        await wait_for(listed, timeout=30, interval=0.5, what="the jobs in `mdq ls`")
        listing = await asyncio.to_thread(_cli, "", "", "ls", state_dir=tmp_path)
        rows = {
            line.split()[1]: line
            for line in listing.stdout.splitlines()
            if "-chain-" in line or "-water-" in line
        }
        assert "WAITING" in rows[job_ids[4]] and "PENDING" in rows[job_ids[0]]

        shown = await asyncio.to_thread(_cli, "", "", "show", job_ids[4], state_dir=tmp_path)
        assert shown.exit_code == 0, shown.output
        assert "WAITING" in shown.stdout and "TASK_MD" in shown.stdout
        assert job_ids[3] in shown.stdout  # it depends on chain-minimize
        assert "submitted" in shown.stdout  # in the timeline

        # A PENDING job: `mdq show` adds placement's word on why it waits (placement writes
        # it to the waiting bucket; tests/integration/test_placement_replicas.py shows that).
        waiting = pb.JobWaiting(attempt=1, summary="0/2 nodes are available: 2 cordoned")
        nc = await nats.connect(nats_url)
        try:
            kv = await nc.jetstream().create_key_value(
                KeyValueConfig(bucket=Subjects(namespace).waiting_bucket, history=1)
            )
            await kv.put(job_ids[0], waiting.SerializeToString())
        finally:
            await nc.close()
        pending = await asyncio.to_thread(_cli, "", "", "show", job_ids[0], state_dir=tmp_path)
        assert pending.exit_code == 0, pending.output
        assert "why it waits (placement): 0/2 nodes are available: 2 cordoned" in pending.stdout

        unknown = await asyncio.to_thread(
            _cli, "", "", "show", "0123456789ab-nope", state_dir=tmp_path
        )
        assert unknown.exit_code == NotFound.exit_code, unknown.output
        assert "no job 0123456789ab-nope" in unknown.output

        # `mdq watch` without ids follows every unfinished job (none is placed: no placement).
        watched = await asyncio.to_thread(
            _cli, "", "", "watch", "--timeout", "1.5", state_dir=tmp_path
        )
        assert watched.exit_code == 1, watched.output  # gave up: nothing succeeded
        bars = {line.split()[0] for line in watched.stdout.splitlines() if line.strip()}
        assert set(job_ids) <= bars
        assert "gave up waiting" in watched.stdout
    finally:
        await stack.stop()
