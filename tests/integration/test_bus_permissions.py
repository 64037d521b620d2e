"""Attacks on the bus, refused by a real nats-server configured by the code that configures mdq.

One server runs with ``mdq.bus.security.auth.Trust`` (operator, accounts, no secrets in its
configuration), and every identity of ``mdq.bus.security.permissions`` connects with credentials
issued by the same code ``mdq up`` uses. Each identity then tries what it must not do — forge every
event kind it does not own, write into every KV bucket, purge, delete, create or update streams,
take over another service's durable consumer, listen to another identity's replies — and the
server's answer (a permissions violation, or nothing stored) is checked against the table,
allowed cases included, so a table that allowed too much or too little fails here.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import nats
import nats.errors
import nats.js.errors
import pytest
from nats.aio.client import Client
from nats.js.api import ConsumerConfig

from mdq.bus.connect import connect
from mdq.bus.publisher import EventPublisher
from mdq.bus.security.auth import Trust, creds_text, encode_jwt, issue, runner_issuer, write_secret
from mdq.bus.security.permissions import (
    IDENTITIES,
    RUNNER_KINDS,
    SERVICES,
    TENANT_MAX_PAYLOAD,
    TENANT_MAX_SUBSCRIPTIONS,
    Names,
    Permissions,
    markdown_table,
    runner_permissions,
    service_permissions,
    tenant_permissions,
)
from mdq.bus.snapshots import SnapshotStore
from mdq.bus.streams import (
    ensure_streams,
    ensure_tenant_stream,
    ensure_tenant_submit_consumer,
    stream_configs,
    tenant_submit_stream_config,
)
from mdq.bus.subjects import Subjects
from mdq.cli.queues import tenant_usages
from mdq.contracts import pb
from mdq.core.producers import EVENT_PRODUCERS
from mdq.core.snapshot import encode as encode_snapshot
from mdq.core.tenants import TenantUsage, usage_key
from mdq.embedded import EmbeddedNats
from services.console.live import NodeBoard
from services.metrics.app import node_summary_event
from tests.helpers import closed_nats, wait_for

SUBJECTS = Subjects("mdq")
JOB = "0123456789ab-victim"
TENANT_JOB = "bob.0123456789ab-victim"
"""A job of tenant bob: a tenant's job ids have two tokens."""
RUNNER_JOB = "0123456789ab-mine"
COPY = "ckpt.1.a.m"
"""A subject of a job's copies (its slot a's manifest of attempt 1)."""
TENANT, OTHER_TENANT = "alice", "bob"
LEASE_BUCKET = "mdq_placement"
BUCKETS = (
    SUBJECTS.pods_bucket,
    SUBJECTS.nodes_bucket,
    SUBJECTS.waiting_bucket,
    SUBJECTS.tenants_bucket,
    SUBJECTS.placement_snapshot_bucket,
    SUBJECTS.recovery_snapshot_bucket,
    SUBJECTS.clusters_lost_bucket,
    LEASE_BUCKET,
)
STREAMS = (
    SUBJECTS.submit_stream,
    SUBJECTS.jobs_stream,
    SUBJECTS.progress_stream,
    SUBJECTS.nodes_stream,
    SUBJECTS.node_summaries_stream,
    SUBJECTS.copies_stream,
    *(f"KV_{bucket}" for bucket in BUCKETS),
)
SHARED_STREAMS = STREAMS[:6]
"""The namespace's own streams (the rest are buckets)."""
KV_WRITERS = {
    SUBJECTS.pods_bucket: {"placement", "watcher", "recovery", "agent"},
    SUBJECTS.nodes_bucket: {"agent"},
    SUBJECTS.waiting_bucket: {"placement"},
    SUBJECTS.tenants_bucket: set(),  # the admin's alone
    SUBJECTS.placement_snapshot_bucket: {"placement"},
    SUBJECTS.recovery_snapshot_bucket: {"recovery"},
    SUBJECTS.clusters_lost_bucket: {"watcher"},
    LEASE_BUCKET: {"placement"},
}
"""Who may write each bucket (everyone else is refused)."""
ATTACKERS = (*SERVICES, "cli", "runners", "runner", "tenant")
"""Identities that try what they must not do (a rogue service, the operator's client, a rogue
job's runner, a rogue tenant: alice)."""


def permissions_of(identity: str) -> Permissions:
    if identity == "runner":
        return runner_permissions(SUBJECTS, RUNNER_JOB)
    if identity == "tenant":
        return tenant_permissions(SUBJECTS, TENANT)
    if identity == "tenant-bob":
        return tenant_permissions(SUBJECTS, OTHER_TENANT)
    return service_permissions(identity, SUBJECTS, Names(lease_bucket=LEASE_BUCKET))


def event_subject(kind: str, job: str = JOB) -> str:
    if kind == "progress":
        return SUBJECTS.progress(job)
    if kind == "node_load":
        return SUBJECTS.node_load("n1")
    if kind == "node_summary":
        return SUBJECTS.node_summary("n1")
    if kind == "rejected":
        return SUBJECTS.rejected("0123456789ab")
    return SUBJECTS.job(job, kind)


@dataclass
class Server:
    nats: EmbeddedNats
    creds: dict[str, Path] = field(default_factory=dict)
    trust: Trust | None = None


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with closed_nats("mdq-auth-") as (embedded, trust, folder):
        server = Server(embedded)
        for identity in IDENTITIES:
            permissions = permissions_of(identity) if identity != "admin" else None
            permissions = permissions or service_permissions("admin", SUBJECTS)
            server.creds[identity] = issue(trust, permissions, folder / f"{identity}.creds")
        # A runner's credentials come from the runner-scoped signing key, as the node agent's do.
        minted = runner_issuer(trust).creds(RUNNER_JOB)
        server.creds["runner"] = write_secret(folder / "runner.creds", minted)
        for tenant in ("tenant", "tenant-bob"):  # as `mdq tenant add` issues them
            server.creds[tenant] = issue(trust, permissions_of(tenant), folder / f"{tenant}.creds")
        server.trust = trust
        yield server


@pytest.fixture(scope="module")
async def prepared(server: Server) -> AsyncIterator[Server]:
    """Streams, buckets and the watcher's durable consumer, made by admin as ``mdq up`` does."""
    admin = await connect(server.nats.url, name="admin", creds=server.creds["admin"])
    js = admin.jetstream()
    await ensure_streams(js, SUBJECTS)
    for bucket in BUCKETS:
        await js.create_key_value(bucket=bucket)
    await js.add_consumer(SUBJECTS.jobs_stream, durable_name="watcher-jobs", ack_policy="explicit")
    for tenant in (TENANT, OTHER_TENANT):
        await ensure_tenant_stream(js, SUBJECTS, tenant)
    yield server
    await admin.close()


@dataclass
class Attempts:
    """One connection's publish and subscribe tries, and what the server refused."""

    client: Client
    errors: list[str]
    markers: int = 0

    async def refused(self, subjects: list[str], *, subscribe: bool = False) -> set[str]:
        """Which of ``subjects`` the server refused (a permissions violation each).

        A marker subject no identity here may use is tried last: the server answers a
        connection's messages in order and the client hands its errors to the callback in
        that order, so once the marker's refusal has come every earlier one has too."""
        self.errors.clear()
        self.markers += 1
        marker = f"mdq_refusal_marker.{self.markers}"
        for subject in [*subjects, marker]:
            if subscribe:
                await self.client.subscribe(subject)
            else:
                await self.client.publish(subject, b"forged")
        await self.client.flush()

        async def marker_refused() -> bool:
            return f'"{marker}"' in " ".join(self.errors)

        await wait_for(marker_refused, timeout=20, what=f"the server to refuse {marker}")
        said = " ".join(self.errors)
        return {subject for subject in subjects if f'"{subject.lower()}"' in said}


@pytest.fixture
async def attempts_of(prepared: Server) -> AsyncIterator[dict[str, Attempts]]:
    opened: dict[str, Attempts] = {}

    async def open_one(identity: str) -> Attempts:
        errors: list[str] = []

        async def on_error(error: Exception) -> None:
            errors.append(str(error))

        client = await nats.connect(
            prepared.nats.url,
            user_credentials=str(prepared.creds[identity]),
            inbox_prefix=permissions_of(identity).inbox_prefix,
            error_cb=on_error,
            allow_reconnect=False,
        )
        return Attempts(client, errors)

    for identity in (*ATTACKERS, "tenant-bob"):
        opened[identity] = await open_one(identity)
    yield opened
    for attempts in opened.values():
        await attempts.client.close()


async def test_a_client_without_credentials_is_refused(prepared: Server) -> None:
    with pytest.raises((nats.errors.Error, OSError)):
        await nats.connect(prepared.nats.url, allow_reconnect=False, max_reconnect_attempts=0)


async def test_the_runner_key_cannot_mint_wider_credentials(prepared: Server) -> None:
    """Whoever holds the runner signing key (a node agent) signs a JWT that claims every
    subject: the server refuses the connection instead of granting it."""
    import nkeys

    from mdq.bus.security.auth import _new_key, _public, _seed

    assert prepared.trust is not None
    issuer = runner_issuer(prepared.trust)
    signer = nkeys.from_seed(bytearray(issuer.signing_seed.encode()))
    user = _new_key(nkeys.PREFIX_BYTE_USER)
    claims = {
        "iss": _public(signer),
        "sub": _public(user),
        "name": RUNNER_JOB,
        "nats": {
            "type": "user",
            "version": 2,
            "issuer_account": issuer.account_public,
            "pub": {"allow": [">"]},
            "sub": {"allow": [">"]},
        },
    }
    path = write_secret(
        Path(tempfile.mkdtemp()) / "wide.creds", creds_text(encode_jwt(claims, signer), _seed(user))
    )
    with pytest.raises((nats.errors.Error, OSError)):
        await nats.connect(prepared.nats.url, user_credentials=str(path), allow_reconnect=False)


@pytest.mark.parametrize("job_of", ["operator", "tenant"])
@pytest.mark.parametrize("identity", ATTACKERS)
async def test_each_identity_publishes_only_the_event_kinds_it_owns(
    attempts_of: dict[str, Attempts], identity: str, job_of: str
) -> None:
    """For the operator's jobs and the tenants' (two-token ids) alike."""
    job = RUNNER_JOB if identity == "runner" else JOB if job_of == "operator" else TENANT_JOB
    subjects = {kind: event_subject(kind, job) for kind in EVENT_PRODUCERS}
    refused = await attempts_of[identity].refused(list(subjects.values()))
    owner = "runner" if identity in ("runner", "runners") else identity
    allowed = {kind for kind, producers in EVENT_PRODUCERS.items() if owner in producers}
    assert {kind for kind, subject in subjects.items() if subject not in refused} == allowed


async def test_a_runner_reports_for_its_own_job_only(attempts_of: dict[str, Attempts]) -> None:
    others = [event_subject(kind, JOB) for kind in RUNNER_KINDS]
    others.append(SUBJECTS.runner_creds(JOB))  # nor asks for another job's credentials
    assert await attempts_of["runner"].refused(others) == set(others)


@pytest.mark.parametrize("identity", ATTACKERS)
async def test_each_identity_writes_only_the_buckets_it_may(
    attempts_of: dict[str, Attempts], identity: str
) -> None:
    keys = {bucket: f"$KV.{bucket}.forged-key" for bucket in BUCKETS}
    refused = await attempts_of[identity].refused(list(keys.values()))
    written = {bucket for bucket, subject in keys.items() if subject not in refused}
    assert written == {bucket for bucket, writers in KV_WRITERS.items() if identity in writers}


@pytest.mark.parametrize("identity", ATTACKERS)
async def test_only_intake_writes_claims(attempts_of: dict[str, Attempts], identity: str) -> None:
    """A claim is the record a retry is answered from: anyone else's could answer for jobs it
    never made, or keep a tenant's key from being used."""
    claims = [SUBJECTS.claim("0123456789ab"), SUBJECTS.claim(f"{TENANT}.0123456789ab")]
    refused = await attempts_of[identity].refused(claims)
    assert refused == (set() if identity == "intake" else set(claims))


@pytest.mark.parametrize("identity", ATTACKERS)
async def test_only_admin_purges_deletes_creates_or_updates_streams(
    attempts_of: dict[str, Attempts], identity: str
) -> None:
    tries = [
        f"$JS.API.STREAM.{verb}.{stream}" for stream in STREAMS for verb in ("PURGE", "DELETE")
    ]
    tries += [
        f"$JS.API.STREAM.{verb}.{stream}"
        for stream in (*SHARED_STREAMS, "EVIL")
        for verb in ("CREATE", "UPDATE")
    ]
    tries += [f"$JS.API.STREAM.MSG.DELETE.{stream}" for stream in STREAMS]
    assert await attempts_of[identity].refused(tries) == set(tries)


@pytest.mark.parametrize("identity", [name for name in ATTACKERS if name != "watcher"])
async def test_no_one_but_the_watcher_touches_its_durable_consumer(
    attempts_of: dict[str, Attempts], identity: str
) -> None:
    stream = SUBJECTS.jobs_stream
    tries = [
        f"$JS.API.CONSUMER.DURABLE.CREATE.{stream}.watcher-jobs",
        f"$JS.API.CONSUMER.CREATE.{stream}.watcher-jobs",
        f"$JS.API.CONSUMER.DELETE.{stream}.watcher-jobs",
        f"$JS.API.CONSUMER.MSG.NEXT.{stream}.watcher-jobs",
        f"$JS.ACK.{stream}.watcher-jobs.1.1.1.1.0",
        f"$JS.API.CONSUMER.DURABLE.CREATE.{stream}.mine",
    ]
    assert await attempts_of[identity].refused(tries) == set(tries)


@pytest.mark.parametrize("identity", ATTACKERS)
async def test_no_one_listens_to_another_identitys_replies(
    attempts_of: dict[str, Attempts], identity: str
) -> None:
    own = permissions_of(identity).inbox_prefix
    others = [f"{permissions_of(other).inbox_prefix}.>" for other in ATTACKERS if other != identity]
    tries = [*others, ">"]
    assert await attempts_of[identity].refused(tries, subscribe=True) == set(tries)
    assert not await attempts_of[identity].refused([f"{own}.>"], subscribe=True)


@pytest.mark.parametrize("identity", ["cli", "tenant"])
async def test_nothing_refused_reached_the_streams(
    prepared: Server, attempts_of: dict[str, Attempts], identity: str
) -> None:
    """A rogue client or tenant forges every kind; of it, only what its table allows is
    stored (nothing: neither owns an event kind)."""
    admin = await connect(prepared.nats.url, name="check", creds=prepared.creds["admin"])
    js = admin.jetstream()
    before = (await js.stream_info(SUBJECTS.jobs_stream)).state.messages
    forged = [event_subject(kind, job) for kind in EVENT_PRODUCERS for job in (JOB, TENANT_JOB)]
    await attempts_of[identity].refused(forged)
    after = (await js.stream_info(SUBJECTS.jobs_stream)).state.messages
    await admin.close()
    assert after == before


SUMMARY_READERS = {"console", "cli"}
"""Who may read the nodes' summarised load (``NS_NODE_SUMMARIES``): the console, whose nodes
page draws each node's last hour from it, and the operator's client."""


@pytest.mark.parametrize("identity", ATTACKERS)
async def test_only_the_console_and_the_operator_read_the_nodes_summaries(
    attempts_of: dict[str, Attempts], identity: str
) -> None:
    """Metrics publishes them, and nobody else may (the event kinds test); of the rest, only
    the console and the operator's client may read them: no other service needs them, and a
    tenant may not learn the load of the nodes its jobs share with others."""
    stream = SUBJECTS.node_summaries_stream
    tries = [
        f"$JS.API.CONSUMER.CREATE.{stream}",
        f"$JS.API.STREAM.MSG.GET.{stream}",
        f"$JS.API.DIRECT.GET.{stream}.{SUBJECTS.node_summary('n1')}",
        f"$JS.FC.{stream}.any",
    ]
    refused = await attempts_of[identity].refused(tries)
    assert refused == (set() if identity in SUMMARY_READERS else set(tries))


async def test_the_console_reads_the_hour_metrics_summarised_across_the_bridge(
    prepared: Server,
) -> None:
    """On the closed bus, as each runs: metrics publishes a node's summary as itself, the
    summaries stream (in the streams account) stores it, and the console, following the nodes
    as it does with its own credentials, has it in the node's last hour."""
    metrics = await connect(prepared.nats.url, name="metrics", creds=prepared.creds["metrics"])
    console = await connect(prepared.nats.url, name="console", creds=prepared.creds["console"])
    board = NodeBoard()
    following = asyncio.create_task(board.follow(console, SUBJECTS))
    try:
        publisher = EventPublisher(js=metrics.jetstream(), subjects=SUBJECTS, producer="metrics")
        summary = pb.NodeLoadSummary(
            node="n7",
            samples=30,
            cpu_load_mean=0.25,
            cpu_load_max=0.5,
            memory_load_mean=0.125,
            memory_load_max=0.375,
        )
        end = int(time.time()) // 60 * 60
        summary.start.FromSeconds(end - 60)
        summary.end.FromSeconds(end)
        ack = await publisher.publish(node_summary_event(publisher, summary))
        assert ack.stream == SUBJECTS.node_summaries_stream

        async def shown() -> bool:
            return board.history("n7").t == [float(end)]

        await wait_for(shown, timeout=10, what="the summary in the console's hour of n7")
        history = board.history("n7")
        assert (history.cpu, history.cpu_max, history.memory, history.memory_max) == (
            [0.25],
            [0.5],
            [0.125],
            [0.375],
        )
    finally:
        following.cancel()
        await asyncio.gather(following, return_exceptions=True)
        await metrics.close()
        await console.close()


async def stored_messages(prepared: Server) -> dict[str, int]:
    """How many messages each stream and bucket holds, tenants' streams included (as admin)."""
    admin = await connect(prepared.nats.url, name="count", creds=prepared.creds["admin"])
    try:
        js = admin.jetstream()
        streams = (
            *STREAMS,
            *(SUBJECTS.tenant_stream(tenant) for tenant in (TENANT, OTHER_TENANT)),
            *(SUBJECTS.tenant_submit_stream(tenant) for tenant in (TENANT, OTHER_TENANT)),
        )
        return {stream: (await js.stream_info(stream)).state.messages for stream in streams}
    finally:
        await admin.close()


def every_stored_subject() -> list[str]:
    """A subject of every kind some stream or bucket stores: each event kind for an
    operator's and a tenant's job, each submit entrance, intake's claims, each bucket's
    keys."""
    subjects = [event_subject(kind, job) for kind in EVENT_PRODUCERS for job in (JOB, TENANT_JOB)]
    subjects += [SUBJECTS.submit, SUBJECTS.submit_for(TENANT)]
    subjects += [SUBJECTS.copy(job, "ckpt.1.a.m") for job in (JOB, TENANT_JOB)]
    subjects += [SUBJECTS.claim("0123456789ab"), SUBJECTS.claim(f"{TENANT}.0123456789ab")]
    return subjects + [f"$KV.{bucket}.forged-key" for bucket in BUCKETS]


@pytest.mark.parametrize("identity", ATTACKERS)
async def test_the_reply_subject_trick_stores_nothing(
    prepared: Server, attempts_of: dict[str, Attempts], identity: str
) -> None:
    """A JetStream API request the identity may make, naming a stream's or a bucket's subject
    as its reply subject (nats-server discussion #8924): the answer comes back in the users
    account, where no stream captures it, so nothing is stored. Red with the streams in the
    account the identities log in to."""
    requests = {
        "tenant": f"$JS.API.STREAM.INFO.{SUBJECTS.tenant_stream(TENANT)}",
        # a runner's one JetStream request: a direct get of its own job's copies
        "runner": f"$JS.API.DIRECT.GET.{SUBJECTS.copies_stream}.{SUBJECTS.copy(RUNNER_JOB, COPY)}",
        "runners": f"$JS.API.DIRECT.GET.{SUBJECTS.copies_stream}.{SUBJECTS.copy(JOB, COPY)}",
    }
    request = requests.get(identity, "$JS.API.INFO")
    client = attempts_of[identity].client
    answer = await client.request(request, b"", timeout=5)  # the request itself is allowed
    assert answer.headers or b'"type":"io.nats.jetstream.api.v1.' in answer.data
    before = await stored_messages(prepared)
    for reply in every_stored_subject():
        await client.publish(request, b"", reply=reply)
    # No event says "stored nowhere", so the marker is one more request of the same kind
    # answered in the client's own inbox: the server takes a connection's messages in order
    # and hands its JetStream API requests to the API's queue in that order, so once the
    # marker is answered every request before it has been answered too.
    marker = await client.request(request, b"", timeout=10)
    assert marker.headers or b'"type":"io.nats.jetstream.api.v1.' in marker.data
    assert await stored_messages(prepared) == before


def every_delivery_target() -> list[str]:
    """Every subject a stream or bucket captures, as a push consumer's delivery subject: what
    ``every_stored_subject`` names, the tenants' submits as the streams account stores them,
    and the operator's and each tenant's literal submit subjects."""
    targets = every_stored_subject()
    targets += [SUBJECTS.submit_for(OTHER_TENANT)]
    targets += [SUBJECTS.submit_stored(tenant) for tenant in (TENANT, OTHER_TENANT)]
    return list(dict.fromkeys(targets))


@pytest.mark.parametrize("identity", ["cli", "tenant-bob"])
async def test_a_push_consumer_delivering_into_a_stream_stores_nothing(
    prepared: Server, identity: str
) -> None:
    """An identity that may create consumers (the operator's client on the nodes stream, a
    tenant on its own stream) names a subject some stream captures (the operator's submits,
    another tenant's, an event, a bucket's key) as a push consumer's delivery subject, with
    idle heartbeats every 100 ms, which a consumer sends whether or not it has messages. The
    server delivers in the streams account, where no stream listens on a literal subject (a
    consumer is active only while a subscription on exactly its delivery subject exists), so
    none is ever active and no stream stores a heartbeat, while a consumer of the same making
    delivering into the identity's own inbox gets its heartbeats. Red with a submit stream
    capturing its literal subject (the operator's submit stream then stores ten heartbeats a
    second of each such consumer)."""
    if identity == "cli":
        stream, seed = SUBJECTS.nodes_stream, SUBJECTS.node_load("n9")
    else:
        stream = SUBJECTS.tenant_stream(OTHER_TENANT)
        seed = SUBJECTS.job(f"{OTHER_TENANT}.00000000000c-copy", "bound")
    admin = await connect(prepared.nats.url, name="seed", creds=prepared.creds["admin"])
    await admin.jetstream().publish(seed, b"copied")
    client = await connect(prepared.nats.url, name=identity, creds=prepared.creds[identity])
    made: list[str] = []
    try:
        for _ in range(50):  # a tenant's stream gathers from the jobs stream, a moment later
            if (await admin.jetstream().stream_info(stream)).state.messages:
                break
            await asyncio.sleep(0.1)
        before = await stored_messages(prepared)

        async def push_consumer(target: str) -> str | None:
            config = {
                "deliver_subject": target,
                "deliver_policy": "all",
                "ack_policy": "none",
                "idle_heartbeat": 100_000_000,  # ns
                "flow_control": True,
            }
            body = json.dumps({"stream_name": stream, "config": config}).encode()
            answer = await client.request(f"$JS.API.CONSUMER.CREATE.{stream}", body, timeout=5)
            if b'"error"' in answer.data:  # into its own stream: "forms a cycle"
                assert b"cycle" in answer.data, answer.data
                return None
            name: str = json.loads(answer.data)["name"]
            made.append(name)
            return name

        targets = every_delivery_target()
        for start in range(0, len(targets), 8):  # a tenant may hold 16 consumers at once
            for target in targets[start : start + 8]:
                await push_consumer(target)
            # the marker: a consumer made alike, delivering into the identity's own inbox,
            # hears its heartbeats; the others have had as long to send theirs
            own = client.new_inbox()
            heard = await client.subscribe(own)
            assert await push_consumer(own)
            beats = 0
            while beats < 3:
                message = await heard.next_msg(timeout=10)
                beats += bool(message.headers and message.headers.get("Status") == "100")
            await heard.unsubscribe()
            for name in made:
                info = await admin.jetstream().consumer_info(stream, name)
                if info.config.deliver_subject != own:
                    assert not info.push_bound and info.delivered.consumer_seq == 0, info
                await admin.jetstream().delete_consumer(stream, name)
            made.clear()
        assert await stored_messages(prepared) == before
    finally:
        for name in made:
            with contextlib.suppress(nats.errors.Error):
                await admin.jetstream().delete_consumer(stream, name)
        await client.close()
        await admin.close()


def test_no_stream_captures_a_literal_subject() -> None:
    """Every subject a stream of a closed bus captures has a wildcard, the operator's and the
    tenants' submit streams included: a stream listening on a literal subject stores what a
    push consumer delivers there."""
    configs = [
        *stream_configs(SUBJECTS),
        tenant_submit_stream_config(SUBJECTS, TENANT, closed=True),
    ]
    literal = {
        (config.name, subject)
        for config in configs
        for subject in config.subjects or []
        if not ({"*", ">"} & set(subject.split(".")))
    }
    assert literal == set()


async def test_no_one_logs_in_to_the_streams_account(prepared: Server, tmp_path: Path) -> None:
    """Credentials signed by the streams account itself, allowing everything, are refused: only
    the imports of the users account reach the streams."""
    import nkeys

    from mdq.bus.security.auth import _new_key, _public, _seed

    assert prepared.trust is not None
    account = nkeys.from_seed(bytearray(prepared.trust.account_seed.encode()))
    user = _new_key(nkeys.PREFIX_BYTE_USER)
    claims = {
        "iss": _public(account),
        "sub": _public(user),
        "name": "intruder",
        "nats": {
            "type": "user",
            "version": 2,
            "pub": {"allow": [">"]},
            "sub": {"allow": [">"]},
            **{"subs": -1, "data": -1, "payload": -1},
        },
    }
    path = write_secret(tmp_path / "s.creds", creds_text(encode_jwt(claims, account), _seed(user)))
    with pytest.raises((nats.errors.Error, OSError)):
        await nats.connect(prepared.nats.url, user_credentials=str(path), allow_reconnect=False)


def test_the_documented_table_is_the_enforced_one() -> None:
    """docs/security.md shows the table these tests enforce, not an older one."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "security.md").read_text()
    documented = text.split("<!-- permissions:start -->\n", 1)[1].split("<!-- permissions:end")[0]
    assert documented == markdown_table(), "regenerate it: python -m mdq.bus.security.permissions"


@pytest.mark.parametrize(
    "identity,bucket",
    [
        ("placement", SUBJECTS.placement_snapshot_bucket),
        ("recovery", SUBJECTS.recovery_snapshot_bucket),
    ],
)
async def test_a_stateful_service_writes_and_reads_its_snapshot_as_itself(
    prepared: Server, identity: str, bucket: str
) -> None:
    """What the service does on a closed bus: a snapshot at the jobs log's last sequence,
    written and read back through the store with the service's own credentials."""
    admin = await connect(prepared.nats.url, name="admin", creds=prepared.creds["admin"])
    await admin.jetstream().publish(SUBJECTS.job(JOB, "started"), b"any")
    await admin.close()
    client = await connect(prepared.nats.url, name=identity, creds=prepared.creds[identity])
    try:
        js = client.jetstream()
        sequence = (await js.stream_info(SUBJECTS.jobs_stream)).state.last_seq or 0
        store = SnapshotStore(js, bucket=bucket, stream=SUBJECTS.jobs_stream, replicas=1)
        state = {"version": 1, "last_sequence": sequence, "jobs": []}
        sha256, chunks = encode_snapshot(state)
        await store.write(sha256, chunks, sequence=sequence, jobs=0, now=datetime.now(UTC))
        loaded = await store.load()
        assert loaded.resume.after == sequence, loaded.resume.reason
        assert loaded.state == state | {"nodes": []}
    finally:
        await client.close()


# -- tenants ---------------------------------------------------------------------------------


async def test_a_tenant_submits_on_its_own_subjects_only(attempts_of: dict[str, Attempts]) -> None:
    own = [SUBJECTS.submit_for(TENANT), SUBJECTS.api_submit_for(TENANT)]
    others = [
        SUBJECTS.submit,
        SUBJECTS.api_submit,
        SUBJECTS.submit_for(OTHER_TENANT),
        SUBJECTS.api_submit_for(OTHER_TENANT),
        SUBJECTS.submit_for("*"),
    ]
    assert await attempts_of["tenant"].refused([*own, *others]) == set(others)


async def test_a_tenant_controls_jobs_on_its_own_subject_only(
    attempts_of: dict[str, Attempts],
) -> None:
    """Job control (docs/control.md): alice may ask on her own subject only, so placement,
    which takes the tenant from the subject, controls her jobs only; nobody but placement may
    listen on a control subject (and hear others' requests)."""
    own = [SUBJECTS.api_control_for(TENANT)]
    others = [
        SUBJECTS.api_control,
        SUBJECTS.api_control_for(OTHER_TENANT),
        SUBJECTS.api_control_for("*"),
        f"{SUBJECTS.api_control}.{OTHER_TENANT}.x",
    ]
    assert await attempts_of["tenant"].refused([*own, *others]) == set(others)
    listen = SUBJECTS.api_control_subjects
    for identity in ("tenant", "cli", "console", "intake", "watcher", "runner"):
        assert await attempts_of[identity].refused(listen, subscribe=True) == set(listen), identity
    assert await attempts_of["placement"].refused(listen, subscribe=True) == set()


async def test_a_tenant_reads_its_own_stream_and_nothing_else(
    attempts_of: dict[str, Attempts],
) -> None:
    """No way into the shared streams (which hold everyone's jobs), another tenant's stream,
    or even the list of streams (it would name the other tenants); of its own submit stream,
    its info alone (how many of its submits wait), of another's, nothing."""
    own, bobs = SUBJECTS.tenant_stream(TENANT), SUBJECTS.tenant_stream(OTHER_TENANT)
    own_submits = SUBJECTS.tenant_submit_stream(TENANT)
    bobs_submits = SUBJECTS.tenant_submit_stream(OTHER_TENANT)
    allowed = [
        f"$JS.API.STREAM.INFO.{own}",
        f"$JS.API.STREAM.INFO.{own_submits}",
        f"$JS.API.CONSUMER.CREATE.{own}",
        f"$JS.API.STREAM.MSG.GET.{own}",
        f"$JS.API.DIRECT.GET.{own}.{SUBJECTS.job('alice.0123456789ab-x', 'bound')}",
    ]
    refused = [
        "$JS.API.STREAM.NAMES",
        "$JS.API.STREAM.LIST",
        "$JS.API.INFO",
        f"$JS.API.STREAM.INFO.{bobs}",
        f"$JS.API.CONSUMER.CREATE.{bobs}",
        f"$JS.API.STREAM.MSG.GET.{bobs}",
        f"$JS.API.DIRECT.GET.{bobs}.{SUBJECTS.job(TENANT_JOB, 'bound')}",
        f"$JS.API.STREAM.PURGE.{own}",
        f"$JS.API.STREAM.DELETE.{own}",
        f"$JS.API.STREAM.UPDATE.{own}",
        f"$JS.API.STREAM.INFO.{bobs_submits}",
    ]
    for submits in (own_submits, bobs_submits):
        refused += [
            f"$JS.API.CONSUMER.CREATE.{submits}",
            f"$JS.API.CONSUMER.CREATE.{submits}.mine",
            f"$JS.API.STREAM.MSG.GET.{submits}",
            f"$JS.API.DIRECT.GET.{submits}.{SUBJECTS.submit_stored(TENANT)}",
            f"$JS.API.STREAM.PURGE.{submits}",
        ]
    for stream in (
        SUBJECTS.jobs_stream,
        SUBJECTS.progress_stream,
        SUBJECTS.nodes_stream,
        SUBJECTS.node_summaries_stream,
    ):
        refused += [
            f"$JS.API.STREAM.INFO.{stream}",
            f"$JS.API.CONSUMER.CREATE.{stream}",
            f"$JS.API.CONSUMER.CREATE.{stream}.mine.{SUBJECTS.namespace}.job.{TENANT}.>",
            f"$JS.API.STREAM.MSG.GET.{stream}",
            f"$JS.API.DIRECT.GET.{stream}.{SUBJECTS.job(TENANT_JOB, 'bound')}",
        ]
    assert await attempts_of["tenant"].refused([*allowed, *refused]) == set(refused)
    core = [SUBJECTS.job_all("*"), SUBJECTS.job_all(f"{TENANT}.*"), SUBJECTS.progress_all]
    assert await attempts_of["tenant"].refused(core, subscribe=True) == set(core)


async def test_a_tenant_follows_its_own_jobs_and_only_them(
    prepared: Server, caplog: pytest.LogCaptureFixture
) -> None:
    """Placement binds a job of alice's, one of bob's, then a marker job of alice's; alice,
    reading her stream as the SDK does, sees hers and the marker next (her stream sources the
    jobs stream in order: bob's would come between); the shared stream and bob's are refused
    by the server."""
    caplog.set_level(logging.ERROR, logger="mdq.bus")
    placement = await connect(prepared.nats.url, name="p", creds=prepared.creds["placement"])
    alice = await connect(prepared.nats.url, name="alice", creds=prepared.creds["tenant"])
    try:
        alice_job = f"{TENANT}.00000000000a-follow"
        marker_job = f"{TENANT}.00000000000c-marker"
        for job in (alice_job, f"{OTHER_TENANT}.00000000000b-follow", marker_job):
            event = pb.Event(event_id=f"bound:{job}:1", job_id=job, attempt=1, producer="placement")
            event.bound.node = "n1"
            await placement.jetstream().publish(
                SUBJECTS.job(job, "bound"), event.SerializeToString()
            )
        js = alice.jetstream()
        stream = SUBJECTS.tenant_stream(TENANT)
        subscription = await js.subscribe(
            SUBJECTS.job_all("*"), stream=stream, ordered_consumer=True
        )
        seen = [(await subscription.next_msg(timeout=10)).data for _ in range(2)]
        assert [pb.Event.FromString(data).job_id for data in seen] == [alice_job, marker_job]
        for forbidden in (SUBJECTS.jobs_stream, SUBJECTS.tenant_stream(OTHER_TENANT)):
            caplog.clear()
            with pytest.raises((nats.errors.Error, asyncio.TimeoutError)):
                await js.subscribe(SUBJECTS.job_all("*"), stream=forbidden, ordered_consumer=True)
            # the server's refusal, not any timeout
            assert f"consumer.create.{forbidden}".lower() in caplog.text.lower(), caplog.text
    finally:
        await placement.close()
        await alice.close()


async def test_a_tenant_jobs_runner_reports_and_hears_its_acks(prepared: Server) -> None:
    """A runner of a tenant's job (an id with a dot) gets credentials from the node agent's
    issuer as any runner does; its JetStream publishes are acknowledged in its own inbox (the
    one the server's template fills in from its name) and land in the tenant's stream."""
    assert prepared.trust is not None
    job = f"{TENANT}.0123456789ab-runs"
    path = write_secret(
        Path(tempfile.mkdtemp()) / "tenant-runner.creds", runner_issuer(prepared.trust).creds(job)
    )
    runner = await connect(prepared.nats.url, name="runner", creds=path)
    try:
        event = pb.Event(event_id=f"progress:{job}:1:10", job_id=job, attempt=1, producer="runner")
        event.progress.step = 10
        ack = await runner.jetstream().publish(
            SUBJECTS.progress(job), event.SerializeToString(), timeout=5
        )
        assert ack.stream == SUBJECTS.progress_stream
    finally:
        await runner.close()
    admin = await connect(prepared.nats.url, name="check", creds=prepared.creds["admin"])
    try:
        stream = SUBJECTS.tenant_stream(TENANT)
        for _ in range(50):
            info = await admin.jetstream().stream_info(stream, subjects_filter=">")
            if SUBJECTS.progress(job) in (info.state.subjects or {}):
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError(f"the runner's progress never reached {stream}")
    finally:
        await admin.close()


async def test_the_operators_client_reads_the_tenants_shares_and_a_tenant_cannot(
    prepared: Server, attempts_of: dict[str, Attempts]
) -> None:
    """``mdq queues`` as the operator's identity reads placement's per-tenant counts from the
    waiting bucket (an ephemeral consumer for its keys, then gets); a tenant's identity may
    not read that bucket at all."""
    usage = TenantUsage(queued_jobs=3, running_cpu=2.0, as_of=datetime.now(UTC), share=0.25)
    placement = await connect(prepared.nats.url, name="p", creds=prepared.creds["placement"])
    kv = await placement.jetstream().key_value(SUBJECTS.waiting_bucket)
    await kv.put(usage_key(TENANT), usage.to_json())
    await placement.close()
    seen = await tenant_usages(prepared.nats.url, "mdq", creds=str(prepared.creds["cli"]))
    assert seen == {TENANT: usage}
    bucket = f"KV_{SUBJECTS.waiting_bucket}"
    tries = [
        f"$JS.API.STREAM.INFO.{bucket}",
        f"$JS.API.CONSUMER.CREATE.{bucket}",
        f"$JS.API.DIRECT.GET.{bucket}.$KV.{SUBJECTS.waiting_bucket}.{usage_key(TENANT)}",
    ]
    assert await attempts_of["tenant"].refused(tries) == set(tries)


async def test_a_tenant_cannot_squat_another_tenants_idempotency_key(
    prepared: Server,
) -> None:
    """Bob publishes first under the message id alice's SDK would give her key
    (``submit:<key>``); her submit is stored all the same, in her own submit stream (which
    deduplicates among her keys only, and intake reads). Red with the one shared submit stream
    deduplicating every tenant's ids together."""
    bob = await connect(prepared.nats.url, name="bob", creds=prepared.creds["tenant-bob"])
    alice = await connect(prepared.nats.url, name="alice", creds=prepared.creds["tenant"])
    admin = await connect(prepared.nats.url, name="check", creds=prepared.creds["admin"])
    key = {"Nats-Msg-Id": f"submit:squat-{time.time_ns()}"}
    try:
        squat = await bob.jetstream().publish(
            SUBJECTS.submit_for(OTHER_TENANT), b'{"jobs": []}', headers=key
        )
        assert not squat.duplicate and squat.stream == SUBJECTS.tenant_submit_stream(OTHER_TENANT)
        mine = await alice.jetstream().publish(
            SUBJECTS.submit_for(TENANT), b'{"jobs": [{"name": "w"}]}', headers=key
        )
        assert not mine.duplicate and mine.stream == SUBJECTS.tenant_submit_stream(TENANT)
        subject = SUBJECTS.submit_stored(TENANT)  # as the streams account stores it
        found = await admin.jetstream().get_msg(SUBJECTS.tenant_submit_stream(TENANT), mine.seq)
        assert found.subject == subject and found.data == b'{"jobs": [{"name": "w"}]}'
        # and no answer tells bob whether alice used a key: his own stream knows his alone
        again = await bob.jetstream().publish(
            SUBJECTS.submit_for(OTHER_TENANT), b'{"jobs": []}', headers=key
        )
        assert again.duplicate  # his own key, used by him
        probe = {"Nats-Msg-Id": f"submit:probe-{time.time_ns()}"}
        await alice.jetstream().publish(SUBJECTS.submit_for(TENANT), b"{}", headers=probe)
        oracle = await bob.jetstream().publish(
            SUBJECTS.submit_for(OTHER_TENANT), b"{}", headers=probe
        )
        assert not oracle.duplicate
    finally:
        for client in (bob, alice, admin):
            await client.close()


@pytest.mark.parametrize("identity", ["runner", "runners", "tenant"])
async def test_no_runner_nor_tenant_lists_or_counts_the_streams(
    attempts_of: dict[str, Attempts], identity: str
) -> None:
    """The names of the streams name every tenant (``MDQ_TENANT_<name>``); the account's
    figures count them. Red with ``COMMON_PUBLISH`` in the runner template."""
    tries = ["$JS.API.STREAM.NAMES", "$JS.API.STREAM.LIST", "$JS.API.INFO"]
    assert await attempts_of[identity].refused(tries) == set(tries)


async def test_a_tenants_connection_is_held_to_its_limits(prepared: Server) -> None:
    """The server enforces the tenant's subscriptions and message size (its JWT's limits):
    a flood of subscriptions ends the connection, a message bigger than a submit may be is
    refused (the size is also the server's default). Red with unlimited JWTs."""
    errors: list[str] = []

    async def on_error(error: Exception) -> None:
        errors.append(str(error))

    client = await nats.connect(
        prepared.nats.url,
        user_credentials=str(prepared.creds["tenant"]),
        inbox_prefix=permissions_of("tenant").inbox_prefix,
        error_cb=on_error,
        allow_reconnect=False,
    )
    try:
        assert client.max_payload == TENANT_MAX_PAYLOAD
        with pytest.raises(nats.errors.MaxPayloadError):
            await client.publish(SUBJECTS.submit_for(TENANT), b"x" * (TENANT_MAX_PAYLOAD + 1))
        own = permissions_of("tenant").inbox_prefix
        for number in range(TENANT_MAX_SUBSCRIPTIONS):
            await client.subscribe(f"{own}.sub{number}")
        await client.flush()
        assert client.is_connected  # as many as it may hold
        await client.subscribe(f"{own}.one-more")
        with contextlib.suppress(nats.errors.Error):
            await client.flush()
        for _ in range(50):
            if client.is_closed:
                break
            await asyncio.sleep(0.1)
        # the server says so and ends the connection
        assert "maximum subscriptions exceeded" in str(client.last_error).lower()
    finally:
        await client.close()


DURABLES = (
    ("intake", SUBJECTS.submit_stream, "intake"),
    ("watcher", SUBJECTS.jobs_stream, "watcher-jobs"),
    ("watcher", SUBJECTS.progress_stream, "watcher-progress"),
)
"""The services' durable consumers: (owner, stream, name)."""
HIJACK_FILTER = "mdq.job.hijacked.>"


@pytest.mark.parametrize(
    "identity", [name for name in ATTACKERS if name not in ("watcher", "runner", "runners")]
)
async def test_no_reader_reconfigures_a_services_durable_consumer(
    prepared: Server, attempts_of: dict[str, Attempts], identity: str
) -> None:
    """A reader asks to make a consumer under the name of a service's durable, with another
    filter: by the nameless request (the name in its body, which no permission sees), by the
    named one, by the legacy durable one. The durables keep their configuration. Red with the
    nameless request granted on the streams that hold them (the `cli` identity and every
    service reading them had it)."""
    admin = await connect(prepared.nats.url, name="durables", creds=prepared.creds["admin"])
    js = admin.jetstream()
    try:
        for _, stream, durable in DURABLES:
            await js.add_consumer(stream, durable_name=durable, ack_policy="explicit")
        attempts = attempts_of[identity]
        attempts.errors.clear()
        tries: list[str] = []
        for owner, stream, durable in DURABLES:
            if owner == identity:
                continue
            config = {"name": durable, "ack_policy": "explicit", "filter_subject": HIJACK_FILTER}
            body = json.dumps({"stream_name": stream, "config": config}).encode()
            legacy = {"durable_name": durable, "ack_policy": "explicit"}
            legacy["filter_subject"] = HIJACK_FILTER
            legacy_body = json.dumps({"stream_name": stream, "config": legacy}).encode()
            for subject, payload in (
                (f"$JS.API.CONSUMER.CREATE.{stream}", body),
                (f"$JS.API.CONSUMER.CREATE.{stream}.{durable}", body),
                (f"$JS.API.CONSUMER.CREATE.{stream}.{durable}.{HIJACK_FILTER}", body),
                (f"$JS.API.CONSUMER.DURABLE.CREATE.{stream}.{durable}", legacy_body),
            ):
                reply = attempts.client.new_inbox()
                await attempts.client.publish(subject, payload, reply=reply)
                tries.append(subject)
        await attempts.client.flush()
        said = ""
        for _ in range(50):  # each refusal comes back as an error of the connection
            said = " ".join(attempts.errors)
            if all(f'"{subject.lower()}"' in said for subject in tries):
                break
            await asyncio.sleep(0.1)
        assert [subject for subject in tries if f'"{subject.lower()}"' not in said] == []
        for _, stream, durable in DURABLES:
            info = await js.consumer_info(stream, durable)
            assert info.config.filter_subject != HIJACK_FILTER, (identity, stream, durable)
    finally:
        await admin.close()


async def test_the_operators_client_makes_its_consumers_by_name(prepared: Server) -> None:
    """The nameless consumer-create request on a stream that holds a service's durable is
    refused to the operator's client; nats-py (with ``mdq.bus.nats_fixes``) follows that
    stream all the same, through the named request."""
    errors: list[str] = []

    async def on_error(error: Exception) -> None:
        errors.append(str(error))

    admin = await connect(prepared.nats.url, name="seed", creds=prepared.creds["admin"])
    job = "00000000000f-named"
    await admin.jetstream().publish(SUBJECTS.job(job, "bound"), b"seed")
    await admin.close()
    client = await nats.connect(
        prepared.nats.url,
        user_credentials=str(prepared.creds["cli"]),
        error_cb=on_error,
        allow_reconnect=False,
    )
    try:
        stream = SUBJECTS.jobs_stream
        config = {"deliver_policy": "all", "ack_policy": "none"}
        body = json.dumps({"stream_name": stream, "config": config}).encode()
        with pytest.raises(nats.errors.TimeoutError):
            await client.request(f"$JS.API.CONSUMER.CREATE.{stream}", body, timeout=1)
        assert any("permissions violation" in error.lower() for error in errors), errors
        subscription = await client.jetstream().subscribe(
            SUBJECTS.job(job, "bound"), stream=stream, ordered_consumer=True
        )
        assert (await subscription.next_msg(timeout=5)).data == b"seed"
    finally:
        await client.close()


async def test_intake_reads_each_tenants_submit_stream_through_its_own_consumer(
    prepared: Server,
) -> None:
    """Intake makes its durable consumer of a tenant's submit stream (streams made after its
    credentials: no permission names them) and pulls and acks the tenant's submits through it;
    the request that makes it must name a tenant's stored submit subject as its filter."""
    tenant = SUBJECTS.tenant_submit_stream(OTHER_TENANT)
    bob = await connect(prepared.nats.url, name="bob", creds=prepared.creds["tenant-bob"])
    intake = await connect(prepared.nats.url, name="intake", creds=prepared.creds["intake"])
    admin = await connect(prepared.nats.url, name="admin", creds=prepared.creds["admin"])
    try:
        ack = await bob.jetstream().publish(SUBJECTS.submit_for(OTHER_TENANT), b'{"jobs": []}')
        js = intake.jetstream()
        await ensure_tenant_submit_consumer(js, SUBJECTS, OTHER_TENANT)
        subscription = await js.pull_subscribe_bind("intake", tenant)
        while True:  # from the stream's first submit (other tests' too) to bob's
            [message] = await subscription.fetch(1, timeout=5)
            await message.ack_sync()
            if message.metadata.sequence.stream == ack.seq:
                break
        assert message.data == b'{"jobs": []}'
        # Elsewhere such a consumer holds nothing: only a tenant's submit stream stores
        # tenants' submit subjects (nats-server 2.15 does not check a filter against the
        # stream's subjects, so the filter, not the server, is what keeps intake to them).
        stored = SUBJECTS.submit_stored("*")
        await admin.jetstream().publish(SUBJECTS.job(JOB, "held"), b"not a submit")
        for stream in (SUBJECTS.jobs_stream, f"KV_{SUBJECTS.tenants_bucket}"):
            config = ConsumerConfig(name="intake", durable_name="intake", filter_subject=stored)
            await js.add_consumer(stream, config)
            elsewhere = await js.pull_subscribe_bind("intake", stream)
            with pytest.raises(TimeoutError):
                await elsewhere.fetch(1, timeout=0.5)
            assert (await js.consumer_info(stream, "intake")).num_pending == 0
            await admin.jetstream().delete_consumer(stream, "intake")
    finally:
        await bob.close()
        await intake.close()
        await admin.close()


@pytest.mark.parametrize("identity", ATTACKERS)
async def test_no_one_but_intake_touches_its_consumer_of_a_tenants_submit_stream(
    attempts_of: dict[str, Attempts], identity: str
) -> None:
    """Nobody else makes, pulls from, acks for or deletes intake's consumer of a tenant's
    submit stream; intake itself makes no other consumer there, none with another filter, and
    deletes none."""
    stream = SUBJECTS.tenant_submit_stream(TENANT)
    stored = SUBJECTS.submit_stored(TENANT)
    tries = [
        f"$JS.API.CONSUMER.CREATE.{stream}",
        f"$JS.API.CONSUMER.CREATE.{stream}.intake",
        f"$JS.API.CONSUMER.CREATE.{stream}.other.{stored}",
        f"$JS.API.CONSUMER.DURABLE.CREATE.{stream}.intake",
        f"$JS.API.CONSUMER.DELETE.{stream}.intake",
        f"$JS.API.STREAM.PURGE.{stream}",
    ]
    if identity != "intake":
        tries += [
            f"$JS.API.CONSUMER.CREATE.{stream}.intake.{stored}",
            f"$JS.API.CONSUMER.MSG.NEXT.{stream}.intake",
            f"$JS.ACK.{stream}.intake.1.1.1.1.0",
        ]
    assert await attempts_of[identity].refused(tries) == set(tries)
