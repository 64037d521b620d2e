"""Encoding on the bus: protobuf binary inside mdq, protobuf or its JSON mapping at the edge.

Anything a client sends is decoded here; every problem becomes a SpecError that names the
field (unknown field, wrong type, malformed JSON, nesting too deep, oversized message), never an
exception that would take a consumer down. The JSON mapping is parsed by
``mdq.core.documents``, as job files are, so both name a problem by the same path
(``jobs[1].depends_on[0]``).
"""

from __future__ import annotations

from google.protobuf import json_format
from google.protobuf.message import DecodeError, Message

from mdq.bus.streams import MAX_SUBMIT_BYTES
from mdq.bus.subjects import Subjects
from mdq.contracts import pb
from mdq.core.documents import MAX_DEPTH, load_json, parse_document, printable
from mdq.core.producers import producer_may_emit
from mdq.core.spec import SpecError


def encode(message: Message) -> bytes:
    """Protobuf binary."""
    return message.SerializeToString(deterministic=True)


def decode_event(data: bytes) -> pb.Event:
    """An event from the log (always protobuf binary)."""
    event = pb.Event()
    event.ParseFromString(data)
    return event


def to_json(message: Message) -> str:
    """The protobuf JSON mapping, with field names as in the .proto file."""
    return json_format.MessageToJson(
        message, preserving_proto_field_name=True, indent=None, sort_keys=True
    )


def to_dict(message: Message) -> dict[str, object]:
    """The protobuf JSON mapping as a dict."""
    return json_format.MessageToDict(message, preserving_proto_field_name=True)


def decode_submit(data: bytes) -> pb.SubmitRequest:
    """A submit as a client sent it: JSON (protobuf JSON mapping) or protobuf binary."""
    if len(data) > MAX_SUBMIT_BYTES:
        raise SpecError("", f"submit is {len(data)} bytes, the limit is {MAX_SUBMIT_BYTES}")
    request = pb.SubmitRequest()
    if data.lstrip()[:1] in (b"{", b"[", b'"') or not data.strip():
        try:
            document = load_json(data or b"null")
        except SpecError:  # nested too deep
            raise
        except (ValueError, UnicodeDecodeError) as error:
            raise SpecError("", printable(f"malformed JSON: {error}")) from None
        if not isinstance(document, dict):
            raise SpecError("", "a submit is a JSON object with a 'jobs' list")
        brackets = data.count(b"{") + data.count(b"[")  # C speed: most submits hold a few
        parse_document(document, request, nested=brackets > MAX_DEPTH)
        return request
    try:
        request.ParseFromString(data)
    except DecodeError as error:
        raise SpecError("", f"neither JSON nor a protobuf SubmitRequest: {error}") from None
    return request


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
    if not producer_may_emit(event.producer, kind):
        return f"producer {event.producer or '(none)'!r} may not emit {kind}"
    try:
        expected = Subjects(subject.split(".", 1)[0]).for_event(event)
    except ValueError as error:
        return str(error)
    if subject != expected:
        about = event.job_id or event.node_load.node or event.node_summary.node
        return f"a {kind} event of {about} on {subject}"
    return None
