"""Job files: YAML or JSON documents that become a ``pb.SubmitRequest``.

The file format is the protobuf JSON mapping of ``SubmitRequest``, written as YAML or JSON, so a
job file, ``nats pub <ns>.submit '{...}'`` and a Go client speak the same language. A bare job
object is a one-job submit; every problem is a ``JobFileError`` naming the field, read the same
as intake reads it (``mdq.core.documents``).

The format and its checks: docs/jobspec.md, "How a submit or a job file is read".
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import yaml
from google.protobuf.descriptor import Descriptor
from google.protobuf.message import Message

from mdq.contracts import pb
from mdq.core.documents import (
    MAX_DEPTH,
    Duplicated,
    duplicate_error,
    field_names,
    load_json,
    near_field,
    nesting_error,
    parse_document,
    unknown_field_reason,
)
from mdq.core.spec import SpecError

_SUBMIT = cast(Descriptor, pb.SubmitRequest.DESCRIPTOR)
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


@dataclass(frozen=True, slots=True)
class Unknown:
    """A key that its message does not define."""

    path: str
    reason: str
    """``mdq.core.documents.unknown_field_reason``: the name it looks like, or the names."""
    near: str | None
    """The field it looks like a misspelling of."""


def unknown_fields(
    document: Mapping[str, Any], descriptor: Descriptor, path: str = ""
) -> list[Unknown]:
    """Every key in ``document`` that ``descriptor`` does not define (recursively)."""
    found: list[Unknown] = []
    known = field_names(descriptor)
    for key, value in document.items():
        where = f"{path}.{key}" if path else str(key)
        field = known.get(str(key))
        if field is None:
            reason = unknown_field_reason(key, descriptor)
            found.append(Unknown(where, reason, near_field(key, descriptor)))
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


class _Loader(yaml.SafeLoader):
    """YAML's safe loader, but a mapping that holds a key twice loads as a ``Duplicated``
    marker, as a JSON object does (``mdq.core.documents.load_json``): PyYAML keeps the last
    one without a word. Keys merged in with ``<<`` may be overridden, as YAML means them to."""


def _mapping(loader: _Loader, node: yaml.MappingNode) -> object:
    seen: set[object] = set()
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node, deep=True)
        if isinstance(key, Hashable):
            if key in seen:
                return Duplicated(key, loader.construct_mapping(node, deep=True))
            seen.add(key)
    return loader.construct_mapping(node, deep=True)


_Loader.add_constructor("tag:yaml.org,2002:map", _mapping)


def submit_from_document(document: object, *, source: str = "") -> pb.SubmitRequest:
    """A submit from a parsed YAML/JSON document (a submit, or one bare job). An object
    that holds a key twice is a ``Duplicated`` marker (``_Loader``, ``load_json``)."""
    mapping = document.mapping if isinstance(document, Duplicated) else document
    if not isinstance(mapping, Mapping):
        raise JobFileError(
            "", "a job file is a mapping: a submit with a 'jobs' list, or one job", source=source
        )
    if not _SUBMIT_KEYS.intersection(mapping):
        document = {"jobs": [document if isinstance(document, Duplicated) else dict(mapping)]}
    if (too_deep := nesting_error(document, descriptor=_SUBMIT)) is not None:
        raise JobFileError(too_deep.field, too_deep.message, source=source)
    if (twice := duplicate_error(document, _SUBMIT)) is not None:
        raise JobFileError(twice.field, twice.message, source=source)
    assert isinstance(document, Mapping)  # a root Duplicated is an error above
    unknown = unknown_fields(document, _SUBMIT)
    if unknown:
        if len(unknown) == 1:
            what = unknown[0].reason
        else:
            what = "unknown fields: " + ", ".join(
                f"{each.path} (did you mean {each.near!r}?)" if each.near else each.path
                for each in unknown
            )
        raise JobFileError(
            unknown[0].path,
            f"{what} (a job file is the protobuf JSON mapping of mdq.v1.SubmitRequest, see "
            "docs/jobspec.md)",
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
        parse_document(document, message, prefix=prefix, respelled=False)  # checked before
    except SpecError as error:
        raise JobFileError(error.field, error.message, source=source) from None


def parse_job_text(text: str, *, source: str = "") -> pb.SubmitRequest:
    """A submit from the text of a YAML or JSON job file (JSON is valid YAML, but a JSON
    document is parsed as JSON so that its errors read like JSON errors)."""
    stripped = text.lstrip()
    try:
        is_json = stripped.startswith(("{", "["))
        if is_json:
            document = load_json(text, descriptor=_SUBMIT)
        else:  # a SafeLoader: builds plain values only
            document = yaml.load(text, Loader=_Loader)
    except SpecError as error:  # JSON malformed, not UTF-8 or nested too deep
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
