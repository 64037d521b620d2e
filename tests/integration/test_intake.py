"""intake against a real NATS JetStream: request-reply and stream submits, idempotency,
dependencies, bad input, and durability of submits made while intake is down.

intake runs in-process (``services.intake.app.Intake``) against the test's own namespace.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import replace
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import cast

import pytest
from google.protobuf import json_format
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import MaxPayloadError, NoRespondersError
from nats.js import JetStreamContext
from nats.js.errors import APIError

from mdq.bus import codec
from mdq.bus.connect import connect
from mdq.bus.publisher import EventPublisher
from mdq.bus.requests import CREATE_ONLY, PLAIN_UP_TO, Requests
from mdq.bus.streams import MAX_SUBMIT_BYTES
from mdq.bus.subjects import Subjects
from mdq.contracts import pb
from mdq.core.documents import MAX_DEPTH
from mdq.core.fingerprint import content_of
from mdq.core.ids import request_id_for_key, request_id_for_sequence
from mdq.core.spec import normalize_job
from mdq.embedded import child_environment, free_port, nats_server_binary
from mdq.settings import CommonSettings
from services.intake import handlers
from services.intake.app import Intake, IntakeSettings, build_intake
from services.intake.registry import (
    ACCEPTED,
    RETENTION_MARGIN,
    SEEN,
    SubmitRegistry,
    claim_record,
)
from tests import helpers
from tests.helpers import OwnersPublisher

TIMEOUT = 5.0
REPO_ROOT = Path(__file__).resolve().parents[2]


# -- helpers -----------------------------------------------------------------------------------


def settings_for(url: str, namespace: str) -> CommonSettings:
    return CommonSettings.model_validate({"NATS_URL": url, "namespace": namespace})


async def started(common: CommonSettings) -> Intake:
    intake = build_intake(common=common, settings=IntakeSettings())
    await intake.start()
    return intake


eventually = partial(helpers.eventually, within=TIMEOUT, interval=0.02)
"""``tests.helpers.eventually`` within this file's ``TIMEOUT``."""


async def job_log(js: JetStreamContext, subjects: Subjects) -> list[tuple[str, pb.Event]]:
    """Every event in the namespace's jobs stream, in order, with its subject (not intake's
    claims, which the stream keeps beside them)."""
    info = await js.stream_info(subjects.jobs_stream)
    events = []
    for sequence in range(info.state.first_seq, info.state.last_seq + 1):
        if sequence == 0:
            continue
        message = await js.get_msg(subjects.jobs_stream, sequence)
        assert message.data is not None
        if (message.subject or "").startswith(subjects.claim_prefix):
            continue
        events.append((message.subject or "", pb.Event.FromString(message.data)))
    return events


async def wait_for_events(
    js: JetStreamContext, subjects: Subjects, count: int
) -> list[tuple[str, pb.Event]]:
    found: list[tuple[str, pb.Event]] = []

    async def enough() -> bool:
        nonlocal found
        found = await job_log(js, subjects)
        return len(found) >= count

    await eventually(enough, f"{count} event(s) in the jobs stream")
    return found


async def ask(nc: Client, subjects: Subjects, payload: dict[str, object] | bytes) -> pb.SubmitReply:
    """A request-reply submit; JSON in gives JSON out, protobuf in gives protobuf out."""
    data = json.dumps(payload).encode() if isinstance(payload, dict) else payload
    return reply_of(await nc.request(subjects.api_submit, data, timeout=TIMEOUT))


def reply_of(answer: Msg) -> pb.SubmitReply:
    """Intake's answer: JSON where its content-type says so, else protobuf."""
    reply = pb.SubmitReply()
    if (answer.headers or {}).get("content-type") == "application/json":
        json_format.Parse(answer.data, reply)
    else:
        reply.ParseFromString(answer.data)
    return reply


async def settled(nc: Client, subjects: Subjects, tap: Tap) -> str:
    """Prove that the submits answered so far published nothing more: a fresh marker submit,
    asked after their replies, is published after anything they published (intake publishes
    before it replies, on one connection, so the tap receives in that order); once the tap has
    the marker, anything of theirs is in it too. The marker's publish is taken back out of the
    tap; returns the marker's job id (to leave it out of the log)."""
    marker = await ask(nc, subjects, {"idempotency_key": "settled-marker", "jobs": [{"name": "m"}]})
    assert not marker.HasField("error"), marker
    [job_id] = marker.job_ids
    subject = subjects.job(job_id, "submitted")

    async def tapped() -> bool:
        return subject in tap.subjects

    await eventually(tapped, "the marker submit's event")
    tap.subjects.remove(subject)
    return job_id


class Tap:
    """Counts every publish on the namespace's job and rejected subjects (core NATS sees
    republished events that JetStream's deduplication would hide)."""

    def __init__(self) -> None:
        self.subjects: list[str] = []

    async def on_message(self, message: Msg) -> None:
        self.subjects.append(message.subject)

    async def at_least(self, count: int) -> bool:
        return len(self.subjects) >= count


@contextlib.asynccontextmanager
async def outcomes_to(
    nc: Client, subjects: Subjects, on_message: Callable[[Msg], Awaitable[None]]
) -> AsyncIterator[None]:
    """``on_message`` gets every job event and every rejection of the namespace while the block
    runs (the server has the subscriptions before it starts)."""
    subscriptions = [
        await nc.subscribe(subjects.job_all("*"), cb=on_message),
        await nc.subscribe(subjects.rejected("*"), cb=on_message),
    ]
    for _ in range(2):  # nats-py 2.16: one flush may overtake the buffered SUBs
        await nc.flush()
    try:
        yield
    finally:
        for subscription in subscriptions:
            await subscription.unsubscribe()


@pytest.fixture
async def tap(nc: Client, subjects: Subjects) -> AsyncIterator[Tap]:
    counter = Tap()
    async with outcomes_to(nc, subjects, counter.on_message):
        yield counter


# -- request-reply ------------------------------------------------------------------------------


async def test_request_reply_accepts_and_publishes_submitted(
    intake: Intake, nc: Client, subjects: Subjects
) -> None:
    reply = await ask(
        nc,
        subjects,
        {
            "idempotency_key": "accept-1",
            "submitted_by": "alice",
            "jobs": [{"name": "water", "steps": 2000, "resources": {"cpu": 2}}],
        },
    )
    request_id = request_id_for_key("accept-1")
    assert not reply.HasField("error")
    assert reply.request_id == request_id
    assert list(reply.job_ids) == [f"{request_id}-water"]

    [(subject, event)] = await wait_for_events(nc.jetstream(), subjects, 1)
    assert subject == subjects.job(f"{request_id}-water", "submitted")
    assert event.event_id == f"submitted:{request_id}-water:0"
    assert (event.job_id, event.attempt, event.producer) == (f"{request_id}-water", 0, "intake")
    submitted = event.submitted
    assert (submitted.request_id, submitted.idempotency_key) == (request_id, "accept-1")
    assert submitted.submitted_by == "alice"
    assert list(submitted.depends_on_ids) == []
    assert submitted.spec.steps == 2000
    assert submitted.spec.resources.cpu == 2
    assert submitted.spec.resources.memory_mb == 1024  # defaults filled in
    assert submitted.spec.task == pb.TASK_MD


AUTO_SUBMIT: dict[str, object] = {
    "idempotency_key": "auto-1",
    "jobs": [
        {"name": "auto", "system": {"water_box": {"box_nm": 3}}, "resources": {"auto": True}},
        {"name": "half", "resources": {"auto": True, "cpu": 2}},
        {"name": "stated", "resources": {"cpu": 1, "memory_mb": 2048}},
    ],
}
"""Three jobs: resources left to history, one of two stated, both stated."""


async def test_auto_resources_are_filled_in_and_stated_ones_kept(
    intake: Intake, nc: Client, subjects: Subjects
) -> None:
    reply = await ask(nc, subjects, AUTO_SUBMIT)
    assert not reply.HasField("error"), reply
    events = {
        e.job_id.rsplit("-", 1)[1]: e.submitted
        for _, e in await wait_for_events(nc.jetstream(), subjects, 3)
    }
    auto = events["auto"]
    # no history here: the physical estimate, with its evidence, applied to the spec
    assert auto.recommended.applied and auto.recommended.confidence == "low"
    assert "no history: physical estimate for water_box, ~2.7k atoms" in auto.recommended.evidence
    assert auto.spec.resources.memory_mb == auto.recommended.memory_mb
    assert 64 <= auto.spec.resources.memory_mb < 1024
    assert auto.spec.resources.cpu == auto.recommended.cpu == 1.0
    half = events["half"]  # a stated value next to auto is kept
    assert (half.spec.resources.cpu, half.recommended.applied) == (2.0, True)
    assert half.spec.resources.memory_mb == half.recommended.memory_mb
    stated = events["stated"]  # stated resources are kept; history's choice is only recorded
    assert (stated.spec.resources.cpu, stated.spec.resources.memory_mb) == (1.0, 2048)
    assert not stated.recommended.applied and stated.recommended.memory_mb > 0
    # the same submit again is the same content (the fingerprint is of what was asked)
    again = await ask(nc, subjects, AUTO_SUBMIT)
    assert list(again.job_ids) == list(reply.job_ids), again


async def test_auto_resources_of_the_wrong_type_are_refused_naming_the_field(
    intake: Intake, nc: Client, subjects: Subjects
) -> None:
    reply = await ask(
        nc,
        subjects,
        {"idempotency_key": "auto-2", "jobs": [{"name": "w", "resources": {"auto": "yes"}}]},
    )
    assert reply.error.field == "jobs[0].resources.auto", reply
    unknown = await ask(
        nc,
        subjects,
        {"idempotency_key": "auto-3", "jobs": [{"name": "w", "resources": {"automatic": True}}]},
    )
    assert unknown.error.field.startswith("jobs[0].resources"), unknown


async def test_protobuf_request_gets_protobuf_reply(
    intake: Intake, nc: Client, subjects: Subjects
) -> None:
    request = pb.SubmitRequest(idempotency_key="binary-1", jobs=[pb.JobSpec(name="bin")])
    answer = await nc.request(subjects.api_submit, request.SerializeToString(), timeout=TIMEOUT)
    assert (answer.headers or {}).get("content-type") == "application/x-protobuf"
    reply = pb.SubmitReply.FromString(answer.data)
    assert list(reply.job_ids) == [f"{request_id_for_key('binary-1')}-bin"]


ANSWERED_IN_KIND = [
    pytest.param(b"null", "application/json", "", "got null", id="bare-null"),
    pytest.param(b"42", "application/json", "", "got the number 42", id="bare-number"),
    pytest.param(b" true", "application/json", "", "got true", id="bare-true"),
    pytest.param(
        b'{"idempotency_key": "dup", "jobs": [{"name": "a", "steps": 300, "steps": 5}]}',
        "application/json",
        "jobs[0].steps",
        "given twice",
        id="a-json-key-twice",
    ),
    pytest.param(
        b'{"idempotency_key": "utf", "jobs": [{"name": "caf\xe9"}]}',
        "application/json",
        "jobs[0].name",
        "byte 0xe9 at offset 49",
        id="latin-1-in-json",
    ),
    pytest.param(
        pb.SubmitRequest(idempotency_key="pb-99", jobs=[pb.JobSpec(name="a")]).SerializeToString()
        + b"\x98\x06\x01",
        "application/x-protobuf",
        "#99",
        "unknown field number 99",
        id="protobuf-field-99",
    ),
    pytest.param(
        pb.SubmitRequest(
            idempotency_key="k" * 34, jobs=[pb.JobSpec(name="a", task=cast(pb.Task, 9))]
        ).SerializeToString(),
        "application/x-protobuf",
        "jobs[0].task",
        "must be one of TASK_MD, TASK_MINIMIZE, TASK_ANALYZE, got 9",
        id="protobuf-key-34-long",
    ),
]


@pytest.mark.parametrize(("data", "content_type", "field", "fragment"), ANSWERED_IN_KIND)
async def test_a_refusal_comes_in_the_encoding_of_the_request(
    intake: Intake,
    nc: Client,
    subjects: Subjects,
    data: bytes,
    content_type: str,
    field: str,
    fragment: str,
) -> None:
    """A bare JSON value is JSON, and so is its answer; a protobuf submit whose key's length
    is a byte that starts JSON (34 is '"') is protobuf."""
    answer = await nc.request(subjects.api_submit, data, timeout=TIMEOUT)
    assert (answer.headers or {}).get("content-type") == content_type
    reply = pb.SubmitReply()
    if content_type == "application/json":
        json_format.Parse(answer.data, reply)
    else:
        reply.ParseFromString(answer.data)
    assert (reply.error.field, fragment in reply.error.message) == (field, True), reply.error
    assert not reply.job_ids


async def test_same_key_gives_same_ids_and_no_second_event(
    intake: Intake, nc: Client, subjects: Subjects, tap: Tap
) -> None:
    submit: dict[str, object] = {"idempotency_key": "twice", "jobs": [{"name": "a"}, {"name": "b"}]}
    first = await ask(nc, subjects, submit)
    await eventually(lambda: tap.at_least(2), "the first submit's events")
    second = await ask(nc, subjects, submit)
    changed = await ask(nc, subjects, {"idempotency_key": "twice", "jobs": [{"name": "zzz"}]})
    marker = await settled(nc, subjects, tap)

    assert first.job_ids and not first.HasField("error")
    assert second == first
    assert changed.error.field == "idempotency_key" and not changed.job_ids  # other content
    assert len(tap.subjects) == 3  # a and b once, then the refusal of the change
    log = [e for _, e in await job_log(nc.jetstream(), subjects) if e.job_id != marker]
    assert len(log) == 3


async def test_a_submit_of_many_jobs_is_stored_in_one_write_and_answered_once(
    intake: Intake, nc: Client, subjects: Subjects, tap: Tap
) -> None:
    """A submit of more jobs than ``PLAIN_UP_TO`` messages alone in its write goes as one
    atomic batch: its claim and every event stored together, in order; the same submit again
    gets the same answer and writes nothing; other content under its key is refused."""
    names = [f"j{index:02d}" for index in range(2 * PLAIN_UP_TO)]
    submit: dict[str, object] = {"idempotency_key": "many", "jobs": [{"name": n} for n in names]}
    first = await ask(nc, subjects, submit)
    again = await ask(nc, subjects, submit)
    changed = await ask(nc, subjects, {"idempotency_key": "many", "jobs": [{"name": "j00"}]})
    marker = await settled(nc, subjects, tap)

    assert not first.HasField("error") and len(first.job_ids) == len(names)
    assert again == first
    assert changed.error.field == "idempotency_key"
    log = [e for _, e in await job_log(nc.jetstream(), subjects) if e.job_id != marker]
    submitted = [e for e in log if e.WhichOneof("body") == "submitted"]
    assert sorted(e.job_id for e in submitted) == sorted(first.job_ids)  # each once
    claim = subjects.claim(request_id_for_key("many"))
    stored = await nc.jetstream().get_last_msg(subjects.jobs_stream, claim)
    batch = (stored.headers or {}).get("Nats-Batch-Id")
    assert batch and stored.seq  # the claim went in an atomic batch ...
    for sequence in range(stored.seq + 1, stored.seq + 1 + len(names)):
        event = await nc.jetstream().get_msg(subjects.jobs_stream, sequence)
        assert (event.headers or {}).get("Nats-Batch-Id") == batch  # ... with every event


async def test_chain_by_name_is_published_dependencies_first(
    intake: Intake, nc: Client, subjects: Subjects
) -> None:
    reply = await ask(
        nc,
        subjects,
        {
            "idempotency_key": "chain",
            "jobs": [
                {"name": "analyze", "task": "TASK_ANALYZE", "depends_on": ["md"]},
                {"name": "md", "depends_on": ["minimize"]},
                {"name": "minimize", "task": "TASK_MINIMIZE"},
            ],
        },
    )
    rid = request_id_for_key("chain")
    assert list(reply.job_ids) == [f"{rid}-analyze", f"{rid}-md", f"{rid}-minimize"]
    events = [event for _, event in await wait_for_events(nc.jetstream(), subjects, 3)]
    assert [event.job_id for event in events] == [f"{rid}-minimize", f"{rid}-md", f"{rid}-analyze"]
    assert [list(event.submitted.depends_on_ids) for event in events] == [
        [],
        [f"{rid}-minimize"],
        [f"{rid}-md"],
    ]
    assert events[2].submitted.spec.task == pb.TASK_ANALYZE


async def test_depends_on_an_earlier_job_id_or_key(
    intake: Intake, nc: Client, subjects: Subjects
) -> None:
    prep = await ask(nc, subjects, {"idempotency_key": "prep", "jobs": [{"name": "eq"}]})
    [prep_job] = prep.job_ids

    by_id = await ask(
        nc,
        subjects,
        {"idempotency_key": "by-id", "jobs": [{"name": "md", "depends_on": [prep_job]}]},
    )
    by_key = await ask(
        nc,
        subjects,
        {"idempotency_key": "by-key", "jobs": [{"name": "md", "depends_on": ["prep"]}]},
    )
    unknown = await ask(
        nc,
        subjects,
        {
            "idempotency_key": "by-nothing",
            "jobs": [{"name": "md", "depends_on": ["000000000000-eq"]}],
        },
    )

    assert not by_id.HasField("error") and not by_key.HasField("error")
    assert unknown.error.field == "jobs[0].depends_on[0]"
    events = {
        event.job_id: event for _, event in await wait_for_events(nc.jetstream(), subjects, 4)
    }
    assert list(events[by_id.job_ids[0]].submitted.depends_on_ids) == [prep_job]
    assert list(events[by_key.job_ids[0]].submitted.depends_on_ids) == [prep_job]
    assert events[""].rejected.request_id == request_id_for_key("by-nothing")


async def test_key_of_a_multi_job_submit_is_no_dependency(
    intake: Intake, nc: Client, subjects: Subjects
) -> None:
    await ask(nc, subjects, {"idempotency_key": "pair", "jobs": [{"name": "a"}, {"name": "b"}]})
    reply = await ask(
        nc,
        subjects,
        {"idempotency_key": "after-pair", "jobs": [{"name": "c", "depends_on": ["pair"]}]},
    )
    assert reply.error.field == "jobs[0].depends_on[0]"
    assert "unknown dependency" in reply.error.message


async def test_request_reply_requires_a_key(intake: Intake, nc: Client, subjects: Subjects) -> None:
    reply = await ask(nc, subjects, {"jobs": [{"name": "a"}]})
    assert reply.error.field == "idempotency_key"
    assert not reply.job_ids


# -- bad input ----------------------------------------------------------------------------------

TEN_TIB_IN_MIB = 10 * 1024 * 1024


def good_job(**fields: object) -> dict[str, object]:
    return {"name": "ok", **fields}


def nested_labels(key: str, depth: int) -> bytes:
    """A submit whose labels hold objects nested ``depth`` deep (``{"a": {"a": ...}}``)."""
    head = json.dumps({"idempotency_key": key, "jobs": [{"name": "ok", "labels": "HERE"}]})
    before, after = head.encode().split(b'"HERE"')
    return before + b'{"a": ' * depth + b'"x"' + b"}" * depth + after


def with_jobs(*jobs: dict[str, object]) -> Callable[[str], dict[str, object]]:
    """A payload builder: a submit of ``jobs`` under the key it is given."""
    return lambda key: {"idempotency_key": key, "jobs": list(jobs)}


# the path of the first object nested more than MAX_DEPTH (32) deep in nested_labels (the
# labels are a map: its keys in brackets)
TOO_DEEP_IN_LABELS = "jobs[0].labels['a']" + ".a" * (MAX_DEPTH + 1 - 5)

# (payload builder taking a key, decodes?, accepted field paths, fragment of the message)
BAD_INPUTS = [
    pytest.param(
        lambda key: b'{"idempotency_key": "' + key.encode() + b'", "jobs": [',
        False,
        {"jobs[0]"},
        "malformed JSON at line 1, column",
        id="malformed-json",
    ),
    pytest.param(
        with_jobs(good_job(resources={"cpu": "lots"})),
        False,
        {"jobs[0].resources.cpu"},
        "lots",
        id="cpu-wrong-type",
    ),
    pytest.param(
        with_jobs(good_job(gpus=4)),
        False,
        {"jobs[0].gpus"},
        "gpus",
        id="unknown-field",
    ),
    pytest.param(
        with_jobs(good_job(resources={"memory_mb": TEN_TIB_IN_MIB})),
        True,
        {"jobs[0].resources.memory_mb"},
        "must be between 64 and",
        id="memory-10-tib",
    ),
    pytest.param(
        with_jobs({"name": "../etc"}),
        True,
        {"jobs[0].name"},
        "lowercase letters",
        id="path-like-name",
    ),
    pytest.param(
        with_jobs({"name": "a\n"}),
        True,
        {"jobs[0].name"},
        "lowercase letters",
        id="name-with-newline",
    ),
    pytest.param(
        with_jobs(good_job(resources={"cpu": 1e6})),
        True,
        {"jobs[0].resources.cpu"},
        "must be between 0.1 and 256",
        id="cpu-absurd",
    ),
    pytest.param(
        with_jobs({"name": "a", "depends_on": ["b"]}, {"name": "b", "depends_on": ["a"]}),
        True,
        {"jobs[0].depends_on"},
        "dependency cycle: a -> b -> a",
        id="cycle",
    ),
    pytest.param(
        with_jobs(),
        True,
        {"jobs"},
        "1 to 500 jobs",
        id="no-jobs",
    ),
    pytest.param(
        with_jobs(good_job(labels={"team": "md\u0000"})),
        True,
        {"jobs[0].labels['team']"},
        "NUL",
        id="nul-in-a-label",
    ),
    pytest.param(
        with_jobs(good_job(), {"name": "b", "depends_on": [42]}),
        False,
        {"jobs[1].depends_on[0]"},
        "must be a string, got 42",
        id="a-number-among-the-dependencies",
    ),
    pytest.param(
        with_jobs(good_job(labels={"team": ["md"]})),
        False,
        {"jobs[0].labels['team']"},
        'must be a string, got ["md"]',
        id="a-list-as-a-label-value",
    ),
    pytest.param(
        lambda key: nested_labels(key, 3000),
        False,
        {TOO_DEEP_IN_LABELS},
        f"more than {MAX_DEPTH} levels deep",
        id="nested-thousands-deep",
    ),
    pytest.param(
        lambda key: nested_labels(key, 40),
        False,
        {TOO_DEEP_IN_LABELS},
        f"more than {MAX_DEPTH} levels deep",
        id="nested-forty-deep",
    ),
    pytest.param(
        with_jobs(good_job(**{"x" * 600_000: 1})),
        False,
        {f"jobs[0]['{'x' * 63}…']"},
        "unknown field 'xxx",
        id="a-field-name-of-600-kb",
    ),
    pytest.param(lambda key: b"", False, {""}, "JSON object", id="empty-payload"),
    pytest.param(
        lambda key: b"\xff\xfe\x00garbage", False, {""}, "neither JSON nor", id="not-protobuf"
    ),
]


def encoded(payload: dict[str, object] | bytes) -> bytes:
    return json.dumps(payload).encode() if isinstance(payload, dict) else payload


@pytest.mark.parametrize(("build", "decodes", "fields", "fragment"), BAD_INPUTS)
async def test_bad_input_is_refused_naming_the_field(
    intake: Intake,
    nc: Client,
    subjects: Subjects,
    build: Callable[[str], dict[str, object] | bytes],
    decodes: bool,
    fields: set[str],
    fragment: str,
) -> None:
    js = nc.jetstream()

    # request-reply: the reply names the field
    reply = await ask(nc, subjects, encoded(build("bad-rr")))
    assert reply.error.field in fields, reply.error
    assert fragment in reply.error.message
    assert not reply.job_ids

    # the stream: only a rejected event, and the message is acked (never redelivered)
    ack = await js.publish(subjects.submit, encoded(build("bad-stream")))
    request_id = request_id_for_key("bad-stream") if decodes else request_id_for_sequence(ack.seq)

    async def rejected_for_stream() -> bool:
        return any(
            subject == subjects.rejected(request_id) for subject, _ in await job_log(js, subjects)
        )

    await eventually(rejected_for_stream, "the rejected event of the stream submit")
    events = await job_log(js, subjects)
    assert {event.WhichOneof("body") for _, event in events} == {"rejected"}
    [stream_event] = [e for s, e in events if s == subjects.rejected(request_id)]
    assert stream_event.event_id == f"rejected:-:0:{request_id}"
    assert stream_event.rejected.request_id == request_id
    assert stream_event.rejected.idempotency_key == ("bad-stream" if decodes else "")
    assert stream_event.rejected.error.field in fields
    assert fragment in stream_event.rejected.error.message

    async def all_acked() -> bool:
        info = await js.consumer_info(subjects.submit_stream, "intake")
        return bool(info.num_pending == 0 and info.num_ack_pending == 0)

    await eventually(all_acked, "the stream submit to be acked")
    assert (await js.consumer_info(subjects.submit_stream, "intake")).num_redelivered == 0

    # intake keeps working
    good = await ask(nc, subjects, {"idempotency_key": "good-after", "jobs": [good_job()]})
    assert not good.HasField("error")
    assert list(good.job_ids) == [f"{request_id_for_key('good-after')}-ok"]


async def test_oversized_payload_is_stopped_by_the_default_server(
    intake: Intake, nc: Client, subjects: Subjects
) -> None:
    """A default server (1 MiB max_payload) refuses a 2 MB submit before it leaves the client."""
    with pytest.raises(MaxPayloadError):
        await nc.request(subjects.api_submit, b"{" + b" " * (2 << 20) + b"}", timeout=TIMEOUT)
    reply = await ask(nc, subjects, {"idempotency_key": "after-big", "jobs": [good_job()]})
    assert not reply.HasField("error")


@pytest.fixture
def roomy_nats_url(tmp_path: Path) -> Iterator[str]:
    """A NATS server that lets 2 MB messages through, so intake's own limit is what stops them."""
    port = free_port()
    config = tmp_path / "nats.conf"
    config.write_text(
        f'listen: "127.0.0.1:{port}"\nmax_payload: 4MB\n'
        f'jetstream {{ store_dir: "{tmp_path / "js"}" }}\n'
    )
    process = subprocess.Popen(
        [nats_server_binary(), "-c", str(config)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"nats://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                    break
            except OSError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise
                time.sleep(0.05)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=10)


async def test_oversized_payload_gets_an_error_reply(roomy_nats_url: str, namespace: str) -> None:
    common = settings_for(roomy_nats_url, namespace)
    subjects = Subjects(common.namespace)
    client = await connect(roomy_nats_url, name="big", subjects=subjects)
    intake = await started(common)
    try:
        big = json.dumps(
            {"idempotency_key": "big", "jobs": [{"name": "a", "labels": {"x": "y" * (2 << 20)}}]}
        ).encode()
        assert len(big) > 2 * 1024 * 1024 > MAX_SUBMIT_BYTES

        reply = await ask(client, subjects, big)
        assert reply.error.field == ""
        assert f"limit is {MAX_SUBMIT_BYTES}" in reply.error.message
        assert not reply.job_ids

        # the submit stream refuses it outright (max_msg_size), so it never reaches intake
        with pytest.raises(APIError):
            await client.jetstream().publish(subjects.submit, big)
        good = await ask(client, subjects, {"idempotency_key": "small", "jobs": [good_job()]})
        assert not good.HasField("error")
        events = await wait_for_events(client.jetstream(), subjects, 1)
        assert [event.WhichOneof("body") for _, event in events] == ["submitted"]
    finally:
        await intake.stop()
        await client.drain()


# -- the submit stream --------------------------------------------------------------------------


async def test_submits_made_while_intake_is_down_are_handled_when_it_starts(
    nats_url: str, namespace: str, nc: Client, subjects: Subjects, tap: Tap
) -> None:
    js = nc.jetstream()
    common = settings_for(nats_url, namespace)

    # published before intake ever ran in this namespace (no consumer exists yet)
    before = await js.publish(subjects.submit, json.dumps({"jobs": [{"name": "before"}]}).encode())
    first = await started(common)
    early = await js.publish(subjects.submit, json.dumps({"jobs": [{"name": "early"}]}).encode())
    await wait_for_events(js, subjects, 2)
    await first.stop()

    # intake is down: a keyless JSON submit and a keyed protobuf one are captured by the stream
    keyless = await js.publish(subjects.submit, json.dumps({"jobs": [{"name": "late"}]}).encode())
    keyed = pb.SubmitRequest(idempotency_key="offline", jobs=[pb.JobSpec(name="proto")])
    await js.publish(subjects.submit, keyed.SerializeToString())
    # captured, not handled: both wait in intake's durable consumer (no intake runs to publish)
    waiting = await js.consumer_info(subjects.submit_stream, IntakeSettings().durable)
    assert (waiting.num_pending, waiting.num_ack_pending) == (2, 0)
    assert len(await job_log(js, subjects)) == 2

    second = await started(common)
    try:
        events = await wait_for_events(js, subjects, 4)
    finally:
        await second.stop()
    assert [event.job_id for _, event in events] == [
        f"{request_id_for_sequence(before.seq)}-before",
        f"{request_id_for_sequence(early.seq)}-early",
        f"{request_id_for_sequence(keyless.seq)}-late",
        f"{request_id_for_key('offline')}-proto",
    ]
    assert len(tap.subjects) == 4  # the submits handled before the restart were not redone


async def test_plain_nats_publish_of_json_is_accepted(
    intake: Intake, nc: Client, subjects: Subjects
) -> None:
    """What `nats pub mdq.submit '{"jobs":[{"name":"hello"}]}'` does: a core publish, no ack."""
    await nc.publish(subjects.submit, b'{"jobs": [{"name": "hello", "steps": 100}]}')
    [(_, event)] = await wait_for_events(nc.jetstream(), subjects, 1)
    assert event.job_id == f"{request_id_for_sequence(1)}-hello"
    assert event.submitted.spec.steps == 100
    assert event.submitted.request_id == request_id_for_sequence(1)


async def test_other_content_under_a_key_at_the_same_moment_creates_nothing(
    nats_url: str, namespace: str, nc: Client, subjects: Subjects
) -> None:
    """Two intakes handed the same key with other content at the same moment: the claim and
    the events of a submit are one write, so one content's jobs are in the log and the other
    is refused, with nothing of it stored, whichever intake took which."""
    common = settings_for(nats_url, namespace)
    replicas = [await started(common), await started(common)]
    keys = [f"race-{i}" for i in range(24)]
    try:
        answers = await asyncio.gather(
            *(
                ask(nc, subjects, {"idempotency_key": key, "jobs": [{"name": name}]})
                for key in keys
                for name in ("left", "right")
            )
        )
    finally:
        for replica in replicas:
            await replica.stop()
    stored = {event.job_id for _, event in await job_log(nc.jetstream(), subjects)}
    for index, key in enumerate(keys):
        request_id = request_id_for_key(key)
        left, right = answers[2 * index], answers[2 * index + 1]
        jobs = {f"{request_id}-left", f"{request_id}-right"} & stored
        assert len(jobs) == 1, (key, jobs)  # one content's job, never both
        [winner] = [reply for reply in (left, right) if not reply.HasField("error")]
        [loser] = [reply for reply in (left, right) if reply.HasField("error")]
        assert set(winner.job_ids) == jobs
        assert loser.error.field == "idempotency_key", loser


async def test_other_content_under_a_key_claimed_before_a_restart_creates_nothing(
    nats_url: str, namespace: str, nc: Client, subjects: Subjects
) -> None:
    """An intake that never saw the key (restarted, or another replica) writes the submit's
    claim before its events: the claim in the log refuses the write, and the other content's
    job is never stored."""
    common = settings_for(nats_url, namespace)
    first = await started(common)
    try:
        accepted = await ask(nc, subjects, {"idempotency_key": "k", "jobs": [{"name": "left"}]})
    finally:
        await first.stop()
    fresh = await started(common)
    try:
        refused = await ask(nc, subjects, {"idempotency_key": "k", "jobs": [{"name": "right"}]})
    finally:
        await fresh.stop()
    request_id = request_id_for_key("k")
    assert list(accepted.job_ids) == [f"{request_id}-left"]
    assert refused.error.field == "idempotency_key", refused
    stored = [event.job_id for _, event in await job_log(nc.jetstream(), subjects)]
    assert f"{request_id}-right" not in stored and f"{request_id}-left" in stored


async def test_replicas_share_the_work(
    nats_url: str, namespace: str, nc: Client, subjects: Subjects, tap: Tap
) -> None:
    """Two intakes: every request-reply submit is answered once, every stream submit handled
    once (queue group + shared durable consumer)."""
    common = settings_for(nats_url, namespace)
    replicas = [await started(common), await started(common)]
    try:
        replies = await asyncio.gather(
            *(
                ask(nc, subjects, {"idempotency_key": f"r{i}", "jobs": [{"name": "a"}]})
                for i in range(10)
            )
        )
        for i in range(10):
            await nc.publish(subjects.submit, json.dumps({"jobs": [{"name": f"s{i}"}]}).encode())
        events = await wait_for_events(nc.jetstream(), subjects, 20)
    finally:
        for replica in replicas:
            await replica.stop()
    assert all(not reply.HasField("error") for reply in replies)
    assert len({event.job_id for _, event in events}) == 20
    assert len(tap.subjects) == 20


async def test_resubmit_after_a_crash_between_publish_and_record(
    intake: Intake, nc: Client, subjects: Subjects
) -> None:
    """An intake that died after publishing a submit's events but before recording it left the
    events in the log and no record: the retry republishes (dropped as duplicates) and records."""
    request_id = request_id_for_key("crashed")
    spec = normalize_job(pb.JobSpec(name="a"), "jobs[0]")
    crashed = EventPublisher(js=nc.jetstream(), subjects=subjects, producer="intake")
    await crashed.emit(
        "submitted",
        pb.JobSubmitted(spec=spec, request_id=request_id, idempotency_key="crashed"),
        job_id=f"{request_id}-a",
        attempt=0,
    )

    reply = await ask(nc, subjects, {"idempotency_key": "crashed", "jobs": [{"name": "a"}]})
    again = await ask(nc, subjects, {"idempotency_key": "crashed", "jobs": [{"name": "a"}]})

    assert list(reply.job_ids) == [f"{request_id}-a"] and again == reply
    events = await job_log(nc.jetstream(), subjects)
    assert [event.event_id for _, event in events] == [f"submitted:{request_id}-a:0"]


async def test_resubmit_after_a_crash_between_claim_and_publish(
    intake: Intake, nc: Client, subjects: Subjects, tap: Tap
) -> None:
    """An intake that died after recording a submit's claim but before publishing its events
    (a submit completed apart from its batch: ``overwrite``, then its events one by one) left
    a record and no events: a dependency on it is unknown, and the retry publishes the
    events."""
    request_id = request_id_for_key("half-done")
    job_ids = [f"{request_id}-a", f"{request_id}-b"]
    submit: dict[str, object] = {
        "idempotency_key": "half-done",
        "jobs": [{"name": "a"}, {"name": "b", "depends_on": ["a"]}],
    }
    fingerprint = content_of(handlers.decode_as(json.dumps(submit).encode(), "")).fingerprint
    assert fingerprint is not None  # valid content has one
    claimed = pb.SubmitReply(request_id=request_id, job_ids=job_ids)
    await nc.jetstream().publish(
        subjects.claim(request_id), claim_record(claimed, fingerprint), headers=CREATE_ONLY
    )

    waiting = await ask(
        nc,
        subjects,
        {"idempotency_key": "on-half", "jobs": [{"name": "md", "depends_on": [job_ids[0]]}]},
    )
    reply = await ask(nc, subjects, submit)
    again = await ask(nc, subjects, submit)
    await eventually(lambda: tap.at_least(3), "the completed submit's events")
    marker = await settled(nc, subjects, tap)

    assert waiting.error.field == "jobs[0].depends_on[0]"
    assert reply == claimed and again == claimed
    events = await job_log(nc.jetstream(), subjects)
    submitted = [
        event.job_id
        for _, event in events
        if event.WhichOneof("body") == "submitted" and event.job_id != marker
    ]
    assert submitted == job_ids  # once each, in the log
    # the rejection, then a and b once: the retry, alone in its write, sent its claim first,
    # which the record refused before any of its events went out
    assert len(tap.subjects) == 3


async def test_an_invalid_resubmit_of_an_accepted_key_is_refused_as_a_change(
    intake: Intake, nc: Client, subjects: Subjects, tap: Tap
) -> None:
    """Content that would not even pass validation, under a key accepted before, is refused
    as other content under that key, naming what changed; nothing new is published."""
    first = await ask(nc, subjects, {"idempotency_key": "kept", "jobs": [{"name": "a"}]})
    await eventually(lambda: tap.at_least(1), "the first submit's event")
    bad = await ask(nc, subjects, {"idempotency_key": "kept", "jobs": [{"name": "a", "steps": -5}]})
    await settled(nc, subjects, tap)

    assert not first.HasField("error")
    assert bad.error.field == "idempotency_key" and not bad.job_ids
    assert "jobs[0].steps: 10000 → -5" in bad.error.message
    assert len(tap.subjects) == 2  # a, then the refusal


async def test_changed_content_under_a_used_key_is_refused_naming_the_change(
    intake: Intake, nc: Client, subjects: Subjects, tap: Tap
) -> None:
    """Request-reply: the same content under a key (in any spelling or encoding) gets the same
    job ids; other content is refused, naming the key and what changed, and each change gets
    a rejected event of its own."""
    first = await ask(
        nc,
        subjects,
        {"idempotency_key": "campaign", "jobs": [{"name": "md", "steps": 1000}]},
    )
    await eventually(lambda: tap.at_least(1), "the first submit's event")
    respelled = await ask(
        nc,
        subjects,
        {
            "idempotencyKey": "campaign",
            "jobs": [{"name": "md", "steps": "1000", "temperatureK": 300, "max_retries": 3}],
        },
    )
    as_protobuf = await ask(
        nc,
        subjects,
        pb.SubmitRequest(
            idempotency_key="campaign", jobs=[pb.JobSpec(name="md", steps=1000)]
        ).SerializeToString(),
    )
    more_steps = await ask(
        nc,
        subjects,
        {"idempotency_key": "campaign", "jobs": [{"name": "md", "steps": 9000}]},
    )
    hotter = await ask(
        nc,
        subjects,
        {
            "idempotency_key": "campaign",
            "jobs": [{"name": "md", "steps": 1000, "temperature_k": 350}],
        },
    )
    another_job = await ask(
        nc,
        subjects,
        {"idempotency_key": "campaign", "jobs": [{"name": "md", "steps": 1000}, {"name": "x"}]},
    )
    await eventually(lambda: tap.at_least(4), "the rejected events of the changes")

    assert not first.HasField("error") and respelled == first and as_protobuf == first
    request_id = request_id_for_key("campaign")
    for refused, change in [
        (more_steps, "jobs[0].steps: 1000 → 9000"),
        (hotter, "jobs[0].temperature_k: 300 → 350"),
        (another_job, "jobs: 1 → 2 jobs"),
    ]:
        assert refused.request_id == request_id and not refused.job_ids
        assert refused.error.field == "idempotency_key"
        assert "'campaign' was already used" in refused.error.message
        assert change in refused.error.message, refused.error.message
    events = await job_log(nc.jetstream(), subjects)
    assert [event.WhichOneof("body") for _, event in events] == ["submitted"] + ["rejected"] * 3
    assert {event.rejected.request_id for _, event in events[1:]} == {request_id}
    assert len({event.event_id for _, event in events}) == 4
    assert len(tap.subjects) == 4  # nothing else was published


async def test_changed_content_under_a_used_key_is_rejected_on_the_stream(
    intake: Intake, nc: Client, subjects: Subjects, tap: Tap
) -> None:
    """The submit stream: a repeat of the content changes nothing; a change gets a rejected
    event naming the key and what changed, and the stream message is acked."""
    js = nc.jetstream()
    request_id = request_id_for_key("nightly")

    def submit(steps: int) -> bytes:
        return json.dumps(
            {"idempotency_key": "nightly", "jobs": [{"name": "md", "steps": steps}]}
        ).encode()

    await js.publish(subjects.submit, submit(1000))
    await eventually(lambda: tap.at_least(1), "the submitted event")
    await js.publish(subjects.submit, submit(1000))
    await js.publish(subjects.submit, submit(9000))
    await eventually(lambda: tap.at_least(2), "the rejected event of the change")

    async def all_acked() -> bool:
        info = await js.consumer_info(subjects.submit_stream, "intake")
        return bool(info.num_pending == 0 and info.num_ack_pending == 0)

    await eventually(all_acked, "the three stream submits to be acked")
    events = await job_log(js, subjects)
    assert [event.WhichOneof("body") for _, event in events] == ["submitted", "rejected"]
    submitted, rejected = events[0][1].submitted, events[1][1].rejected
    assert submitted.spec.steps == 1000  # the first content is what runs
    assert events[1][0] == subjects.rejected(request_id)
    assert (rejected.request_id, rejected.idempotency_key) == (request_id, "nightly")
    assert rejected.error.field == "idempotency_key"
    assert "jobs[0].steps: 1000 → 9000" in rejected.error.message
    assert len(tap.subjects) == 2  # the repeat published nothing


async def test_a_submit_that_breaks_intake_gets_an_error_and_the_others_their_answers(
    intake: Intake, nc: Client, subjects: Subjects, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unexpected exception while handling one submit answers that submit with an internal
    error (request-reply) or a rejected event (stream); the submits handled with it in the
    same batch get their own answers, and intake keeps serving."""
    decode = codec.decode_submit

    def breaks_on_poison(data: bytes) -> pb.SubmitRequest:
        if b"poison" in data:
            raise RuntimeError("a bug in intake")
        return decode(data)

    monkeypatch.setattr(handlers, "decode_submit", breaks_on_poison)
    burst: list[dict[str, object]] = [
        {"idempotency_key": f"fine-{i}" if i != 3 else "poison", "jobs": [{"name": "md"}]}
        for i in range(8)
    ]
    replies = await asyncio.gather(*(ask(nc, subjects, submit) for submit in burst))

    poisoned = replies.pop(3)
    assert poisoned.error.field == "" and not poisoned.job_ids
    assert "internal error in intake: RuntimeError" in poisoned.error.message
    assert all(not reply.HasField("error") and reply.job_ids for reply in replies)

    js = nc.jetstream()
    ack = await js.publish(subjects.submit, b'{"jobs": [{"name": "poison"}]}')
    request_id = request_id_for_sequence(ack.seq)

    async def rejected() -> bool:
        return any(
            subject == subjects.rejected(request_id) for subject, _ in await job_log(js, subjects)
        )

    await eventually(rejected, "the rejected event of the poisoned stream submit")
    good = await ask(nc, subjects, {"idempotency_key": "afterwards", "jobs": [{"name": "md"}]})
    assert not good.HasField("error")


async def test_a_batch_that_fails_answers_every_submit_it_had_not_answered(
    intake: Intake, nc: Client, subjects: Subjects, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Should handling a batch of request-reply submits fail after answering some, the others
    get an internal error each, not silence; none is answered twice."""

    async def answers_one_then_fails(batch: list[bytes], answer: handlers.Answer) -> None:
        await answer(0, pb.SubmitReply(request_id="first", job_ids=["first-a"]))
        await answer(0, pb.SubmitReply(request_id="twice"))  # never sent
        raise RuntimeError("a bug in intake")

    monkeypatch.setattr(intake.handler, "on_api_submits", answers_one_then_fails)
    replies = await asyncio.gather(
        *(
            ask(nc, subjects, {"idempotency_key": f"k{i}", "jobs": [{"name": "a"}]})
            for i in range(5)
        )
    )

    first = [reply for reply in replies if reply.request_id == "first"]
    assert len(first) >= 1  # the first of each batch
    assert all(reply.request_id != "twice" for reply in replies)
    for reply in replies:
        if reply.request_id != "first":
            assert reply.error.message == "internal error in intake: RuntimeError"
    assert intake._in_flight == 0  # every slot was given back


async def test_old_claims_are_not_completed_once_their_events_may_have_expired(
    nc: Client, subjects: Subjects
) -> None:
    """A claim older than the jobs stream's retention (less a margin) with no events in the
    log is taken as expired history, not as a submit to finish: its jobs must not run again."""
    js = nc.jetstream()
    requests = await Requests(nc).start()
    try:
        registry = await SubmitRegistry.open(js=js, requests=requests, subjects=subjects)
        max_age = (await js.stream_info(subjects.jobs_stream)).config.max_age
        assert max_age  # the jobs stream keeps its history for a limited time
        retention = timedelta(seconds=max_age)
        reply = pb.SubmitReply(request_id="0123456789ab", job_ids=["0123456789ab-a"])
        fingerprint = bytes(range(32))
        claim_it = partial(registry.accept, request_id="0123456789ab", reply=reply, events=())
        assert await claim_it(fingerprint=fingerprint) == ACCEPTED
        assert await claim_it(fingerprint=bytes(32)) == SEEN
        claim = await registry.existing("0123456789ab")
        assert claim is not None and claim.reply == reply
        assert claim.fingerprint == fingerprint  # the first claim's
        assert await registry.needs_events(claim, "0123456789ab-a")
        aged = replace(claim, written_at=claim.written_at - retention + RETENTION_MARGIN)
        assert not await registry.needs_events(aged, "0123456789ab-a")
        publisher = OwnersPublisher(js=js, subjects=subjects)
        await publisher.emit(
            "submitted",
            pb.JobSubmitted(spec=normalize_job(pb.JobSpec(name="a"), "jobs[0]")),
            job_id="0123456789ab-a",
            attempt=0,
        )
        assert await registry.has_submitted("0123456789ab-a")
        assert not await registry.has_submitted("0123456789ab-b")
        assert not await registry.needs_events(claim, "0123456789ab-a")  # its events are there
    finally:
        await requests.close()


async def test_runs_as_a_process(
    nats_url: str, namespace: str, nc: Client, subjects: Subjects
) -> None:
    """`python -m services.intake` serves request-reply and stops cleanly on SIGTERM."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "services.intake",
        env=child_environment(NATS_URL=nats_url, MDQ_NAMESPACE=namespace),
        cwd=REPO_ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        reply = None
        deadline = time.monotonic() + 20
        while reply is None:
            try:
                reply = await ask(
                    nc, subjects, {"idempotency_key": "proc", "jobs": [{"name": "p"}]}
                )
            except NoRespondersError:
                assert process.returncode is None, "intake exited"
                assert time.monotonic() < deadline, "intake did not come up"
                await asyncio.sleep(0.1)
        assert list(reply.job_ids) == [f"{request_id_for_key('proc')}-p"]
        process.send_signal(signal.SIGTERM)
        output, _ = await asyncio.wait_for(process.communicate(), timeout=20)
        assert process.returncode == 0, output.decode()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def test_many_submits_at_once_each_accepted_once(
    intake: Intake, nc: Client, subjects: Subjects, tap: Tap
) -> None:
    """Request-reply submits are handled side by side; two with the same key still give one
    set of events and the same reply."""
    keys = [f"burst-{number % 150}" for number in range(300)]  # every key twice
    replies = await asyncio.gather(
        *(ask(nc, subjects, {"idempotency_key": key, "jobs": [{"name": "md"}]}) for key in keys)
    )

    by_key: dict[str, set[str]] = {}
    for key, reply in zip(keys, replies, strict=True):
        assert not reply.HasField("error"), reply.error
        by_key.setdefault(key, set()).update(reply.job_ids)
    assert all(len(job_ids) == 1 for job_ids in by_key.values())
    events = await wait_for_events(nc.jetstream(), subjects, 150)
    accepted = sorted(job_id for job_ids in by_key.values() for job_id in job_ids)
    assert sorted(event.job_id for _, event in events) == accepted
    # published once each: a second publish (which JetStream would drop) shows in the tap
    await settled(nc, subjects, tap)
    assert sorted(tap.subjects) == sorted(subjects.job(job, "submitted") for job in accepted)


async def test_a_mixed_burst_is_handled_as_one_by_one_submits_would_be(
    intake: Intake, nc: Client, subjects: Subjects, tap: Tap, caplog: pytest.LogCaptureFixture
) -> None:
    """Submits that arrive together are claimed and published as batches; the outcome of
    each is still its own: chains keep dependencies first, a repeated key gets one set of
    events, a refusal is refused, a dependency on an earlier submit resolves, and a key
    accepted earlier gets its first reply."""
    earlier = await ask(nc, subjects, {"idempotency_key": "earlier", "jobs": [{"name": "eq"}]})
    await eventually(lambda: tap.at_least(1), "the earlier submit's event")
    burst: list[dict[str, object]] = [
        {"idempotency_key": "solo", "jobs": [{"name": "md"}]},
        {
            "idempotency_key": "chain",
            "jobs": [
                {"name": "analyze", "task": "TASK_ANALYZE", "depends_on": ["md"]},
                {"name": "md", "depends_on": ["prep"]},
                {"name": "prep", "task": "TASK_MINIMIZE"},
            ],
        },
        {"idempotency_key": "solo", "jobs": [{"name": "md"}]},
        {"idempotency_key": "bad", "jobs": [{"name": "md", "temperature_k": -1}]},
        {"idempotency_key": "after", "jobs": [{"name": "md", "depends_on": ["earlier"]}]},
        {"idempotency_key": "earlier", "jobs": [{"name": "eq"}]},
    ]
    burst += [{"idempotency_key": f"many-{i}", "jobs": [{"name": "md"}]} for i in range(40)]
    caplog.set_level(logging.INFO, logger="services.intake.handlers")
    replies = await asyncio.gather(*(ask(nc, subjects, submit) for submit in burst))
    solo, chain, solo_again, bad, after, earlier_again = replies[:6]
    events = await wait_for_events(nc.jetstream(), subjects, 1 + 1 + 3 + 1 + 1 + 40)
    await settled(nc, subjects, tap)  # a second publish of anything is in the tap by now

    assert solo_again == solo and not solo.HasField("error")
    assert bad.error.field == "jobs[0].temperature_k"
    assert earlier_again == earlier
    assert all(not reply.HasField("error") for reply in replies[6:])
    by_job = {event.job_id: (sequence, event) for sequence, (_, event) in enumerate(events)}
    prep, md, analyze = (
        f"{request_id_for_key('chain')}-{name}" for name in ("prep", "md", "analyze")
    )
    assert by_job[prep][0] < by_job[md][0] < by_job[analyze][0]
    assert list(chain.job_ids) == [analyze, md, prep]
    assert list(by_job[after.job_ids[0]][1].submitted.depends_on_ids) == list(earlier.job_ids)
    assert sum(event.WhichOneof("body") == "submitted" for _, event in events) == 1 + 1 + 3 + 1 + 40
    assert len(tap.subjects) == len(events)  # nothing was published twice
    together = [
        int(r.getMessage().split()[1]) for r in caplog.records if "together" in r.getMessage()
    ]
    assert together and max(together) > 1  # some were batched
    # and written as atomic batches: many events stored with one flush (docs/durability.md)
    batches: dict[str, int] = {}
    info = await nc.jetstream().stream_info(subjects.jobs_stream)
    for sequence in range(1, info.state.last_seq + 1):
        stored = await nc.jetstream().get_msg(subjects.jobs_stream, sequence)
        if batch := (stored.headers or {}).get("Nats-Batch-Id"):
            batches[batch] = batches.get(batch, 0) + 1
    assert batches and max(batches.values()) > 1


async def test_a_submit_waiting_for_its_key_does_not_hold_up_the_others(
    intake: Intake, nc: Client, subjects: Subjects
) -> None:
    """In a batch, each submit is answered as soon as its outcome is known: one whose request
    id is in hand elsewhere waits for it alone."""
    held = request_id_for_key("busy")
    assert intake.handler._locks.try_hold(held)  # as if a submit with that key were running
    try:
        busy = asyncio.ensure_future(
            ask(nc, subjects, {"idempotency_key": "busy", "jobs": [{"name": "md"}]})
        )
        others = await asyncio.gather(
            *(
                ask(nc, subjects, {"idempotency_key": f"free-{i}", "jobs": [{"name": "md"}]})
                for i in range(20)
            )
        )
        assert all(not reply.HasField("error") for reply in others)
        assert not busy.done()
    finally:
        intake.handler._locks.release(held)
    reply = await busy
    assert list(reply.job_ids) == [f"{held}-md"]
