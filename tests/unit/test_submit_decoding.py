"""A submit's bytes as intake decodes them (``mdq.bus.codec``): which encoding a client used
(so the answer comes back in it), text that is not UTF-8, a bare JSON value, protobuf fields
this mdq does not know; and Hypothesis properties: a key given twice anywhere in a JSON
submit, and an unknown field anywhere in a protobuf one, are refused naming where. Pure."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, cast

import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mdq.bus.codec import decode_submit, submit_is_json
from mdq.contracts import pb
from mdq.core.documents import quoted
from mdq.core.spec import RANGES, SpecError
from mdq.sdk.jobfile import parse_job_text


def refusal(data: bytes) -> SpecError:
    with pytest.raises(SpecError) as caught:
        decode_submit(data)
    return caught.value


def protobuf(*jobs: pb.JobSpec, key: str = "") -> bytes:
    return pb.SubmitRequest(idempotency_key=key, jobs=list(jobs)).SerializeToString()


# -- which encoding ------------------------------------------------------------------------------

ENCODINGS = {
    "an object": (b'{"jobs": []}', True),
    "an object after blanks": (b' \r\n\t{"jobs": []}', True),
    "null": (b"null", True),
    "a number": (b"42", True),
    "a negative number": (b"-1", True),
    "true": (b"true", True),
    "false": (b"false", True),
    "a string": (b'"x"', True),
    "a list": (b"[]", True),
    "nothing": (b"", True),
    "blanks": (b" \n ", True),
    "broken JSON that starts like a number": (b"4x", True),
    "a protobuf submit": (protobuf(pb.JobSpec(name="a")), False),
    "a protobuf submit with a key": (protobuf(pb.JobSpec(name="a"), key="k"), False),
    "bytes that are neither": (b"\xff\xfe\x00garbage", False),
    "a newer client's protobuf with a key 34 long": (
        protobuf(pb.JobSpec(name="a"), key="k" * 34) + b"\x98\x06\x01",  # and field 99
        False,
    ),
    "JSON after a newline": (b'\n\n{"jobs": [{"name": "a"}]}', True),
    # the key is the first field: a newline (its tag), then its length, which may be a byte
    # that starts JSON: 34 is '"', 45 '-', 48 to 57 digits, 91 '[', 102 'f', 110 'n',
    # 116 't', 123 '{'; 32 is a blank
    **{
        f"a protobuf submit whose key is {size} long": (
            protobuf(pb.JobSpec(name="a"), key="k" * size),
            False,
        )
        for size in (32, 34, 45, 48, 57, 91, 102, 110, 116, 123)
    },
}


@pytest.mark.parametrize("case", list(ENCODINGS))
def test_the_encoding_a_client_used(case: str) -> None:
    data, is_json = ENCODINGS[case]
    assert submit_is_json(data) is is_json


@pytest.mark.parametrize("size", [32, 34, 45, 48, 91, 102, 110, 116, 123])
def test_a_protobuf_submit_whose_key_length_starts_json_is_decoded(size: int) -> None:
    request = decode_submit(protobuf(pb.JobSpec(name="a"), key="k" * size))
    assert (request.idempotency_key, request.jobs[0].name) == ("k" * size, "a")


# -- JSON text -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Refused:
    data: bytes
    field: str
    message: str
    """The whole message, unless ``fragment``."""
    fragment: bool = False


REFUSED = {
    "null": Refused(b"null", "", "a submit is a JSON object with a 'jobs' list, got null"),
    "a number": Refused(
        b" 42", "", "a submit is a JSON object with a 'jobs' list, got the number 42"
    ),
    "true": Refused(b"true", "", "a submit is a JSON object with a 'jobs' list, got true"),
    "a string": Refused(b'"x"', "", "a submit is a JSON object with a 'jobs' list, got a string"),
    "a list": Refused(b"[{}]", "", "a submit is a JSON object with a 'jobs' list, got a list"),
    "nothing": Refused(b"", "", "the submit is empty: send a JSON object with a 'jobs' list"),
    "a byte that is not UTF-8 in a label": Refused(
        b'{"jobs": [{"name": "a", "labels": {"x": "\xff"}}]}',
        "jobs[0].labels['x']",
        "is not UTF-8 text: byte 0xff at offset 41 (line 1, column 42); JSON is UTF-8",
    ),
    "Latin-1 in a name, on the second line": Refused(
        b'{"jobs": [\n  {"name": "caf\xe9"}]}',
        "jobs[0].name",
        "is not UTF-8 text: byte 0xe9 at offset 26 (line 2, column 16); JSON is UTF-8",
    ),
    "a byte that is not UTF-8 in a key": Refused(
        b'{"jobs": [{"n\x80me": "a"}]}',
        "jobs[0]['n\ufffdme']",
        "byte 0x80 at offset 13",
        fragment=True,
    ),
    "a byte that is not UTF-8 between values": Refused(
        b'{"jobs": [] \xc0}', "jobs", "byte 0xc0 at offset 12", fragment=True
    ),
    "broken JSON that starts like a number": Refused(
        b"4x",
        "",
        "malformed JSON at line 1, column 2: more text after the end of the JSON document",
    ),
    "JSON cut short": Refused(
        b'{"jobs": [{"name": "a", "steps": ',
        "jobs[0].steps",
        "malformed JSON at line 1, column 34: a value is missing",
        fragment=True,
    ),
    "a key given twice": Refused(
        b'{"jobs": [{"name": "a", "temperature_k": 300, "temperature_k": 5}]}',
        "jobs[0].temperature_k",
        "given twice in one object (which one is meant?): give it once",
    ),
    "a key of the whole submit given twice": Refused(
        b'{"submitted_by": "a", "submitted_by": "b", "jobs": [{"name": "a"}]}',
        "submitted_by",
        "given twice",
        fragment=True,
    ),
    "one field under both spellings, one behind an escape": Refused(
        b'{"jobs": [{"name": "a", "temperature_k": 300, "temperature\\u004b": 5}]}',
        "jobs[0].temperature_k",
        "given twice, as 'temperature_k' and 'temperatureK'",
        fragment=True,
    ),
    "one field under both its spellings": Refused(
        b'{"jobs": [{"name": "a", "maxRetries": 1, "max_retries": 5}]}',
        "jobs[0].max_retries",
        "given twice, as 'maxRetries' and 'max_retries' (which one is meant?): give it once",
    ),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_refused_text_is_named(case: str) -> None:
    expected = REFUSED[case]
    error = refusal(expected.data)
    assert error.field == expected.field, error
    if expected.fragment:
        assert expected.message in error.message
    else:
        assert error.message == expected.message


def test_a_utf8_byte_order_mark_is_skipped() -> None:
    request = decode_submit(b'\xef\xbb\xbf{"jobs": [{"name": "a"}]}')
    assert request.jobs[0].name == "a"


def test_camel_case_alone_is_accepted() -> None:
    request = decode_submit(b'{"jobs": [{"name": "a", "maxRetries": 1, "temperatureK": 310}]}')
    assert (request.jobs[0].max_retries, request.jobs[0].temperature_k) == (1, 310)


def test_both_spellings_of_a_label_key_are_two_labels() -> None:
    """A map's keys are the client's own: only a message's fields have two spellings."""
    request = decode_submit(
        b'{"jobs": [{"name": "a", "labels": {"max_retries": "1", "maxRetries": "2"}}]}'
    )
    assert dict(request.jobs[0].labels) == {"max_retries": "1", "maxRetries": "2"}


# -- protobuf --------------------------------------------------------------------------------------


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def unknown_field(number: int, wire_type: int) -> bytes:
    """One field on the wire: its tag, then a payload of its wire type."""
    payload = {0: varint(300), 1: b"\x01" * 8, 2: varint(3) + b"abc", 5: b"\x02" * 4}
    return varint(number << 3 | wire_type) + payload[wire_type]


def with_unknown(request: pb.SubmitRequest, path: str, extra: bytes) -> bytes:
    """``request`` serialized with ``extra`` merged into the message at ``path``."""
    message: Any = request
    for part in filter(None, path.replace("]", "").replace("[", ".").split(".")):
        message = message[int(part)] if part.isdigit() else getattr(message, part)
    message.MergeFromString(extra)
    return request.SerializeToString()


def two_jobs() -> pb.SubmitRequest:
    return pb.SubmitRequest(
        idempotency_key="k",
        jobs=[
            pb.JobSpec(name="a"),
            pb.JobSpec(
                name="b",
                resources=pb.Resources(cpu=2),
                system=pb.System(water_box=pb.WaterBox(box_nm=2.5)),
                labels={"team": "md"},
            ),
        ],
    )


PROTOBUF_REFUSED = {
    "field 99 of the submit": ("", unknown_field(99, 0), "#99"),
    "a field of a newer job": ("jobs[0]", unknown_field(40, 2), "jobs[0].#40"),
    "deep in the second job": (
        "jobs[1].system.water_box",
        unknown_field(7, 5),
        "jobs[1].system.water_box.#7",
    ),
    "a large field number": (
        "jobs[1].resources",
        unknown_field(2**28, 1),
        "jobs[1].resources.#268435456",
    ),
}


@pytest.mark.parametrize("case", list(PROTOBUF_REFUSED))
def test_unknown_protobuf_fields_are_refused(case: str) -> None:
    path, extra, field = PROTOBUF_REFUSED[case]
    data = with_unknown(two_jobs(), path, extra)
    assert not submit_is_json(data)
    error = refusal(data)
    assert error.field == field
    assert f"unknown field number {field.rsplit('#', 1)[1]}" in error.message
    assert "newer mdq.proto" in error.message


def test_a_known_field_in_another_wire_form_is_named() -> None:
    """The name of a job sent as a number: protobuf would keep it as an unknown field."""
    data = protobuf(pb.JobSpec(name="a")) + b"\x12\x02" + b"\x08\x05"  # a second job: name=5
    error = refusal(data)
    assert (error.field, "field 1 (name) of mdq.v1.JobSpec came as varint" in error.message) == (
        "jobs[1].name",
        True,
    )


def test_a_map_entry_with_an_unknown_field_is_named() -> None:
    entry = b"\x0a\x01k\x12\x01v" + unknown_field(3, 0)
    data = protobuf(pb.JobSpec(name="a")) + b"\x12" + varint(3 + 2 + 1 + len(entry))
    data += b"\x0a\x01b" + b"\x82\x01" + varint(len(entry)) + entry
    assert refusal(data).field == "jobs[1].labels"


def test_broken_protobuf_is_said_so() -> None:
    error = refusal(b"\x12\x05\x0a")
    assert error.field == ""
    assert error.message.startswith("neither JSON nor a protobuf mdq.v1.SubmitRequest")


# -- values: the allowed ranges are what validation allows ---------------------------------------


def _fields() -> dict[str, FieldDescriptor]:
    found: dict[str, FieldDescriptor] = {}
    todo = [cast(Descriptor, pb.SubmitRequest.DESCRIPTOR)]
    while todo:
        message = todo.pop()
        for field in message.fields:
            if field.full_name not in found:
                found[field.full_name] = field
                if field.message_type is not None:
                    todo.append(field.message_type)
    return found


INTEGER_HOLDS = {
    FieldDescriptor.CPPTYPE_INT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.CPPTYPE_INT64: (-(2**63), 2**63 - 1),
}


@pytest.mark.parametrize("name", sorted(RANGES))
def test_each_range_is_a_number_field_that_holds_it(name: str) -> None:
    field = _fields()[name]
    low, high = RANGES[name]
    if field.cpp_type in INTEGER_HOLDS:
        holds = INTEGER_HOLDS[field.cpp_type]
        assert holds[0] <= low <= high <= holds[1]
    else:
        assert field.cpp_type == FieldDescriptor.CPPTYPE_DOUBLE and low <= high


def test_a_number_too_large_reads_like_validation() -> None:
    """The decoder's range for a number it cannot even hold is the one validation states."""
    from mdq.core.spec import normalize_job

    too_many = refusal(b'{"jobs": [{"name": "a", "max_retries": 4294967296}]}')
    with pytest.raises(SpecError) as validated:
        normalize_job(pb.JobSpec(name="a", max_retries=21), "jobs[0]")
    range_of = validated.value.message.split(", got")[0].removeprefix("must be ")
    assert range_of == "between 0 and 20"
    assert too_many.message.startswith(f"must be a whole number {range_of}, got")


# -- properties ------------------------------------------------------------------------------------

names = st.from_regex(r"[a-z][a-z0-9-]{0,8}", fullmatch=True)
label_keys = st.text(alphabet="abcdefgxyz_-.", min_size=1, max_size=6)
numbers = st.integers(min_value=1, max_value=10_000)


@st.composite
def job_documents(draw: st.DrawFn) -> dict[str, object]:
    job: dict[str, object] = {"name": draw(names)}
    if draw(st.booleans()):
        job["steps"] = draw(numbers)
    if draw(st.booleans()):
        job["labels"] = draw(st.dictionaries(label_keys, names, min_size=1, max_size=3))
    if draw(st.booleans()):
        job["system"] = {"water_box": {"box_nm": draw(st.sampled_from([1.5, 2.0, 3.0]))}}
    if draw(st.booleans()):
        job["resources"] = {"cpu": draw(st.sampled_from([0.5, 1, 2])), "memory_mb": 512}
    return job


submits = st.fixed_dictionaries(
    {"jobs": st.lists(job_documents(), min_size=1, max_size=4)},
    optional={"idempotency_key": names, "submitted_by": names},
)

_SPELLINGS = {
    field.name: field.json_name for field in _fields().values() if field.json_name != field.name
}


def objects(
    document: object, path: str = "", in_map: bool = False
) -> list[tuple[object, str, bool]]:
    """Every JSON object in a submit document: (the object, its path, whether its keys are a
    map's)."""
    found: list[tuple[object, str, bool]] = []
    if isinstance(document, dict):
        found.append((document, path, in_map))
        for key, value in document.items():
            here = f"{path}[{quoted(key)}]" if in_map else (f"{path}.{key}" if path else key)
            found += objects(value, here, key == "labels" and not in_map)
    elif isinstance(document, list):
        for index, item in enumerate(document):
            found += objects(item, f"{path}[{index}]")
    return found


def dumped(value: object, target: object, key: str, spelling: str) -> str:
    """``value`` as JSON text, with ``key`` of the object ``target`` written a second time
    (as ``spelling``), just after its first."""
    if isinstance(value, dict):
        pairs = []
        for name, item in value.items():
            text = dumped(item, target, key, spelling)
            pairs.append(f"{json.dumps(name)}: {text}")
            if value is target and name == key:
                pairs.append(f"{json.dumps(spelling)}: {text}")
        return "{" + ", ".join(pairs) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(dumped(item, target, key, spelling) for item in value) + "]"
    return json.dumps(value)


@settings(max_examples=200, deadline=None, database=None)
@given(submit=submits, data=st.data())
def test_a_key_given_twice_anywhere_is_refused_naming_it(
    submit: dict[str, object], data: st.DataObject
) -> None:
    target, path, in_map = data.draw(st.sampled_from(objects(submit)), label="object")
    assert isinstance(target, dict)
    key = data.draw(st.sampled_from(sorted(target)), label="key")
    spellings = [key] if in_map or key not in _SPELLINGS else [key, _SPELLINGS[key]]
    spelling = data.draw(st.sampled_from(spellings), label="spelling")
    text = dumped(submit, target, key, spelling)
    expected = f"{path}[{quoted(key)}]" if in_map else (f"{path}.{key}" if path else key)

    with pytest.raises(SpecError) as from_intake:
        decode_submit(text.encode())
    with pytest.raises(SpecError) as from_a_job_file:
        parse_job_text(text)
    for caught in (from_intake, from_a_job_file):
        assert caught.value.field == expected
        assert "given twice" in caught.value.message


def message_paths(message: Any, path: str = "") -> list[tuple[Any, str]]:
    """Every message in ``message`` (itself first), with its path."""
    found = [(message, path)]
    for field, value in message.ListFields():
        if field.message_type is None or field.message_type.GetOptions().map_entry:
            continue
        here = f"{path}.{field.name}" if path else field.name
        if field.is_repeated:
            for index, item in enumerate(value):
                found += message_paths(item, f"{here}[{index}]")
        else:
            found += message_paths(value, here)
    return found


@settings(
    max_examples=200,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    submit=submits,
    data=st.data(),
    number=st.integers(min_value=1, max_value=2**29 - 1).filter(
        lambda n: not 19_000 <= n <= 19_999  # reserved by protobuf itself
    ),
    wire_type=st.sampled_from([0, 1, 2, 5]),
)
def test_an_unknown_protobuf_field_anywhere_is_refused_naming_it(
    submit: dict[str, object], data: st.DataObject, number: int, wire_type: int
) -> None:
    request = decode_submit(json.dumps(submit).encode())
    message, path = data.draw(st.sampled_from(message_paths(request)), label="message")
    descriptor = cast(Descriptor, message.DESCRIPTOR)
    if number in descriptor.fields_by_number:
        return  # a known field: not what this property is about
    message.MergeFromString(unknown_field(number, wire_type))
    error = refusal(request.SerializeToString())
    assert error.field == (f"{path}.#{number}" if path else f"#{number}")
    assert f"unknown field number {number}" in error.message
