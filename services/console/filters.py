"""The jobs page's filters and its keyset cursor, read from a query string: pure, no I/O.

A filter is what a person can narrow the jobs list by (state, tenant, priority class, one
label, text in the name, a submit-time window); the cursor is where the previous page ended
(the last row's submit time and job id), so the next page starts after it with an index range
scan instead of ``OFFSET`` (which reads and throws away every row before the page).
Everything a browser sends is checked here, and a bad value is refused naming its parameter.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from urllib.parse import urlencode

from mdq.core.spec import MAX_LABEL_LENGTH, PRIORITY_CLASSES
from mdq.core.state import JobState
from mdq.errors import InvalidInput

PAGE_SIZES = (25, 50, 100, 200)
"""The page sizes a person may ask for; the first is the default."""
MAX_TEXT = 100
"""Longest name fragment, tenant or label accepted (characters)."""
TENANT_PATTERN = re.compile(r"^[a-z][a-z0-9-]{0,30}$")
"""A tenant's name (``mdq.core.tenants``); ``-`` alone stands for the operator's jobs."""
OPERATOR = "-"
"""The tenant filter's value for jobs with no tenant (the operator's)."""
KNOWN = frozenset(
    {"state", "tenant", "priority", "label", "name", "since", "until", "after", "size"}
)
"""Every query parameter of the jobs page."""


class FilterError(InvalidInput):
    """A query parameter that cannot be used; ``field`` names it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@dataclass(frozen=True, slots=True)
class Cursor:
    """Where a page ended: the last row's submit time and job id (newest first)."""

    submitted_at: datetime
    job_id: str

    def encode(self) -> str:
        raw = f"{self.submitted_at.isoformat()}|{self.job_id}".encode()
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")

    @classmethod
    def decode(cls, token: str) -> Cursor:
        try:
            padded = token + "=" * (-len(token) % 4)
            text = base64.urlsafe_b64decode(padded.encode()).decode()
            stamp, job_id = text.split("|", 1)
            at = datetime.fromisoformat(stamp)
        except (ValueError, binascii.Error, UnicodeDecodeError):
            raise FilterError("after", "not a cursor this console made") from None
        if at.tzinfo is None or not job_id or len(job_id) > 200:
            raise FilterError("after", "not a cursor this console made")
        return cls(at, job_id)


@dataclass(frozen=True, slots=True)
class JobFilter:
    """What the jobs list shows: every set field must hold (AND)."""

    state: str = ""
    tenant: str = ""
    """A tenant's name, ``OPERATOR`` for the operator's jobs, "" for everyone's."""
    priority_class: str = ""
    label: tuple[str, str] | None = None
    name: str = ""
    """Text the job's name contains (case-insensitive)."""
    since: datetime | None = None
    until: datetime | None = None
    after: Cursor | None = None
    size: int = PAGE_SIZES[0]

    def query(self, **changes: object) -> str:
        """This filter as a query string (with ``changes``), for links to other pages."""
        chosen = replace(self, **changes)  # type: ignore[arg-type]
        pairs: list[tuple[str, str]] = []
        if chosen.state:
            pairs.append(("state", chosen.state))
        if chosen.tenant:
            pairs.append(("tenant", chosen.tenant))
        if chosen.priority_class:
            pairs.append(("priority", chosen.priority_class))
        if chosen.label is not None:
            pairs.append(("label", f"{chosen.label[0]}={chosen.label[1]}"))
        if chosen.name:
            pairs.append(("name", chosen.name))
        if chosen.since is not None:
            pairs.append(("since", chosen.since.isoformat()))
        if chosen.until is not None:
            pairs.append(("until", chosen.until.isoformat()))
        if chosen.after is not None:
            pairs.append(("after", chosen.after.encode()))
        if chosen.size != PAGE_SIZES[0]:
            pairs.append(("size", str(chosen.size)))
        return urlencode(pairs)


def _text(params: Mapping[str, str], field: str) -> str:
    value = params.get(field, "").strip()
    if len(value) > MAX_TEXT:
        raise FilterError(field, f"at most {MAX_TEXT} characters")
    if any(ord(ch) < 32 for ch in value):
        raise FilterError(field, "no control characters")
    return value


def _time(params: Mapping[str, str], field: str) -> datetime | None:
    value = _text(params, field)
    if not value:
        return None
    try:
        at = datetime.fromisoformat(value)
    except ValueError:
        raise FilterError(field, "a date or time such as 2026-12-01 or 2026-12-01T08:00") from None
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)


def parse_label(value: str, field: str = "label") -> tuple[str, str]:
    """``key=value`` of one label, both parts as the job spec allows them."""
    key, separator, label_value = value.partition("=")
    if not separator:
        raise FilterError(field, "key=value, e.g. campaign=water-280-320")
    for part, text in (("key", key), ("value", label_value)):
        if not 1 <= len(text) <= MAX_LABEL_LENGTH:
            raise FilterError(field, f"a label {part} is 1 to {MAX_LABEL_LENGTH} characters")
    return key, label_value


def parse_filter(params: Mapping[str, str]) -> JobFilter:
    """The filter a query string asks for; ``FilterError`` names the first bad parameter."""
    unknown = sorted(set(params) - KNOWN)
    if unknown:
        raise FilterError(unknown[0], f"unknown parameter; known: {', '.join(sorted(KNOWN))}")
    state = _text(params, "state").upper()
    if state and state not in JobState.__members__:
        raise FilterError("state", f"one of {', '.join(JobState.__members__)}")
    tenant = _text(params, "tenant")
    if tenant and tenant != OPERATOR and not TENANT_PATTERN.match(tenant):
        raise FilterError("tenant", f"a tenant's name, or {OPERATOR!r} for the operator's jobs")
    priority = _text(params, "priority")
    if priority and priority not in PRIORITY_CLASSES:
        raise FilterError("priority", f"one of {', '.join(PRIORITY_CLASSES)}")
    label_text = _text(params, "label")
    since, until = _time(params, "since"), _time(params, "until")
    if since is not None and until is not None and since > until:
        raise FilterError("until", "must not be before since")
    after_text = _text(params, "after")
    size_text = _text(params, "size") or str(PAGE_SIZES[0])
    if not size_text.isdigit() or int(size_text) not in PAGE_SIZES:
        raise FilterError("size", f"one of {', '.join(map(str, PAGE_SIZES))}")
    return JobFilter(
        state=state,
        tenant=tenant,
        priority_class=priority,
        label=parse_label(label_text) if label_text else None,
        name=_text(params, "name"),
        since=since,
        until=until,
        after=Cursor.decode(after_text) if after_text else None,
        size=int(size_text),
    )
