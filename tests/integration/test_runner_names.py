"""A rogue node agent asks for runner credentials under names that would be wildcards.

The server fills a runner credential's name into the runner permission template as it is: a
credential named ``*`` would publish every operator job's progress and outputs, ``alice.*``
every job of alice's, ``intake`` would listen on intake's reply inbox. The node agent therefore
holds no key (``mdq up`` gives the runner issuer to placement alone) and asks placement's desk,
which mints for a job id only, and only for the attempt the jobs log says is live.

Against a real nats-server configured by ``mdq.bus.security.auth``: the agent's identity asks the
desk (as placement runs it, ``log_verdict`` over a jobs stream that holds a live ``bound`` event of
an operator's and of a tenant's job, so a wildcard would match them) for each hostile name and is
refused, naming the field; for the live attempt it gets credentials that publish that job's
progress and nothing of the other job's.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import nats
import nats.errors
import pytest
from nats.aio.client import Client

from mdq.bus.connect import connect
from mdq.bus.security.auth import RunnerIssuer, Trust, issue, runner_issuer
from mdq.bus.security.permissions import service_permissions
from mdq.bus.security.runner_creds import (
    CredsRefused,
    RenewableCreds,
    RenewalDesk,
    log_verdict,
    request_runner_creds,
)
from mdq.bus.streams import ensure_streams
from mdq.bus.subjects import Subjects
from mdq.contracts import pb
from mdq.core.producers import owner_of
from mdq.core.tenants import JobIdError
from mdq.embedded import EmbeddedNats
from tests.helpers import closed_nats

SUBJECTS = Subjects("mdq")
JOB = "0123456789ab-victim"
TENANT_JOB = "alice.0123456789ab-victim"
HOSTILE_NAMES = [
    "*",
    "*.*",
    ">",
    "a.*",
    "alice.*",
    "intake",
    "tenant.alice",
    "_INBOX.>",
    "0123456789ab-" + "x" * 987,  # 1,000 characters
    "0123456789ab-ünïcödé",
    "0123456789ab-victim\u200b",  # a zero-width space after a real id
    "\uff10\uff11\uff12\uff13\uff14\uff15\uff16\uff17\uff18\uff19ab-victim",  # full-width digits
    "intake.0123456789ab-victim",  # a reserved name as the tenant
]


@dataclass
class Bus:
    nats: EmbeddedNats
    trust: Trust
    folder: Path

    def creds(self, identity: str) -> Path:
        path = self.folder / f"{identity}.creds"
        return issue(self.trust, service_permissions(identity, SUBJECTS), path)


@pytest.fixture(scope="module")
def bus() -> Iterator[Bus]:
    with closed_nats("mdq-names-") as (server, trust, folder):
        yield Bus(server, trust, folder)


@pytest.fixture(scope="module")
async def desk(bus: Bus) -> AsyncIterator[RenewalDesk]:
    """The streams (as admin), a live first attempt of JOB and TENANT_JOB in the jobs log (as
    placement binds them), and placement's desk over that log."""
    admin = await connect(bus.nats.url, name="admin", creds=bus.creds("admin"))
    await ensure_streams(admin.jetstream(), SUBJECTS)
    await admin.close()
    placement = await connect(bus.nats.url, name="placement", creds=bus.creds("placement"))
    js = placement.jetstream()
    for job in (JOB, TENANT_JOB):
        event = pb.Event(event_id=f"bound:{job}:1", job_id=job, attempt=1, producer="placement")
        event.bound.node = "n1"
        await js.publish(SUBJECTS.job(job, "bound"), event.SerializeToString())
    mint = RunnerIssuer(runner_issuer(bus.trust).signing_seed, bus.trust.users_public).creds
    desk = await RenewalDesk(
        placement, SUBJECTS, mint=mint, verdict=log_verdict(js, SUBJECTS)
    ).start()
    yield desk
    await desk.close()
    await placement.close()


@pytest.fixture
async def agent(bus: Bus, desk: RenewalDesk) -> AsyncIterator[Client]:
    client = await connect(bus.nats.url, name="agent", creds=bus.creds("agent"))
    yield client
    await client.close()


@pytest.mark.parametrize("name", HOSTILE_NAMES)
async def test_the_desk_refuses_every_name_that_is_not_a_job_id(agent: Client, name: str) -> None:
    """Red without the desk's check: ``*``, ``a.*``… match a live job's ``bound`` event in
    the log, and the minted credentials would grant every such job's subjects."""
    answer = await agent.request(SUBJECTS.runner_creds(name), b'{"attempt": 1}', timeout=5)
    reply = json.loads(answer.data)
    assert "creds" not in reply, name
    assert reply["error"].startswith("job_id: "), reply


@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_the_issuer_itself_mints_for_job_ids_only(bus: Bus, name: str) -> None:
    """The check is in the issuer too (what placement uses for its Kubernetes pods' Secrets)."""
    with pytest.raises(JobIdError, match=r"^job_id: "):
        runner_issuer(bus.trust).creds(name)


async def test_a_live_attempt_gets_credentials_for_its_job_alone(bus: Bus, agent: Client) -> None:
    """What the agent does when it starts a pod; the credentials then publish that job's
    progress and are refused the other job's by the server."""
    text = await request_runner_creds(agent, SUBJECTS, job_id=JOB, attempt=1, wait_s=10)
    creds = RenewableCreds(text)
    assert creds.current.name == JOB and creds.current.expires_at is None
    errors: list[str] = []

    async def on_error(error: Exception) -> None:
        errors.append(str(error))

    runner = await nats.connect(bus.nats.url, error_cb=on_error, **creds.connect_options())
    try:
        event = pb.Event(event_id=f"progress:{JOB}:1:1", job_id=JOB, attempt=1, producer="runner")
        ack = await runner.jetstream().publish(
            SUBJECTS.progress(JOB), event.SerializeToString(), timeout=5
        )
        assert ack.stream == SUBJECTS.progress_stream
        other = SUBJECTS.job(TENANT_JOB, "outputs")
        await runner.publish(other, b"forged")
        await runner.flush()
        for _ in range(50):
            if errors:
                break
            await asyncio.sleep(0.1)
        assert any(other.lower() in error.lower() for error in errors), errors
    finally:
        await runner.close()


@pytest.mark.parametrize(
    ("job", "attempt"),
    [(JOB, 2), (TENANT_JOB, 2), ("0123456789ab-never", 1)],
    ids=["a later attempt", "a tenant's later attempt", "a job never bound"],
)
async def test_an_attempt_that_does_not_live_is_refused(
    agent: Client, job: str, attempt: int
) -> None:
    with pytest.raises(CredsRefused, match="is not running"):
        await request_runner_creds(agent, SUBJECTS, job_id=job, attempt=attempt, wait_s=10)


async def test_an_attempt_that_failed_is_refused(bus: Bus, agent: Client) -> None:
    job = "0123456789ab-failing"
    placement = await connect(bus.nats.url, name="p", creds=bus.creds("placement"))
    watcher = await connect(bus.nats.url, name="w", creds=bus.creds("watcher"))
    try:
        bound = pb.Event(event_id=f"bound:{job}:1", job_id=job, attempt=1, producer="placement")
        bound.bound.node = "n1"
        await placement.jetstream().publish(SUBJECTS.job(job, "bound"), bound.SerializeToString())
        assert await request_runner_creds(agent, SUBJECTS, job_id=job, attempt=1, wait_s=10)
        failed = pb.Event(
            event_id=f"attempt_failed:{job}:1", job_id=job, attempt=1, producer="watcher"
        )
        failed.attempt_failed.SetInParent()
        subject = SUBJECTS.job(job, "attempt_failed")
        await watcher.jetstream().publish(subject, failed.SerializeToString())
        with pytest.raises(CredsRefused, match="is not running"):
            await request_runner_creds(agent, SUBJECTS, job_id=job, attempt=1, wait_s=10)
    finally:
        await placement.close()
        await watcher.close()


async def test_an_extended_job_lives_on_in_its_later_attempt(bus: Bus, agent: Client) -> None:
    """A job that succeeded and was extended runs on in attempt 2: its end in attempt 1 does
    not refuse attempt 2, and attempt 1 stays refused."""
    job = "0123456789ab-extended"
    placement = await connect(bus.nats.url, name="p", creds=bus.creds("placement"))
    watcher = await connect(bus.nats.url, name="w", creds=bus.creds("watcher"))

    async def publish(who: Client, kind: str, attempt: int) -> None:
        event = pb.Event(
            event_id=f"{kind}:{job}:{attempt}", job_id=job, attempt=attempt, producer=owner_of(kind)
        )
        getattr(event, kind).SetInParent()
        await who.jetstream().publish(SUBJECTS.job(job, kind), event.SerializeToString())

    try:
        await publish(placement, "bound", 1)
        await publish(watcher, "succeeded", 1)
        with pytest.raises(CredsRefused, match="is not running"):
            await request_runner_creds(agent, SUBJECTS, job_id=job, attempt=1, wait_s=10)
        await publish(placement, "extended", 2)
        await publish(placement, "bound", 2)
        assert await request_runner_creds(agent, SUBJECTS, job_id=job, attempt=2, wait_s=10)
        with pytest.raises(CredsRefused, match="is not running"):
            await request_runner_creds(agent, SUBJECTS, job_id=job, attempt=1, wait_s=10)
        await publish(watcher, "succeeded", 2)  # and its second end ends it again
        with pytest.raises(CredsRefused, match="is not running"):
            await request_runner_creds(agent, SUBJECTS, job_id=job, attempt=2, wait_s=10)
    finally:
        await placement.close()
        await watcher.close()


async def test_the_agent_holds_no_key_and_answers_no_one(bus: Bus) -> None:
    """What the generator gives the node agent is its own credentials, no signing key; the
    server refuses it the desk's subject (it cannot pose as the desk either)."""
    assert runner_issuer(bus.trust).signing_seed not in bus.creds("agent").read_text()
    errors: list[str] = []

    async def on_error(error: Exception) -> None:
        errors.append(str(error))

    client = await nats.connect(
        bus.nats.url,
        user_credentials=str(bus.creds("agent")),
        inbox_prefix=service_permissions("agent", SUBJECTS).inbox_prefix,
        error_cb=on_error,
    )
    try:
        await client.subscribe(SUBJECTS.runner_creds(">"))
        await client.flush()
        for _ in range(50):
            if errors:
                break
            await asyncio.sleep(0.1)
        assert any("subscription" in error.lower() for error in errors), errors
    finally:
        await client.close()
