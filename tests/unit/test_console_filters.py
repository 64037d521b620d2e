"""The console's jobs filters and keyset cursor (``services.console.filters``): tables of named
cases, every refusal naming its parameter."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from services.console.filters import (
    OPERATOR,
    Cursor,
    FilterError,
    JobFilter,
    parse_filter,
    parse_label,
)

AT = datetime(2026, 12, 1, 8, 30, tzinfo=UTC)

ACCEPTED = {
    "nothing": ({}, JobFilter()),
    "state, any case": ({"state": "running"}, JobFilter(state="RUNNING")),
    "a tenant": ({"tenant": "alice"}, JobFilter(tenant="alice")),
    "the operator's jobs": ({"tenant": OPERATOR}, JobFilter(tenant=OPERATOR)),
    "a priority class": ({"priority": "high"}, JobFilter(priority_class="high")),
    "a label": ({"label": "campaign=water"}, JobFilter(label=("campaign", "water"))),
    "a label value with =": ({"label": "a=b=c"}, JobFilter(label=("a", "b=c"))),
    "name text, trimmed": ({"name": "  water "}, JobFilter(name="water")),
    "a naive time is UTC": (
        {"since": "2026-12-01T08:30"},
        JobFilter(since=AT),
    ),
    "a window": (
        {"since": "2026-12-01T08:30+00:00", "until": "2026-12-02"},
        JobFilter(since=AT, until=datetime(2026, 12, 2, tzinfo=UTC)),
    ),
    "a page size": ({"size": "100"}, JobFilter(size=100)),
    "a cursor": (
        {"after": Cursor(AT, "alice.0123456789ab-run").encode()},
        JobFilter(after=Cursor(AT, "alice.0123456789ab-run")),
    ),
    "empty values are no filter": ({"state": "", "tenant": "", "label": ""}, JobFilter()),
}

REFUSED = {
    "an unknown parameter": ({"colour": "red"}, "colour"),
    "an unknown state": ({"state": "DONE"}, "state"),
    "a tenant that cannot exist": ({"tenant": "Alice!"}, "tenant"),
    "a path trick as tenant": ({"tenant": "../etc"}, "tenant"),
    "an unknown priority": ({"priority": "urgent"}, "priority"),
    "a label without =": ({"label": "campaign"}, "label"),
    "an empty label key": ({"label": "=x"}, "label"),
    "a label key too long": ({"label": "k" * 64 + "=v"}, "label"),
    "not a time": ({"since": "yesterday"}, "since"),
    "a window backwards": ({"since": "2026-12-02", "until": "2026-12-01"}, "until"),
    "a page size not offered": ({"size": "1000000"}, "size"),
    "a negative page size": ({"size": "-5"}, "size"),
    "a forged cursor": ({"after": "bm90LWEtY3Vyc29y"}, "after"),
    "a cursor that is not base64": ({"after": "%%%"}, "after"),
    "text too long": ({"name": "x" * 101}, "name"),
    "control characters": ({"name": "a\x00b"}, "name"),
}


@pytest.mark.parametrize("params, expected", ACCEPTED.values(), ids=ACCEPTED.keys())
def test_a_filter_is_read_from_the_query(params: dict[str, str], expected: JobFilter) -> None:
    assert parse_filter(params) == expected


@pytest.mark.parametrize("params, field", REFUSED.values(), ids=REFUSED.keys())
def test_a_bad_parameter_is_refused_by_name(params: dict[str, str], field: str) -> None:
    with pytest.raises(FilterError) as refused:
        parse_filter(params)
    assert refused.value.field == field
    assert refused.value.message


@pytest.mark.parametrize("chosen", [f for _, f in ACCEPTED.values()], ids=ACCEPTED.keys())
def test_a_filter_survives_its_own_query_string(chosen: JobFilter) -> None:
    from urllib.parse import parse_qsl

    assert parse_filter(dict(parse_qsl(chosen.query()))) == chosen


def test_a_link_to_the_next_page_keeps_the_filter_and_moves_the_cursor() -> None:
    from urllib.parse import parse_qsl

    chosen = JobFilter(state="RUNNING", label=("campaign", "water"))
    after = Cursor(AT, "0123456789ab-run")
    following = parse_filter(dict(parse_qsl(chosen.query(after=after))))
    assert following.state == "RUNNING" and following.label == ("campaign", "water")
    assert following.after == after


def test_a_label_is_key_and_value() -> None:
    assert parse_label("series=temperature") == ("series", "temperature")
