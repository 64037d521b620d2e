"""NUL characters in protobuf strings (pure).

Protobuf strings may hold U+0000; PostgreSQL text and JSONB may not (it refuses the whole
statement). Intake refuses a submit with one, naming the field (``first_nul``); the projection
scrubs one that reached the log another way (a pod's termination message, say) rather than stop
on it (``scrub_nul``).
"""

from __future__ import annotations

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

NUL = "\x00"
REPLACEMENT = "\ufffd"


def _is_map(field: FieldDescriptor) -> bool:
    return field.message_type is not None and field.message_type.GetOptions().map_entry


def _map_value(field: FieldDescriptor) -> FieldDescriptor:
    """The value field of a map field's entry type."""
    entry = field.message_type
    assert entry is not None
    value: FieldDescriptor = entry.fields_by_name["value"]
    return value


def first_nul(message: Message, path: str = "") -> str | None:
    """The path (``jobs[0].labels['k']``) of the first string holding a NUL, None if none."""
    for field, value in message.ListFields():
        name = f"{path}.{field.name}" if path else field.name
        if _is_map(field):
            value_field = _map_value(field)
            for key, item in value.items():
                at = f"{name}[{key!r}]"
                if isinstance(key, str) and NUL in key:
                    return at
                if value_field.type == FieldDescriptor.TYPE_STRING and NUL in item:
                    return at
                if value_field.type == FieldDescriptor.TYPE_MESSAGE and (
                    found := first_nul(item, at)
                ):
                    return found
        elif field.type == FieldDescriptor.TYPE_STRING:
            if field.is_repeated:
                for index, item in enumerate(value):
                    if NUL in item:
                        return f"{name}[{index}]"
            elif NUL in value:
                return name
        elif field.type == FieldDescriptor.TYPE_MESSAGE:
            if field.is_repeated:
                for index, item in enumerate(value):
                    if found := first_nul(item, f"{name}[{index}]"):
                        return found
            elif found := first_nul(value, name):
                return found
    return None


def scrub_nul(message: Message) -> bool:
    """Replace every NUL in the message's strings (at any depth) with U+FFFD; True if any."""
    changed = False
    for field, value in message.ListFields():
        if _is_map(field):
            value_field = _map_value(field)
            for key in list(value):
                item = value[key]
                if value_field.type == FieldDescriptor.TYPE_MESSAGE:
                    changed |= scrub_nul(item)
                elif value_field.type == FieldDescriptor.TYPE_STRING and NUL in item:
                    value[key] = item.replace(NUL, REPLACEMENT)
                    changed = True
                if isinstance(key, str) and NUL in key:
                    moved = value[key]
                    del value[key]
                    if value_field.type == FieldDescriptor.TYPE_MESSAGE:
                        value[key.replace(NUL, REPLACEMENT)].CopyFrom(moved)
                    else:
                        value[key.replace(NUL, REPLACEMENT)] = moved
                    changed = True
        elif field.type == FieldDescriptor.TYPE_STRING:
            if field.is_repeated:
                for index, item in enumerate(value):
                    if NUL in item:
                        value[index] = item.replace(NUL, REPLACEMENT)
                        changed = True
            elif NUL in value:
                setattr(message, field.name, value.replace(NUL, REPLACEMENT))
                changed = True
        elif field.type == FieldDescriptor.TYPE_MESSAGE:
            if field.is_repeated:
                for item in value:
                    changed |= scrub_nul(item)
            else:
                changed |= scrub_nul(value)
    return changed
