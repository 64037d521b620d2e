"""The input files' buckets on a real nats-server configured by ``mdq.bus.security.auth``: who may
put a file where, and who may read it (docs/security.md, "Who may do what").

Each identity connects with credentials issued the way ``mdq up`` and ``mdq tenant add`` issue
them (a runner's from the runner-scoped signing key), through the two-account bridge: a tenant
and the operator's client upload into their own bucket and no other, a tenant's bucket holds no
more than its quota, and a runner gets its own job's files from intake's desk and nothing by
itself.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import nats.errors
import pytest
from nats.aio.client import Client

from mdq.bus.connect import connect
from mdq.bus.inputs import (
    FetchRefused,
    InputDesk,
    InputFetch,
    InputsError,
    InputsFull,
    ensure_inputs_bucket,
    lookup,
    upload,
)
from mdq.bus.publisher import EventPublisher
from mdq.bus.security.auth import issue, runner_issuer, write_secret
from mdq.bus.security.permissions import service_permissions, tenant_permissions
from mdq.bus.streams import ensure_streams
from mdq.bus.subjects import Subjects
from mdq.contracts import pb
from mdq.embedded import EmbeddedNats
from tests.helpers import closed_nats

SUBJECTS = Subjects("mdq")
JOB = "alice.0123456789ab-melt"
OTHER_JOB = "alice.0123456789ab-other"
QUOTA = 256 * 1024
"""bob's inputs bucket's size limit (alice's is 4 MiB)."""


@dataclass
class Server:
    nats: EmbeddedNats
    folder: Path
    creds: dict[str, Path] = field(default_factory=dict)


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with closed_nats("mdq-inputs-auth-") as (embedded, trust, folder):
        server = Server(embedded, folder)
        for identity in ("admin", "intake", "cli"):
            server.creds[identity] = issue(
                trust, service_permissions(identity, SUBJECTS), folder / f"{identity}.creds"
            )
        for tenant in ("alice", "bob"):
            server.creds[tenant] = issue(
                trust, tenant_permissions(SUBJECTS, tenant), folder / f"{tenant}.creds"
            )
        for job in (JOB, OTHER_JOB):
            server.creds[job] = write_secret(
                folder / f"{job}.creds", runner_issuer(trust).creds(job)
            )
        yield server


@pytest.fixture(scope="module")
async def prepared(server: Server) -> AsyncIterator[Server]:
    """The streams and the buckets, made as the admin makes them (``mdq up``, ``mdq tenant
    add``)."""
    admin = await connect(server.nats.url, name="admin", creds=server.creds["admin"])
    js = admin.jetstream()
    await ensure_streams(js, SUBJECTS)
    await ensure_inputs_bucket(js, SUBJECTS, max_bytes=4 << 20)
    await ensure_inputs_bucket(js, SUBJECTS, "alice", max_bytes=4 << 20)
    await ensure_inputs_bucket(js, SUBJECTS, "bob", max_bytes=QUOTA)
    yield server
    await admin.close()


async def connected(server: Server, identity: str) -> Client:
    return await connect(server.nats.url, name=identity, creds=server.creds[identity], wait=False)


@asynccontextmanager
async def connections(server: Server, *identities: str) -> AsyncIterator[list[Client]]:
    """A connection as each of ``identities``, in their order; all closed when the block ends
    (also those made before one failed to connect)."""
    async with AsyncExitStack() as stack:
        clients = []
        for identity in identities:
            client = await connected(server, identity)
            stack.push_async_callback(client.close)
            clients.append(client)
        yield clients


def refused(caplog: pytest.LogCaptureFixture, name: str) -> bool:
    """Whether the server refused one of this test's clients a subject with ``name`` (a bucket,
    its stream ``OBJ_<bucket>``, a job id) as one of its tokens: the permissions violation
    ``mdq.bus.connect.log_client_error`` logs, not any timeout. Forgets what it read."""
    subjects = re.findall(
        r'permissions violation for (?:publish|subscription) to "([^"]+)"', caplog.text, re.I
    )
    caplog.clear()
    names = (f".{name}.".lower(), f".obj_{name}.".lower())  # the server writes it lowercased
    return any(n in f".{subject.lower()}." for subject in subjects for n in names)


def file_of(tmp_path: Path, name: str, data: bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


async def test_each_uploads_into_its_own_bucket_only(
    prepared: Server, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="mdq.bus")
    async with connections(prepared, "alice", "cli", "admin") as (alice, cli, admin):
        script = file_of(tmp_path, "in.alice", b"units metal\n")
        mine = await upload(alice.jetstream(), SUBJECTS.inputs_bucket("alice"), script)
        assert mine.sent
        again = await upload(alice.jetstream(), SUBJECTS.inputs_bucket("alice"), script)
        assert not again.sent, "content-addressed: a file that is there is not sent again"
        operator = await upload(cli.jetstream(), SUBJECTS.inputs_bucket(), script)
        assert operator.sent
        caplog.clear()
        for bucket in (SUBJECTS.inputs_bucket("bob"), SUBJECTS.inputs_bucket()):
            with pytest.raises((InputsError, nats.errors.Error, TimeoutError)):
                await upload(alice.jetstream(), bucket, file_of(tmp_path, "x", b"forged\n"))
            assert refused(caplog, bucket), f"the server refused alice {bucket}"
        with pytest.raises((InputsError, nats.errors.Error, TimeoutError)):
            await upload(cli.jetstream(), SUBJECTS.inputs_bucket("bob"), script)
        assert refused(caplog, SUBJECTS.inputs_bucket("bob")), "the server refused the cli bob's"
        js = admin.jetstream()
        assert await lookup(js, SUBJECTS.inputs_bucket("alice"), mine.sha256) is not None
        info = await js.stream_info(f"OBJ_{SUBJECTS.inputs_bucket('bob')}")
        assert info.state.messages == 0, "nothing of the refused uploads was stored"


async def test_a_tenants_bucket_holds_its_quota_and_no_more(
    prepared: Server, tmp_path: Path
) -> None:
    async with connections(prepared, "bob") as (bob,):
        big = file_of(tmp_path, "big.data", b"x" * (QUOTA + 1))
        with pytest.raises(InputsFull, match="is full"):
            await upload(bob.jetstream(), SUBJECTS.inputs_bucket("bob"), big)
        small = file_of(tmp_path, "small.data", b"y" * 1000)
        assert (await upload(bob.jetstream(), SUBJECTS.inputs_bucket("bob"), small)).sent


async def test_a_runner_gets_its_own_jobs_files_from_intake_and_nothing_itself(
    prepared: Server, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="mdq.bus")
    async with connections(prepared, "alice", "intake", JOB, OTHER_JOB) as clients:
        alice, intake, runner, other = clients
        desk = InputDesk(intake, SUBJECTS)
        await desk.start()
        try:
            data = b"units metal\nlattice fcc 3.615\n" * 20_000  # several chunks
            uploaded = await upload(
                alice.jetstream(), SUBJECTS.inputs_bucket("alice"), file_of(tmp_path, "in", data)
            )
            spec = pb.JobSpec(name="melt")
            spec.inputs.add(name="in.melt", sha256=uploaded.sha256, size_bytes=uploaded.size_bytes)
            publisher = EventPublisher(js=intake.jetstream(), subjects=SUBJECTS, producer="intake")
            await publisher.publish(
                publisher.event("submitted", pb.JobSubmitted(spec=spec), job_id=JOB, attempt=0)
            )
            got = bytearray()
            written = await InputFetch(runner, SUBJECTS, JOB).fetch(uploaded.sha256, got.extend)
            assert bytes(got) == data and written == len(data)

            # another job of the same tenant asks for it: on its own subject intake refuses (not
            # its spec's), on the first job's subject the server refuses
            with pytest.raises(FetchRefused, match="has no submitted event"):
                await InputFetch(other, SUBJECTS, OTHER_JOB).fetch(
                    uploaded.sha256, bytearray().extend
                )
            caplog.clear()
            with pytest.raises((nats.errors.Error, TimeoutError)):
                await InputFetch(other, SUBJECTS, JOB, timeout_s=1.0).fetch(
                    uploaded.sha256, bytearray().extend
                )
            assert refused(caplog, JOB), "the server refused the other runner the job's subject"
            # and a runner reads no bucket by itself
            alices = SUBJECTS.inputs_bucket("alice")
            with pytest.raises((nats.errors.Error, TimeoutError)):
                await lookup(runner.jetstream(), alices, uploaded.sha256)
            assert refused(caplog, alices), "the server refused the runner alice's bucket"
            request = json.dumps({"seq": 1}).encode()
            with pytest.raises((nats.errors.Error, TimeoutError)):
                await runner.request(f"$JS.API.DIRECT.GET.OBJ_{alices}", request, timeout=1)
            assert refused(caplog, alices), "the server refused the runner a direct get"
            assert desk.served >= 2
        finally:
            await desk.stop()
