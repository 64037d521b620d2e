"""Job files: YAML or JSON documents that become a ``pb.SubmitRequest``.

The file format *is* the protobuf JSON mapping of ``SubmitRequest`` (proto/mdq/v1/mdq.proto),
written as YAML or JSON, so a job file, ``nats pub <ns>.submit '{...}'`` and a Go client all
speak the same language::

    idempotency_key: my-campaign-1
    jobs:
      - name: water-300k
        system: {water_box: {box_nm: 2.0}}
        temperature_k: 300
        steps: 5000

A bare job object (no ``jobs`` key) is accepted as a one-job submit. Every problem — unknown
fields (all of them, each with its path), wrong types, malformed YAML — is a ``JobFileError``
(a ``SpecError``) that names the field, so the CLI can print it like a refusal from intake.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import yaml
from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

from mdq.contracts import pb
from mdq.core.spec import SpecError

_SUBMIT_KEYS = frozenset(
    {"jobs", "idempotency_key", "idempotencyKey", "submitted_by", "submittedBy"}
)


class JobFileError(SpecError):
    """A job file that cannot become a submit; ``field`` is the path of the culprit."""

    def __init__(self, field: str, message: str, *, source: str = "") -> None:
        super().__init__(field, message)
        self.source = source

    def __str__(self) -> str:
        where = f"{self.source}: " if self.source else ""
        return f"{where}{self.field}: {self.message}" if self.field else f"{where}{self.message}"


def _field_names(descriptor: Descriptor) -> dict[str, FieldDescriptor]:
    """Both spellings the JSON mapping accepts: proto names and lowerCamelCase json names."""
    names: dict[str, FieldDescriptor] = {}
    for field in descriptor.fields:
        names[field.name] = field
        names[field.json_name] = field
    return names


def unknown_fields(
    document: Mapping[str, Any], descriptor: Descriptor, path: str = ""
) -> list[str]:
    """Paths of every key in ``document`` that ``descriptor`` does not define (recursively)."""
    found: list[str] = []
    known = _field_names(descriptor)
    for key, value in document.items():
        where = f"{path}.{key}" if path else str(key)
        field = known.get(str(key))
        if field is None:
            found.append(where)
            continue
        if field.message_type is None or field.message_type.GetOptions().map_entry:
            continue
        if field.message_type.full_name.startswith("google.protobuf."):
            continue
        if field.is_repeated:
            if isinstance(value, list):
                for index, item in enumerate(value):
                    if isinstance(item, Mapping):
                        found += unknown_fields(item, field.message_type, f"{where}[{index}]")
        elif isinstance(value, Mapping):
            found += unknown_fields(value, field.message_type, where)
    return found


def submit_from_document(document: object, *, source: str = "") -> pb.SubmitRequest:
    """A submit from a parsed YAML/JSON document (a submit, or one bare job)."""
    if not isinstance(document, Mapping):
        raise JobFileError(
            "", "a job file is a mapping: a submit with a 'jobs' list, or one job", source=source
        )
    if not _SUBMIT_KEYS.intersection(document):
        document = {"jobs": [dict(document)]}
    unknown = unknown_fields(document, cast(Descriptor, pb.SubmitRequest.DESCRIPTOR))
    if unknown:
        raise JobFileError(
            unknown[0],
            ("unknown fields: " if len(unknown) > 1 else "unknown field: ")
            + ", ".join(unknown)
            + " (a job file is the protobuf JSON mapping of mdq.v1.SubmitRequest,"
            " see docs/jobspec.md)",
            source=source,
        )
    jobs = document.get("jobs", [])
    if not isinstance(jobs, list):
        raise JobFileError("jobs", "must be a list of jobs", source=source)
    request = pb.SubmitRequest()
    top = {key: value for key, value in document.items() if key != "jobs"}
    _parse_into(top, request, prefix="", source=source)
    for index, job in enumerate(jobs):
        if not isinstance(job, Mapping):
            raise JobFileError(f"jobs[{index}]", "a job is a mapping of fields", source=source)
        _parse_into(job, request.jobs.add(), prefix=f"jobs[{index}]", source=source)
    return request


_PARSE_CHAIN = re.compile(r"Failed to parse (\w+) field")
_PARSE_CHAIN_PREFIX = re.compile(r"(Failed to parse \w+ field: )+")
_AT_PATH_SUFFIX = re.compile(r" at \"?[A-Za-z]\w*(\.[\w.\[\]]+)?\"?$")


def _parse_into(document: Mapping[str, Any], message: Message, *, prefix: str, source: str) -> None:
    """ParseDict one message; a ParseError becomes a JobFileError naming the field."""
    try:
        json_format.ParseDict(dict(document), message, ignore_unknown_fields=False)
    except json_format.ParseError as error:
        text = str(error).rstrip(".")
        path = _resolve_path(document, _PARSE_CHAIN.findall(text))
        field = ".".join(part for part in (prefix, path) if part)
        reason = _AT_PATH_SUFFIX.sub("", _PARSE_CHAIN_PREFIX.sub("", text))
        raise JobFileError(field, reason, source=source) from None


def _resolve_path(document: Mapping[str, Any], names: list[str]) -> str:
    """The document path of the chain of field names in a ParseDict error, which leaves out
    oneof wrappers: descend by name, looking one level deeper when the name sits inside a
    wrapper such as ``water_box``."""
    parts: list[str] = []
    current: object = document
    for name in names:
        if not isinstance(current, Mapping):
            parts.append(name)
            continue
        if name in current:
            parts.append(name)
            current = current[name]
            continue
        wrapper = next(
            (key for key, value in current.items() if isinstance(value, Mapping) and name in value),
            None,
        )
        if wrapper is None:
            parts.append(name)
            current = None
            continue
        parts += [str(wrapper), name]
        current = current[wrapper][name]
    return ".".join(parts)


def parse_job_text(text: str, *, source: str = "") -> pb.SubmitRequest:
    """A submit from the text of a YAML or JSON job file (JSON is valid YAML, but a JSON
    document is parsed as JSON so that its errors read like JSON errors)."""
    stripped = text.lstrip()
    try:
        is_json = stripped.startswith(("{", "["))
        document = json.loads(text) if is_json else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as error:
        raise JobFileError("", f"not valid YAML or JSON: {error}", source=source) from None
    return submit_from_document(document, source=source)


def load_job_file(path: str | Path) -> pb.SubmitRequest:
    """Read a job file (``.yaml``, ``.yml`` or ``.json``) into a submit."""
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as error:
        raise JobFileError("", f"cannot read: {error.strerror}", source=str(file)) from None
    return parse_job_text(text, source=str(file))
