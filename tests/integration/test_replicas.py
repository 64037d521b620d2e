"""Streams and buckets carry ``MDQ_STREAM_REPLICAS`` copies, on a real three-node JetStream cluster.

Three nats-servers from the wheel (``mdq.embedded.start_nats`` with a ``cluster`` block, fsync
always, as on the production overlay) form one cluster on 127.0.0.1. Every place mdq creates a
stream or a KV bucket (``ensure_streams``, the local backend's buckets, the intake registry,
the placement lease) is asked for three replicas, and the server is asked what it made: three
copies each, placed on three servers. A process started with fewer (one) leaves them at three.
"""

from __future__ import annotations

import contextlib
import random
import socket
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.errors import APIError, ServiceUnavailableError

from mdq.backends.local.records import ensure_buckets
from mdq.bus.lease import LeaderLease
from mdq.bus.streams import ensure_streams, stream_configs
from mdq.bus.subjects import Subjects
from mdq.embedded import SHARED_FILE_STORE, EmbeddedNats, NatsCluster, start_nats
from mdq.settings import CommonSettings
from tests.helpers import wait_for


def test_the_setting_reaches_every_stream_config(monkeypatch: pytest.MonkeyPatch) -> None:
    assert CommonSettings().stream_replicas == 1  # a single server by default
    monkeypatch.setenv("MDQ_STREAM_REPLICAS", "3")
    replicas = CommonSettings().stream_replicas
    assert replicas == 3
    configs = stream_configs(Subjects("mdq"), replicas=replicas)
    assert configs and {config.num_replicas for config in configs} == {3}
    assert {config.num_replicas for config in stream_configs(Subjects("mdq"))} == {1}


def route_ports(count: int) -> tuple[int, ...]:
    """Free ports below the ephemeral range for the cluster's routes. They are chosen before
    any server binds them, so one taken from the ephemeral range could be handed meanwhile to
    another server's client port or an outgoing connection (seen: "Error listening on router
    port: address already in use")."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    ports: list[int] = []
    candidate = random.randrange(20000, low - 1000)
    while len(ports) < count:
        with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as probe:
            try:
                probe.bind(("127.0.0.1", candidate))
                ports.append(candidate)
            except OSError:
                pass
        candidate += 1
    return tuple(ports)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[EmbeddedNats]]:
    routes = route_ports(3)
    servers: list[EmbeddedNats] = []
    try:
        for index, route in enumerate(routes):
            servers.append(
                start_nats(
                    tmp_path_factory.mktemp(f"nats-{index}"),
                    server_name=f"n{index}",
                    cluster=NatsCluster(name="mdq-test", port=route, routes=routes),
                    max_file_store=SHARED_FILE_STORE,  # every test's namespace on one cluster
                )
            )
        yield servers
    finally:
        for server in servers:
            server.stop()


@pytest.fixture
async def clustered(cluster: list[EmbeddedNats]) -> AsyncIterator[Client]:
    client = await nats.connect(cluster[0].url, name="replicas-test")
    js = client.jetstream()

    async def ready() -> bool:
        try:
            await js.account_info()  # answers once the cluster elected its meta leader
        except (TimeoutError, APIError, ServiceUnavailableError, nats.errors.Error):
            return False
        return True

    await wait_for(ready, timeout=60, what="the JetStream cluster")
    yield client
    await client.drain()


async def replicas_of(js: JetStreamContext, stream: str) -> tuple[int, int]:
    """(configured replicas, servers holding a copy) of ``stream``."""
    info = await js.stream_info(stream)
    cluster = info.cluster
    assert cluster is not None
    return info.config.num_replicas or 1, 1 + len(cluster.replicas or [])


async def test_streams_and_buckets_have_three_copies(clustered: Client, namespace: str) -> None:
    js = clustered.jetstream()
    subjects = Subjects(namespace)
    await ensure_streams(js, subjects, replicas=3)
    streams = [config.name or "" for config in stream_configs(subjects)]
    assert len(streams) == 6  # submit, jobs, progress, nodes, node summaries, copies

    await ensure_buckets(js, subjects, replicas=3)
    lease = LeaderLease(
        js=js, bucket=f"{namespace}_placement", holder="test", ttl_s=5.0, replicas=3
    )
    assert await lease.try_acquire()
    buckets = [
        subjects.pods_bucket,
        subjects.nodes_bucket,
        f"{namespace}_placement",
    ]
    for stream in [*streams, *(f"KV_{bucket}" for bucket in buckets)]:
        assert await replicas_of(js, stream) == (3, 3), stream

    # A process started without the setting (one replica) does not scale them down.
    await ensure_streams(js, subjects, replicas=1)
    await ensure_buckets(js, subjects, replicas=1)
    lower = LeaderLease(js=js, bucket=f"{namespace}_placement", holder="other", ttl_s=5.0)
    assert await lower.holder_now() == "test"
    for stream in [*streams, f"KV_{subjects.pods_bucket}", f"KV_{namespace}_placement"]:
        assert await replicas_of(js, stream) == (3, 3), stream


async def test_existing_single_copy_buckets_are_raised(clustered: Client, namespace: str) -> None:
    """A namespace created before the setting (R1) gets its copies when a service starts."""
    js = clustered.jetstream()
    subjects = Subjects(namespace)
    await ensure_streams(js, subjects)
    await ensure_buckets(js, subjects)
    assert await replicas_of(js, subjects.jobs_stream) == (1, 1)
    await ensure_streams(js, subjects, replicas=3)
    await ensure_buckets(js, subjects, replicas=3)

    async def raised() -> bool:
        for stream in (subjects.jobs_stream, f"KV_{subjects.nodes_bucket}"):
            if await replicas_of(js, stream) != (3, 3):
                return False
        return True

    await wait_for(raised, timeout=30, what="three copies")  # new peers are added async


async def test_a_stream_keeps_its_creation_time_when_its_leader_changes(
    clustered: Client, namespace: str
) -> None:
    """The projector tells a recreated stream by its creation time (docs/durability.md): on a
    cluster every server must report the same one, before and after a leader change, or a
    routine failover would stop the projection."""
    js = clustered.jetstream()
    subjects = Subjects(namespace)
    await ensure_streams(js, subjects, replicas=3)
    stream = subjects.jobs_stream
    before = await js.stream_info(stream)
    assert before.created is not None and before.cluster is not None
    first_leader = before.cluster.leader
    api = f"$JS.API.STREAM.LEADER.STEPDOWN.{stream}"

    async def new_leader() -> bool:
        info = await js.stream_info(stream)
        return info.cluster is not None and info.cluster.leader not in (None, first_leader)

    await clustered.request(api, b"", timeout=10)
    await wait_for(new_leader, timeout=30, what="another stream leader")
    after = await js.stream_info(stream)
    assert after.created == before.created
