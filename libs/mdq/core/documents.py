"""Client documents into protobuf messages, every problem named by its field path (pure).

A submit from a plain NATS client is the protobuf JSON mapping of ``mdq.v1.SubmitRequest``;
a job file is the same mapping written as YAML. Both are parsed here (by ``mdq.bus.codec`` for
intake, by ``mdq.sdk.jobfile`` for the CLI), so both name a problem the same way, in the path
style of the validation errors (``jobs[1].depends_on[0]``, ``jobs[0].labels['team']``):

- **Nesting.** A submit is at most six lists and objects deep; a document nested more than
  ``MAX_DEPTH`` deep is refused before the protobuf parser (or ``repr`` of a value in its
  error message) recurses into it, naming the path of the first container too deep
  (``nesting_error``). A JSON text too deep for ``json.loads`` itself (which raises
  ``RecursionError`` some thousand levels down) is scanned without recursion for that same
  path (``nesting_error_in_json``).
- **Types.** ``json_format.ParseDict`` stops at the first problem, but its message names
  only the chain of fields (``jobs.depends_on``), not the element of a list or the key of a
  map. ``parse_document`` finds the element by asking ParseDict itself about the parts of the
  document one at a time (the key, then each element of a list, each entry of a map, each
  field of a nested message), so the path it reports is exactly what ParseDict refuses. This
  runs only once a parse has failed.

Error messages are cut to ``MAX_REASON_CHARS`` and hold no lone surrogates (JSON may carry
``"\\ud800"``, which neither protobuf nor a terminal can encode).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from json.decoder import scanstring  # type: ignore[attr-defined]  # C accelerated, untyped
from typing import Any, cast

from google.protobuf import json_format, message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

from mdq.core.spec import SpecError

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


def field_names(descriptor: Descriptor) -> dict[str, FieldDescriptor]:
    """Both spellings the JSON mapping accepts: proto names and lowerCamelCase json names."""
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


def nesting_error(document: object, prefix: str = "") -> SpecError | None:
    """The error for the first list or object (in document order) nested more than
    ``MAX_DEPTH`` deep in ``document`` (lists and dicts, as JSON and YAML load), None if there
    is none. Walks without recursion, and builds a path only for the culprit (a reference
    cycle, which a YAML alias can make, is too deep as well)."""
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
            path = prefix
            for key in reversed(keys):
                path = join(path, key)
            return SpecError(path, _too_deep("lists and objects are nested"))
        nested = [
            (child, depth + 1, entry, key)
            for key, child in children
            if isinstance(child, dict | list)
        ]
        stack.extend(reversed(nested))  # the first child is looked at first
    return None


def nesting_error_in_json(text: str, prefix: str = "") -> SpecError:
    """The error for a JSON text too deep to load: the path of its first list or object
    nested more than ``MAX_DEPTH`` deep, found by scanning the text (no recursion); the
    whole document (``prefix``) when the text breaks off before that."""
    # each open container: [is an object, its current key or index, a key comes next]
    stack: list[list[Any]] = []
    position = 0
    while match := _STRUCTURE.search(text, position):
        char, position = match.group(), match.end()
        top = stack[-1] if stack else None
        if char == '"':
            try:
                string, position = scanstring(text, position)
            except ValueError:
                break
            if top is not None and top[0] and top[2]:
                top[1], top[2] = string, False
        elif char in "{[":
            if len(stack) >= MAX_DEPTH:
                path = prefix
                for _, key, _ in stack:
                    path = join(path, key) if key is not None else path
                return SpecError(path, _too_deep("lists and objects are nested"))
            stack.append([char == "{", None if char == "{" else 0, True])
        elif char in "}]":
            if stack:
                stack.pop()
        elif char == "," and top is not None:
            if top[0]:
                top[2] = True
            else:
                top[1] += 1
    return SpecError(prefix, _too_deep("the document is nested"))


def load_json(data: bytes | str, prefix: str = "") -> object:
    """``json.loads``; a text nested too deep for it (it gives up with ``RecursionError``) is
    a ``SpecError`` naming where, ValueError is a text that is no JSON. A document it loads
    may still be too deep for a message: ``parse_document`` checks."""
    try:
        return json.loads(data)
    except RecursionError:
        text = data if isinstance(data, str) else data.decode(json.detect_encoding(data), "replace")
        raise nesting_error_in_json(text, prefix) from None


# -- types -------------------------------------------------------------------------------------


def parse_document(
    document: Mapping[str, Any], message: Message, *, prefix: str = "", nested: bool = True
) -> None:
    """``json_format.ParseDict`` of ``document`` into ``message`` (unknown fields refused); a
    ``SpecError`` naming the exact path of the first problem (``prefix`` before it).
    ``nested=False`` skips the nesting check of a document known to be shallow (a JSON text
    with at most ``MAX_DEPTH`` brackets, say)."""
    if nested and (too_deep := nesting_error(document, prefix)) is not None:
        raise too_deep
    try:
        json_format.ParseDict(_dict(document), message, ignore_unknown_fields=False)
    except Exception as error:  # ParseError; upb's SystemError on a key it cannot encode
        reason = _reason(error)
        found = _locate(document, _descriptor(message), prefix)
        if found is None:  # only a combination of fields fails (two members of a oneof, say)
            raise SpecError(_path_in(str(error), prefix), reason) from None
        raise SpecError(*found) from None


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
            return join(path, key), f"unknown field {quoted(key)} of {descriptor.full_name}"
        here = join(path, field.name)
        if (wrong := _expected(field, value, whole=True)) is not None:
            return here, wrong
        message_type = field.message_type
        if message_type is not None and message_type.GetOptions().map_entry:
            if isinstance(value, Mapping):
                value_field = message_type.fields_by_name["value"]
                for map_key, item in value.items():
                    if (why := _refused(descriptor, {key: {map_key: item}})) is not None:
                        return f"{here}[{quoted(map_key)}]", _expected(value_field, item) or why
        elif field.is_repeated:
            if isinstance(value, list):
                for index, item in enumerate(value):
                    if (why := _refused(descriptor, {key: [item]})) is not None:
                        element = f"{here}[{index}]"
                        plain = message_type is not None and _is_plain_message(field)
                        if plain and message_type is not None and isinstance(item, Mapping):
                            return _locate(item, message_type, element) or (element, why)
                        return element, _expected(field, item) or why
        elif message_type is not None and _is_plain_message(field) and isinstance(value, Mapping):
            return _locate(value, message_type, here) or (here, reason)
        return here, reason
    return None


_NUMBER = float | int


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
        names = ", ".join(item.name for item in enum_type.values) if enum_type else "its names"
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
