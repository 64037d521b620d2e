"""Job control's input against a real JetStream: placement's leader refuses a badly named job
or request naming the field, for the operator and tenants alike, answers a request naming the
most ids (10,000) without a consumer per id, and records who asked by the identity its subject
proves (docs/control.md)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext

from mdq.bus.publisher import EventPublisher
from mdq.bus.subjects import Subjects
from mdq.contracts import pb
from mdq.core.control import MAX_JOB_IDS
from mdq.core.spec import normalize_job
from tests.helpers import (
    RecordingBackend,
    event,
    node_load,
    read_all,
    wait_for,
)
from tests.integration.test_control import placement_running
from tests.tables import named_cases

pytestmark = pytest.mark.timeout(120)


def job(job_id: str, *, cpu: float = 1) -> pb.Event:
    request_id, _, name = job_id.rpartition("-")
    spec = pb.JobSpec(name=name, steps=1000)
    spec.resources.cpu, spec.resources.memory_mb = cpu, 512
    body = pb.JobSubmitted(spec=normalize_job(spec, "jobs[0]"), request_id=request_id)
    return event("submitted", body, job=job_id, attempt=0)


async def ask(
    nc: Client, subjects: Subjects, tenant: str, *, timeout: float = 10, **fields: object
) -> dict[str, Any]:
    """The JSON answer to a request of ``tenant`` ("" the operator), as a plain client sends it."""
    data = json.dumps({"verb": "CONTROL_CANCEL", **fields}).encode()
    message = await nc.request(subjects.api_control_for(tenant), data, timeout=timeout)
    answer = json.loads(message.data)
    assert isinstance(answer, dict)
    return answer


def field_of(answer: dict[str, Any]) -> str:
    error = answer.get("error")
    assert isinstance(error, dict), answer
    return str(error.get("field", ""))


BAD_NAMES = [
    ("a wildcard", "", {"job_ids": [">"]}, "job_ids[0]"),
    ("a space", "", {"job_ids": ["3f2a9c1e0b7d-a", "a b"]}, "job_ids[1]"),
    ("two dots", "", {"job_ids": ["x..y"]}, "job_ids[0]"),
    ("a tenant's wildcard", "alice", {"job_ids": [">"]}, "job_ids[0]"),
    ("a tenant's token wildcard", "alice", {"job_ids": ["alice.*"]}, "job_ids[0]"),
    ("a tenant's blank", "alice", {"job_ids": ["alice. "]}, "job_ids[0]"),
    ("a wildcard request", "alice", {"request_id": "*"}, "request_id"),
    ("a blank request", "alice", {"request_id": " "}, "request_id"),
    ("another tenant's request", "alice", {"request_id": "bob.32d485543236"}, "request_id"),
    ("a fractional verb", "alice", {"verb": 1.5, "job_ids": ["alice.3f2a9c1e0b7d-a"]}, "verb"),
]


@named_cases(("tenant", "fields", "field"), BAD_NAMES)
async def test_a_badly_named_job_is_refused_naming_the_field(
    nc: Client,
    subjects: Subjects,
    bus: EventPublisher,
    backend: RecordingBackend,
    tenant: str,
    fields: dict[str, Any],
    field: str,
) -> None:
    own = "alice.3f2a9c1e0b7d-a" if tenant else "3f2a9c1e0b7d-a"
    await bus.publish(job(own, cpu=64))  # fits no node: stays PENDING
    async with placement_running(nc, subjects, backend):
        answer = await ask(nc, subjects, tenant, control_key="bad", **fields)
        assert field_of(answer) == field
        assert not answer.get("outcomes"), answer
        # placement answers on: the next request is decided
        good = await ask(nc, subjects, tenant, control_key="good", job_ids=[own])
        [outcome] = good["outcomes"]
        assert (outcome["result"], outcome["state"]) == ("CONTROL_DONE", "CANCELLED"), good


async def test_raw_json_is_refused_as_a_whole(
    nc: Client, subjects: Subjects, backend: RecordingBackend
) -> None:
    async with placement_running(nc, subjects, backend):
        for data, field, words in [
            (b"null", "", "must be a JSON object"),
            (b'{"control_key": "a", "control_key": "b", "verb": 1}', "control_key", "twice"),
        ]:
            message = await nc.request(subjects.api_control_for("alice"), data, timeout=10)
            answer = json.loads(message.data)
            assert (field_of(answer), words in answer["error"]["message"]) == (field, True)


async def test_a_tenant_cannot_pass_for_the_operator_in_the_history(
    nc: Client,
    subjects: Subjects,
    js: JetStreamContext,
    bus: EventPublisher,
    backend: RecordingBackend,
) -> None:
    await bus.publish(job("alice.3f2a9c1e0b7d-a", cpu=64))
    async with placement_running(nc, subjects, backend):
        answer = await ask(
            nc,
            subjects,
            "alice",
            control_key="forged",
            job_ids=["alice.3f2a9c1e0b7d-a"],
            requested_by="the operator",
            reason="maintenance",
        )
        assert "error" not in answer, answer
    [cancelled] = [
        e for e in await read_all(js, f"{subjects.namespace}.job.>") if e.HasField("cancelled")
    ]
    assert cancelled.cancelled.message == "cancelled by tenant alice ('the operator'): maintenance"
    assert cancelled.cancelled.origin.tenant == "alice"


async def test_the_most_ids_are_answered_without_a_consumer_each(
    nc: Client,
    subjects: Subjects,
    js: JetStreamContext,
    bus: EventPublisher,
    backend: RecordingBackend,
) -> None:
    """A tenant's hold of 10,000 of its own ids, of which one is live, two ended long ago
    (placement forgot them: read back from the log) and the rest never existed: an outcome for
    each, while the jobs stream's consumers stay as few as before; a forgotten job's history
    is still read whole (its extension is fenced by its last bound)."""
    live, ended, minimised = (
        "alice.aaaaaaaaaaaa-live",
        "alice.bbbbbbbbbbbb-md",
        "alice.bbbbbbbbbbbb-min",
    )
    await bus.publish(node_load("n1", cpu_capacity=4))
    await bus.publish(job(ended))
    await bus.publish(job(minimised))
    async with placement_running(nc, subjects, backend) as placement:

        async def both_bound() -> bool:
            return len(backend.pods) == 2

        await wait_for(both_bound, what="both bound")
        final = pb.Checkpoint(step=1000, path="checkpoints/ckpt-1000.xml", sha256="ab")
        await bus.publish(event("checkpoint", final, job=ended, attempt=1, detail=1000))
        for each in (ended, minimised):
            await bus.publish(
                event("succeeded", pb.JobSucceeded(final_step=1000), job=each, attempt=1)
            )

        async def forgotten() -> bool:
            return not placement.book.jobs

        await wait_for(forgotten, what="the ended jobs pruned")
        await bus.publish(job(live, cpu=64))  # fits no node: PENDING

        async def held_live() -> bool:
            return live in placement.book.jobs

        await wait_for(held_live, what="the live job folded")
        before = (await js.stream_info(subjects.jobs_stream)).state.consumer_count
        missing = [f"alice.0000{index:08x}-x" for index in range(MAX_JOB_IDS - 3)]
        ids = [live, ended, minimised, *missing]
        asking = asyncio.ensure_future(
            ask(
                nc,
                subjects,
                "alice",
                timeout=90,
                control_key="big",
                verb="CONTROL_HOLD",
                job_ids=ids,
            )
        )
        peak = before
        while not asking.done():
            info = await js.stream_info(subjects.jobs_stream)
            peak = max(peak, info.state.consumer_count)
            await asyncio.sleep(0.02)
        answer = await asking
        assert answer.get("counts") == {
            "CONTROL_DONE": 1,
            "CONTROL_NOT_APPLICABLE": 2,
            "CONTROL_NOT_FOUND": MAX_JOB_IDS - 3,
        }, answer.get("counts") or answer.get("error")
        assert answer["matched"] == MAX_JOB_IDS
        assert peak <= before + 2, (before, peak)
        # the forgotten job's history is whole: extended from its checkpoint, fenced by its bound
        extend = await ask(
            nc,
            subjects,
            "alice",
            control_key="more",
            verb="CONTROL_EXTEND",
            job_ids=[ended],
            extendSteps=500,
        )
        [outcome] = extend["outcomes"]
        assert (outcome["result"], outcome["attempt"]) == ("CONTROL_DONE", 2), extend
        pod = await backend.pod_created(
            "mdq-alice-bbbbbbbbbbbb-md-2", what="the extension bound as attempt 2"
        )
        assert pod.resume_from is not None and pod.resume_from.step == 1000
        assert placement.fenced_total == 0
