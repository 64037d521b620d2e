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


DEEP_LABELS = "jobs[0].labels['a']" + ".a" * (MAX_DEPTH + 1 - 5)
"""The first object too deep in ``nested``: root, jobs, the job, labels are the first four
(the labels are a map: their keys are in brackets)."""

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
        message="must be one of TASK_MD, TASK_MINIMIZE, TASK_ANALYZE, got [",
    ),
    "a system that is a number": Refused(
        submit({"name": "a", "system": 3}),
        field="jobs[0].system",
        message="must be an object, got 3",
    ),
    "two systems at once": Refused(
        submit({"name": "a", "system": {"water_box": {}, "lennard_jones": {}}}),
        field="jobs[0].system",
        message="set only one of water_box, lennard_jones, structure, lammps, openmm_xml; got",
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
    # -- a key given twice: JSON parsers keep the last one without a word
    "a field of a job given twice": Refused(
        '{"jobs": [{"name": "a", "temperature_k": 300, "temperature_k": 5}]}',
        field="jobs[0].temperature_k",
        message="given twice in one object",
    ),
    "the key of the submit given twice": Refused(
        '{"idempotency_key": "a", "jobs": [{"name": "a"}], "idempotency_key": "b"}',
        field="idempotency_key",
        message="given twice",
    ),
    "the jobs given twice": Refused(
        '{"jobs": [{"name": "a"}], "jobs": [{"name": "b"}]}', field="jobs", message="given twice"
    ),
    "a label given twice": Refused(
        '{"jobs": [{"name": "a", "labels": {"team": "md", "team": "qm"}}]}',
        field="jobs[0].labels['team']",
        message="given twice",
    ),
    "a field deep in the second job given twice": Refused(
        '{"jobs": [{"name": "a"}, {"name": "b", "system": {"water_box": '
        '{"box_nm": 2, "box_nm": 3}}}]}',
        field="jobs[1].system.water_box.box_nm",
        message="given twice",
    ),
    "a field given twice in camelCase": Refused(
        '{"jobs": [{"name": "a", "temperatureK": 300, "temperatureK": 5}]}',
        field="jobs[0].temperature_k",
        message="given twice",
    ),
    "one field under both spellings": Refused(
        submit({"name": "a", "temperature_k": 300, "temperatureK": 5}),
        field="jobs[0].temperature_k",
        message="given twice, as 'temperature_k' and 'temperatureK'",
    ),
    # -- values said in the caller's terms: the allowed range, the valid names
    "a word for the steps": Refused(
        submit({"name": "a", "steps": "many"}),
        field="jobs[0].steps",
        message='must be a whole number between 1 and 10000000000, got "many"',
    ),
    "a word for a temperature": Refused(
        submit({"name": "a", "temperature_k": "many"}),
        field="jobs[0].temperature_k",
        message='must be a number between 1 and 5000, got "many"',
    ),
    "more retries than a whole number holds": Refused(
        submit({"name": "a", "max_retries": 10**18}),
        field="jobs[0].max_retries",
        message="must be a whole number between 0 and 20, got 1000000000000000000",
    ),
    "a seed past 32 bits": Refused(
        submit({"name": "a", "seed": 2**31}),
        field="jobs[0].seed",
        message="must be a whole number between -2147483648 and 2147483647, got 2147483648",
    ),
    "more steps than a whole number holds": Refused(
        submit({"name": "a", "steps": 10**30}),
        field="jobs[0].steps",
        message="must be a whole number between 1 and 10000000000, got 1" + "0" * 30,
    ),
    "a fraction of a memory size": Refused(
        submit({"name": "a", "resources": {"memory_mb": "512.5"}}),
        field="jobs[0].resources.memory_mb",
        message='must be a whole number between 64 and 1048576, got "512.5"',
    ),
    "a task that does not exist": Refused(
        submit({"name": "a", "task": "TASK_X"}),
        field="jobs[0].task",
        message='must be one of TASK_MD, TASK_MINIMIZE, TASK_ANALYZE, got "TASK_X"',
    ),
    "an integrator in lower case": Refused(
        submit({"name": "a", "integrator": "verlet"}),
        field="jobs[0].integrator",
        message="must be one of INTEGRATOR_LANGEVIN_MIDDLE, INTEGRATOR_LANGEVIN, "
        'INTEGRATOR_VERLET, INTEGRATOR_NOSE_HOOVER, got "verlet"',
    ),
    "a misspelt field": Refused(
        submit({"name": "a", "temprature_k": 300}),
        field="jobs[0].temprature_k",
        message="unknown field 'temprature_k': did you mean 'temperature_k'?",
    ),
    "a misspelt field in camelCase": Refused(
        submit({"name": "a", "temperatureKk": 300}),
        field="jobs[0].temperatureKk",
        message="did you mean 'temperature_k'?",
    ),
    "a field that resembles none": Refused(
        submit({"name": "a", "resources": {"gpus": 1}}),
        field="jobs[0].resources.gpus",
        message="unknown field 'gpus' (the fields here: cpu, memory_mb, auto)",
    ),
    "a trailing comma": Refused(
        '{"jobs": [{"name": "a", "steps": 10,}]}',
        field="jobs[0].steps",
        message="malformed JSON at line 1, column 37: expecting a key in double quotes",
    ),
    "single quotes": Refused(
        "{'jobs': []}", field="", message="malformed JSON at line 1, column 2: expecting a key"
    ),
    "a missing comma between jobs": Refused(
        '{"jobs": [{"name": "a"}\n {"name": "b"}]}',
        field="jobs[0]",
        message="malformed JSON at line 2, column 2: expecting ',' delimiter",
    ),
}


def assert_names(expected: Refused, error: SpecError) -> None:
    assert (error.field, expected.message in error.message) == (expected.field, True), error.message


@pytest.mark.parametrize("case", list(REFUSED))
def test_intake_names_the_field(case: str) -> None:
    expected = REFUSED[case]
    with pytest.raises(SpecError) as caught:
        decode_submit(expected.document.encode())
    assert_names(expected, caught.value)


@pytest.mark.parametrize("case", list(REFUSED))
def test_job_files_name_the_same_field(case: str) -> None:
    expected = REFUSED[case]
    with pytest.raises(JobFileError) as caught:
        parse_job_text(expected.document, source="case.json")
    assert_names(expected, caught.value)


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
    assert caught.value.field == DEEP_LABELS


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
