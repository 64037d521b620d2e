"""Helpers shared by the integration and end-to-end tests: building and reading events, waiting
for a condition, running a local node agent."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import asyncpg
import nats.errors
from google.protobuf.message import Message
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import DeliverPolicy

from mdq.backends.local.launcher import start_agent
from mdq.backends.port import PodExists, PodSpec, PodUpdate
from mdq.bus.codec import decode_event
from mdq.bus.publisher import EventPublisher
from mdq.bus.security.auth import Trust
from mdq.bus.snapshots import SnapshotStore
from mdq.bus.subjects import Subjects
from mdq.contracts import pb
from mdq.core.clusters import cluster_of
from mdq.core.events import make_event
from mdq.core.nodes import NodeSample
from mdq.core.producers import owner_of
from mdq.core.recovery import RecoveryPolicy
from mdq.core.spec import normalize_job
from mdq.embedded import EmbeddedNats, start_nats
from mdq.stack import Stack
from services.placement.app import Placement
from services.placement.settings import PlacementSettings
from services.recovery.app import Recovery


def event(
    kind: str, body: Message, *, job: str, attempt: int, detail: str | int | None = None
) -> pb.Event:
    return make_event(
        kind,
        body,
        job_id=job,
        attempt=attempt,
        producer=owner_of(kind),
        at=datetime.now(UTC),
        detail=detail,
    )


def with_fields(spec: pb.JobSpec, fields: Mapping[str, object]) -> pb.JobSpec:
    """``spec`` with ``fields`` set on it, for spec builders that take a test's fields as
    keyword arguments: a message (a ``Convergence``, a ``Barostat``, ``Resources``) is copied
    into its field, any other value assigned. Changes ``spec`` and returns it."""
    for name, value in fields.items():
        if isinstance(value, Message):
            getattr(spec, name).CopyFrom(value)
        else:
            setattr(spec, name, value)
    return spec


def attribute(message: object, path: str) -> object:
    """The value at the dotted ``path`` in ``message``: a field by its name, else a map's entry
    by its key (``labels.campaign``); a repeated field as a list, to compare with one."""
    for part in path.split("."):
        message = getattr(message, part) if hasattr(message, part) else message[part]  # type: ignore[index]
    if hasattr(message, "__len__") and not isinstance(message, str):
        return list(message)  # type: ignore[call-overload]
    return message


def lj(**fields: object) -> pb.System:
    """A Lennard-Jones fluid system with ``fields`` (a spec's ``system``)."""
    return pb.System(lennard_jones=pb.LennardJonesFluid(**fields))  # type: ignore[arg-type]


def submitted(
    job: str,
    *,
    cpu: float = 1,
    memory_mb: int = 512,
    depends_on: tuple[str, ...] = (),
    priority: str = "normal",
    max_retries: int = 3,
    clusters: pb.ClusterSelector | None = None,
) -> pb.Event:
    spec = pb.JobSpec(
        name=job.split("-", 1)[-1], steps=1000, priority_class=priority, max_retries=max_retries
    )
    spec.resources.cpu, spec.resources.memory_mb = cpu, memory_mb
    spec.depends_on.extend(depends_on)
    if clusters is not None:
        spec.clusters.CopyFrom(clusters)
    body = pb.JobSubmitted(
        spec=normalize_job(spec, "jobs[0]"),
        request_id=job.split("-", 1)[0],
        depends_on_ids=list(depends_on),
    )
    return event("submitted", body, job=job, attempt=0)


def node_load(
    name: str,
    *,
    cpu_capacity: float = 4,
    memory_mb: int = 8192,
    cpu_load: float = 0.0,
    ready: bool = True,
    cluster_labels: dict[str, str] | None = None,
    problem: str = "",
) -> pb.Event:
    """A node's load report; a ``name`` of "<cluster>/<node>" is a node of that cluster, whose
    ``cluster_labels`` come with it; ``problem``: why its environment cannot run pods."""
    body = pb.NodeLoad(
        node=name,
        cpu_load=cpu_load,
        memory_load=0.0,
        cpu_capacity=cpu_capacity,
        memory_capacity_mb=memory_mb,
        ready=ready,
        cluster=cluster_of(name),
        cluster_labels=cluster_labels or {},
        problem=problem,
    )
    return event("node_load", body, job="", attempt=0, detail=f"{name}:{time.time_ns()}")


async def read_all(js: JetStreamContext, subject: str, *, timeout: float = 10.0) -> list[pb.Event]:
    """Every event currently stored on ``subject`` (in stream order).

    The consumer's info says how many there are, so a wait here is for a message known to be
    stored, never for one that may not come: ``timeout`` is how late one may arrive. It was
    0.5 s, and on the 2-core machine, with a test's MD runners on both cores and recovery being
    killed, one arrived later (test_runners_killed_at_random_steps… failed in a fresh-clone
    run on nats' TimeoutError inside its kill loop)."""
    events: list[pb.Event] = []
    subscription = await js.subscribe(
        subject, ordered_consumer=True, deliver_policy=DeliverPolicy.ALL
    )
    try:
        info = await subscription.consumer_info()
        delivered = info.delivered.consumer_seq if info.delivered is not None else 0
        total = (info.num_pending or 0) + delivered
        while len(events) < total:
            message = await subscription.next_msg(timeout=timeout)
            events.append(decode_event(message.data))
    finally:
        await subscription.unsubscribe()
    return events


async def reconnected(client: Client) -> None:
    """Until ``client`` is connected again (after its server was restarted)."""

    async def connected() -> bool:
        return bool(client.is_connected)

    await wait_for(connected, timeout=20, what="the reconnect")


def thread_states(pid: int) -> list[str]:
    """The state letter of every thread of process ``pid`` (``T``: stopped)."""
    tasks = Path(f"/proc/{pid}/task")
    return [(task / "stat").read_text().rsplit(")", 1)[1].split()[0] for task in tasks.iterdir()]


async def all_threads_stopped(pid: int) -> None:
    """Until every thread of process ``pid`` is stopped: SIGSTOP takes effect a moment after
    it is sent, and a server's thread that still runs meanwhile answers."""

    async def all_stopped() -> bool:
        return all(state in "tT" for state in thread_states(pid))

    await wait_for(all_stopped, timeout=10, what=f"process {pid} stopped")


def stack_part(stack: Stack, name: str) -> tuple[bool, int, int | None]:
    """(running, restarts, pid) of one part of a stack, from the stack's own status."""
    [found] = [each for each in stack.status() if each.name == name]
    return found.running, found.restarts, found.pid


async def wait_for(
    check: Callable[[], Awaitable[bool]],
    *,
    timeout: float = 20.0,
    interval: float = 0.1,
    what: str = "condition",
) -> None:
    """Poll ``check`` until it is true, or fail after ``timeout`` seconds (``eventually``)."""
    await eventually(check, what, within=timeout, interval=interval)


@contextmanager
def closed_nats(prefix: str) -> Iterator[tuple[EmbeddedNats, Trust, Path]]:
    """A NATS server that admits only users of its own new trust, in a new folder named from
    ``prefix``: the server, the trust and the folder; stopped and removed afterwards."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    trust = Trust.load_or_create(folder / "secrets")
    server = start_nats(folder / "nats", auth=trust.server_block())
    yield server, trust, folder
    server.stop()
    shutil.rmtree(folder, ignore_errors=True)


@contextmanager
def agent_running(
    nats_url: str,
    namespace: str,
    data_dir: Path,
    nodes: Sequence[str],
    settings: Mapping[str, str],
    *,
    log_file: Path | None = None,
    creds: Path | None = None,
) -> Iterator[subprocess.Popen[bytes]]:
    """A local node agent (``start_agent``) serving ``nodes`` with ``settings`` (and its own
    ``creds`` on an authenticating server); killed when the block ends."""
    process = start_agent(
        nats_url=nats_url,
        namespace=namespace,
        data_dir=data_dir,
        node_names=nodes,
        settings=settings,
        log_file=log_file,
        creds=creds,
    )
    try:
        yield process
    finally:
        process.kill()
        process.wait()


async def intake_answering(nc: Client, subject: str, *, within: float) -> None:
    """Until intake answers a request-reply submit on ``subject`` (any answer will do); fail
    after ``within`` seconds."""
    deadline = time.monotonic() + within
    while True:
        try:
            await nc.request(subject, b"{}", timeout=1.0)
            return
        except (nats.errors.NoRespondersError, nats.errors.TimeoutError):
            if time.monotonic() > deadline:
                raise AssertionError("intake did not start answering") from None
            await asyncio.sleep(0.2)


Found = TypeVar("Found")


async def eventually(
    probe: Callable[[], Awaitable[Found | None]],
    what: str = "",
    *,
    within: float = 15.0,
    interval: float = 0.1,
) -> Found:
    """Poll ``probe`` until it returns something truthy, and return that; fail after ``within``
    seconds naming ``what`` (else the probe).

    The probe runs once more at the deadline: a loop starved past it (two loaded cores) must
    not fail a condition that came true while this coroutine was not running."""
    deadline = time.monotonic() + within
    while True:
        result = await probe()
        if result:
            return result
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {within}s waiting for {what or probe}")
        await asyncio.sleep(interval)


async def events_of(
    js: JetStreamContext, subjects: Subjects, kind: str, job: str = "*"
) -> list[pb.Event]:
    return await read_all(js, subjects.job(job, kind))


async def wait_for_events(
    js: JetStreamContext,
    subjects: Subjects,
    kind: str,
    job: str = "*",
    *,
    count: int | None = None,
    timeout: float = 20.0,
    what: str = "condition",
) -> list[pb.Event]:
    """Until the jobs log holds ``kind`` events of ``job`` (of every job with ``"*"``): exactly
    ``count`` of them where it is given, else at least one; returns them as they were then.
    Fails as ``wait_for`` does."""
    found: list[pb.Event] = []

    async def enough() -> bool:
        nonlocal found
        found = await events_of(js, subjects, kind, job)
        return len(found) == count if count is not None else bool(found)

    await wait_for(enough, timeout=timeout, what=what)
    return found


MARKER_PREFIX = "mk"
"""Request ids of ``placement_settled``'s marker jobs: ``mk<n>-marker``."""


async def placement_settled(
    js: JetStreamContext, subjects: Subjects, *, tag: int | str = 0, timeout: float = 20.0
) -> str:
    """A positive marker for "placement did nothing more": a node too small for anything a
    test submits (0.5 cores) and a job that fits only there (0.1 cores, 64 MB), published
    after everything the test did. Placement folds the jobs log in order and binds in passes
    over what it has folded, so once the marker is bound, every event before it has been
    folded and a binding pass has run over it: what was not bound by then was refused, not
    late. Returns the marker's job id (leave it out of the test's counts)."""
    marker_job = f"{MARKER_PREFIX}{tag}-marker"
    bus = OwnersPublisher(js=js, subjects=subjects)
    await bus.publish(node_load(f"marker{tag}", cpu_capacity=0.5, memory_mb=128))
    await bus.publish(submitted(marker_job, cpu=0.1, memory_mb=64))

    async def marker_bound() -> bool:
        return bool(await events_of(js, subjects, "bound", marker_job))

    await wait_for(marker_bound, timeout=timeout, what=f"placement to bind its marker {marker_job}")
    return marker_job


class RecordingBackend:
    """The cluster backend port, in memory: records pods, reports what the test tells it.

    For testing services at the port boundary (cosmicpython's fake adapter); the real local
    and Kubernetes adapters have their own tests.
    """

    def __init__(self) -> None:
        self.pods: dict[str, PodSpec] = {}
        self.created = 0
        self.deleted: list[str] = []
        self.updates: asyncio.Queue[PodUpdate] = asyncio.Queue()

    async def create_pod(self, pod: PodSpec) -> None:
        if pod.name in self.pods:
            raise PodExists(pod.name)
        self.pods[pod.name] = pod
        self.created += 1

    async def delete_pod(self, name: str) -> None:
        self.deleted.append(name)

    async def pod_created(self, name: str, *, what: str) -> PodSpec:
        """The pod ``name`` once it was created (``what`` names that moment if it never
        comes: fails as ``wait_for`` does)."""

        async def created() -> bool:
            return name in self.pods

        await wait_for(created, what=what)
        return self.pods[name]

    async def watch_pods(self) -> AsyncIterator[PodUpdate]:
        while True:
            yield await self.updates.get()

    async def sample_nodes(self) -> list[NodeSample]:
        return []

    async def close(self) -> None:
        return None


def placement_of(
    js: JetStreamContext,
    subjects: Subjects,
    backend: RecordingBackend | None = None,
    *,
    nc: Client | None = None,
    **settings: Any,
) -> Placement:
    """A placement service on the test's bus that publishes as the owners would
    (``publisher``), with a recording backend unless given one. ``settings``: fields of
    ``PlacementSettings`` (a reconcile pass every 0.2 s unless they say otherwise); ``nc``: the
    connection it answers job control on (None: it answers none)."""
    return Placement(
        js=js,
        subjects=subjects,
        publisher=publisher(js, subjects),
        backend=backend or RecordingBackend(),
        settings=PlacementSettings(**{"reconcile_interval_s": 0.2, **settings}),
        namespace=subjects.namespace,
        nc=nc,
    )


def recovery_of(
    js: JetStreamContext,
    subjects: Subjects,
    policy: RecoveryPolicy | None = None,
    *,
    snapshots: SnapshotStore | None = None,
    snapshot_interval_s: float = 60.0,
) -> Recovery:
    """A recovery service on the test's bus that publishes as the owners would
    (``publisher``), deciding by ``policy`` (the default one unless given); ``snapshots``: the
    store it keeps its snapshot in (None: it keeps none)."""
    return Recovery(
        js=js,
        subjects=subjects,
        publisher=publisher(js, subjects),
        policy=policy or RecoveryPolicy(),
        snapshots=snapshots,
        snapshot_interval_s=snapshot_interval_s,
    )


def snapshot_store(js: JetStreamContext, subjects: Subjects, bucket: str) -> SnapshotStore:
    """The snapshot store of a service whose snapshots are kept in ``bucket``, over the jobs
    stream, with one replica (the tests' single server)."""
    return SnapshotStore(js, bucket=bucket, stream=subjects.jobs_stream, replicas=1)


@asynccontextmanager
async def running(
    coroutine: Awaitable[None], *, stop_timeout: float = 10.0
) -> AsyncIterator[asyncio.Task[None]]:
    """Run a service coroutine in the background for the duration of a block; fail the block
    if the service did not survive it.

    Services run until they are cancelled, so at the end of the block (after cancelling the
    service and waiting up to ``stop_timeout`` seconds for it to stop):

    - an exception the service raised is re-raised here (with a note naming the service), so
      a test that asserts "nothing happened" cannot pass over a dead service. If the block
      failed too, the service's crash wins (it is the likelier cause), with the block's
      exception as its ``__context__``;
    - a service that *returned* before the end of the block is a failure (AssertionError):
      it stopped serving in the middle of the test;
    - a CancelledError counts as a clean stop only if some ``cancel()`` of this task caused
      it: the block's own at the end, or the test's ``task.cancel()`` (a replica killed on
      purpose). One that leaked out of the service (a cancelled inner future) is a crash;
    - a service that does not stop within ``stop_timeout`` after its cancel is a failure.
    """
    task: asyncio.Task[None] = asyncio.ensure_future(coroutine)
    name = getattr(coroutine, "__qualname__", task.get_name())
    returned_early = False
    try:
        yield task
    finally:
        if task.done():
            returned_early = not task.cancelled() and task.exception() is None
        else:
            task.cancel()
            await asyncio.wait([task], timeout=stop_timeout)
        if not task.done():
            raise AssertionError(f"{name} did not stop within {stop_timeout}s of its cancel")
        if task.cancelled():
            if task.cancelling() == 0:
                raise AssertionError(
                    f"{name} ended with a CancelledError that no cancel() of it asked for"
                )
        elif (crash := task.exception()) is not None:
            crash.add_note(f"raised by {name}, a service run by tests.helpers.running()")
            raise crash
        elif returned_early:
            raise AssertionError(f"{name} returned before the end of the block")


class OwnersPublisher(EventPublisher):
    """Publishes each event as the producer that owns its kind would (``owner_of``): what the
    consumers accept (``mdq.bus.codec.foreign_reason``), for tests that play every service."""

    def __init__(self, *, js: JetStreamContext, subjects: Subjects) -> None:
        super().__init__(js=js, subjects=subjects, producer="")

    def producer_of(self, kind: str) -> str:
        return owner_of(kind)


def publisher(js: JetStreamContext, subjects: Subjects) -> EventPublisher:
    return OwnersPublisher(js=js, subjects=subjects)


INSERT_JOB_ROW = (
    "INSERT INTO jobs (job_id, request_id, name, task, state, attempt, priority_class, spec, "
    "depends_on, submitted_at, updated_at, target_steps, last_step) VALUES ($1, $1, 'md', "
    "'TASK_MD', $3, 1, 'normal', $2::jsonb, '{}', now(), now(), 100, 0)"
)


async def insert_job_rows(
    connection: asyncpg.Connection, specs: Mapping[str, str], *, state: str = "RUNNING"
) -> None:
    """A ``jobs`` row for each job id of ``specs``, with that spec (JSON text): what rows of
    ``attempts`` and the tables kept from it need, written straight into PostgreSQL."""
    await connection.executemany(
        INSERT_JOB_ROW, [(job, spec, state) for job, spec in specs.items()]
    )
