"""Client documents into protobuf messages, every problem named by its field path (pure).

A submit (the protobuf JSON mapping of ``mdq.v1.SubmitRequest``) and a job file (the same
mapping as YAML) are parsed here, for intake and for the CLI alike, so both name a problem the
same way (``jobs[1].depends_on[0]``): nesting, types, text, values and unknown protobuf fields,
as docs/jobspec.md ("How a submit or a job file is read") says.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from json.decoder import scanstring  # type: ignore[attr-defined]  # C accelerated, untyped
from typing import Any, cast

from google.protobuf import json_format, message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from google.protobuf.unknown_fields import UnknownFieldSet

from mdq.core.spec import RANGES, SpecError, enum_choices

MAX_DEPTH = 32
"""Lists and objects nested in each other, at most (a submit needs six:
``{"jobs": [{"system": {"structure": {"force_fields": [...]}}}]}``)."""
MAX_REASON_CHARS = 300
"""Error messages are cut to this length (a value is quoted in some of them)."""

_PARSE_CHAIN = re.compile(r"Failed to parse (\w+) field")
_PARSE_CHAIN_PREFIX = re.compile(r"(Failed to parse \w+ field: )+")
_AT_PATH = re.compile(r' at "?[A-Za-z]\w*\.?([\w.\[\]]*?)"?\.*$')
_AVAILABLE = re.compile(r"\s*Available Fields.*$", re.DOTALL)
_STRUCTURE = re.compile(r'[{}\[\],:"]')


def printable(text: str, limit: int = MAX_REASON_CHARS) -> str:
    """``text`` cut to ``limit`` characters, with lone surrogates written as escapes."""
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


_NAME_CHARS = 64


def quoted(key: object, limit: int = _NAME_CHARS) -> str:
    """``key`` as the path shows it inside brackets: a Python literal, cut to ``limit``
    characters (``repr`` escapes what cannot be printed)."""
    if isinstance(key, str) and len(key) > limit:
        key = key[: limit - 1] + "…"
    return repr(key)


def join(path: str, key: object) -> str:
    """The path of ``key`` inside ``path``: ``.name`` for a field name, ``[3]`` for a list
    index, ``['some key']`` for any other key (a key that is no name)."""
    if isinstance(key, int) and not isinstance(key, bool):
        return f"{path}[{key}]"
    if isinstance(key, str) and key.isidentifier() and len(key) <= _NAME_CHARS:
        return f"{path}.{key}" if path else key
    return f"{path}[{quoted(key)}]"


@cache
def field_names(descriptor: Descriptor) -> Mapping[str, FieldDescriptor]:
    """Both spellings the JSON mapping accepts: proto names and lowerCamelCase json names
    (one mapping per message type, kept)."""
    names: dict[str, FieldDescriptor] = {}
    for field in descriptor.fields:
        names[field.name] = field
        names[field.json_name] = field
    return names


# -- nesting -----------------------------------------------------------------------------------


def _too_deep(message: str) -> str:
    return f"{message} more than {MAX_DEPTH} levels deep (a submit needs six at most)"


def _deeper_than_allowed(document: object) -> bool:
    """Whether lists and objects nest more than ``MAX_DEPTH`` deep in ``document``: one level
    at a time, without recursion (a few microseconds for a submit)."""
    if not isinstance(document, dict | list):
        return False
    level: list[dict[Any, object] | list[object]] = [document]
    for _ in range(MAX_DEPTH):
        below: list[dict[Any, object] | list[object]] = []
        for value in level:
            items = value.values() if isinstance(value, dict) else value
            below += [item for item in items if isinstance(item, dict | list)]
        if not below:
            return False
        level = below
    return True


def nesting_error(
    document: object, prefix: str = "", descriptor: Descriptor | None = None
) -> SpecError | None:
    """The error for the first list or object (in document order) nested more than
    ``MAX_DEPTH`` deep in ``document`` (lists and dicts, as JSON and YAML load), None if there
    is none. Walks without recursion, and builds a path only for the culprit (a reference
    cycle, which a YAML alias can make, is too deep as well), naming fields as
    ``descriptor``'s message does (``keyed_path``)."""
    if not _deeper_than_allowed(document):
        return None
    # depth first, for the first culprit in document order:
    # (container, depth, parent entry, key in the parent)
    Entry = tuple[object, int, Any, object]
    stack: list[Entry] = [(document, 1, None, None)]
    while stack:
        entry = stack.pop()
        value, depth = entry[0], entry[1]
        children: Iterator[tuple[object, object]]
        if isinstance(value, dict):
            children = iter(value.items())
        elif isinstance(value, list):
            children = enumerate(value)
        else:
            continue
        if depth > MAX_DEPTH:
            keys: list[object] = []
            while entry[2] is not None:
                keys.append(entry[3])
                entry = entry[2]
            path = keyed_path(keys[::-1], descriptor, prefix)
            return SpecError(path, _too_deep("lists and objects are nested"))
        nested = [
            (child, depth + 1, entry, key)
            for key, child in children
            if isinstance(child, dict | list)
        ]
        stack.extend(reversed(nested))  # the first child is looked at first
    return None


# each open container while a JSON text is scanned: [is an object, its current key or index
# (None before an object's first key), a key comes next]
_Open = list[Any]


def _scan(text: str) -> Iterator[tuple[int, int, str, list[_Open]]]:
    """The structure of a JSON text, without recursion: for each bracket, brace, comma, colon
    and string, (where it starts, where it ends, its first character, the containers open
    after it). Stops at a string that does not end; does not check the grammar (a text that
    ``json.loads`` refused is scanned too, to say where it went wrong)."""
    stack: list[_Open] = []
    position = 0
    while match := _STRUCTURE.search(text, position):
        char, start, position = match.group(), match.start(), match.end()
        top = stack[-1] if stack else None
        if char == '"':
            try:
                string, position = scanstring(text, position)
            except ValueError:
                return
            if top is not None and top[0] and top[2]:
                top[1], top[2] = string, False
        elif char in "{[":
            stack.append([char == "{", None if char == "{" else 0, True])
        elif char in "}]":
            if stack:
                stack.pop()
        elif char == "," and top is not None:
            if top[0]:
                top[2] = True
            else:
                top[1] += 1
        yield start, position, char, stack


def _stack_path(stack: list[_Open], prefix: str, descriptor: Descriptor | None = None) -> str:
    return keyed_path([key for _, key, _ in stack if key is not None], descriptor, prefix)


def keyed_path(keys: list[object], descriptor: Descriptor | None, prefix: str = "") -> str:
    """The path of a value reached by ``keys`` (object keys and list indices) from a
    ``descriptor`` message, as the other errors name it: proto names of fields, a map's keys
    in brackets (``jobs[0].labels['x']``); keys outside the message as they are."""
    path, message, map_values = prefix, descriptor, False
    for key in keys:
        if map_values:  # a key of a map: its value is a string, or a message of ours
            path, map_values = f"{path}[{quoted(key)}]", False
            continue
        if isinstance(key, int):  # an index: the elements are of the repeated field's type
            path = f"{path}[{key}]"
            continue
        field = field_names(message).get(str(key)) if message is not None else None
        if field is None:
            path, message = join(path, key), None
            continue
        path, entry = join(path, field.name), field.message_type
        if entry is not None and entry.GetOptions().map_entry:
            message, map_values = entry.fields_by_name["value"].message_type, True
        else:
            message = entry if _is_plain_message(field) else None
    return path


def nesting_error_in_json(
    text: str, prefix: str = "", descriptor: Descriptor | None = None
) -> SpecError:
    """The error for a JSON text too deep to load: the path of its first list or object
    nested more than ``MAX_DEPTH`` deep, found by scanning the text (no recursion); the
    whole document (``prefix``) when the text breaks off before that."""
    for _, _, char, stack in _scan(text):
        if char in "{[" and len(stack) > MAX_DEPTH:
            return SpecError(
                _stack_path(stack[:-1], prefix, descriptor),
                _too_deep("lists and objects are nested"),
            )
    return SpecError(prefix, _too_deep("the document is nested"))


def path_at(
    text: str, position: int, prefix: str = "", descriptor: Descriptor | None = None
) -> str:
    """The path of the value of a JSON text that holds character ``position`` (or, for a
    position between values, of the value before it): where a syntax error or a bad byte
    is. Fields are named as in ``descriptor``'s message (``keyed_path``)."""
    path = prefix
    for start, end, _, stack in _scan(text):
        if start >= position:
            break
        path = _stack_path(stack, prefix, descriptor)
        if end > position:  # inside this string
            break
    return path


class Duplicated:
    """What an object that holds a key twice loads as (``load_json``, and job files' YAML):
    no mapping, so the protobuf parser refuses it wherever it is, and ``duplicate_error``
    names it."""

    __slots__ = ("key", "mapping")

    def __init__(self, key: object, mapping: Mapping[Any, object]) -> None:
        self.key = key
        """The first key given a second time."""
        self.mapping = mapping
        """The object as it would have loaded (the last of each key)."""

    def __repr__(self) -> str:  # ParseDict may quote the value it refuses
        return f"<an object with {quoted(self.key)} twice>"


def _object(pairs: list[tuple[str, object]]) -> dict[str, object] | Duplicated:
    """``json.loads``' ``object_pairs_hook``: the object, or a ``Duplicated`` marker."""
    loaded = dict(pairs)
    if len(loaded) == len(pairs):
        return loaded
    seen: set[str] = set()
    for key, _ in pairs:  # the first key given again
        if key in seen:
            return Duplicated(key, loaded)
        seen.add(key)
    raise AssertionError("unreachable: fewer keys than pairs means a key was repeated")


_BOM = "\ufeff"


def load_json(data: bytes | str, prefix: str = "", descriptor: Descriptor | None = None) -> object:
    """A JSON text as Python values, or a ``SpecError`` that says where it went wrong: a
    byte that is not UTF-8 (its offset, and the path it falls in), a syntax error (its line,
    column and path), nesting too deep for ``json.loads`` (which gives up with
    ``RecursionError``). An object holding a key twice loads as ``Duplicated``; a document it
    loads may still be too deep for a message: ``parse_document`` checks both. Paths name
    fields as ``descriptor``'s message does, when the text is meant to be one."""
    if isinstance(data, bytes):
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as error:
            raise _not_utf8(data, error, prefix, descriptor) from None
    else:
        text = data
    if text.startswith(_BOM):
        text = text[1:]
    try:
        return json.loads(text, object_pairs_hook=_object)
    except RecursionError:
        raise nesting_error_in_json(text, prefix, descriptor) from None
    except json.JSONDecodeError as error:
        where = f"line {error.lineno}, column {error.colno}"
        reason = _JSON_ERRORS.get(error.msg, error.msg[:1].lower() + error.msg[1:])
        raise SpecError(
            path_at(text, error.pos, prefix, descriptor),
            printable(f"malformed JSON at {where}: {reason}"),
        ) from None


_JSON_ERRORS = {
    "Expecting value": "a value is missing, or is not JSON (strings need double quotes)",
    "Extra data": "more text after the end of the JSON document",
    "Expecting property name enclosed in double quotes": (
        "expecting a key in double quotes (no trailing commas, no comments)"
    ),
}
"""Python's wording of the JSON errors that need more words for a person; the others
("Expecting ',' delimiter", "Unterminated string starting at") are said as they are."""


def _not_utf8(
    data: bytes, error: UnicodeDecodeError, prefix: str, descriptor: Descriptor | None
) -> SpecError:
    """Where a text that is not UTF-8 goes wrong: the offset of its first bad byte, and the
    path of the value it is in (the text up to there is UTF-8)."""
    bad = data[error.start : error.start + 1]
    before = data[: error.start].decode("utf-8")
    line = before.count("\n") + 1
    column = len(before) - (before.rfind("\n") + 1) + 1
    text = data.decode("utf-8", "replace")  # a bad byte in a key shows as U+FFFD
    return SpecError(
        path_at(text, len(before), prefix, descriptor),
        f"is not UTF-8 text: byte 0x{bad.hex()} at offset {error.start} (line {line}, "
        f"column {column}); JSON is UTF-8",
    )


def duplicate_error(
    document: object, descriptor: Descriptor | None, prefix: str = ""
) -> SpecError | None:
    """The error for the first object of ``document`` (in document order) that holds a key
    twice (a ``Duplicated``), or that gives one field of ``descriptor``'s message under both
    of its spellings (``temperature_k`` and ``temperatureK``); None if there is none. Paths
    use the proto names of the fields, as the other errors do."""
    found = _duplicate_in(document, descriptor)
    if found is None:
        return None
    keys, reason = found
    return SpecError(keyed_path(keys[::-1], descriptor, prefix), reason)


_WHICH = "(which one is meant?): give it once"
_TWICE = f"given twice in one object {_WHICH}"


@dataclass(frozen=True, slots=True)
class _Child:
    """What the value under one key of a message is: a message of ours (``message``), a map
    (``message`` is then the type of its values, None for strings), or anything else."""

    name: str
    message: Descriptor | None
    is_map: bool
    aliased: bool
    """Whether the field has a second spelling (``temperatureK`` for ``temperature_k``)."""


@cache
def _children(descriptor: Descriptor) -> dict[str, _Child]:
    children: dict[str, _Child] = {}
    for key, field in field_names(descriptor).items():
        entry = field.message_type
        is_map = entry is not None and entry.GetOptions().map_entry
        if is_map and entry is not None:
            message = entry.fields_by_name["value"].message_type
        else:
            message = entry if _is_plain_message(field) else None
        aliased = field.json_name != field.name
        children[key] = _Child(field.name, message, is_map, aliased)
    return children


_Found = tuple[list[object], str]
"""The keys down to a problem, innermost first, and what it is."""


def _duplicate_in(value: object, descriptor: Descriptor | None) -> _Found | None:
    """Depth first, in document order; a path is built only for the culprit."""
    if isinstance(value, Duplicated):
        return [value.key], _TWICE
    if isinstance(value, list):
        for index, item in enumerate(value):
            if isinstance(item, _CONTAINERS) and (found := _duplicate_in(item, descriptor)):
                found[0].append(index)
                return found
        return None
    if not isinstance(value, dict):
        return None
    children = _children(descriptor) if descriptor is not None else {}
    spelled: dict[str, str] | None = None
    for key, item in value.items():
        child = children.get(key)
        if child is not None and child.aliased:
            spelled = {} if spelled is None else spelled
            if (other := spelled.setdefault(child.name, key)) != key:
                return [key], f"given twice, as {quoted(other)} and {quoted(key)} {_WHICH}"
        if not isinstance(item, _CONTAINERS):
            continue
        if child is not None and child.is_map:
            found = _duplicate_in_map(item, child.message)
        else:
            found = _duplicate_in(item, child.message if child is not None else None)
        if found is not None:
            found[0].append(key)
            return found
    return None


def _duplicate_in_map(value: object, value_type: Descriptor | None) -> _Found | None:
    """In the object of a map field: its keys are the client's own."""
    if not isinstance(value, dict):
        return _duplicate_in(value, None)
    for key, item in value.items():
        if isinstance(item, _CONTAINERS) and (found := _duplicate_in(item, value_type)):
            found[0].append(key)
            return found
    return None


_CONTAINERS = (dict, list, Duplicated)


# -- protobuf ----------------------------------------------------------------------------------

_WIRE_TYPES = {
    0: "varint",
    1: "64-bit",
    2: "length-delimited",
    3: "group",
    4: "group end",
    5: "32-bit",
}


def drop_unknown_fields(message: Message) -> bool:
    """Drop the fields of a parsed protobuf ``message`` (and of the messages in it) that
    their types do not define; whether there were any. Protobuf keeps them without a word,
    so a client built from a newer ``mdq.proto`` would lose what it asked for: a caller
    refuses such a message, naming the field with ``unknown_field_error`` on a fresh parse
    (this runs at C speed; that one walks every message in Python)."""
    size = message.ByteSize()
    message.DiscardUnknownFields()
    return message.ByteSize() != size


def unknown_field_error(message: Message, prefix: str = "") -> SpecError | None:
    """The error for the first field of a parsed protobuf ``message`` (or of a message in it)
    that its type does not define, None if there is none. The path names the message and the
    field's number (``jobs[0].resources.#99``); a known number on the wire in another form
    than its type's (or a map entry that cannot be read) names the field itself."""
    return _unknown_in(message, prefix)


def _unknown_in(message: Message, path: str) -> SpecError | None:
    descriptor = _descriptor(message)
    unknowns = UnknownFieldSet(message)
    if len(unknowns):
        unknown = unknowns[0]
        number, wire = unknown.field_number, _WIRE_TYPES.get(unknown.wire_type, "unknown")
        known = descriptor.fields_by_number.get(number)
        if known is not None:
            return SpecError(
                join(path, known.name),
                f"field {number} ({known.name}) of {descriptor.full_name} came as {wire} data, "
                "which is not its type (or a map entry that cannot be read)",
            )
        return SpecError(
            f"{path}.#{number}" if path else f"#{number}",
            f"unknown field number {number} ({wire}) of {descriptor.full_name}: this mdq does "
            "not know it (was the client built from a newer mdq.proto?)",
        )
    for field, value in message.ListFields():
        if field.message_type is None:
            continue
        here = join(path, field.name)
        if field.message_type.GetOptions().map_entry:
            if field.message_type.fields_by_name["value"].message_type is not None:
                items = [(f"{here}[{quoted(key)}]", item) for key, item in value.items()]
            else:
                continue
        elif field.is_repeated:
            items = [(f"{here}[{index}]", item) for index, item in enumerate(value)]
        else:
            items = [(here, value)]
        for where, item in items:
            if (found := _unknown_in(item, where)) is not None:
                return found
    return None


# -- types -------------------------------------------------------------------------------------


def parse_document(
    document: Mapping[str, Any],
    message: Message,
    *,
    prefix: str = "",
    nested: bool = True,
    respelled: bool = True,
) -> None:
    """``json_format.ParseDict`` of ``document`` into ``message`` (unknown fields refused); a
    ``SpecError`` naming the exact path of the first problem (``prefix`` before it).
    ``nested=False`` skips the nesting check of a document known to be shallow (a JSON text
    with at most ``MAX_DEPTH`` brackets, say); ``respelled=False`` skips looking for a field
    given under both its spellings, which ParseDict takes silently (the last wins), in a
    document known to hold none of ``camel_case_names`` (a JSON text without them, say)."""
    descriptor = _descriptor(message)
    if nested and (too_deep := nesting_error(document, prefix, descriptor)) is not None:
        raise too_deep
    if respelled and (twice := duplicate_error(document, descriptor, prefix)) is not None:
        raise twice
    try:
        json_format.ParseDict(_dict(document), message, ignore_unknown_fields=False)
    except Exception as error:  # ParseError; upb's SystemError on a key it cannot encode
        if (twice := duplicate_error(document, descriptor, prefix)) is not None:
            raise twice from None
        reason = _reason(error)
        found = _locate(document, descriptor, prefix)
        if found is None:  # only a combination of fields fails (two members of a oneof, say)
            raise SpecError(_path_in(str(error), prefix), reason) from None
        raise SpecError(*found) from None


@cache
def camel_case_names(descriptor: Descriptor) -> frozenset[str]:
    """The lowerCamelCase spellings (``temperatureK``) of the fields of ``descriptor``'s
    message and of every message in it, where they differ from the proto names: a document
    without any of them cannot give a field twice under two spellings."""
    names: set[str] = set()
    seen: set[str] = set()
    todo = [descriptor]
    while todo:
        message = todo.pop()
        if message.full_name in seen:
            continue
        seen.add(message.full_name)
        for key, child in _children(message).items():
            if child.aliased and key != child.name:
                names.add(key)
            if child.message is not None:
                todo.append(child.message)
    return frozenset(names)


def _dict(document: Mapping[str, Any]) -> dict[str, Any]:
    return document if isinstance(document, dict) else dict(document)


def _descriptor(message: Message) -> Descriptor:
    return cast(Descriptor, message.DESCRIPTOR)


def _reason(error: Exception) -> str:
    """The message of a ParseDict error without the chain of field names and the path (the
    field path says where)."""
    text = str(error) or type(error).__name__
    text = _AVAILABLE.sub("", _PARSE_CHAIN_PREFIX.sub("", text.strip()))
    lines = text.splitlines()
    text = _AT_PATH.sub("", lines[0] if lines else "").rstrip(".")
    return printable(text)


def _path_in(text: str, prefix: str) -> str:
    """The path a ParseDict error names itself (``at SubmitRequest.jobs[0].system``), or the
    chain of fields it went through."""
    first_line = text.splitlines()[0] if text else ""
    at = _AT_PATH.search(first_line)
    path = at.group(1).strip(".") if at else ".".join(_PARSE_CHAIN.findall(text))
    return printable(".".join(part for part in (prefix, path) if part))


def _refused(descriptor: Descriptor, document: Mapping[str, Any]) -> str | None:
    """Why ParseDict refuses ``document`` as a ``descriptor`` message, None if it does not."""
    try:
        json_format.ParseDict(
            _dict(document),
            message_factory.GetMessageClass(descriptor)(),
            ignore_unknown_fields=False,
        )
    except Exception as error:
        return _reason(error)
    return None


def _is_plain_message(field: FieldDescriptor) -> bool:
    """A message field of ours (a well-known type such as Timestamp has its own JSON form)."""
    message_type = field.message_type
    return (
        message_type is not None
        and not message_type.GetOptions().map_entry
        and not message_type.full_name.startswith("google.protobuf.")
    )


def _locate(
    document: Mapping[str, Any], descriptor: Descriptor, path: str
) -> tuple[str, str] | None:
    """(path, reason) of the first part of ``document`` that ParseDict refuses, in document
    order (the order ParseDict reads it in); None when every key parses on its own."""
    known = field_names(descriptor)
    for key, value in document.items():
        reason = _refused(descriptor, {key: value})
        if reason is None:
            continue
        field = known.get(key) if isinstance(key, str) else None
        if field is None:
            return join(path, key), unknown_field_reason(key, descriptor)
        here = join(path, field.name)
        if (wrong := _expected(field, value, whole=True)) is not None:
            return here, wrong
        message_type = field.message_type
        if message_type is not None and message_type.GetOptions().map_entry:
            if isinstance(value, Mapping):
                value_field = message_type.fields_by_name["value"]
                for map_key, item in value.items():
                    if (why := _refused(descriptor, {key: {map_key: item}})) is not None:
                        if _has_lone_surrogate(map_key):
                            why = _LONE_SURROGATE
                        else:
                            why = _explain(value_field, item, why)
                        return f"{here}[{quoted(map_key)}]", why
        elif field.is_repeated:
            if isinstance(value, list):
                for index, item in enumerate(value):
                    if (why := _refused(descriptor, {key: [item]})) is not None:
                        element = f"{here}[{index}]"
                        plain = message_type is not None and _is_plain_message(field)
                        if plain and message_type is not None and isinstance(item, Mapping):
                            return _locate(item, message_type, element) or (element, why)
                        return element, _explain(field, item, why)
        elif message_type is not None and _is_plain_message(field) and isinstance(value, Mapping):
            return _locate(value, message_type, here) or (here, reason)
        return here, _explain(field, value, reason)
    return _oneof_conflict(document, descriptor, path)


def near_field(key: object, descriptor: Descriptor) -> str | None:
    """The proto name of the field of ``descriptor`` that an unknown ``key`` looks like a
    misspelling of (either spelling), None if none is close."""
    names = field_names(descriptor)
    near = difflib.get_close_matches(str(key), list(names), n=1, cutoff=0.75)
    return names[near[0]].name if near else None


def unknown_field_reason(key: object, descriptor: Descriptor) -> str:
    """An unknown field: the known name it looks like, else the names there are."""
    if (near := near_field(key, descriptor)) is not None:
        return f"unknown field {quoted(key)}: did you mean {near!r}?"
    names = ", ".join(field.name for field in descriptor.fields)
    return f"unknown field {quoted(key)} (the fields here: {names})"


def _oneof_conflict(
    document: Mapping[str, Any], descriptor: Descriptor, path: str
) -> tuple[str, str] | None:
    """(path, reason) when ``document`` sets two members of one oneof (a system that is
    both a water box and a Lennard-Jones fluid), which ParseDict refuses only together."""
    known = field_names(descriptor)
    chosen: dict[str, str] = {}
    for key, value in document.items():
        field = known.get(key) if isinstance(key, str) else None
        if field is None or value is None or field.containing_oneof is None:
            continue
        oneof = field.containing_oneof
        if oneof.name in chosen:
            members = ", ".join(member.name for member in oneof.fields)
            return path, f"set only one of {members}; got {chosen[oneof.name]} and {field.name}"
        chosen[oneof.name] = field.name
    return None


_LONE_SURROGATE = (
    "holds a lone surrogate (\\ud800 to \\udfff without its pair), which is no character"
)


def _has_lone_surrogate(value: object) -> bool:
    return isinstance(value, str) and _SURROGATE.search(value) is not None


def _bounds(field: FieldDescriptor) -> tuple[float, float] | None:
    """The allowed range of a numeric field: the job's own (``mdq.core.spec.RANGES``), else
    what its protobuf type holds (None for a floating-point number)."""
    if (fixed := RANGES.get(field.full_name)) is not None:
        return fixed
    return _TYPE_RANGES.get(field.cpp_type)


def _number(value: float) -> str:
    """A bound as a person writes it: 10000000000, 0.1 (an integer exactly, however large)."""
    if isinstance(value, int) or value.is_integer():
        return str(int(value))
    return f"{value:g}"


def _between(bounds: tuple[float, float] | None) -> str:
    if bounds is None:
        return ""
    low, high = (_number(bound) for bound in bounds)
    return f" between {low} and {high}"


def _explain(field: FieldDescriptor, value: object, reason: str) -> str:
    """Why ParseDict refuses ``value`` (one element, for a list) as ``field``, in the
    caller's terms; ``reason`` (ParseDict's own words, without its paths) for anything
    else."""
    if (wrong := _expected(field, value)) is not None:
        return wrong
    if field.enum_type is not None:
        return f"must be one of {enum_choices(field.enum_type)}, got {_shown(value)}"
    if field.cpp_type in _TYPE_RANGES:
        return f"must be a whole number{_between(_bounds(field))}, got {_shown(value)}"
    if field.cpp_type in _FLOATING:
        return f"must be a number{_between(_bounds(field))}, got {_shown(value)}"
    if _has_lone_surrogate(value):
        return _LONE_SURROGATE
    return reason


_NUMBER = float | int
_TYPE_RANGES: dict[int, tuple[float, float]] = {
    FieldDescriptor.CPPTYPE_INT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.CPPTYPE_INT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.CPPTYPE_UINT32: (0, 2**32 - 1),
    FieldDescriptor.CPPTYPE_UINT64: (0, 2**64 - 1),
}
"""What each protobuf integer type holds."""
_FLOATING = frozenset({FieldDescriptor.CPPTYPE_DOUBLE, FieldDescriptor.CPPTYPE_FLOAT})
_SURROGATE = re.compile("[\ud800-\udfff]")


def _expected(field: FieldDescriptor, value: object, *, whole: bool = False) -> str | None:
    """Why ``value`` cannot be ``field`` (one element of it, unless ``whole``) when its JSON
    type is wrong ("must be a string, got 42"); None when its type is right (the problem, if
    any, is then its value, which ParseDict's own message describes)."""
    if whole and field.is_repeated:
        is_map = field.message_type is not None and field.message_type.GetOptions().map_entry
        if is_map and not isinstance(value, Mapping):
            return f"must be an object, got {_shown(value)}"
        if not is_map and not isinstance(value, list):
            return f"must be a list, got {_shown(value)}"
        return None
    kind = field.type
    if value is None and whole:
        return None  # null leaves a field unset; only an element or map value cannot be null
    if kind == FieldDescriptor.TYPE_MESSAGE:
        if _is_plain_message(field) and not isinstance(value, Mapping):
            return f"must be an object, got {_shown(value)}"
        return None
    if kind == FieldDescriptor.TYPE_STRING and not isinstance(value, str):
        return f"must be a string, got {_shown(value)}"
    if kind == FieldDescriptor.TYPE_BOOL and not isinstance(value, bool):
        return f"must be true or false, got {_shown(value)}"
    if kind == FieldDescriptor.TYPE_ENUM and not isinstance(value, str | int):
        enum_type = field.enum_type
        names = enum_choices(enum_type) if enum_type else "its names"
        return f"must be one of {names}, got {_shown(value)}"
    numeric = kind not in (
        FieldDescriptor.TYPE_STRING,
        FieldDescriptor.TYPE_BOOL,
        FieldDescriptor.TYPE_ENUM,
        FieldDescriptor.TYPE_BYTES,
    )
    if numeric and (isinstance(value, bool) or not isinstance(value, _NUMBER | str)):
        return f"must be a number, got {_shown(value)}"
    return None


def _shown(value: object) -> str:
    """A value as JSON would write it, cut short."""
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):
        text = repr(value)
    return printable(text, 60)
