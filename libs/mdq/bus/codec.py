"""Encoding on the bus: protobuf binary inside mdq, protobuf or its JSON mapping at the edge.

Anything a client sends is decoded here; every problem becomes a SpecError that names the
field (unknown field, wrong type, malformed JSON, oversized message), never an exception that
would take a consumer down.
"""

from __future__ import annotations

import json
import re

from google.protobuf import json_format
from google.protobuf.message import DecodeError, Message

from mdq.bus.streams import MAX_SUBMIT_BYTES
from mdq.contracts import pb
from mdq.core.spec import SpecError

_AT_PATH = re.compile(r' at "?SubmitRequest\.?([\w.\[\]]*?)"?\.*$')
_NO_FIELD = re.compile(r'has no field named "([^"]+)"')
_REPEATED = re.compile(r"repeated field (\w+) must be in")
_PARSE_CHAIN = re.compile(r"Failed to parse (\w+) field")


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


def _field_of(error: str) -> str:
    """The field path ("jobs[0].resources.cpu") named by a protobuf JSON parse error."""
    first_line = error.splitlines()[0] if error else ""
    at = _AT_PATH.search(first_line)
    path = at.group(1).strip(".") if at else ""
    if child := (_NO_FIELD.search(error) or _REPEATED.search(error)):
        return f"{path}.{child.group(1)}" if path else child.group(1)
    return path or ".".join(_PARSE_CHAIN.findall(error))


def decode_submit(data: bytes) -> pb.SubmitRequest:
    """A submit as a client sent it: JSON (protobuf JSON mapping) or protobuf binary."""
    if len(data) > MAX_SUBMIT_BYTES:
        raise SpecError("", f"submit is {len(data)} bytes, the limit is {MAX_SUBMIT_BYTES}")
    request = pb.SubmitRequest()
    if data.lstrip()[:1] in (b"{", b"[", b'"') or not data.strip():
        try:
            document = json.loads(data or b"null")
        except (ValueError, UnicodeDecodeError) as error:
            raise SpecError("", f"malformed JSON: {error}") from None
        if not isinstance(document, dict):
            raise SpecError("", "a submit is a JSON object with a 'jobs' list")
        try:
            json_format.ParseDict(document, request, ignore_unknown_fields=False)
        except json_format.ParseError as error:
            text = str(error)
            raise SpecError(_field_of(text), text) from None
        return request
    try:
        request.ParseFromString(data)
    except DecodeError as error:
        raise SpecError("", f"neither JSON nor a protobuf SubmitRequest: {error}") from None
    return request
