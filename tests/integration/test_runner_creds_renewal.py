"""Short-lived runner credentials on a real nats-server configured by mdq's own code: a runner
whose attempt lives keeps working past its credentials' lifetime, renewing them at half-life;
one whose attempt ended is refused fresh ones, asked to stop, and its file stops working once
it expires; another job's renewal is refused by the server itself."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import nats
import nats.errors
import pytest
from nats.aio.client import Client

from mdq.bus.connect import connect
from mdq.bus.security.auth import RunnerIssuer, Trust, issue, runner_issuer, write_secret
from mdq.bus.security.permissions import service_permissions
from mdq.bus.security.runner_creds import RenewableCreds, RenewalDesk
from mdq.bus.streams import ensure_streams
from mdq.bus.subjects import Subjects
from mdq.contracts import pb
from mdq.embedded import EmbeddedNats
from tests.helpers import closed_nats, wait_for

SUBJECTS = Subjects("mdq")
JOB = "0123456789ab-renew"
TTL_S = 3.0


@dataclass
class Bus:
    nats: EmbeddedNats
    trust: Trust
    folder: Path

    def issuer(self) -> RunnerIssuer:
        return RunnerIssuer(
            runner_issuer(self.trust).signing_seed, self.trust.users_public, expires_s=TTL_S
        )


StartDesk = Callable[[Callable[[str, int], bool | None]], Awaitable[RenewalDesk]]


@pytest.fixture(scope="module")
def bus() -> Iterator[Bus]:
    with closed_nats("mdq-renew-") as (server, trust, folder):
        yield Bus(server, trust, folder)


@pytest.fixture
async def desk_for(bus: Bus) -> AsyncIterator[StartDesk]:
    """Start a desk as placement does (its own identity), deciding with ``verdict``."""
    opened: list[tuple[Client, RenewalDesk]] = []
    admin_creds = issue(bus.trust, service_permissions("admin", SUBJECTS), bus.folder / "a.creds")
    admin = await connect(bus.nats.url, name="admin", creds=admin_creds)
    await ensure_streams(admin.jetstream(), SUBJECTS)
    await admin.close()

    async def start(decide: Callable[[str, int], bool | None]) -> RenewalDesk:
        async def verdict(job: str, attempt: int) -> bool | None:
            return decide(job, attempt)

        path = bus.folder / "placement.creds"
        creds = issue(bus.trust, service_permissions("placement", SUBJECTS), path)
        client = await connect(bus.nats.url, name="placement", creds=creds)
        desk = await RenewalDesk(client, SUBJECTS, mint=bus.issuer().creds, verdict=verdict).start()
        opened.append((client, desk))
        return desk

    yield start
    for client, desk in opened:
        await desk.close()
        await client.close()


async def report(client: Client, step: int) -> int:
    """Publish a progress event of JOB and wait for JetStream's acknowledgement; return how
    many tries it took. A publish in flight while the runner reconnects on renewed credentials
    may lose its acknowledgement: it is sent again under the same message id, as the runner's
    outbox does (JetStream stores it once)."""
    event = pb.Event(event_id=f"progress:{JOB}:1:{step}", job_id=JOB, attempt=1, producer="runner")
    event.progress.step = step
    for tries in range(1, 4):
        try:
            ack = await client.jetstream().publish(
                SUBJECTS.progress(JOB),
                event.SerializeToString(),
                timeout=2,
                headers={"Nats-Msg-Id": event.event_id},
            )
        except nats.errors.TimeoutError:
            continue
        assert ack.stream == SUBJECTS.progress_stream
        return tries
    raise AssertionError(f"report {step} was never acknowledged")


async def test_a_live_attempt_keeps_reporting_past_its_credentials_lifetime(
    bus: Bus, desk_for: StartDesk
) -> None:
    desk = await desk_for(lambda job, attempt: job == JOB and attempt == 1)
    creds = RenewableCreds(bus.issuer().creds(JOB))
    first_expiry = creds.current.expires_at
    assert first_expiry is not None and first_expiry - time.time() <= TTL_S + 1
    lost: list[str] = []
    client = await connect(bus.nats.url, name="runner", creds=creds)
    renewing = asyncio.create_task(
        creds.keep_renewed(client, SUBJECTS, job_id=JOB, attempt=1, on_lost=lost.append)
    )
    try:
        step, retried = 0, 0
        while time.time() < first_expiry + 2 * TTL_S:  # well past the first credentials' end
            step += 1
            retried += await report(client, step) - 1  # never refused, never closed
            await asyncio.sleep(0.2)
        assert creds.renewals >= 2 and desk.renewed >= 2
        assert retried <= creds.renewals  # at most the report in flight at each reconnect
        assert (creds.current.expires_at or 0) > first_expiry
        assert not lost and client.is_connected
    finally:
        renewing.cancel()
        await client.close()


async def test_an_ended_attempt_is_refused_and_its_file_stops_working(
    bus: Bus, desk_for: StartDesk
) -> None:
    desk = await desk_for(lambda job, attempt: False)
    text = bus.issuer().creds(JOB)
    path = write_secret(bus.folder / "ended.creds", text)
    creds = RenewableCreds(text)
    lost: list[str] = []
    client = await connect(bus.nats.url, name="runner", creds=creds)
    await report(client, 1)  # valid until it expires
    await asyncio.wait_for(
        creds.keep_renewed(client, SUBJECTS, job_id=JOB, attempt=1, on_lost=lost.append),
        timeout=TTL_S + 5,
    )
    assert lost == [f"its NATS credentials were not renewed: attempt 1 of job {JOB} is not running"]
    assert desk.refused == 1
    expires_at = creds.current.expires_at or 0

    async def closed() -> bool:
        return client.is_closed

    # the server ends the connection when the JWT expires
    await wait_for(closed, timeout=max(0.0, expires_at - time.time()) + 5, what="the close")
    # ``exp`` is in whole seconds and the server refuses a JWT once that second has passed:
    # the connection may end a moment before the file is refused
    await asyncio.sleep(max(0.0, expires_at + 1 - time.time()))
    with pytest.raises((nats.errors.Error, OSError)):
        await nats.connect(bus.nats.url, user_credentials=str(path), allow_reconnect=False)


async def test_a_desk_that_cannot_tell_says_nothing(bus: Bus, desk_for: StartDesk) -> None:
    """A desk whose verdict is None (not its to say) does not answer: the asker asks again."""
    await desk_for(lambda job, attempt: None)
    client = await connect(
        bus.nats.url, name="runner", creds=RenewableCreds(bus.issuer().creds(JOB))
    )
    try:
        with pytest.raises(nats.errors.TimeoutError):
            await client.request(SUBJECTS.runner_creds(JOB), b'{"attempt": 1}', timeout=1)
    finally:
        await client.close()


async def test_a_runner_cannot_ask_for_another_jobs_credentials(
    bus: Bus, desk_for: StartDesk
) -> None:
    await desk_for(lambda job, attempt: True)
    errors: list[str] = []

    async def on_error(error: Exception) -> None:
        errors.append(str(error))

    creds = RenewableCreds(bus.issuer().creds(JOB))
    client = await nats.connect(bus.nats.url, error_cb=on_error, **creds.connect_options())
    try:
        other = SUBJECTS.runner_creds("0123456789ab-other")
        with pytest.raises(nats.errors.Error):  # no answer: the server dropped the request
            await client.request(other, b'{"attempt": 1}', timeout=1)
        assert any(other.lower() in error.lower() for error in errors), errors
    finally:
        await client.close()
