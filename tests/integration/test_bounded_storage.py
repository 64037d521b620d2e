"""Bounded storage against a real NATS JetStream: every stream and bucket
has the limits of ``MDQ_STORAGE_*``, and what happens at a limit is a clear error to whoever
submitted, never a silent loss.

- a jobs log at its high-water mark refuses new submits (request-reply and stream), keeps room
  for the events of the jobs already accepted, and loses none of them; when even a refusal does
  not fit, a request-reply submit is still answered and a stream submit waits in its stream
  until the limit is raised, then is handled;
- a full submit stream refuses the publisher (the SDK says so), and every submit it stored is
  handled;
- a key used again after intake's duplicate window is refused by the log (no second run of its
  jobs), and its old job can still be named as a dependency;
- a full request registry refuses a request-reply submit with a clear error, and a stream submit
  waits until it has room;
- an update never sets a size limit below what a stream holds.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from functools import partial

import pytest
from google.protobuf import json_format
from nats.aio.client import Client
from nats.js.api import DiscardPolicy
from pydantic import ByteSize

from mdq.bus.publisher import EventPublisher
from mdq.bus.requests import CREATE_ONLY, Requests, is_stream_full
from mdq.bus.setup import prepare_bus
from mdq.bus.storage import DAY_S, StorageSettings
from mdq.bus.streams import ensure_streams
from mdq.bus.subjects import Subjects
from mdq.contracts import pb
from mdq.core.ids import request_id_for_key
from mdq.sdk.client import MdqClient, SubmitRefused
from mdq.settings import CommonSettings
from services.intake.app import Intake, IntakeSettings, build_intake
from services.intake.registry import ACCEPTED, SubmitRegistry
from tests import helpers
from tests.helpers import OwnersPublisher

TIMEOUT = 10.0
KiB = 1024


eventually = partial(helpers.eventually, within=TIMEOUT, interval=0.05)
"""``tests.helpers.eventually`` within this file's ``TIMEOUT``."""


def limits(monkeypatch: pytest.MonkeyPatch, **fields: str) -> StorageSettings:
    """Set ``MDQ_STORAGE_*`` for the services started in this test; the settings they read."""
    for name, value in fields.items():
        monkeypatch.setenv(f"MDQ_STORAGE_{name.upper()}", value)
    return StorageSettings()


StartIntake = Callable[[], Awaitable[Intake]]


@pytest.fixture
async def start_intake(nats_url: str, namespace: str, nc: Client) -> AsyncIterator[StartIntake]:
    """Start intake on the test's bus once the test has set its limits; every intake started
    is stopped afterwards (before the test's connection closes)."""
    services: list[Intake] = []

    async def start() -> Intake:
        common = CommonSettings.model_validate({"NATS_URL": nats_url, "namespace": namespace})
        # the jobs log's size read before every batch: the test fills it submit by submit
        settings = IntakeSettings(retry_delay_s=0.2, log_room_refresh_s=0.0)
        intake = build_intake(common=common, settings=settings)
        await intake.start()
        services.append(intake)
        return intake

    yield start
    for service in services:
        await service.stop()


async def ask(nc: Client, subjects: Subjects, key: str, **job: object) -> pb.SubmitReply:
    payload = {"idempotency_key": key, "jobs": [{"name": "md", "steps": 1000, **job}]}
    answer = await nc.request(subjects.api_submit, json.dumps(payload).encode(), timeout=TIMEOUT)
    return json_format.Parse(answer.data, pb.SubmitReply())


async def submit_until_refused(
    nc: Client, subjects: Subjects, prefix: str, *, at_most: int = 200
) -> tuple[list[str], pb.SubmitError]:
    """Request-reply submits of one job each (keys ``<prefix>-<n>``) until one is refused:
    the accepted jobs' ids, and the refusal."""
    accepted: list[str] = []
    for index in range(at_most):
        reply = await ask(nc, subjects, f"{prefix}-{index}")
        if reply.HasField("error"):
            return accepted, reply.error
        accepted.extend(reply.job_ids)
    raise AssertionError(f"{at_most} submits and none refused: no limit was reached")


async def put_back_by_intake(nc: Client, subjects: Subjects) -> None:
    """Until intake has been handed the stream submit again after it could not handle it (the
    submit stream's durable redelivered it): intake has seen it and did not ack it."""
    durable = IntakeSettings().durable

    async def redelivered() -> bool:
        info = await nc.jetstream().consumer_info(subjects.submit_stream, durable)
        return (info.num_redelivered or 0) >= 1 and (info.num_ack_pending or 0) >= 1

    await eventually(redelivered, "intake to put the stream submit back")


async def submitted_jobs(nc: Client, subjects: Subjects) -> list[str]:
    """The job ids of every ``submitted`` event in the jobs stream, in order."""
    js = nc.jetstream()
    info = await js.stream_info(subjects.jobs_stream)
    found = []
    for sequence in range(max(1, info.state.first_seq), info.state.last_seq + 1):
        message = await js.get_msg(subjects.jobs_stream, sequence)
        if (message.subject or "").startswith(subjects.claim_prefix):
            continue  # intake's claims are kept beside the events
        event = pb.Event.FromString(message.data or b"")
        if event.WhichOneof("body") == "submitted":
            found.append(event.job_id)
    return found


async def test_every_stream_and_bucket_gets_the_limits_of_the_settings(
    nats_url: str,
    namespace: str,
    nc: Client,
    monkeypatch: pytest.MonkeyPatch,
    start_intake: StartIntake,
) -> None:
    storage = limits(
        monkeypatch,
        jobs_bytes="3MiB",
        progress_bytes="5MiB",
        registry_days="2",
        bucket_bytes="1MiB",
    )
    await prepare_bus(nats_url, namespace=namespace, local_backend=True, storage=storage)
    await start_intake()  # makes its registry
    subjects = Subjects(namespace)
    js = nc.jetstream()

    jobs = await js.stream_info(subjects.jobs_stream)
    progress = await js.stream_info(subjects.progress_stream)
    assert (jobs.config.max_bytes, jobs.config.discard) == (3 << 20, DiscardPolicy.NEW)
    assert (progress.config.max_bytes, progress.config.discard) == (5 << 20, DiscardPolicy.OLD)
    for name in (subjects.tenants_bucket, subjects.pods_bucket, subjects.nodes_bucket):
        assert (await js.stream_info(f"KV_{name}")).config.max_bytes == 1 << 20, name


async def test_a_full_jobs_log_refuses_new_submits_and_keeps_the_accepted_ones(
    nc: Client, subjects: Subjects, monkeypatch: pytest.MonkeyPatch, start_intake: StartIntake
) -> None:
    storage = limits(monkeypatch, jobs_bytes=str(24 * KiB), jobs_high_water="0.5")
    await ensure_streams(nc.jetstream(), subjects, storage=storage)
    await start_intake()
    js = nc.jetstream()

    accepted, refusal = await submit_until_refused(nc, subjects, "fill")
    assert refusal.field == "" and "jobs log is full" in refusal.message, refusal
    assert "MDQ_STORAGE_JOBS_BYTES" in refusal.message
    assert accepted and await submitted_jobs(nc, subjects) == accepted  # none lost

    # The room above the mark is the accepted jobs' own: their lifecycle events still fit.
    owners = OwnersPublisher(js=js, subjects=subjects)
    for job in accepted:
        await owners.emit("released", pb.JobReleased(), job_id=job, attempt=0)

    # A retry of an accepted submit still gets its reply, above the mark.
    again = await ask(nc, subjects, "fill-0")
    assert list(again.job_ids) == accepted[:1] and not again.HasField("error")

    # Fill the stream to its limit: even a refusal's event no longer fits.
    filler = 0
    while True:
        try:
            await owners.emit(
                "released", pb.JobReleased(), job_id=f"{accepted[0]}x{filler}", attempt=0
            )
        except Exception as error:  # JetStream: maximum bytes exceeded
            assert "maximum bytes" in str(getattr(error, "description", error)), error
            break
        filler += 1
    answered = await ask(nc, subjects, "when-full")  # answered, though nothing is recorded
    assert "jobs log is full" in answered.error.message
    stream_submit = json.dumps({"idempotency_key": "waits", "jobs": [{"name": "md"}]})
    await js.publish(subjects.submit, stream_submit.encode())
    await put_back_by_intake(nc, subjects)  # it met the full log: nak, not ack
    waits = request_id_for_key("waits")
    assert not any(job.startswith(waits) for job in await submitted_jobs(nc, subjects))

    # An operator raises the limit: the waiting stream submit is handled, nothing was lost.
    await ensure_streams(js, subjects, storage=StorageSettings(jobs_bytes=ByteSize(1 << 20)))

    async def handled() -> bool:
        return f"{waits}-md" in await submitted_jobs(nc, subjects)

    await eventually(handled, "the stream submit once the limit was raised")
    assert (await submitted_jobs(nc, subjects))[: len(accepted)] == accepted


async def test_a_full_submit_stream_refuses_the_publisher_and_keeps_what_it_stored(
    nc: Client, subjects: Subjects, monkeypatch: pytest.MonkeyPatch, start_intake: StartIntake
) -> None:
    storage = limits(monkeypatch, submit_bytes=str(8 * KiB))
    await ensure_streams(nc.jetstream(), subjects, storage=storage)
    stored: list[str] = []
    async with MdqClient(nc=nc, subjects=subjects) as client:
        with pytest.raises(SubmitRefused, match="submit stream is full"):
            for index in range(1000):  # intake is not running: the submits pile up
                stored.extend(
                    await client.publish_submit(
                        [pb.JobSpec(name="md", steps=1000)], idempotency_key=f"s-{index}"
                    )
                )
    assert stored

    await start_intake()

    async def all_handled() -> bool:
        return sorted(await submitted_jobs(nc, subjects)) == sorted(stored)

    await eventually(all_handled, "every stored submit's job")


async def test_a_key_used_again_after_the_duplicate_window_is_refused_by_the_log(
    nc: Client, subjects: Subjects, monkeypatch: pytest.MonkeyPatch, start_intake: StartIntake
) -> None:
    window_s = 1.5
    limits(monkeypatch, registry_days=str(window_s / DAY_S))
    await start_intake()
    first = await ask(nc, subjects, "campaign-1")
    assert not first.HasField("error")
    [old_job] = first.job_ids
    claim = await nc.jetstream().get_last_msg(
        subjects.jobs_stream, subjects.claim(first.request_id)
    )
    assert claim.time is not None

    async def forgotten() -> bool:
        age = datetime.now(UTC) - claim.time.replace(tzinfo=UTC)  # type: ignore[union-attr]
        return age >= timedelta(seconds=window_s)

    await eventually(forgotten, "the claim to age out of the duplicate window")
    reused = await ask(nc, subjects, "campaign-1")
    again = await ask(nc, subjects, "campaign-1")

    assert reused.error.field == "idempotency_key", reused
    assert "duplicate window" in reused.error.message and old_job in reused.error.message
    assert again == reused  # the refusal is what the key records now
    assert await submitted_jobs(nc, subjects) == [old_job]  # its jobs did not run twice
    # The old job is still a dependency one can name by its id (found in the log).
    chained = await ask(nc, subjects, "analysis", depends_on=[old_job])
    assert not chained.HasField("error"), chained


async def test_an_update_never_sets_a_size_limit_below_what_a_stream_holds(
    nc: Client, subjects: Subjects
) -> None:
    js = nc.jetstream()
    for index in range(40):
        await js.publish(subjects.progress("j"), b"x" * 512, headers={"Nats-Msg-Id": f"p{index}"})
    before = await js.stream_info(subjects.progress_stream)

    await ensure_streams(js, subjects, storage=StorageSettings(progress_bytes=ByteSize(4 * KiB)))

    after = await js.stream_info(subjects.progress_stream)
    assert after.state.messages == before.state.messages == 40  # nothing dropped
    assert after.config.max_bytes == before.state.bytes > 4 * KiB


async def test_a_claim_the_full_jobs_log_refuses_stores_nothing_and_goes_in_later(
    nc: Client, subjects: Subjects
) -> None:
    """A submit's claim and events go into the jobs stream together: a full stream refuses
    them all (an error that says so), and once it has room the same submit is accepted."""
    js = nc.jetstream()
    await ensure_streams(js, subjects, storage=StorageSettings(jobs_bytes=ByteSize(4 * KiB)))
    owners = OwnersPublisher(js=js, subjects=subjects)
    filler = 0
    while True:  # fill the stream to its limit
        try:
            await owners.emit("released", pb.JobReleased(), job_id=f"f{filler}", attempt=0)
        except Exception as error:
            assert "maximum bytes" in str(getattr(error, "description", error)), error
            break
        filler += 1
    requests = await Requests(nc).start()
    try:
        registry = await SubmitRegistry.open(js=js, requests=requests, subjects=subjects)
        request_id = request_id_for_key("full")
        publisher = EventPublisher(js=requests, subjects=subjects, producer="intake")
        event = publisher.event(
            "submitted",
            pb.JobSubmitted(spec=pb.JobSpec(name="md"), request_id=request_id),
            job_id=f"{request_id}-md",
            attempt=0,
        )
        accept = partial(
            registry.accept,
            request_id=request_id,
            reply=pb.SubmitReply(request_id=request_id, job_ids=[f"{request_id}-md"]),
            fingerprint=bytes(32),
            events=[publisher.outgoing(event, CREATE_ONLY)],
        )
        refused = await accept()
        assert is_stream_full(refused), refused
        assert await registry.existing(request_id) is None
        assert f"{request_id}-md" not in await submitted_jobs(nc, subjects)

        await ensure_streams(js, subjects, storage=StorageSettings(jobs_bytes=ByteSize(1 << 20)))
        assert await accept() == ACCEPTED
        assert await registry.existing(request_id) is not None
        assert f"{request_id}-md" in await submitted_jobs(nc, subjects)
    finally:
        await requests.close()
