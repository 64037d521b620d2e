"""Tables of named cases for client documents (``mdq.core.documents``): the field path and the
message of every problem, the same from intake's decoder (``mdq.bus.codec.decode_submit``)
and from the CLI's job files (``mdq.sdk.jobfile.parse_job_text``); nesting bounds. Pure."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from mdq.bus.codec import decode_submit
from mdq.contracts import pb
from mdq.core.documents import (
    MAX_DEPTH,
    join,
    nesting_error,
    nesting_error_in_json,
    parse_document,
)
from mdq.core.spec import SpecError
from mdq.sdk.jobfile import JobFileError, parse_job_text


@dataclass(frozen=True)
class Refused:
    document: str
    """A JSON text (JSON is YAML too: both decoders read the same text)."""
    field: str
    message: str
    """A fragment of the message."""


def submit(*jobs: object) -> str:
    return json.dumps({"idempotency_key": "k", "jobs": list(jobs)})


def nested(depth: int, leaf: str = '"x"') -> str:
    """A submit whose first job's labels hold objects nested ``depth`` deep."""
    head = submit({"name": "a", "labels": "HERE"})
    return head.replace('"HERE"', '{"a": ' * depth + leaf + "}" * depth)


DEEP_LABELS = "jobs[0].labels" + ".a" * (MAX_DEPTH + 1 - 4)
"""The first object too deep in ``nested``: root, jobs, the job, labels are the first four."""

REFUSED = {
    "a number among the dependencies of the second job": Refused(
        submit({"name": "a"}, {"name": "b", "depends_on": [42]}),
        field="jobs[1].depends_on[0]",
        message="must be a string, got 42",
    ),
    "the second dependency is the wrong one": Refused(
        submit({"name": "a", "depends_on": ["b", True]}, {"name": "b"}),
        field="jobs[0].depends_on[1]",
        message="must be a string, got true",
    ),
    "a null dependency": Refused(
        submit({"name": "a", "depends_on": [None]}),
        field="jobs[0].depends_on[0]",
        message="must be a string, got null",
    ),
    "dependencies that are no list": Refused(
        submit({"name": "a", "depends_on": "b"}),
        field="jobs[0].depends_on",
        message='must be a list, got "b"',
    ),
    "a number as a label value": Refused(
        submit({"name": "a", "labels": {"team": "md", "cost": 7}}),
        field="jobs[0].labels['cost']",
        message="must be a string, got 7",
    ),
    "labels that are a list": Refused(
        submit({"name": "a", "labels": ["md"]}),
        field="jobs[0].labels",
        message='must be an object, got ["md"]',
    ),
    "a number among the force fields": Refused(
        submit(
            {
                "name": "a",
                "system": {"structure": {"pdb_path": "p.pdb", "force_fields": ["a.xml", 3]}},
            }
        ),
        field="jobs[0].system.structure.force_fields[1]",
        message="must be a string, got 3",
    ),
    "a word for a number in a oneof": Refused(
        submit({"name": "a", "system": {"water_box": {"box_nm": "big"}}}),
        field="jobs[0].system.water_box.box_nm",
        message="big",
    ),
    "a word for a number, camelCase": Refused(
        submit({"name": "a", "temperatureK": "hot"}),
        field="jobs[0].temperature_k",
        message="hot",
    ),
    "a fraction of a step": Refused(
        submit({"name": "a", "steps": 1.5}),
        field="jobs[0].steps",
        message="1.5",
    ),
    "a boolean for retries": Refused(
        submit({"name": "a", "max_retries": True}),
        field="jobs[0].max_retries",
        message="must be a number, got true",
    ),
    "a list for a task": Refused(
        submit({"name": "a", "task": ["TASK_MD"]}),
        field="jobs[0].task",
        message="must be one of TASK_UNSPECIFIED, TASK_MD",
    ),
    "a system that is a number": Refused(
        submit({"name": "a", "system": 3}),
        field="jobs[0].system",
        message="must be an object, got 3",
    ),
    "two systems at once": Refused(
        submit({"name": "a", "system": {"water_box": {}, "lennard_jones": {}}}),
        field="jobs[0].system",
        message='multiple "kind" oneof fields',
    ),
    "a key that is a list": Refused(
        json.dumps({"idempotency_key": ["k"], "jobs": [{"name": "a"}]}),
        field="idempotency_key",
        message='must be a string, got ["k"]',
    ),
    "an unknown field deep down": Refused(
        submit({"name": "a"}, {"name": "b", "resources": {"cpus": 2}}),
        field="jobs[1].resources.cpus",
        message="unknown field",
    ),
    "a lone surrogate in a label key": Refused(
        submit({"name": "a", "labels": {"\ud800": "x"}}),
        field="jobs[0].labels['\\ud800']",
        message="surrogate",
    ),
    "nested forty deep": Refused(nested(40), field=DEEP_LABELS, message="more than 32 levels"),
    "nested five thousand deep": Refused(
        nested(5000), field=DEEP_LABELS, message="more than 32 levels"
    ),
    "a deep list in the jobs": Refused(
        submit("[" * 100 + "]" * 100)
        .replace('"' + "[" * 100, "[" * 100)
        .replace("]" * 100 + '"', "]" * 100),
        field="jobs" + "[0]" * (MAX_DEPTH - 1),
        message="more than 32 levels",
    ),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_intake_names_the_field(case: str) -> None:
    expected = REFUSED[case]
    with pytest.raises(SpecError) as caught:
        decode_submit(expected.document.encode())
    assert (caught.value.field, expected.message in caught.value.message) == (
        expected.field,
        True,
    ), caught.value.message


@pytest.mark.parametrize("case", list(REFUSED))
def test_job_files_name_the_same_field(case: str) -> None:
    expected = REFUSED[case]
    with pytest.raises(JobFileError) as caught:
        parse_job_text(expected.document, source="case.json")
    assert (caught.value.field, expected.message in caught.value.message) == (
        expected.field,
        True,
    ), caught.value.message


# -- nesting -----------------------------------------------------------------------------------

NESTING = {
    "a submit": ({"jobs": [{"system": {"structure": {"force_fields": ["a.xml"]}}}]}, None),
    "exactly the limit": (json.loads("[" * MAX_DEPTH + "]" * MAX_DEPTH), None),
    "one past the limit": (json.loads("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1)), "[0]" * 32),
    "the first culprit in document order": (
        {"b": [1, json.loads("[" * 40 + "]" * 40)], "a": json.loads("[" * 40 + "]" * 40)},
        "b[1]" + "[0]" * 30,
    ),
    "a key that is no name": ({"a b": json.loads("[" * 40 + "]" * 40)}, "['a b']" + "[0]" * 31),
}


@pytest.mark.parametrize("case", list(NESTING))
def test_nesting_is_bounded(case: str) -> None:
    document, field = NESTING[case]
    error = nesting_error(document)
    assert (error.field if error else None) == field


def test_a_cycle_is_too_deep() -> None:
    """A YAML alias can make a document that holds itself."""
    cycle: list[object] = []
    cycle.append(cycle)
    error = nesting_error({"jobs": cycle})
    assert error is not None and error.field == "jobs" + "[0]" * (MAX_DEPTH - 1)


@pytest.mark.parametrize(
    ("text", "field"),
    [
        pytest.param('{"a": [' + "{" * 40, "a[0]", id="object-keys-not-yet-known"),
        pytest.param('{"a": [1, 2, ' + '{"b": ' * 40, "a[2]" + ".b" * 30, id="indices-and-keys"),
        pytest.param('{"a": "[[[[[", "b": ' + "[" * 40, "b" + "[0]" * 31, id="brackets-in-strings"),
        pytest.param('{"a\\"b": ' + "[" * 40, "['a\"b']" + "[0]" * 31, id="escaped-quote-in-key"),
        pytest.param("[" * 10 + '"unterminated', "", id="breaks-off-before-the-limit"),
    ],
)
def test_nesting_in_text_too_deep_to_load(text: str, field: str) -> None:
    assert nesting_error_in_json(text).field == field


def test_deep_yaml_is_refused() -> None:
    with pytest.raises(JobFileError) as caught:
        parse_job_text("jobs: " + "[" * 5000 + "]" * 5000 + "\n")
    assert "levels deep" in caught.value.message


def test_deep_yaml_that_loads_is_refused_with_its_path() -> None:
    with pytest.raises(JobFileError) as caught:
        parse_job_text("name: a\nlabels: " + "{a: " * 40 + "x" + "}" * 40 + "\n")
    assert caught.value.field == "jobs[0].labels" + ".a" * (MAX_DEPTH + 1 - 4)


# -- paths -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "path"),
    [
        pytest.param("jobs", "x.jobs", id="name"),
        pytest.param(3, "x[3]", id="index"),
        pytest.param("a b", "x['a b']", id="not-a-name"),
        pytest.param("\ud800", "x['\\ud800']", id="lone-surrogate-escaped"),
        pytest.param("y" * 100, "x['" + "y" * 63 + "…']", id="long-name-cut"),
        pytest.param(True, "x[True]", id="not-a-string"),
    ],
)
def test_join(key: object, path: str) -> None:
    assert join("x", key) == path


def test_a_parsed_document_fills_the_message() -> None:
    request = pb.SubmitRequest()
    parse_document({"jobs": [{"name": "a", "dependsOn": ["b"]}]}, request)
    assert list(request.jobs[0].depends_on) == ["b"]
