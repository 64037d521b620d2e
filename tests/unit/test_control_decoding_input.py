"""A control request's input as placement's entrance checks it (``mdq.core.control``): the
decoding of its JSON (``decode_request``), the names of its jobs (``check_names``) and who
the history says asked (``requester``); every refusal names its field (docs/control.md,
"The verbs")."""

from __future__ import annotations

import json

import pytest

from mdq.bus.codec import encode, to_json
from mdq.contracts import pb
from mdq.core.control import (
    MAX_JOB_IDS,
    ControlRefused,
    check_names,
    check_request,
    decode_request,
    fitted,
    is_json,
    not_found,
    origin_of,
    reply_of,
    requester,
)
from mdq.core.recovery import cancel_message
from tests.tables import named_cases

JOB = "3f2a9c1e0b7d-water"
ALICES = "alice.3f2a9c1e0b7d-water"


def body(**fields: object) -> bytes:
    return json.dumps({"control_key": "k", **fields}).encode()


DECODE_REFUSED = [
    ("a fractional verb", body(verb=1.5, job_ids=[JOB]), "verb", "1.5"),
    ("a whole float verb", body(verb=1.0, job_ids=[JOB]), "verb", "1.0"),
    ("a boolean verb", body(verb=True, job_ids=[JOB]), "verb", "true"),
    ("null", b"null", "", "must be a JSON object"),
    ("null with blanks", b" null\n", "", "got null"),
    ("true", b"true", "", "got true"),
    ("a number", b"12", "", "got the number 12"),
    ("a list", b"[1]", "", "got a list"),
    ("a string", b'"hi"', "", "got a string"),
    ("nothing", b"", "", "got null"),
    ("a key twice", b'{"control_key": "a", "control_key": "b", "verb": 1}', "control_key",
     "given twice"),
    ("a camelCase key twice", b'{"control_key": "a", "extendSteps": 1, "extendSteps": 2}',
     "extend_steps", "given twice"),
    ("a label twice", b'{"control_key": "a", "labels": {"x": "1", "x": "2"}}', "labels['x']",
     "given twice"),
    ("a field under both spellings", b'{"control_key": "a", "job_ids": [], "jobIds": []}',
     "job_ids", ""),
]  # fmt: skip


@named_cases(("data", "field", "words"), DECODE_REFUSED)
def test_decode_refuses_naming_the_field(data: bytes, field: str, words: str) -> None:
    with pytest.raises(ControlRefused) as refused:
        decode_request(data)
    assert (refused.value.field, words in refused.value.message) == (field, True)


DECODED = [
    ("the verb's name", body(verb="CONTROL_HOLD", job_ids=[JOB]), pb.CONTROL_HOLD),
    ("the verb's number", body(verb=2, job_ids=[JOB]), pb.CONTROL_HOLD),
    ("a camelCase key", body(verb=1, jobIds=[JOB]), pb.CONTROL_CANCEL),
]


@named_cases(("data", "verb"), DECODED)
def test_decode_takes_the_json_mapping(data: bytes, verb: pb.ControlVerb) -> None:
    request = decode_request(data)
    assert (request.verb, list(request.job_ids)) == (verb, [JOB])


ENCODINGS = [
    ("an object", b'{"verb": 1}', True),
    ("null", b"null", True),
    ("a number", b"-1.5e3", True),
    ("blank", b" ", True),
    (
        "protobuf",
        pb.ControlRequest(control_key="k", verb=pb.CONTROL_CANCEL).SerializeToString(),
        False,
    ),
    ("protobuf garbage", b"\xff\xfe", False),
]


@named_cases(("data", "json_"), ENCODINGS)
def test_the_answer_is_in_the_requests_encoding(data: bytes, json_: bool) -> None:
    assert is_json(data) is json_


def req(**fields: object) -> pb.ControlRequest:
    return pb.ControlRequest(control_key="k", verb=pb.CONTROL_CANCEL, **fields)  # type: ignore[arg-type]


NAMES_REFUSED = [
    ("a wildcard id", "", req(job_ids=[">"]), "job_ids[0]"),
    ("a star", "", req(job_ids=["*"]), "job_ids[0]"),
    ("a space", "", req(job_ids=[JOB, "a b"]), "job_ids[1]"),
    ("two dots", "", req(job_ids=["x..y"]), "job_ids[0]"),
    ("a token wildcard in a tenant's id", "alice", req(job_ids=["alice.>"]), "job_ids[0]"),
    ("another tenant's wildcard", "alice", req(job_ids=["bob.>"]), "job_ids[0]"),
    ("no hex", "alice", req(job_ids=["alice.x-md"]), "job_ids[0]"),
    ("a reserved tenant", "", req(job_ids=["admin.3f2a9c1e0b7d-a"]), "job_ids[0]"),
    ("an upper-case name", "", req(job_ids=["3f2a9c1e0b7d-Water"]), "job_ids[0]"),
    ("the last of many", "", req(job_ids=[JOB] * (MAX_JOB_IDS - 1) + ["a.b.c"]),
     f"job_ids[{MAX_JOB_IDS - 1}]"),
    ("a wildcard request id", "alice", req(request_id="*"), "request_id"),
    ("a blank request id", "alice", req(request_id=" "), "request_id"),
    ("a request id with a subject token", "", req(request_id="3f2a9c1e0b7d.>"), "request_id"),
    ("another tenant's request id", "alice", req(request_id="bob.32d485543236"), "request_id"),
    ("the operator's request id from a tenant", "alice", req(request_id="32d485543236"),
     "request_id"),
]  # fmt: skip


@named_cases(("tenant", "request_", "field"), NAMES_REFUSED)
def test_badly_named_jobs_are_refused_naming_the_field(
    tenant: str, request_: pb.ControlRequest, field: str
) -> None:
    check_request(request_, tenant=tenant)
    with pytest.raises(ControlRefused) as refused:
        check_names(request_, tenant=tenant)
    assert refused.value.field == field


NAMES_TAKEN = [
    ("the operator's job", "", req(job_ids=[JOB])),
    ("a tenant's job, by the operator", "", req(job_ids=[ALICES])),
    ("a tenant's own job", "alice", req(job_ids=[ALICES])),
    ("another tenant's job (forbidden per job later)", "alice",
     req(job_ids=["bob.3f2a9c1e0b7d-water"])),
    ("a tenant's own request", "alice", req(request_id="alice.32d485543236")),
    ("any request, by the operator", "", req(request_id="bob.32d485543236")),
    ("the operator's request", "", req(request_id="32d485543236")),
    ("labels", "alice", req(labels={"campaign": "x y*"})),
]  # fmt: skip


@named_cases(("tenant", "request_"), NAMES_TAKEN)
def test_well_named_jobs_are_taken(tenant: str, request_: pb.ControlRequest) -> None:
    assert check_names(check_request(request_, tenant=tenant), tenant=tenant) is request_


REQUESTERS = [
    ("a tenant that says nothing", "", "alice", "tenant alice"),
    ("a tenant that says who", "ann", "alice", "tenant alice ('ann')"),
    ("a tenant that claims to be the operator", "the operator", "alice",
     "tenant alice ('the operator')"),
    ("a tenant that claims to be another", "tenant bob", "alice", "tenant alice ('tenant bob')"),
    ("the operator's user", "ann", "", "ann"),
    ("the console", "the console", "", "the console"),
    ("the operator, unsaid", "", "", "the operator"),
]  # fmt: skip


@named_cases(("requested_by", "tenant", "who"), REQUESTERS)
def test_the_history_says_the_identity_that_asked(requested_by: str, tenant: str, who: str) -> None:
    assert requester(requested_by, tenant) == who
    request = req(job_ids=[JOB], requested_by=requested_by, reason="maintenance")
    origin = origin_of(request, control_id="c1", tenant=tenant)
    assert (origin.requested_by, origin.tenant) == (who, tenant)
    assert cancel_message(origin) == f"cancelled by {who}: maintenance"


@pytest.mark.parametrize("encoding", ["json", "protobuf"])
def test_a_reply_of_the_most_ids_fits_the_bus_in_either_encoding(encoding: str) -> None:
    outcomes = [
        not_found(f"alice.0000{i:08x}-x").outcome(f"alice.0000{i:08x}-x")
        for i in range(MAX_JOB_IDS)
    ]
    reply = reply_of("c1", outcomes)

    def size_of(reply: pb.ControlReply) -> int:
        return len(to_json(reply).encode() if encoding == "json" else encode(reply))

    limit = 1024 * 1024 - 4096
    cut = fitted(reply, size_of, limit)
    assert size_of(cut) <= limit
    assert len(cut.outcomes) + cut.omitted == MAX_JOB_IDS == cut.matched
    assert dict(cut.counts) == {"CONTROL_NOT_FOUND": MAX_JOB_IDS}
    assert list(cut.outcomes) == list(reply.outcomes[: len(cut.outcomes)])
    small = reply_of("c1", outcomes[:3])
    assert fitted(small, size_of, limit) is small
