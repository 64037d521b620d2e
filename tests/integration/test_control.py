"""Job control against a real JetStream: placement's leader answers cancel, hold, release,
requeue, reprioritize and extend (docs/control.md), idempotently under a control key, for the
requester's own jobs only; the log says what happened."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext
from typer.testing import CliRunner, Result

from mdq.bus.publisher import EventPublisher
from mdq.bus.subjects import Subjects
from mdq.cli.main import app
from mdq.contracts import pb
from mdq.core.control import control_id_for_key
from mdq.core.spec import normalize_job
from mdq.errors import NotFound
from mdq.sdk.client import ControlRefused, MdqClient
from services.placement.app import Placement
from services.placement.control import ControlDesk, ControlRegistry, Decide
from tests.helpers import (
    RecordingBackend,
    event,
    events_of,
    node_load,
    placement_of,
    read_all,
    running,
    wait_for,
    wait_for_events,
)


def job(
    job_id: str,
    *,
    cpu: float = 1,
    labels: dict[str, str] | None = None,
    depends_on: tuple[str, ...] = (),
    priority: str = "normal",
    task: pb.Task = pb.TASK_MD,
) -> pb.Event:
    request_id, _, name = job_id.rpartition("-")
    spec = pb.JobSpec(name=name, steps=1000, priority_class=priority, task=task)
    spec.resources.cpu, spec.resources.memory_mb = cpu, 512
    spec.labels.update(labels or {})
    body = pb.JobSubmitted(
        spec=normalize_job(spec, "jobs[0]"), request_id=request_id, depends_on_ids=depends_on
    )
    return event("submitted", body, job=job_id, attempt=0)


@asynccontextmanager
async def placement_running(
    nc: Client, subjects: Subjects, backend: RecordingBackend
) -> AsyncIterator[Placement]:
    placement = placement_of(nc.jetstream(), subjects, backend, nc=nc)
    async with running(placement.run()):

        async def answering() -> bool:
            return placement.controls is not None and placement.controls.open

        await wait_for(answering, what="the control entrance open")
        yield placement


async def kind_of_all(nc: Client, subjects: Subjects, kind: str) -> list[pb.Event]:
    """Every ``kind`` event of every job, the operator's and the tenants'."""
    every = await read_all(nc.jetstream(), f"{subjects.namespace}.job.>")
    return [e for e in every if e.WhichOneof("body") == kind]


@pytest.fixture
def client(nc: Client, subjects: Subjects) -> MdqClient:
    """The operator's client on the test's connection."""
    return MdqClient(nc=nc, subjects=subjects)


@asynccontextmanager
async def bound_on_n1(
    nc: Client, subjects: Subjects, bus: EventPublisher, backend: RecordingBackend, job_id: str
) -> AsyncIterator[Placement]:
    """Node n1, and ``job_id`` submitted and bound there (its first attempt's pod created) by a
    placement that answers job control until the block ends."""
    await bus.publish(node_load("n1"))
    await bus.publish(job(job_id))
    async with placement_running(nc, subjects, backend) as placement:
        await backend.pod_created(f"mdq-{job_id}-1", what="the job bound")
        yield placement


def outcomes(reply: pb.ControlReply) -> dict[str, tuple[str, str]]:
    return {o.job_id: (pb.ControlResult.Name(o.result), o.state) for o in reply.outcomes}


async def test_a_pending_job_is_cancelled_at_once_and_never_bound(
    nc: Client,
    subjects: Subjects,
    js: JetStreamContext,
    bus: EventPublisher,
    backend: RecordingBackend,
    client: MdqClient,
) -> None:
    await bus.publish(job("aaaaaaaaaaaa-big", cpu=64))  # fits no node: stays PENDING
    await bus.publish(node_load("n1", cpu_capacity=4))
    async with placement_running(nc, subjects, backend):
        reply = await client.cancel(
            ["aaaaaaaaaaaa-big"], control_key="k1", reason="typo in steps", requested_by="ann"
        )
        assert outcomes(reply) == {"aaaaaaaaaaaa-big": ("CONTROL_DONE", "CANCELLED")}
        assert reply.control_id == control_id_for_key("k1")
        [cancelled] = await events_of(js, subjects, "cancelled")
        assert cancelled.cancelled.message == "cancelled by ann: typo in steps"
        assert cancelled.cancelled.origin.control_id == reply.control_id
        # the same key again: the same answer, nothing new in the log
        again = await client.cancel(
            ["aaaaaaaaaaaa-big"], control_key="k1", reason="typo in steps", requested_by="ann"
        )
        assert again == reply
        # the same key, other content: refused, naming the key
        with pytest.raises(ControlRefused) as refused:
            await client.hold(["aaaaaaaaaaaa-big"], control_key="k1")
        assert refused.value.field == "control_key"
        await bus.publish(node_load("n1", cpu_capacity=128))  # room now: still never bound
        second = await client.cancel(["aaaaaaaaaaaa-big"], control_key="k2")
        assert outcomes(second) == {"aaaaaaaaaaaa-big": ("CONTROL_UNCHANGED", "CANCELLED")}
    assert len(await events_of(js, subjects, "cancelled")) == 1
    assert await events_of(js, subjects, "bound") == []
    assert backend.pods == {}


async def test_a_running_job_is_stopped_and_its_pod_deleted(
    nc: Client,
    subjects: Subjects,
    js: JetStreamContext,
    bus: EventPublisher,
    backend: RecordingBackend,
    client: MdqClient,
) -> None:
    async with bound_on_n1(nc, subjects, bus, backend, "bbbbbbbbbbbb-run") as placement:
        await bus.publish(
            event("started", pb.JobStarted(node="n1"), job="bbbbbbbbbbbb-run", attempt=1)
        )

        async def started() -> bool:
            view = placement.book.jobs["bbbbbbbbbbbb-run"]
            return view.state.value == "RUNNING"

        await wait_for(started, what="the job running")
        reply = await client.cancel(["bbbbbbbbbbbb-run"])
        assert outcomes(reply) == {"bbbbbbbbbbbb-run": ("CONTROL_STOPPING", "RUNNING")}
        assert backend.deleted == ["mdq-bbbbbbbbbbbb-run-1"]
        [requested] = await events_of(js, subjects, "cancel_requested")
        assert requested.attempt == 1
        # not ended by placement: recovery ends it once the stopped attempt has failed
        assert await events_of(js, subjects, "cancelled") == []
        again = await client.cancel(["bbbbbbbbbbbb-run"])
        assert outcomes(again) == {"bbbbbbbbbbbb-run": ("CONTROL_UNCHANGED", "RUNNING")}
    assert backend.deleted == ["mdq-bbbbbbbbbbbb-run-1"]  # once


async def test_a_held_job_is_not_placed_until_released(
    nc: Client,
    subjects: Subjects,
    bus: EventPublisher,
    backend: RecordingBackend,
    client: MdqClient,
) -> None:
    await bus.publish(job("cccccccccccc-big", cpu=64))
    await bus.publish(node_load("n1", cpu_capacity=4))
    async with placement_running(nc, subjects, backend) as placement:
        reply = await client.hold(["cccccccccccc-big"])
        assert outcomes(reply) == {"cccccccccccc-big": ("CONTROL_DONE", "HELD")}
        passes = placement.passes_total
        await bus.publish(node_load("n1", cpu_capacity=128))  # room: but it is held

        async def two_more_passes() -> bool:
            return (
                placement.passes_total >= passes + 2
                and "n1" in placement.nodes
                and (placement.nodes["n1"].cpu_capacity == 128)
            )

        await wait_for(two_more_passes, what="passes with room for it")
        assert backend.pods == {}
        assert outcomes(await client.hold(["cccccccccccc-big"])) == {
            "cccccccccccc-big": ("CONTROL_UNCHANGED", "HELD")
        }
        released = await client.release(["cccccccccccc-big"])
        assert outcomes(released) == {"cccccccccccc-big": ("CONTROL_DONE", "PENDING")}

        await backend.pod_created("mdq-cccccccccccc-big-1", what="the released job bound")
        again = await client.release(["cccccccccccc-big"])
        assert outcomes(again)["cccccccccccc-big"][0] == "CONTROL_NOT_APPLICABLE"


async def test_reprioritize_reranks_the_queue_within_the_tenants_classes(
    nc: Client,
    subjects: Subjects,
    bus: EventPublisher,
    backend: RecordingBackend,
) -> None:
    await bus.publish(node_load("n1", cpu_capacity=1))
    await bus.publish(job("alice.dddddddddddd-blocker", cpu=1))
    alice = MdqClient(nc=nc, subjects=subjects, tenant="alice")
    first, second = "alice.dddddddddddd-first", "alice.dddddddddddd-second"
    async with placement_running(nc, subjects, backend) as placement:

        async def one_bound() -> bool:
            return len(backend.pods) == 1

        await wait_for(one_bound, what="the only slot taken")
        # two more wait for the slot; the later, lower one is raised and goes first
        await bus.publish(job(first, cpu=1))
        await bus.publish(job(second, cpu=1, priority="low"))

        async def queued() -> bool:
            return {first, second} <= placement.book.jobs.keys()

        await wait_for(queued, what="both queued")
        # high is not alice's (no allow_high in her policy): the whole request is refused
        with pytest.raises(ControlRefused) as refused:
            await alice.reprioritize([second], priority_class="high")
        assert refused.value.field == "priority_class"
        lowered = await alice.reprioritize([first], priority_class="low")
        assert outcomes(lowered) == {first: ("CONTROL_DONE", "PENDING")}
        raised = await alice.reprioritize([second], priority_class="normal")
        assert outcomes(raised) == {second: ("CONTROL_DONE", "PENDING")}
        assert placement.book.jobs[second].priority > placement.book.jobs[first].priority
        await bus.publish(
            event(
                "succeeded",
                pb.JobSucceeded(final_step=1),
                job="alice.dddddddddddd-blocker",
                attempt=1,
            )
        )

        async def two_bound() -> bool:
            return len(backend.pods) == 2

        await wait_for(two_bound, what="the next job bound")
        assert f"mdq-{second.replace('.', '-')}-1" in backend.pods
        assert backend.deleted == []  # nothing restarted
    changed = await kind_of_all(nc, subjects, "reprioritized")
    assert [
        (e.job_id, e.reprioritized.previous, e.reprioritized.priority_class) for e in changed
    ] == [
        (first, "normal", "low"),
        (second, "low", "normal"),
    ]
    assert {e.reprioritized.origin.tenant for e in changed} == {"alice"}


async def test_a_tenant_controls_its_own_jobs_only(
    nc: Client,
    subjects: Subjects,
    bus: EventPublisher,
    backend: RecordingBackend,
) -> None:
    await bus.publish(node_load("n1", cpu_capacity=1))
    for each in ("alice.eeeeeeeeeeee-a", "bob.eeeeeeeeeeee-b", "eeeeeeeeeeee-op"):
        await bus.publish(job(each, cpu=8, labels={"campaign": "x"}))
    alice = MdqClient(nc=nc, subjects=subjects, tenant="alice")
    operator = MdqClient(nc=nc, subjects=subjects)
    async with placement_running(nc, subjects, backend):
        by_id = await alice.cancel(["bob.eeeeeeeeeeee-b", "eeeeeeeeeeee-op"])
        assert outcomes(by_id) == {
            "bob.eeeeeeeeeeee-b": ("CONTROL_FORBIDDEN", ""),
            "eeeeeeeeeeee-op": ("CONTROL_FORBIDDEN", ""),
        }
        for verb in ("hold", "reprioritize", "extend"):
            extra: dict[str, object] = {}
            if verb == "reprioritize":
                extra["priority_class"] = "low"
            if verb == "extend":
                extra["extend_steps"] = 10
            reply = await alice.control(verb, ["bob.eeeeeeeeeeee-b"], **extra)  # type: ignore[arg-type]
            assert outcomes(reply) == {"bob.eeeeeeeeeeee-b": ("CONTROL_FORBIDDEN", "")}
        # a selector matches her own jobs only
        selected = await alice.hold(labels={"campaign": "x"})
        assert outcomes(selected) == {"alice.eeeeeeeeeeee-a": ("CONTROL_DONE", "HELD")}
        with pytest.raises(ControlRefused) as others_request:  # whether it exists or not
            await alice.cancel(request_id="bob.eeeeeeeeeeee")
        assert others_request.value.field == "request_id"
        # the operator controls every job
        everyone = await operator.hold(labels={"campaign": "x"})
        assert outcomes(everyone) == {
            "alice.eeeeeeeeeeee-a": ("CONTROL_UNCHANGED", "HELD"),
            "bob.eeeeeeeeeeee-b": ("CONTROL_DONE", "HELD"),
            "eeeeeeeeeeee-op": ("CONTROL_DONE", "HELD"),
        }
    held = await kind_of_all(nc, subjects, "held")
    assert sorted(e.job_id for e in held) == [
        "alice.eeeeeeeeeeee-a",
        "bob.eeeeeeeeeeee-b",
        "eeeeeeeeeeee-op",
    ]
    assert await kind_of_all(nc, subjects, "cancelled") == []


async def test_bad_requests_are_refused_naming_the_field(
    nc: Client, subjects: Subjects, backend: RecordingBackend, client: MdqClient
) -> None:
    async with placement_running(nc, subjects, backend):
        cases: list[tuple[dict[str, object], str]] = [
            ({"verb": "cancel"}, ""),  # no jobs named
            ({"verb": "cancel", "job_ids": ["x"], "labels": {"a": "b"}}, ""),
            (
                {"verb": "reprioritize", "job_ids": ["x"], "priority_class": "urgent"},
                "priority_class",
            ),
            ({"verb": "extend", "job_ids": ["x"], "extend_steps": 0}, "extend_steps"),
            ({"verb": "extend", "labels": {"a": "b"}, "extend_steps": 5}, "job_ids"),
            ({"verb": "cancel", "job_ids": ["x"], "reason": "r" * 501}, "reason"),
        ]
        for options, field in cases:
            verb = str(options.pop("verb"))
            with pytest.raises(ControlRefused) as refused:
                await client.control(verb, **options)  # type: ignore[arg-type]
            assert refused.value.field == field, options
        # plain JSON, as any language sends it; an unknown field is named
        message = await nc.request(
            subjects.api_control,
            b'{"control_key": "j1", "verb": "CONTROL_CANCEL", "job_ids": ["x"], "force": 1}',
            timeout=10,
        )
        assert b'"field": "force"' in message.data
        ok = await nc.request(
            subjects.api_control,
            b'{"control_key": "j2", "verb": "CONTROL_CANCEL", "job_ids": ["dddddddddd01-x"]}',
            timeout=10,
        )
        assert b"CONTROL_NOT_FOUND" in ok.data, ok.data


async def test_cancelling_a_job_cancels_what_waits_for_it(
    nc: Client,
    subjects: Subjects,
    js: JetStreamContext,
    bus: EventPublisher,
    backend: RecordingBackend,
    client: MdqClient,
) -> None:
    await bus.publish(node_load("n1", cpu_capacity=1))
    await bus.publish(job("ffffffffffff-first", cpu=8))
    await bus.publish(job("ffffffffffff-then", depends_on=("ffffffffffff-first",)))
    await bus.publish(job("ffffffffffff-last", depends_on=("ffffffffffff-then",)))
    async with placement_running(nc, subjects, backend):
        reply = await client.cancel(["ffffffffffff-first"])
        assert outcomes(reply) == {"ffffffffffff-first": ("CONTROL_DONE", "CANCELLED")}

        await wait_for_events(js, subjects, "cancelled", count=3, what="the chain cancelled")
    by_job = {e.job_id: e.cancelled for e in await events_of(js, subjects, "cancelled")}
    assert by_job["ffffffffffff-then"].dependency == "ffffffffffff-first"
    assert by_job["ffffffffffff-last"].message == "dependency ffffffffffff-then was cancelled"


async def test_verbs_that_do_not_apply_get_a_clear_answer(
    nc: Client,
    subjects: Subjects,
    js: JetStreamContext,
    bus: EventPublisher,
    backend: RecordingBackend,
    client: MdqClient,
) -> None:
    await bus.publish(node_load("n1"))
    await bus.publish(job("dddddddddd02-done"))
    await bus.publish(job("dddddddddd02-min", task=pb.TASK_MINIMIZE))
    async with placement_running(nc, subjects, backend) as placement:

        async def both_bound() -> bool:
            return len(backend.pods) == 2

        await wait_for(both_bound, what="both bound")
        for name in ("done", "min"):
            await bus.publish(
                event(
                    "succeeded",
                    pb.JobSucceeded(final_step=1000),
                    job=f"dddddddddd02-{name}",
                    attempt=1,
                )
            )

        async def forgotten() -> bool:
            return not placement.book.jobs  # ended and pruned: read back from the log

        await wait_for(forgotten, what="the ended jobs pruned")
        cancel = await client.cancel(["dddddddddd02-done", "dddddddddd01-none"])
        assert outcomes(cancel) == {
            "dddddddddd02-done": ("CONTROL_NOT_APPLICABLE", "SUCCEEDED"),
            "dddddddddd01-none": ("CONTROL_NOT_FOUND", ""),
        }
        [done] = [o for o in cancel.outcomes if o.job_id == "dddddddddd02-done"]
        assert "already SUCCEEDED" in done.message
        extend = await client.extend(["dddddddddd02-min"], steps=100)
        assert outcomes(extend) == {"dddddddddd02-min": ("CONTROL_NOT_APPLICABLE", "SUCCEEDED")}
        assert "TASK_MINIMIZE" in extend.outcomes[0].message
        requeue = await client.requeue(["dddddddddd02-done"])
        assert outcomes(requeue)["dddddddddd02-done"][0] == "CONTROL_NOT_APPLICABLE"
    assert await events_of(js, subjects, "cancelled") == []
    assert await events_of(js, subjects, "extended") == []


async def test_a_succeeded_job_is_extended_as_a_new_attempt(
    nc: Client,
    subjects: Subjects,
    js: JetStreamContext,
    bus: EventPublisher,
    backend: RecordingBackend,
    client: MdqClient,
) -> None:
    async with bound_on_n1(nc, subjects, bus, backend, "dddddddddd03-md") as placement:
        final = pb.Checkpoint(step=1000, path="checkpoints/ckpt-1000.xml", sha256="ab")
        await bus.publish(event("checkpoint", final, job="dddddddddd03-md", attempt=1, detail=1000))
        await bus.publish(
            event("succeeded", pb.JobSucceeded(final_step=1000), job="dddddddddd03-md", attempt=1)
        )

        async def forgotten() -> bool:
            return "dddddddddd03-md" not in placement.book.jobs

        await wait_for(forgotten, what="the ended job pruned")
        reply = await client.extend(["dddddddddd03-md"], steps=500, reason="longer")
        assert outcomes(reply) == {"dddddddddd03-md": ("CONTROL_DONE", "PENDING")}
        assert reply.outcomes[0].attempt == 2

        pod = await backend.pod_created(
            "mdq-dddddddddd03-md-2", what="the extension bound as attempt 2"
        )
        assert pod.spec.steps == 1500
        assert pod.resume_from is not None and pod.resume_from.step == 1000
        assert placement.fenced_total == 0
    [extended] = await events_of(js, subjects, "extended")
    assert (extended.attempt, extended.extended.added_steps) == (2, 500)
    assert len(await events_of(js, subjects, "bound", "dddddddddd03-md")) == 2


def cli(nats_url: str, namespace: str, *args: str) -> Result:
    env = {"NATS_URL": nats_url, "MDQ_NAMESPACE": namespace, "DATABASE_URL": ""}
    return CliRunner().invoke(app, list(args), env=env, catch_exceptions=False)


async def test_the_cli_verbs_exit_as_documented(
    nc: Client,
    subjects: Subjects,
    bus: EventPublisher,
    backend: RecordingBackend,
    nats_url: str,
) -> None:
    await bus.publish(node_load("n1", cpu_capacity=1))
    for name in ("a", "b"):
        await bus.publish(job(f"dddddddddd04-{name}", cpu=8, labels={"campaign": "x"}))
    namespace = subjects.namespace

    async def run(*args: str) -> Result:
        return await asyncio.to_thread(cli, nats_url, namespace, *args)

    async with placement_running(nc, subjects, backend):
        held = await run("hold", "-l", "campaign=x", "--reason", "check inputs", "--wait")
        assert held.exit_code == 0, held.output
        assert "dddddddddd04-a" in held.stdout and "dddddddddd04-b" in held.stdout
        assert held.stdout.count("HELD") >= 4  # each job's outcome, then its state waited for
        released = await run("release", "dddddddddd04-a")
        assert released.exit_code == 0 and "done" in released.stdout
        cancelled = await run("cancel", "dddddddddd04-a", "dddddddddd04-b", "--wait")
        assert cancelled.exit_code == 0, cancelled.output
        assert "dddddddddd04-b CANCELLED" in cancelled.stdout
        # a job it cannot change: exit 1, and why
        again = await run("extend", "dddddddddd04-a", "--steps", "5")
        assert again.exit_code == 1 and "not_applicable" in again.stdout
        unknown = await run("requeue", "dddddddddd01-x")
        assert unknown.exit_code == 1 and "not_found" in unknown.stdout
        # a refused request: exit 2, naming the field
        refused = await run("reprioritize", "dddddddddd04-a", "--priority", "urgent")
        assert refused.exit_code == 2 and "priority_class" in refused.stderr
        bad_label = await run("hold", "-l", "campaign")
        assert bad_label.exit_code == 2 and "KEY=VALUE" in bad_label.output


async def test_a_selector_that_matches_no_job_says_so_and_exits_not_found(
    nc: Client,
    subjects: Subjects,
    bus: EventPublisher,
    backend: RecordingBackend,
    nats_url: str,
) -> None:
    """``mdq cancel -l k=v`` (or ``--request``) that matches nothing exits 5, as the CLI does
    for what does not exist, saying so; not 0 as if it had cancelled something."""
    await bus.publish(node_load("n1", cpu_capacity=1))
    await bus.publish(job("dddddddddd05-a", cpu=8, labels={"campaign": "x"}))
    namespace = subjects.namespace

    async def run(*args: str) -> Result:
        return await asyncio.to_thread(cli, nats_url, namespace, *args)

    async with placement_running(nc, subjects, backend):
        for verb in ("cancel", "hold", "release", "requeue"):
            nothing = await run(verb, "-l", "campaign=nosuch")
            assert nothing.exit_code == NotFound.exit_code, (verb, nothing.output)
            assert "no job matched the label campaign=nosuch" in nothing.stderr, nothing.output
        two = await run("reprioritize", "-l", "campaign=x", "-l", "team=y", "--priority", "low")
        assert two.exit_code == NotFound.exit_code, two.output
        assert "the labels campaign=x, team=y" in two.stderr
        no_submit = await run("cancel", "--request", "dddddddddd09", "--wait")
        assert no_submit.exit_code == NotFound.exit_code, no_submit.output
        assert "no job matched submit dddddddddd09" in no_submit.stderr
        # and one that matches is in hand: exit 0
        held = await run("hold", "-l", "campaign=x")
        assert held.exit_code == 0 and "dddddddddd05-a" in held.stdout, held.output


def test_the_cli_says_when_nobody_answers(nats_url: str, namespace: str) -> None:
    result = cli(nats_url, namespace, "cancel", "dddddddddd01-x", "--key", "k")
    assert result.exit_code == 3 and "is placement running?" in result.stderr


def desk_deciding(nc: Client, subjects: Subjects, decide: Decide) -> ControlDesk:
    """Placement's control entrance deciding with ``decide``, as the leader's would."""
    return ControlDesk(
        nc=nc,
        subjects=subjects,
        registry=ControlRegistry(nc.jetstream(), subjects),
        decide=decide,
        allow_high=lambda tenant: True,
    )


async def test_a_resend_while_its_request_is_decided_gets_the_same_answer(
    nc: Client, subjects: Subjects
) -> None:
    """A big selector takes seconds: a client that stopped waiting and sent the request again
    (the same key) waits for the decision under way, which is made once; other content under
    the key is refused."""
    release = asyncio.Event()
    decided: list[str] = []

    async def decide(request: pb.ControlRequest, tenant: str, control_id: str) -> pb.ControlReply:
        decided.append(control_id)
        await release.wait()
        return pb.ControlReply(control_id=control_id, matched=7)

    desk = desk_deciding(nc, subjects, decide)
    request = pb.ControlRequest(control_key="slow", verb=pb.CONTROL_CANCEL, labels={"a": "b"})
    other = pb.ControlRequest(control_key="slow", verb=pb.CONTROL_HOLD, labels={"a": "b"})
    first = asyncio.create_task(desk.handle(request.SerializeToString(), subjects.api_control))
    second = asyncio.create_task(desk.handle(request.SerializeToString(), subjects.api_control))
    refused = asyncio.create_task(desk.handle(other.SerializeToString(), subjects.api_control))

    async def deciding() -> bool:
        return bool(decided)

    await wait_for(deciding, what="the decision under way")
    release.set()
    answers = await asyncio.gather(first, second, refused)
    assert answers[0] == answers[1] and answers[0].matched == 7
    assert answers[2].error.field == "control_key"
    assert len(decided) == 1
    again = await desk.handle(request.SerializeToString(), subjects.api_control)
    assert again == answers[0] and len(decided) == 1  # recorded: not decided again


async def test_a_decision_cut_short_by_lost_leadership_leaves_no_error_unseen(
    nc: Client, subjects: Subjects
) -> None:
    """The replica stops leading while it decides: the waiting answer is cancelled (its desk
    closes) and the decision ends in ``NotLeader``; the request goes unanswered for the client
    to send again, and no "exception was never retrieved" is left for asyncio to log."""
    from services.placement.control import NotLeader

    release = asyncio.Event()
    deciding = asyncio.Event()

    async def decide(request: pb.ControlRequest, tenant: str, control_id: str) -> pb.ControlReply:
        deciding.set()
        await release.wait()
        raise NotLeader("this placement replica does not lead")

    loop = asyncio.get_running_loop()
    unseen: list[str] = []
    loop.set_exception_handler(lambda _, context: unseen.append(str(context.get("message"))))
    try:
        desk = desk_deciding(nc, subjects, decide)
        request = pb.ControlRequest(control_key="cut", verb=pb.CONTROL_CANCEL, labels={"a": "b"})
        answer = asyncio.create_task(desk.handle(request.SerializeToString(), subjects.api_control))
        await asyncio.wait_for(deciding.wait(), timeout=10)
        answer.cancel()  # the desk closes: leadership lost
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await answer

        async def decision_ended() -> bool:
            return desk.deciding == 0

        await wait_for(decision_ended, interval=0.01, what="the decision ended")
        del answer  # and nothing refers to it any more
        gc.collect()
        await asyncio.sleep(0)
    finally:
        loop.set_exception_handler(None)
    assert not [line for line in unseen if "never retrieved" in line], unseen
