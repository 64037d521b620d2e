"""What a submit asks for, whatever its encoding: its fingerprint, and how two differ (pure).

Intake records a submit's content fingerprint with its idempotency key's claim, so that a
resubmit of the same content gets the first submit's job ids and other content under the key
is refused, with ``changes`` saying what differs field by field.

What the fingerprint covers and why: docs/intake.md, "What counts as the same content".
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from google.protobuf.message import Message

from mdq.contracts import pb
from mdq.core.documents import quoted
from mdq.core.spec import SpecError, normalize_job

MAX_CHANGES_SHOWN = 5
_VALUE_CHARS = 40


def content_fingerprint(jobs: Sequence[pb.JobSpec], submitted_by: str) -> bytes:
    """The fingerprint of a submit of ``jobs`` (normalized, in submitted order)."""
    content = pb.SubmitRequest(submitted_by=submitted_by)
    content.jobs.extend(jobs)
    return hashlib.sha256(content.SerializeToString(deterministic=True)).digest()


@dataclass(frozen=True, slots=True)
class Content:
    """A submit's jobs, each normalized where it can be; ``as_sent``: the indices of those
    that cannot (they are compared by the fields the client set)."""

    jobs: list[pb.JobSpec]
    submitted_by: str
    as_sent: frozenset[int]

    @property
    def fingerprint(self) -> bytes | None:
        """The content fingerprint; None if a job does not normalize (no accepted submit has
        that content)."""
        return None if self.as_sent else content_fingerprint(self.jobs, self.submitted_by)


def content_of(request: pb.SubmitRequest) -> Content:
    """The content of a submit that may not pass validation."""
    jobs: list[pb.JobSpec] = []
    as_sent: set[int] = set()
    for index, job in enumerate(request.jobs):
        try:
            jobs.append(normalize_job(job, f"jobs[{index}]"))
        except SpecError:
            jobs.append(job)
            as_sent.add(index)
    return Content(jobs=jobs, submitted_by=request.submitted_by, as_sent=frozenset(as_sent))


@dataclass(frozen=True, slots=True)
class Earlier:
    """What is known of the first submit under a key: its jobs' names (from its job ids) and,
    where its ``submitted`` event was found, each job's normalized spec and the submitter."""

    names: list[str]
    specs: list[pb.JobSpec | None]
    submitted_by: str | None


def changes(earlier: Earlier, later: Content) -> list[str]:
    """What differs from ``earlier`` to ``later``, one "path: before → after" per field (the
    first ``MAX_CHANGES_SHOWN``, then how many more); empty when no difference can be named."""
    found: list[str] = []
    if earlier.submitted_by is not None and earlier.submitted_by != later.submitted_by:
        found.append(f"submitted_by: {_value(earlier.submitted_by)} → {_value(later.submitted_by)}")
    if len(earlier.names) != len(later.jobs):
        found.append(f"jobs: {len(earlier.names)} → {len(later.jobs)} jobs")
    for index, (name, spec, job) in enumerate(
        zip(earlier.names, earlier.specs, later.jobs, strict=False)
    ):
        here = f"jobs[{index}]"
        if spec is None:  # only its name is known
            if name != job.name:
                found.append(f"{here}.name: {_value(name)} → {_value(job.name)}")
            continue
        found += _message_changes(spec, job, here, only_set=index in later.as_sent)
    if len(found) > MAX_CHANGES_SHOWN:
        more = len(found) - MAX_CHANGES_SHOWN
        found = [*found[:MAX_CHANGES_SHOWN], f"and {more} more"]
    return found


def _message_changes(before: Message, after: Message, path: str, *, only_set: bool) -> list[str]:
    """The fields that differ; with ``only_set``, only those set in ``after`` (a job as sent,
    whose unset fields mean "the default", not "zero")."""
    present = {field.name for field, _ in after.ListFields()} if only_set else None
    found: list[str] = []
    for field in after.DESCRIPTOR.fields:
        name = field.name
        if present is not None and name not in present:
            continue
        here = f"{path}.{name}"
        old, new = getattr(before, name), getattr(after, name)
        message_type = field.message_type
        if message_type is not None and message_type.GetOptions().map_entry:
            for key in sorted(set(old) | set(new)):
                if old.get(key) != new.get(key):
                    found.append(f"{here}[{quoted(key)}]: {_entry(old, key)} → {_entry(new, key)}")
        elif field.is_repeated:
            if list(old) != list(new):
                found.append(f"{here}: {_list(old)} → {_list(new)}")
        elif message_type is not None:
            had, has = before.HasField(name), after.HasField(name)
            if had and has:
                found += _message_changes(old, new, here, only_set=only_set)
            elif had != has:
                found.append(
                    f"{here}: {'set' if had else '(unset)'} → {'set' if has else '(unset)'}"
                )
        elif not _same(old, new):
            found.append(f"{here}: {_scalar(field, old)} → {_scalar(field, new)}")
    return found


def _same(old: object, new: object) -> bool:
    if isinstance(old, float) and isinstance(new, float) and math.isnan(old) and math.isnan(new):
        return True
    return old == new


def _scalar(field: Any, value: object) -> str:
    """A scalar field's value; an enum's by its name (``field``: its FieldDescriptor)."""
    enum_type = field.enum_type
    if enum_type is not None and isinstance(value, int):
        named = enum_type.values_by_number.get(value)
        return named.name if named is not None else str(value)
    return _value(value)


def _value(value: object) -> str:
    """A field's value as JSON would write it, cut short."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, str):
        return quoted(value, _VALUE_CHARS)
    text = json.dumps(value) if isinstance(value, bool | int | float) else str(value)
    return text[:_VALUE_CHARS]


def _entry(values: Any, key: str) -> str:
    """A map's value at ``key`` (a protobuf map: it has ``get``)."""
    found = values.get(key)
    return "(none)" if found is None else _value(found)


def _list(values: Collection[object]) -> str:
    text = "[" + ", ".join(_value(value) for value in values) + "]"
    return text if len(text) <= 2 * _VALUE_CHARS else text[: 2 * _VALUE_CHARS - 2] + "…]"
