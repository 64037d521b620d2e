"""People on the closed bus: every mdq command, the SDK and the README's clients, run with the
identity a person gets, the operator's ``cli`` and a tenant's, against a real nats-server
configured by the code that configures ``mdq up`` (``mdq.bus.security.auth.generate``) and the real
intake service in its own process with its own credentials.

What the services would log for a job (placement's ``bound``, the watcher's ``started`` and
``succeeded``, the runner's ``progress``) is published by each of them with its own
credentials, the runner's minted by the runner issuer; nothing here connects without
credentials. A stock client of another language reads with its own pull consumers: the
README's nats.js client runs as written (``npm ci --prefix tests/readme-js``), and nats-py's
pull consumers stand in for any other.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import nats
import nats.errors
import pytest
from nats.js.api import AckPolicy, ConsumerConfig
from nats.js.errors import APIError
from typer.testing import CliRunner, Result

from mdq.bus.connect import auth_options, connect
from mdq.bus.publisher import EventPublisher
from mdq.bus.security.auth import Generated, generate, runner_issuer, write_secret
from mdq.bus.security.permissions import inbox_prefix, tenant_identity
from mdq.bus.streams import ensure_streams
from mdq.bus.subjects import Subjects
from mdq.bus.tenants import ensure_tenants_bucket
from mdq.cli.main import app
from mdq.contracts import pb
from mdq.core.tenants import TenantUsage, usage_key
from mdq.embedded import EmbeddedNats, child_environment, end_process, start_nats
from mdq.errors import PermissionDenied
from mdq.sdk import MdqClient, OperatorOnly
from mdq.tenancy import add_tenant
from services.placement.waiting import waiting_bucket_config
from tests.helpers import intake_answering

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
NODE_PACKAGES = REPO / "tests" / "readme-js"
NS = "mdq"
SUBJECTS = Subjects(NS)
TENANT, OTHER = "alice", "bob"
WHO = ["cli", TENANT]
"""The two identities a person gets: the operator's client, a tenant's."""
TIMEOUT_S = 60.0


@dataclass
class Closed:
    server: EmbeddedNats
    generated: Generated
    secrets: Path
    tenants: dict[str, Path]

    @property
    def url(self) -> str:
        return self.server.url

    def creds(self, who: str) -> Path:
        return self.tenants[who] if who in self.tenants else self.generated.creds[who]


async def _prepare(closed: Closed) -> None:
    """What ``mdq up`` does as admin, placement's own waiting bucket, and two tenants as
    ``mdq tenant add`` makes them."""
    admin = await connect(closed.url, name="admin", creds=closed.generated.creds["admin"])
    try:
        await ensure_streams(admin.jetstream(), SUBJECTS)
        await ensure_tenants_bucket(admin.jetstream(), SUBJECTS)
    finally:
        await admin.close()
    placement = await connect(closed.url, name="p", creds=closed.generated.creds["placement"])
    try:
        config = waiting_bucket_config(SUBJECTS.waiting_bucket)
        config.max_bytes = 1 << 20
        await placement.jetstream().create_key_value(config)
    finally:
        await placement.close()
    for tenant in (TENANT, OTHER):
        added = await add_tenant(
            tenant,
            secrets=closed.secrets,
            nats_url=closed.url,
            namespace=NS,
            admin_creds=closed.generated.creds["admin"],
        )
        closed.tenants[tenant] = added.creds


async def _intake_answers(closed: Closed) -> None:
    nc = await nats.connect(closed.url, **auth_options(str(closed.creds("cli"))))
    try:
        await intake_answering(nc, SUBJECTS.api_submit, within=TIMEOUT_S)
    finally:
        await nc.close()


@pytest.fixture(scope="module")
def closed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Closed]:
    folder = tmp_path_factory.mktemp("closed")
    generated = generate(folder / "secrets", NS)
    server = start_nats(folder / "nats", auth=generated.server_block.read_text())
    bus = Closed(server, generated, folder / "secrets", {})
    asyncio.run(_prepare(bus))
    env = child_environment(
        NATS_URL=server.url, MDQ_NAMESPACE=NS, MDQ_NATS_CREDS=str(generated.creds["intake"])
    )
    with (folder / "intake.log").open("wb") as log:
        intake = subprocess.Popen(
            [sys.executable, "-m", "services.intake"], env=env, cwd=REPO, stdout=log, stderr=log
        )
    try:
        asyncio.run(_intake_answers(bus))
        yield bus
    finally:
        end_process(intake, timeout=10)
        server.stop()


# -- what the services would log, each as itself ---------------------------------------------
async def run_job(closed: Closed, job: str, *, node: str = "n1") -> None:
    """Bound (with the nodes' scores), started, two progress reports, succeeded: published
    by placement, the watcher and the job's own runner with their credentials."""
    runner_file = write_secret(
        closed.secrets / "runners" / f"{job}.creds",
        runner_issuer(closed.generated.trust).creds(job),
    )
    opened = {
        producer: await connect(closed.url, name=producer, creds=creds)
        for producer, creds in (
            ("placement", closed.generated.creds["placement"]),
            ("watcher", closed.generated.creds["watcher"]),
            ("runner", runner_file),
        )
    }
    try:
        by = {
            producer: EventPublisher(js=nc.jetstream(), subjects=SUBJECTS, producer=producer)
            for producer, nc in opened.items()
        }
        scores = [pb.NodeScore(node=node, score=0.9), pb.NodeScore(node="n2", filtered="full")]
        bound = pb.JobBound(node=node, pod_name=f"mdq-{job}-1", candidates=scores)
        await by["placement"].emit("bound", bound, job_id=job, attempt=1)
        await by["watcher"].emit("started", pb.JobStarted(node=node), job_id=job, attempt=1)
        for step in (250, 500):
            report = pb.Progress(step=step, target_steps=500, potential_kj_mol=-1000.0 - step)
            await by["runner"].emit("progress", report, job_id=job, attempt=1, detail=step)
        done = pb.JobSucceeded(final_step=500, reason="steps_reached")
        await by["watcher"].emit("succeeded", done, job_id=job, attempt=1)
    finally:
        for nc in opened.values():
            await nc.close()


async def stored(closed: Closed, stream: str, subject: str) -> None:
    """Wait until ``stream`` holds a message on ``subject`` (read as the admin)."""
    admin = await connect(closed.url, name="check", creds=closed.generated.creds["admin"])
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            info = await admin.jetstream().stream_info(stream, subjects_filter=subject)
            if subject in (info.state.subjects or {}):
                return
            assert time.monotonic() < deadline, f"{subject} never reached {stream}"
            await asyncio.sleep(0.1)
    finally:
        await admin.close()


async def in_tenant_stream(closed: Closed, tenant: str, job: str) -> None:
    """Wait until the server has copied ``job``'s terminal event into the tenant's stream."""
    await stored(closed, SUBJECTS.tenant_stream(tenant), SUBJECTS.job(job, "succeeded"))


async def accepted(closed: Closed, job: str) -> None:
    """Wait until intake has logged ``job``'s ``submitted`` event: a fire-and-forget submit is
    taken in the background, and a job's life published before its submit would be folded
    into nothing."""
    await stored(closed, SUBJECTS.jobs_stream, SUBJECTS.job(job, "submitted"))


async def report_node(closed: Closed, node: str) -> None:
    metrics = await connect(closed.url, name="metrics", creds=closed.generated.creds["metrics"])
    try:
        publisher = EventPublisher(js=metrics.jetstream(), subjects=SUBJECTS, producer="metrics")
        body = pb.NodeLoad(
            node=node, cpu_load=0.42, cpu_capacity=4, memory_capacity_mb=4096, ready=True
        )
        await publisher.emit("node_load", body, job_id="", attempt=0, detail=f"{node}:1")
    finally:
        await metrics.close()


async def count_usage(closed: Closed, tenant: str) -> None:
    placement = await connect(closed.url, name="p", creds=closed.generated.creds["placement"])
    try:
        kv = await placement.jetstream().key_value(SUBJECTS.waiting_bucket)
        usage = TenantUsage(queued_jobs=2, running_cpu=1.0, as_of=datetime.now(UTC), share=0.5)
        await kv.put(usage_key(tenant), usage.to_json())
    finally:
        await placement.close()


def mdq(closed: Closed, who: str, *args: str) -> Result:
    """``mdq ARGS`` as ``who`` (``--creds``), against the closed server, without a stack."""
    env = {"NATS_URL": closed.url, "MDQ_NAMESPACE": NS, "DATABASE_URL": "", "MDQ_NATS_CREDS": ""}
    argv = ["--creds", str(closed.creds(who)), *args]
    return CliRunner().invoke(app, argv, env=env, catch_exceptions=False)


def job_file(folder: Path, key: str) -> Path:
    path = folder / f"{key}.json"
    path.write_text(json.dumps({"idempotency_key": key, "jobs": [{"name": "w", "steps": 500}]}))
    return path


# -- the command line ------------------------------------------------------------------------
@pytest.mark.parametrize("who", WHO)
async def test_every_command_a_person_runs_works_with_their_credentials(
    closed: Closed, who: str, tmp_path: Path
) -> None:
    """submit, watch, explain and replay as the operator and as a tenant; nodes and queues
    as the operator (``mdq nodes`` was refused a pull consumer as ``cli``: red without
    ``mdq.bus.security.permissions._pull_reader``)."""
    key = f"cmd-{who}-{os.urandom(3).hex()}"
    submitted = await asyncio.to_thread(mdq, closed, who, "submit", str(job_file(tmp_path, key)))
    assert submitted.exit_code == 0, submitted.output
    [job] = submitted.stdout.split()
    assert job.startswith(f"{TENANT}.") == (who == TENANT), job
    await run_job(closed, job)
    if who == TENANT:
        await in_tenant_stream(closed, TENANT, job)

    watched = await asyncio.to_thread(mdq, closed, who, "watch", job, "--timeout", "30")
    assert watched.exit_code == 0, watched.output
    assert "SUCCEEDED" in watched.stdout and "500/500" in watched.stdout
    explained = await asyncio.to_thread(mdq, closed, who, "explain", job)
    assert explained.exit_code == 0, explained.output
    assert "n1" in explained.stdout and "full" in explained.stdout
    replayed = await asyncio.to_thread(mdq, closed, who, "replay", job)
    assert replayed.exit_code == 0, replayed.output
    for kind in ("submitted", "bound", "started", "progress", "succeeded"):
        assert kind in replayed.stdout, (kind, replayed.stdout)

    await report_node(closed, "node-x")
    await count_usage(closed, TENANT)
    nodes = await asyncio.to_thread(mdq, closed, who, "nodes")
    queues = await asyncio.to_thread(mdq, closed, who, "queues")
    if who == "cli":
        assert nodes.exit_code == 0, nodes.output
        assert "node-x" in nodes.stdout and "42%" in nodes.stdout
        assert queues.exit_code == 0, queues.output
        assert TENANT in queues.stdout
    else:  # the operator's to read: said plainly, not a crash
        for refused in (nodes, queues):
            assert refused.exit_code == PermissionDenied.exit_code, refused.output
            assert f"tenant {TENANT}'s credentials may not" in refused.output, refused.output


async def explain_waiting(closed: Closed, job: str, summary: str) -> None:
    """Placement's word on why ``job`` waits, written as placement writes it."""
    waiting = pb.JobWaiting(attempt=1, nodes_total=2, summary=summary)
    waiting.at.FromDatetime(datetime.now(UTC))
    nc = await connect(closed.url, name="p", creds=closed.generated.creds["placement"])
    try:
        kv = await nc.jetstream().key_value(SUBJECTS.waiting_bucket)
        await kv.put(job, waiting.SerializeToString())
    finally:
        await nc.close()


async def test_a_tenant_reads_why_its_own_job_waits_and_no_one_elses(
    closed: Closed, tmp_path: Path
) -> None:
    """A job that fits no node: its tenant hears why (placement's summary), as the operator
    does, by a direct get of its own job's key; another tenant's key is refused it."""
    key = f"wait-{os.urandom(3).hex()}"
    submitted = await asyncio.to_thread(mdq, closed, TENANT, "submit", str(job_file(tmp_path, key)))
    assert submitted.exit_code == 0, submitted.output
    [job] = submitted.stdout.split()
    await stored(closed, SUBJECTS.tenant_stream(TENANT), SUBJECTS.job(job, "submitted"))
    summary = "0/2 nodes are available: 2 insufficient cpu"
    await explain_waiting(closed, job, summary)
    await explain_waiting(closed, f"{OTHER}.0123456789ab-w", "0/2 nodes are available: bob's")

    for who in WHO:
        explained = await asyncio.to_thread(mdq, closed, who, "explain", job)
        assert explained.exit_code == 0, explained.output
        assert summary in explained.stdout, (who, explained.stdout)

    nc = await nats.connect(closed.url, **auth_options(str(closed.creds(TENANT))))
    try:
        bucket = SUBJECTS.waiting_bucket
        with pytest.raises((TimeoutError, nats.errors.Error)):
            await nc.jetstream().get_last_msg(
                f"KV_{bucket}", f"$KV.{bucket}.{OTHER}.0123456789ab-w", direct=True
            )
        with pytest.raises((TimeoutError, nats.errors.Error)):  # nor the bucket as a whole
            await nc.jetstream().get_last_msg(f"KV_{bucket}", f"$KV.{bucket}.{job}")
    finally:
        await nc.close()


# -- the SDK ---------------------------------------------------------------------------------
@pytest.mark.parametrize("who", WHO)
async def test_the_sdk_works_with_each_identity(closed: Closed, who: str) -> None:
    async with await MdqClient.connect(closed.url, NS, creds=closed.creds(who)) as client:
        assert client.tenant == ("" if who == "cli" else TENANT)
        request = pb.SubmitRequest(jobs=[pb.JobSpec(name="w", steps=500)])
        [job] = await client.submit(request, idempotency_key=f"sdk-{who}-{os.urandom(3).hex()}")
        [later] = await client.publish_submit(
            request, idempotency_key=f"sdk-{who}-stream-{os.urandom(3).hex()}"
        )
        await accepted(closed, later)
        for each in (job, later):
            await run_job(closed, each)
        states = await client.wait([job, later], timeout=30)
        assert {str(state) for state in states.values()} == {"SUCCEEDED"}, states
        steps = sorted([report.step async for _, report in client.progress([job])])
        assert steps == [250, 500]
        if who == "cli":
            await report_node(closed, "node-sdk")
            assert "node-sdk" in await client.node_loads()
        else:
            with pytest.raises(OperatorOnly, match="may not"):
                await client.node_loads()


async def test_another_tenant_cannot_squat_a_tenants_key(closed: Closed) -> None:
    """Bob publishes first under the message id alice's SDK gives her key; her fire-and-forget
    submit under that key is still accepted by intake and runs. Red with one submit stream
    deduplicating every tenant's message ids together (hers was dropped as bob's copy)."""
    key = f"squat-{os.urandom(3).hex()}"
    bob = await nats.connect(closed.url, **auth_options(str(closed.creds(OTHER))))
    try:
        squat = await bob.jetstream().publish(
            SUBJECTS.submit_for(OTHER), b'{"jobs": []}', headers={"Nats-Msg-Id": f"submit:{key}"}
        )
        assert not squat.duplicate
    finally:
        await bob.close()
    async with await MdqClient.connect(closed.url, NS, creds=closed.creds(TENANT)) as alice:
        [job] = await alice.publish_submit(
            pb.SubmitRequest(jobs=[pb.JobSpec(name="w", steps=500)]), idempotency_key=key
        )
        await accepted(closed, job)
        await run_job(closed, job)
        assert {str(s) for s in (await alice.wait([job], timeout=30)).values()} == {"SUCCEEDED"}


# -- pull consumers, as any language's stock client makes them -------------------------------
@pytest.mark.parametrize("who", WHO)
async def test_a_person_reads_its_jobs_with_pull_consumers_of_its_own(
    closed: Closed, who: str
) -> None:
    """An ephemeral pull consumer with explicit acknowledgements on the stream the identity
    may read: created, fetched from, acknowledged, deleted. Red without the pull grants."""
    async with await MdqClient.connect(closed.url, NS, creds=closed.creds(who)) as client:
        [job] = await client.submit(
            pb.SubmitRequest(jobs=[pb.JobSpec(name="w", steps=500)]),
            idempotency_key=f"pull-{who}-{os.urandom(3).hex()}",
        )
    await run_job(closed, job)
    stream = SUBJECTS.jobs_stream if who == "cli" else SUBJECTS.tenant_stream(TENANT)
    if who == TENANT:
        await in_tenant_stream(closed, TENANT, job)
    nc = await nats.connect(
        closed.url,
        user_credentials=str(closed.creds(who)),
        inbox_prefix=inbox_prefix("cli" if who == "cli" else tenant_identity(TENANT)),
    )
    try:
        js = nc.jetstream()
        subscription = await js.pull_subscribe(
            SUBJECTS.job_all(job),
            stream=stream,
            config=ConsumerConfig(ack_policy=AckPolicy.EXPLICIT, inactive_threshold=30.0),
        )
        kinds = []
        while "succeeded" not in kinds:
            for message in await subscription.fetch(10, timeout=5):
                kinds.append(message.subject.rsplit(".", 1)[1])
                await message.ack_sync(timeout=5)
        assert kinds == ["submitted", "bound", "started", "succeeded"]
        info = await subscription.consumer_info()
        assert info.num_ack_pending == 0 and info.num_pending == 0
        name = info.name
        await js.delete_consumer(stream, name)
    finally:
        await nc.close()


async def test_a_tenant_keeps_a_bounded_number_of_consumers_none_for_ever(closed: Closed) -> None:
    """The server refuses bob his 17th consumer, and gives each one (a durable too) the idle
    limit after which it deletes it. Red without the tenant stream's limits."""
    nc = await nats.connect(
        closed.url,
        user_credentials=str(closed.creds(OTHER)),
        inbox_prefix=inbox_prefix(tenant_identity(OTHER)),
    )
    stream = SUBJECTS.tenant_stream(OTHER)
    made: list[str] = []
    try:
        js = nc.jetstream()
        durable = await js.add_consumer(
            stream,
            ConsumerConfig(name="kept", durable_name="kept", ack_policy=AckPolicy.EXPLICIT),
        )
        made.append(durable.name)
        assert durable.config.inactive_threshold == 600.0
        with pytest.raises(APIError, match="inactive threshold"):
            await js.add_consumer(stream, ConsumerConfig(name="long", inactive_threshold=3600.0))
        with pytest.raises(APIError, match="maximum consumers"):
            for number in range(100):
                made.append((await js.add_consumer(stream, ConsumerConfig(name=f"c{number}"))).name)
        assert len(made) == 16
    finally:
        for name in made:
            await js.delete_consumer(stream, name)
        await nc.close()


# -- the README's clients, as written ----------------------------------------------------------
def readme_block(language: str, contains: str) -> str:
    blocks = re.findall(rf"```{language}\n(.*?)```", README.read_text(), re.DOTALL)
    [block] = [block for block in blocks if contains in block]
    return str(block)


async def test_the_readme_python_client_runs_as_the_operator(
    closed: Closed, tmp_path: Path
) -> None:
    script = tmp_path / "client.py"
    script.write_text(readme_block("python", "api.submit"))
    env = child_environment(
        NATS_URL=closed.url, MDQ_NAMESPACE=NS, MDQ_NATS_CREDS=str(closed.creds("cli"))
    )
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(script),
        env=env,
        cwd=tmp_path,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await asyncio.wait_for(process.communicate(), TIMEOUT_S)
    assert process.returncode == 0, output.decode()
    assert "job_ids" in output.decode()


@pytest.mark.parametrize("who", WHO)
async def test_the_readme_javascript_client_follows_its_job(
    closed: Closed, who: str, tmp_path: Path
) -> None:
    """nats.js v3 as the README writes it: credsAuthenticator, a request-reply submit, then
    the job's events through an ordered pull consumer (``js.consumers.get``), which a tenant
    and ``cli`` are allowed (the server refused its pulls before: ``next()`` gave nothing)."""
    node = shutil.which("node")
    if node is None or not (NODE_PACKAGES / "node_modules" / "@nats-io" / "jetstream").is_dir():
        pytest.skip("nats.js is not installed: npm ci --prefix tests/readme-js")
    script = tmp_path / "follow.mjs"
    script.write_text(
        readme_block("js", "credsAuthenticator").replace('"js-1"', f'"js-{who}-{tmp_path.name}"')
    )
    (tmp_path / "node_modules").symlink_to(NODE_PACKAGES / "node_modules")
    env = child_environment(
        NATS_URL=closed.url,
        MDQ_NAMESPACE=NS,
        MDQ_NATS_CREDS=str(closed.creds(who)),
        MDQ_TENANT="" if who == "cli" else TENANT,
    )
    process = await asyncio.create_subprocess_exec(
        node,
        str(script),
        env=env,
        cwd=tmp_path,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    assert process.stdout is not None
    try:
        first = await asyncio.wait_for(process.stdout.readline(), TIMEOUT_S)
        assert first.startswith(b"submitted "), first + await process.stdout.read()
        job = first.decode().split()[1]
        await run_job(closed, job)
        rest, _ = await asyncio.wait_for(process.communicate(), TIMEOUT_S)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode == 0, rest.decode()
    kinds = [line.split()[1] for line in rest.decode().splitlines() if line.startswith(job)]
    assert kinds == ["submitted", "bound", "started", "succeeded"], rest.decode()


def test_the_readme_go_client_says_what_the_javascript_one_does() -> None:
    """Go is not installed where the tests run: its client is held to the same subjects,
    inbox, stream and filter as the JavaScript one, which runs."""
    go = readme_block("go", "jetstream.New")
    for needed in (
        'nats.UserCredentials(os.Getenv("MDQ_NATS_CREDS"))',
        "nats.CustomInboxPrefix(inbox)",
        '"_INBOX_tenant."+tenant',
        'ns+".api.submit"',
        'strings.ToUpper(ns) + "_TENANT_" + tenant',
        'strings.ToUpper(ns)+"_JOBS"',
        'ns + ".job." + jobID + ".>"',
        "js.OrderedConsumer(",
    ):
        assert needed in go, needed
