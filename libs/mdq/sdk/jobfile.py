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
fields (all of them, each with its path), wrong types, nesting too deep, malformed YAML — is a
``JobFileError`` (a ``SpecError``) that names the field, so the CLI can print it like a refusal
from intake. Types and nesting are checked by ``mdq.core.documents``, which intake uses too, so
a wrong type reads the same from both (``jobs[1].depends_on[0]: must be a string, got 42``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import yaml
from google.protobuf.descriptor import Descriptor
from google.protobuf.message import Message

from mdq.contracts import pb
from mdq.core.documents import MAX_DEPTH, field_names, load_json, nesting_error, parse_document
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


def unknown_fields(
    document: Mapping[str, Any], descriptor: Descriptor, path: str = ""
) -> list[str]:
    """Paths of every key in ``document`` that ``descriptor`` does not define (recursively)."""
    found: list[str] = []
    known = field_names(descriptor)
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
    if (too_deep := nesting_error(document)) is not None:
        raise JobFileError(too_deep.field, too_deep.message, source=source)
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


def _parse_into(document: Mapping[str, Any], message: Message, *, prefix: str, source: str) -> None:
    """Parse one message; a problem becomes a JobFileError naming the field, as intake would."""
    try:
        parse_document(document, message, prefix=prefix)
    except SpecError as error:
        raise JobFileError(error.field, error.message, source=source) from None


def parse_job_text(text: str, *, source: str = "") -> pb.SubmitRequest:
    """A submit from the text of a YAML or JSON job file (JSON is valid YAML, but a JSON
    document is parsed as JSON so that its errors read like JSON errors)."""
    stripped = text.lstrip()
    try:
        is_json = stripped.startswith(("{", "["))
        document = load_json(text) if is_json else yaml.safe_load(text)
    except SpecError as error:  # JSON nested too deep
        raise JobFileError(error.field, error.message, source=source) from None
    except RecursionError:  # YAML nested too deep for PyYAML's composer
        raise JobFileError(
            "",
            f"nested more than {MAX_DEPTH} levels deep (a submit needs six at most)",
            source=source,
        ) from None
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
