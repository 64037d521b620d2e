"""The watcher's lifecycle half against a real JetStream: pod updates, fencing, lost runs."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TypeVar

from nats.aio.client import Client
from nats.js import JetStreamContext

from mdq.backends.port import PodUpdate
from mdq.bus.publisher import EventPublisher
from mdq.bus.subjects import Subjects
from mdq.contracts import pb
from mdq.core.state import JobState
from services.watcher.lifecycle import Lifecycle, LostRunPolicy
from tests.helpers import (
    RecordingBackend,
    event,
    events_of,
    publisher,
    running,
    submitted,
    wait_for,
    wait_for_events,
)

Made = TypeVar("Made", bound=Lifecycle)


def lifecycle_of(
    kind: type[Made],
    nc: Client,
    subjects: Subjects,
    backend: RecordingBackend,
    lost: LostRunPolicy = LostRunPolicy(),
) -> Made:
    """A lifecycle of class ``kind`` on the test's bus that checks for lost runs every 0.2 s."""
    js = nc.jetstream()
    return kind(
        js=js,
        subjects=subjects,
        publisher=publisher(js, subjects),
        backend=backend,
        lost=lost,
        check_interval_s=0.2,
    )


def make_lifecycle(
    nc: Client, subjects: Subjects, backend: RecordingBackend, lost: LostRunPolicy = LostRunPolicy()
) -> Lifecycle:
    return lifecycle_of(Lifecycle, nc, subjects, backend, lost)


async def bound_to_n1(
    nc: Client, subjects: Subjects, job: str
) -> tuple[JetStreamContext, EventPublisher]:
    """``job`` submitted and its attempt 1 bound to n1, in the log; the bus that put them there."""
    js = nc.jetstream()
    bus = publisher(js, subjects)
    await bus.publish(submitted(job))
    await bus.publish(event("bound", pb.JobBound(node="n1"), job=job, attempt=1))
    return js, bus


class CountingLifecycle(Lifecycle):
    """A lifecycle that counts its finished lost-run checks (to know one has run since)."""

    checks = 0

    async def check_lost(self) -> list[str]:
        lost = await super().check_lost()
        self.checks += 1
        return lost


def pod(job: str, attempt: int, phase: int, *, exit_code: int = 0, reason: str = "") -> PodUpdate:
    return PodUpdate(
        pod_name=f"mdq-{job}-{attempt}",
        job_id=job,
        attempt=attempt,
        node="n1",
        phase=phase,  # type: ignore[arg-type]
        exit_code=exit_code,
        reason=reason,
    )


async def test_pod_phases_become_lifecycle_events(nc: Client, subjects: Subjects) -> None:
    js, bus = await bound_to_n1(nc, subjects, "r1-md")
    backend = RecordingBackend()
    async with running(make_lifecycle(nc, subjects, backend).run()):
        await backend.updates.put(pod("r1-md", 1, pb.POD_RUNNING))

        await wait_for_events(js, subjects, "started", "r1-md", count=1, what="started")
        final = pb.Progress(step=1000, target_steps=1000, done_reason="steps_reached")
        await bus.publish(event("progress", final, job="r1-md", attempt=1, detail=1000))
        await backend.updates.put(pod("r1-md", 1, pb.POD_SUCCEEDED, reason="Completed"))

        await wait_for_events(js, subjects, "succeeded", "r1-md", count=1, what="succeeded")
    body = (await events_of(js, subjects, "succeeded", "r1-md"))[0].succeeded
    assert (body.final_step, body.reason) == (1000, "steps_reached")
    assert len(await events_of(js, subjects, "pod", "r1-md")) == 2


async def test_a_pod_first_seen_succeeded_is_started_then_succeeded(
    nc: Client, subjects: Subjects
) -> None:
    """A watcher that starts after the pod ran sees only Succeeded: the job still goes BOUND →
    RUNNING → SUCCEEDED in the log, once each."""
    js, bus = await bound_to_n1(nc, subjects, "r4-md")
    final = pb.Progress(step=1000, target_steps=1000, done_reason="steps_reached")
    await bus.publish(event("progress", final, job="r4-md", attempt=1, detail=1000))
    backend = RecordingBackend()
    async with running(make_lifecycle(nc, subjects, backend).run()):
        await backend.updates.put(pod("r4-md", 1, pb.POD_SUCCEEDED, reason="Completed"))

        await wait_for_events(js, subjects, "succeeded", "r4-md", count=1, what="succeeded")
    kinds = [
        e.WhichOneof("body")
        for e in await events_of(js, subjects, "*", "r4-md")
        if e.WhichOneof("body") in ("started", "succeeded")
    ]
    assert kinds == ["started", "succeeded"]


async def test_a_pod_seen_running_after_its_first_report_is_started_once(
    nc: Client, subjects: Subjects
) -> None:
    """The runner's first report is folded before the pod's Running phase arrives (a busy
    watch, a slow kubelet): the attempt is RUNNING already, and still gets its one ``started``
    in the log; a Running phase seen again adds none."""
    js, bus = await bound_to_n1(nc, subjects, "r5-md")
    backend = RecordingBackend()
    lifecycle = make_lifecycle(nc, subjects, backend)
    async with running(lifecycle.run()):

        async def folded(state: JobState) -> bool:
            view = lifecycle.book.jobs.get("r5-md")
            return view is not None and view.state is state

        await wait_for(lambda: folded(JobState.BOUND), what="the job BOUND in the fold")
        report = pb.Progress(step=100, target_steps=1000)
        await bus.publish(event("progress", report, job="r5-md", attempt=1, detail=100))
        await wait_for(lambda: folded(JobState.RUNNING), what="the report folded first")
        await backend.updates.put(pod("r5-md", 1, pb.POD_RUNNING))

        await wait_for_events(js, subjects, "started", "r5-md", count=1, what="started")
        await backend.updates.put(pod("r5-md", 1, pb.POD_RUNNING))
        await backend.updates.put(pod("r5-md", 1, pb.POD_FAILED, reason="Error", exit_code=1))

        await wait_for_events(
            js, subjects, "attempt_failed", "r5-md", count=1, what="attempt_failed"
        )
    assert len(await events_of(js, subjects, "started", "r5-md")) == 1


async def test_failed_pod_is_classified_and_stale_attempts_are_fenced(
    nc: Client, subjects: Subjects
) -> None:
    js, bus = await bound_to_n1(nc, subjects, "r2-md")
    backend = RecordingBackend()
    async with running(make_lifecycle(nc, subjects, backend).run()):
        await backend.updates.put(pod("r2-md", 1, pb.POD_FAILED, exit_code=137, reason="OOMKilled"))

        await wait_for_events(
            js, subjects, "attempt_failed", "r2-md", count=1, what="attempt_failed"
        )
        requeue = pb.JobRequeued()
        requeue.resources.cpu, requeue.resources.memory_mb = 1, 768
        await bus.publish(event("requeued", requeue, job="r2-md", attempt=2))
        await bus.publish(event("bound", pb.JobBound(node="n1"), job="r2-md", attempt=2))
        # A late success of the old attempt must change nothing.
        await backend.updates.put(pod("r2-md", 1, pb.POD_SUCCEEDED, reason="Completed"))
        await backend.updates.put(pod("r2-md", 2, pb.POD_RUNNING))

        async def started2() -> bool:
            return any(e.attempt == 2 for e in await events_of(js, subjects, "started", "r2-md"))

        await wait_for(started2, what="attempt 2 started")
    failure = (await events_of(js, subjects, "attempt_failed", "r2-md"))[0].attempt_failed
    assert failure.reason == pb.FAILURE_OOM_KILLED and failure.exit_code == 137
    assert await events_of(js, subjects, "succeeded", "r2-md") == []


async def test_silent_running_job_is_declared_lost_once_and_its_pod_deleted(
    nc: Client, subjects: Subjects
) -> None:
    js = nc.jetstream()
    bus = publisher(js, subjects)
    await bus.publish(submitted("r3-md"))
    await bus.publish(
        event("bound", pb.JobBound(node="n1", pod_name="mdq-r3-md-1"), job="r3-md", attempt=1)
    )
    await bus.publish(event("started", pb.JobStarted(node="n1"), job="r3-md", attempt=1))
    lost = LostRunPolicy(min_silence_s=1.0, interval_factor=5.0, first_report_s=1.0)
    first, second = RecordingBackend(), RecordingBackend()
    replicas = [
        lifecycle_of(CountingLifecycle, nc, subjects, backend, lost) for backend in (first, second)
    ]
    # Two replicas watch the same job: the fact is published once.
    async with (
        running(replicas[0].run()),
        running(replicas[1].run()),
    ):

        async def both_know() -> bool:
            views = [replica.book.jobs.get("r3-md") for replica in replicas]
            return all(view is not None and view.state is JobState.RECOVERING for view in views)

        await wait_for(both_know, what="both replicas to know the job lost")
        # Neither replica can declare it again now; a check that was already under way when
        # it learned is over once the replica has finished one more.
        checks = [replica.checks for replica in replicas]

        async def checked_again() -> bool:
            pairs = zip(replicas, checks, strict=True)
            return all(replica.checks > before for replica, before in pairs)

        await wait_for(checked_again, what="one more lost-run check by each replica")
    events = await events_of(js, subjects, "attempt_failed", "r3-md")
    assert len(events) == 1 and events[0].attempt_failed.reason == pb.FAILURE_LOST
    assert "mdq-r3-md-1" in first.deleted + second.deleted


async def test_a_running_job_as_old_as_the_jobs_log_is_ended_and_its_pod_deleted(
    nc: Client, subjects: Subjects
) -> None:
    """Seen from a year and a day later (the clock): its attempt fails with FAILURE_EXPIRED
    while its history is still in the log, and its pod goes; a younger job runs on."""
    js = nc.jetstream()
    bus = publisher(js, subjects)
    later = datetime.now(UTC) + timedelta(days=365)
    for job in ("r5-old", "r5-young"):
        submit = submitted(job)
        if job == "r5-young":
            submit.time.FromDatetime(later - timedelta(days=100))
        await bus.publish(submit)
        pod_name = f"mdq-{job}-1"
        await bus.publish(
            event("bound", pb.JobBound(node="n1", pod_name=pod_name), job=job, attempt=1)
        )
        await bus.publish(event("started", pb.JobStarted(node="n1"), job=job, attempt=1))
    backend = RecordingBackend()
    lifecycle = Lifecycle(
        js=js,
        subjects=subjects,
        publisher=publisher(js, subjects),
        backend=backend,
        lost=LostRunPolicy(min_silence_s=1e9),  # nothing is lost for silence here
        check_interval_s=0.2,
        clock=lambda: later,
        jobs_log_days=365,  # the old one lived 365 days, more than 364; the young one 100
    )
    async with running(lifecycle.run()):

        async def ended() -> bool:
            view = lifecycle.book.jobs.get("r5-old")
            return view is not None and view.state is JobState.RECOVERING

        await wait_for(ended, what="the old job's attempt to end")
    [failed] = await events_of(js, subjects, "attempt_failed", "r5-old")
    assert failed.attempt_failed.reason == pb.FAILURE_EXPIRED
    assert "the jobs log keeps 365 days" in failed.attempt_failed.message
    assert backend.deleted == ["mdq-r5-old-1"]
    assert not await events_of(js, subjects, "attempt_failed", "r5-young")


async def test_an_attempt_that_has_not_reported_yet_has_longer_before_it_is_lost(
    nc: Client, subjects: Subjects
) -> None:
    """Its system is built, minimised and timed before the runner reports: the short silence
    limit of a reporting run applies only from its first report on."""
    js, bus = await bound_to_n1(nc, subjects, "r9-md")
    await bus.publish(event("started", pb.JobStarted(node="n1"), job="r9-md", attempt=1))
    lost = LostRunPolicy(min_silence_s=0.5, interval_factor=1.0, first_report_s=4.0)
    lifecycle = lifecycle_of(CountingLifecycle, nc, subjects, RecordingBackend(), lost)
    async with running(lifecycle.run()):
        checks = lifecycle.checks

        async def checked_a_while() -> bool:  # about 2 s: past the short limit, not the long
            return lifecycle.checks >= checks + 10

        await wait_for(checked_a_while, what="ten lost-run checks")
        assert lifecycle.book.jobs["r9-md"].state is JobState.RUNNING
        assert await events_of(js, subjects, "attempt_failed", "r9-md") == []
        # its first report: from now on half a second of silence is enough
        await bus.publish(event("progress", pb.Progress(step=10), job="r9-md", attempt=1))

        async def lost_soon() -> bool:
            return lifecycle.book.jobs["r9-md"].state is not JobState.RUNNING

        await wait_for(lost_soon, timeout=3.0, what="the reporting run lost after 0.5 s")
    failed = await events_of(js, subjects, "attempt_failed", "r9-md")
    assert [each.attempt_failed.reason for each in failed] == [pb.FAILURE_LOST]
