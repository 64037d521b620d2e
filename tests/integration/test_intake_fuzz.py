"""Fuzzing the real intake over NATS with Hypothesis: arbitrary JSON (nested a few levels or
thousands), submit-shaped documents with wrong types in every field, bracket soup and raw
bytes, each sent to both submit subjects.

Every message must get exactly one answer (docs/architecture.md, invariant 6):

- request-reply (``NS.api.submit``): one reply, in the request's encoding, that accepts the
  submit (job ids) or refuses it with a message and a field path (empty for the whole
  document), never "internal error";
- the submit stream (``NS.submit``): the message is acked, and its request id (from its key,
  or its stream sequence) has either one ``rejected`` event or the ``submitted`` events of its
  jobs, each once, never both; nothing is published twice.

And intake keeps serving: a plain submit is accepted on both subjects afterwards. The
Hypothesis body runs in a worker thread and hands each send to the test's event loop, where
intake and the client live. Keys are replaced by fresh ones per send, so every stream message
has request ids of its own (a key repeated with the same content is answered by nothing new,
which would read as no answer).
"""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from google.protobuf import json_format
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from nats.aio.client import Client
from nats.aio.msg import Msg

from mdq.bus.subjects import Subjects
from mdq.contracts import pb
from mdq.core.ids import request_id_for_key, request_id_for_sequence
from services.intake.app import Intake
from services.intake.handlers import MAX_FIELD_CHARS
from tests.integration.test_intake import outcomes_to, reply_of

TIMEOUT = 10.0
EXAMPLES = 150

# -- what is sent ------------------------------------------------------------------------------

_DESCRIPTORS = [
    message.DESCRIPTOR
    for message in (pb.SubmitRequest, pb.JobSpec, pb.System, pb.Structure, pb.Resources)
]
FIELD_NAMES = sorted(
    {f.name for d in _DESCRIPTORS for f in d.fields}
    | {f.json_name for d in _DESCRIPTORS for f in d.fields}
)
JOB_NAMES = ["a", "b", "md", "prep"]

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats()
    | st.text(max_size=12)
    | st.sampled_from(["TASK_MD", "TASK_ANALYZE", "NaN", "1e400", "-0", *JOB_NAMES])
)
keys = st.text(max_size=8) | st.sampled_from(FIELD_NAMES)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=4),
    max_leaves=24,
)


def _with_name(job: dict[str, object], name: str) -> dict[str, object]:
    return {"name": name, **job}


jobs = st.builds(
    _with_name,
    st.dictionaries(st.sampled_from(FIELD_NAMES), json_values, max_size=3)
    | st.fixed_dictionaries(
        {},
        optional={
            "steps": st.integers(min_value=-5, max_value=10**6),
            "temperature_k": st.floats(min_value=-1, max_value=6000),
            "depends_on": st.lists(st.sampled_from(JOB_NAMES) | json_values, max_size=2),
            "task": st.sampled_from(["TASK_MD", "TASK_MINIMIZE", "TASK_ANALYZE", 7]),
            "labels": st.dictionaries(st.text(max_size=5), st.text(max_size=5) | json_values),
            "resources": st.fixed_dictionaries(
                {}, optional={"cpu": json_values, "memory_mb": st.integers(0, 10**7)}
            ),
        },
    ),
    st.sampled_from(JOB_NAMES) | st.text(max_size=6),
)
submits = st.fixed_dictionaries(
    {"idempotency_key": st.just("KEY"), "jobs": st.lists(jobs, max_size=3)},
    optional={"submitted_by": st.text(max_size=8)},
)


def _deep_labels(depth: int) -> bytes:
    return (
        b'{"idempotency_key": "KEY", "jobs": [{"name": "a", "labels": '
        + b'{"a": ' * depth
        + b'"x"'
        + b"}" * depth
        + b"}]}"
    )


@dataclass(frozen=True)
class AsProtobuf:
    """A submit-shaped document to send in protobuf binary (as JSON where it does not parse)."""

    document: dict[str, Any]


payloads: st.SearchStrategy[object] = st.one_of(
    submits,
    submits.map(AsProtobuf),
    json_values,
    st.integers(min_value=1, max_value=6000).map(_deep_labels),
    st.integers(min_value=1, max_value=6000).map(
        lambda depth: b'{"jobs": ' + b"[" * depth + b"]" * depth + b"}"
    ),
    st.text(alphabet='[]{}":,a1 \\', max_size=400).map(str.encode),
    st.binary(max_size=300),
)


def encoded(payload: object, key: str) -> bytes:
    """The bytes sent, with the idempotency key, if there is one, replaced by ``key`` (a new
    one for each send): JSON for a document, protobuf binary for ``AsProtobuf``, bytes as they
    are unless they decode as a protobuf submit with a key."""
    if isinstance(payload, AsProtobuf):
        request = pb.SubmitRequest()
        try:
            json_format.ParseDict(payload.document, request)
        except Exception:  # wrong types: sent as JSON
            payload = payload.document
        else:
            request.idempotency_key = key
            return request.SerializeToString()
    if isinstance(payload, bytes):
        payload = payload.replace(b'"KEY"', json.dumps(key).encode())
        if payload.lstrip()[:1] in (b"{", b"[", b'"') or not payload.strip():
            return payload
        try:
            request = pb.SubmitRequest.FromString(payload)
        except Exception:  # no protobuf submit: its sequence names it
            return payload
        if not request.idempotency_key:
            return payload
        request.idempotency_key = key
        return request.SerializeToString()
    if isinstance(payload, dict):
        payload = {
            name: key if name in ("idempotency_key", "idempotencyKey") else value
            for name, value in payload.items()
        }
    return json.dumps(payload).encode()


# -- what comes back ---------------------------------------------------------------------------

PATH = re.compile(r"^$|^(\w+|\[|#\d+$)")
"""A field path: empty (the whole document), or starting with a field name or a bracket, or
the number of an unknown protobuf field of the submit itself (``#99``)."""


def check_refusal(error: pb.SubmitError) -> None:
    assert error.message, error
    assert "internal error" not in error.message, error
    assert PATH.match(error.field) and len(error.field) <= MAX_FIELD_CHARS, error


@dataclass
class Answers:
    """Every event intake publishes, by request id, as core NATS delivers them (so a publish
    that JetStream's deduplication drops still counts)."""

    by_request: dict[str, list[pb.Event]] = field(default_factory=lambda: defaultdict(list))
    count: int = 0
    arrived: asyncio.Event = field(default_factory=asyncio.Event)

    async def on_message(self, message: Msg) -> None:
        event = pb.Event.FromString(message.data)
        body = event.WhichOneof("body")
        request_id = event.rejected.request_id if body == "rejected" else event.submitted.request_id
        self.by_request[request_id].append(event)
        self.count += 1
        self.arrived.set()

    async def wait_for(self, request_ids: set[str]) -> str:
        """The request id among ``request_ids`` that got an answer."""
        async with asyncio.timeout(TIMEOUT):
            while True:
                if found := request_ids & self.by_request.keys():
                    [request_id] = found
                    return request_id
                self.arrived.clear()
                await self.arrived.wait()


@pytest.fixture
async def answers(nc: Client, subjects: Subjects) -> AsyncIterator[Answers]:
    collected = Answers()
    async with outcomes_to(nc, subjects, collected.on_message):
        yield collected


@dataclass
class Fuzzer:
    nc: Client
    subjects: Subjects
    answers: Answers
    stream_requests: list[str] = field(default_factory=list)
    """The request id that answered each stream message."""
    accepted: int = 0
    refused: int = 0

    async def send(self, payload: object) -> None:
        await self.request_reply(encoded(payload, f"rr-{uuid.uuid4().hex}"))
        key = f"st-{uuid.uuid4().hex}"
        await self.stream(encoded(payload, key), key=key)

    async def request_reply(self, data: bytes) -> None:
        answer = await self.nc.request(self.subjects.api_submit, data, timeout=TIMEOUT)
        reply = reply_of(answer)
        if reply.HasField("error"):
            check_refusal(reply.error)
            assert not reply.job_ids
            self.refused += 1
        else:
            assert reply.request_id and reply.job_ids, reply
            self.accepted += 1

    async def stream(self, data: bytes, *, key: str = "") -> None:
        """Publish to the submit stream; wait for the answer under the request id of the
        stream sequence or of ``key`` (the key it was sent with, if it has one)."""
        ack = await self.nc.jetstream().publish(self.subjects.submit, data)
        candidates = {request_id_for_sequence(ack.seq), request_id_for_key(key)}
        self.stream_requests.append(await self.answers.wait_for(candidates))


# Hypothesis warns that the repr of the payload strategy is large (its lists of field names)
@pytest.mark.filterwarnings("ignore:Generating overly large repr")
async def test_every_message_gets_exactly_one_answer(
    intake: Intake, nc: Client, subjects: Subjects, answers: Answers
) -> None:
    loop = asyncio.get_running_loop()
    fuzzer = Fuzzer(nc, subjects, answers)

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(payload=payloads)
    def one(payload: object) -> None:
        asyncio.run_coroutine_threadsafe(fuzzer.send(payload), loop).result(TIMEOUT * 3)

    await asyncio.to_thread(one)

    # every stream message: one rejected event, or the submitted events of its jobs, once each
    assert len(set(fuzzer.stream_requests)) == len(fuzzer.stream_requests)
    for request_id in fuzzer.stream_requests:
        events = answers.by_request[request_id]
        kinds = {event.WhichOneof("body") for event in events}
        assert kinds in ({"rejected"}, {"submitted"}), events
        if kinds == {"rejected"}:
            [rejected] = events
            check_refusal(rejected.rejected.error)
        assert len({event.event_id for event in events}) == len(events), events

    # nothing was published twice (a duplicate would be a second answer); the stream keeps
    # intake's claims beside the events
    js = nc.jetstream()
    info = await js.stream_info(subjects.jobs_stream)
    claims = await js.stream_info(subjects.jobs_stream, subjects_filter=f"{subjects.claim_prefix}>")
    stored_events = info.state.messages - sum((claims.state.subjects or {}).values())

    async with asyncio.timeout(TIMEOUT):
        while answers.count < stored_events:
            answers.arrived.clear()
            await answers.arrived.wait()
    assert answers.count == stored_events

    # intake keeps serving, on both subjects
    submit = {"idempotency_key": "after-fuzzing", "jobs": [{"name": "md", "steps": 100}]}
    reply = reply_of(
        await nc.request(subjects.api_submit, json.dumps(submit).encode(), timeout=TIMEOUT)
    )
    assert not reply.HasField("error") and len(reply.job_ids) == 1
    await fuzzer.stream(b'{"jobs": [{"name": "md", "steps": 100}]}')
    [last] = answers.by_request[fuzzer.stream_requests[-1]]
    assert last.WhichOneof("body") == "submitted"
    assert fuzzer.accepted > 0 and fuzzer.refused > 0  # both outcomes were exercised
