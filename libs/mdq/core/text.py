"""NUL characters in protobuf strings (pure).

Protobuf strings may hold U+0000; PostgreSQL text and JSONB may not (it refuses the whole
statement). Intake refuses a submit with one, naming the field (``first_nul``); the projection
scrubs one that reached the log another way (a pod's termination message, say) rather than stop
on it (``scrub_nul``).

Both walk the fields that are set (``ListFields``, in field number order) and look only at the
ones that can hold a string at some depth: string fields, maps with string keys or values, and
message fields (or map values) whose type can hold one. Which fields those are is worked out
once per field descriptor (``_walk``), not on every call.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

NUL = "\x00"
REPLACEMENT = "\ufffd"

_STRING = FieldDescriptor.TYPE_STRING
_MESSAGE = FieldDescriptor.TYPE_MESSAGE


class _Walk(NamedTuple):
    """How to look for strings in one field that can hold one."""

    kind: Literal["string", "message", "map"]
    name: str
    repeated: bool
    value_type: int
    """A map's values: their ``FieldDescriptor.TYPE_*`` (0 for other kinds)."""


_WALKS: dict[FieldDescriptor, _Walk | None] = {}
_HOLDS_STRINGS: dict[Descriptor, bool] = {}


def _holds_strings(message_type: Descriptor | None) -> bool:
    """Whether a message of this type can hold a string at some depth (cached)."""
    if message_type is None:  # not a message field
        return False
    holds = _HOLDS_STRINGS.get(message_type)
    if holds is None:
        holds = _HOLDS_STRINGS[message_type] = _reaches_a_string(message_type, set())
    return holds


def _reaches_a_string(message_type: Descriptor, seen: set[Descriptor]) -> bool:
    """Depth-first search of the message types reachable from ``message_type`` (map entries
    included) for a string field; ``seen`` keeps it from going round a recursive type."""
    if message_type.extension_ranges:  # extensions are not in ``fields``: assume a string
        return True
    seen.add(message_type)
    for field in message_type.fields:
        if field.type == _STRING:
            return True
        child = field.message_type
        if (
            field.type == _MESSAGE
            and child is not None
            and child not in seen
            and _reaches_a_string(child, seen)
        ):
            return True
    return False


def _walk(field: FieldDescriptor) -> _Walk | None:
    """How to look for strings in ``field``; None if it cannot hold one (cached)."""
    try:
        return _WALKS[field]
    except KeyError:
        pass
    walk: _Walk | None = None
    entry = field.message_type
    if entry is not None and entry.GetOptions().map_entry:
        key: FieldDescriptor = entry.fields_by_name["key"]
        value: FieldDescriptor = entry.fields_by_name["value"]
        if (
            key.type == _STRING
            or value.type == _STRING
            or (value.type == _MESSAGE and _holds_strings(value.message_type))
        ):
            walk = _Walk("map", field.name, True, value.type)
    elif field.type == _STRING:
        walk = _Walk("string", field.name, field.is_repeated, 0)
    elif field.type == _MESSAGE and _holds_strings(field.message_type):
        walk = _Walk("message", field.name, field.is_repeated, 0)
    _WALKS[field] = walk
    return walk


def first_nul(message: Message, path: str = "") -> str | None:
    """The path (``jobs[0].labels['k']``) of the first string holding a NUL, None if none."""
    found = _first_nul(message)
    return f"{path}.{found}" if found is not None and path else found


def _first_nul(message: Message) -> str | None:
    """``first_nul`` relative to ``message``; a path is only built for the NUL found."""
    for field, value in message.ListFields():
        walk = _walk(field)
        if walk is None:
            continue
        kind, name, repeated, value_type = walk
        if kind == "map":
            for key, item in value.items():
                if (isinstance(key, str) and NUL in key) or (value_type == _STRING and NUL in item):
                    return f"{name}[{key!r}]"
                if value_type == _MESSAGE and (found := _first_nul(item)):
                    return f"{name}[{key!r}].{found}"
        elif kind == "string":
            if repeated:
                for index, item in enumerate(value):
                    if NUL in item:
                        return f"{name}[{index}]"
            elif NUL in value:
                return name
        elif repeated:
            for index, item in enumerate(value):
                if found := _first_nul(item):
                    return f"{name}[{index}].{found}"
        elif found := _first_nul(value):
            return f"{name}.{found}"
    return None


def scrub_nul(message: Message) -> bool:
    """Replace every NUL in the message's strings (at any depth) with U+FFFD; True if any."""
    changed = False
    for field, value in message.ListFields():
        walk = _walk(field)
        if walk is None:
            continue
        if walk.kind == "map":
            for key in list(value):
                item = value[key]
                if walk.value_type == _MESSAGE:
                    changed |= scrub_nul(item)
                elif walk.value_type == _STRING and NUL in item:
                    value[key] = item.replace(NUL, REPLACEMENT)
                    changed = True
                if isinstance(key, str) and NUL in key:
                    moved = value[key]
                    del value[key]
                    if walk.value_type == _MESSAGE:
                        value[key.replace(NUL, REPLACEMENT)].CopyFrom(moved)
                    else:
                        value[key.replace(NUL, REPLACEMENT)] = moved
                    changed = True
        elif walk.kind == "string":
            if walk.repeated:
                for index, item in enumerate(value):
                    if NUL in item:
                        value[index] = item.replace(NUL, REPLACEMENT)
                        changed = True
            elif NUL in value:
                setattr(message, walk.name, value.replace(NUL, REPLACEMENT))
                changed = True
        elif walk.repeated:
            for item in value:
                changed |= scrub_nul(item)
        else:
            changed |= scrub_nul(value)
    return changed
