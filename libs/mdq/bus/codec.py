"""Encoding on the bus: protobuf binary inside mdq, protobuf or its JSON mapping at the edge.

Anything a client sends is decoded here; every problem becomes a SpecError that names the
field (unknown field, in JSON or protobuf; a key given twice; wrong type; malformed JSON or
text that is not UTF-8; nesting too deep; oversized message), never an exception that would
take a consumer down. ``submit_is_json`` says which encoding a client used, which is the one
intake answers in. The JSON mapping is parsed by
``mdq.core.documents``, as job files are, so both name a problem by the same path
(``jobs[1].depends_on[0]``).
"""

from __future__ import annotations

import functools
import json
import re
from typing import cast

from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import DecodeError, Message

from mdq.bus.streams import MAX_SUBMIT_BYTES
from mdq.bus.subjects import Subjects
from mdq.contracts import pb
from mdq.core.documents import (
    MAX_DEPTH,
    Duplicated,
    camel_case_names,
    drop_unknown_fields,
    duplicate_error,
    load_json,
    parse_document,
    unknown_field_error,
)
from mdq.core.producers import producer_may_emit
from mdq.core.spec import SpecError

_VARINT_TYPES = frozenset(
    {
        FieldDescriptor.TYPE_INT32,
        FieldDescriptor.TYPE_INT64,
        FieldDescriptor.TYPE_UINT32,
        FieldDescriptor.TYPE_UINT64,
        FieldDescriptor.TYPE_SINT32,
        FieldDescriptor.TYPE_SINT64,
        FieldDescriptor.TYPE_BOOL,
        FieldDescriptor.TYPE_ENUM,
    }
)


def encode(message: Message) -> bytes:
    """Protobuf binary."""
    return message.SerializeToString(deterministic=True)


_PARSE_EVENT = pb.Event.FromString


def decode_event(data: bytes) -> pb.Event:
    """An event from the log (always protobuf binary). ``FromString`` makes and parses the
    message in one call, a third cheaper than an empty message and ``ParseFromString``: every
    consumer decodes every event of its streams here."""
    return _PARSE_EVENT(data)


def to_json(message: Message) -> str:
    """The protobuf JSON mapping, with field names as in the .proto file."""
    return json_format.MessageToJson(
        message, preserving_proto_field_name=True, indent=None, sort_keys=True
    )


def to_dict(message: Message) -> dict[str, object]:
    """The protobuf JSON mapping as a dict."""
    return json_format.MessageToDict(message, preserving_proto_field_name=True)


_SUBMIT = cast(Descriptor, pb.SubmitRequest.DESCRIPTOR)
_CAMEL_CASE_KEY = re.compile(
    b'"(?:' + b"|".join(re.escape(name.encode()) for name in camel_case_names(_SUBMIT)) + b')"'
)
"""A key that may give a field a second time, under its other spelling (``temperatureK``)."""
_UTF8_BOM = b"\xef\xbb\xbf"
"""A byte-order mark, which some editors write before UTF-8 text: skipped."""
_JSON_BLANKS = b" \t\r\n"
_JSON_STARTS = frozenset(b'{["-0123456789tfn')
"""The first byte of a JSON text after its blanks: an object, a list, a string, a number,
true, false or null."""
_SUBMIT_TAGS = frozenset(
    (field.number << 3) | (0 if field.type in _VARINT_TYPES else 2)
    for field in _SUBMIT.fields
    if field.number < 16
)
"""The first byte of a protobuf ``SubmitRequest`` that has only known fields: the tag of
one of them (``\\n``, the idempotency key, is a JSON blank too)."""


def submit_is_json(data: bytes) -> bool:
    """Whether a client sent the JSON mapping rather than protobuf binary: a text that starts
    like JSON (after blanks, and a UTF-8 byte-order mark) or is empty. A protobuf submit whose
    first field is its idempotency key starts with a newline, and the key's length may be a
    byte that starts JSON (``{`` is 123): such bytes are protobuf when they read as a
    ``SubmitRequest`` (unknown fields and all: a newer client's, which is then told so in
    protobuf), which JSON text practically never does (every length would have to land on
    the next field's tag, up to the last byte). Intake answers in the encoding this names."""
    start = data.removeprefix(_UTF8_BOM).lstrip(_JSON_BLANKS)[:1]
    if not start:
        return True
    if start[0] not in _JSON_STARTS:
        return False
    if data[0] not in _SUBMIT_TAGS:
        return True
    try:
        pb.SubmitRequest.FromString(data)
    except DecodeError:
        return True
    return False


def decode_submit(data: bytes) -> pb.SubmitRequest:
    """A submit as a client sent it: JSON (protobuf JSON mapping) or protobuf binary
    (``submit_is_json`` tells which). Duplicate JSON keys and unknown protobuf fields are
    refused, as unknown JSON fields are."""
    if len(data) > MAX_SUBMIT_BYTES:
        raise SpecError("", f"submit is {len(data)} bytes, the limit is {MAX_SUBMIT_BYTES}")
    request = pb.SubmitRequest()
    if submit_is_json(data):
        if not data.strip(_JSON_BLANKS):
            raise SpecError("", "the submit is empty: send a JSON object with a 'jobs' list")
        document = load_json(data, descriptor=_SUBMIT)  # a SpecError says where
        if isinstance(document, Duplicated):
            raise duplicate_error(document, _SUBMIT) or SpecError("", "a key given twice")
        if not isinstance(document, dict):
            raise SpecError(
                "", f"a submit is a JSON object with a 'jobs' list, got {_json_kind(document)}"
            )
        brackets = data.count(b"{") + data.count(b"[")  # C speed: most submits hold a few
        # most clients send no camelCase key; one may hide behind a \u escape
        respelled = b"\\u" in data or _CAMEL_CASE_KEY.search(data) is not None
        parse_document(document, request, nested=brackets > MAX_DEPTH, respelled=respelled)
        return request
    try:
        request.ParseFromString(data)
    except DecodeError:
        raise SpecError(
            "",
            "neither JSON nor a protobuf mdq.v1.SubmitRequest: the protobuf wire format is "
            "broken (cut short, or not protobuf)",
        ) from None
    if drop_unknown_fields(request):  # read them again, to name one
        again = pb.SubmitRequest.FromString(data)
        raise unknown_field_error(again) or SpecError("", "fields this mdq does not know")
    return request


def _json_kind(document: object) -> str:
    """What a JSON value is, for a person: ``null``, ``the number 42``, ``a list``."""
    if document is None or isinstance(document, bool):
        return json.dumps(document)
    if isinstance(document, int | float):
        return f"the number {json.dumps(document)}"
    if isinstance(document, str):
        return "a string"
    return "a list"


@functools.lru_cache(maxsize=64)
def _subjects_of(namespace: str) -> Subjects:
    """The subjects of ``namespace``, made once (every event checked names one): checking the
    namespace in ``Subjects.__post_init__`` for every event would cost more than the rest of the
    check. An invalid namespace raises ``ValueError`` each time (exceptions are not cached)."""
    return Subjects(namespace)


_CHECKED_REPORTS: set[tuple[str, str, str]] = set()
"""(subject, producer, job id) of progress reports that passed ``foreign_reason``: a job's
reports all share them, and the check runs for every report the watcher projects."""
CHECKED_REPORTS_MAX = 65_536


def report_checked(subject: str, producer: str, job_id: str) -> bool:
    """Whether a progress report of ``job_id`` from ``producer`` on ``subject`` passed
    ``foreign_reason`` before: then every report of the same three does (a hot loop's short
    way; anything else asks ``foreign_reason``)."""
    return (subject, producer, job_id) in _CHECKED_REPORTS


def foreign_reason(event: pb.Event, subject: str) -> str | None:
    """Why ``event``, read from ``subject``, is not what it claims to be; None when it is.

    The consumers' own check behind the server's permissions: an event must have a body, come
    from a producer that may emit its kind (``mdq.core.producers``) and sit on the very subject
    its producer publishes it on. What reached a stream some other way (a JetStream reply aimed
    at a stream subject, a message of one job delivered onto another's subject, a server run
    without permissions) fails here and is skipped."""
    kind = event.WhichOneof("body")
    if kind is None:
        return "no body"
    report = (subject, event.producer, event.job_id) if kind == "progress" else None
    if report is not None and report in _CHECKED_REPORTS:
        return None
    if not producer_may_emit(event.producer, kind):
        return f"producer {event.producer or '(none)'!r} may not emit {kind}"
    try:
        expected = _subjects_of(subject.split(".", 1)[0]).for_event(event)
    except ValueError as error:
        return str(error)
    if subject != expected:
        about = event.job_id or event.node_load.node or event.node_summary.node
        return f"a {kind} event of {about} on {subject}"
    if report is not None:
        if len(_CHECKED_REPORTS) >= CHECKED_REPORTS_MAX:
            _CHECKED_REPORTS.clear()
        _CHECKED_REPORTS.add(report)
    return None
