"""Job files (mdq.sdk.jobfile): YAML/JSON in the protobuf JSON mapping → SubmitRequest.

Table tests: each named case is a file's text and either what the submit must contain or the
field (and a fragment of the message) the error must name.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from mdq.contracts import pb
from mdq.sdk.jobfile import JobFileError, load_job_file, parse_job_text
from tests.helpers import attribute


@dataclass(frozen=True)
class Accepted:
    text: str
    key: str
    names: tuple[str, ...]
    check: str = ""
    """An attribute path on jobs[0] and its expected value, "path=value"."""


@dataclass(frozen=True)
class Refused:
    text: str
    field: str
    message: str


ACCEPTED: dict[str, Accepted] = {
    "submit with a jobs list": Accepted(
        "idempotency_key: k1\njobs:\n  - name: a\n  - name: b\n    depends_on: [a]\n",
        key="k1",
        names=("a", "b"),
    ),
    "bare single job": Accepted(
        "name: solo\nsteps: 1500\ntemperature_k: 310\n",
        key="",
        names=("solo",),
        check="steps=1500",
    ),
    "json file": Accepted(
        '{"idempotency_key": "j", "jobs": [{"name": "x", "resources": {"cpu": 2}}]}',
        key="j",
        names=("x",),
        check="resources.cpu=2.0",
    ),
    "lowerCamelCase json names": Accepted(
        '{"idempotencyKey": "c", "jobs": [{"name": "x", "reportIntervalSteps": 250}]}',
        key="c",
        names=("x",),
        check="report_interval_steps=250",
    ),
    "enum by name and oneof system": Accepted(
        "jobs:\n  - name: m\n    task: TASK_MINIMIZE\n    system: {water_box: {box_nm: 2.5}}\n",
        key="",
        names=("m",),
        check="system.water_box.box_nm=2.5",
    ),
    "int64 steps as a string (JSON mapping)": Accepted(
        "name: big\nsteps: '20000'\n", key="", names=("big",), check="steps=20000"
    ),
    "explicit zero retries keeps presence": Accepted(
        "name: once\nmax_retries: 0\n", key="", names=("once",), check="max_retries=0"
    ),
    "keys merged in YAML may be overridden": Accepted(
        "jobs:\n  - &base {name: a, steps: 10}\n  - <<: *base\n    name: b\n",
        key="",
        names=("a", "b"),
    ),
    "labels map": Accepted(
        "name: l\nlabels: {campaign: demo}\n", key="", names=("l",), check="labels.campaign=demo"
    ),
}

REFUSED: dict[str, Refused] = {
    "a field given twice in YAML": Refused(
        "name: a\ntemperature_k: 300\ntemperature_k: 5\n",
        field="jobs[0].temperature_k",
        message="given twice in one object",
    ),
    "a label given twice in YAML": Refused(
        "jobs:\n  - name: a\n  - name: b\n    labels: {team: md, team: qm}\n",
        field="jobs[1].labels['team']",
        message="given twice in one object",
    ),
    "the jobs given twice in YAML": Refused(
        "jobs: [{name: a}]\njobs: [{name: b}]\n", field="jobs", message="given twice"
    ),
    "one field under both spellings in YAML": Refused(
        "name: a\nmax_retries: 1\nmaxRetries: 2\n",
        field="jobs[0].max_retries",
        message="given twice, as 'max_retries' and 'maxRetries'",
    ),
    "unknown top-level field": Refused(
        "idempotency_key: k\njobz: []\n",
        field="jobz",
        message="unknown field 'jobz': did you mean 'jobs'?",
    ),
    "unknown job field": Refused(
        "jobs:\n  - name: a\n  - name: b\n    temprature_k: 300\n",
        field="jobs[1].temprature_k",
        message="unknown field",
    ),
    "every unknown field is named": Refused(
        "name: a\nstepz: 3\nresources: {cpus: 1}\n",
        field="jobs[0].stepz",
        message="jobs[0].stepz (did you mean 'steps'?), "
        "jobs[0].resources.cpus (did you mean 'cpu'?)",
    ),
    "unknown field in the oneof system": Refused(
        "name: a\nsystem: {water_box: {edge_nm: 2}}\n",
        field="jobs[0].system.water_box.edge_nm",
        message="unknown field",
    ),
    "unknown enum value": Refused(
        "name: a\ntask: TASK_FOLD\n", field="jobs[0].task", message="TASK_FOLD"
    ),
    "wrong type of a nested number": Refused(
        "jobs:\n  - name: a\n  - name: b\n    resources: {cpu: lots}\n",
        field="jobs[1].resources.cpu",
        message="lots",
    ),
    "wrong type inside the oneof": Refused(
        "name: a\nsystem: {water_box: {box_nm: [1, 2]}}\n",
        field="jobs[0].system.water_box.box_nm",
        message="",
    ),
    "jobs is not a list": Refused("jobs: 3\n", field="jobs", message="list"),
    "a job is not a mapping": Refused("jobs: [just-a-name]\n", field="jobs[0]", message="mapping"),
    "depends_on is not a list": Refused(
        "name: a\ndepends_on: b\n", field="jobs[0].depends_on", message="must be a list"
    ),
    "key of the wrong type": Refused(
        "idempotency_key: [1]\njobs: []\n", field="idempotency_key", message=""
    ),
    "not a mapping at all": Refused("- a\n- b\n", field="", message="mapping"),
    "malformed yaml": Refused("jobs: [\n", field="", message="not valid YAML or JSON"),
    "malformed json": Refused(
        '{"jobs": [}', field="jobs[0]", message="malformed JSON at line 1, column 11: a value is"
    ),
}


@pytest.mark.parametrize("case", list(ACCEPTED), ids=list(ACCEPTED))
def test_accepted_job_files(case: str) -> None:
    expected = ACCEPTED[case]
    request = parse_job_text(expected.text, source="case.yaml")
    assert isinstance(request, pb.SubmitRequest)
    assert request.idempotency_key == expected.key
    assert tuple(job.name for job in request.jobs) == expected.names
    if expected.check:
        path, _, value = expected.check.partition("=")
        assert str(attribute(request.jobs[0], path)) == value
    if case == "explicit zero retries keeps presence":
        assert request.jobs[0].HasField("max_retries")


@pytest.mark.parametrize("case", list(REFUSED), ids=list(REFUSED))
def test_refused_job_files_name_the_field(case: str) -> None:
    expected = REFUSED[case]
    with pytest.raises(JobFileError) as caught:
        parse_job_text(expected.text, source="case.yaml")
    assert caught.value.field == expected.field
    assert expected.message in caught.value.message
    assert str(caught.value).startswith("case.yaml: ")


def test_a_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(JobFileError) as caught:
        load_job_file(tmp_path / "nope.yaml")
    assert "cannot read" in caught.value.message
    assert caught.value.source.endswith("nope.yaml")


def test_the_file_format_is_the_protobuf_json_mapping(tmp_path: Path) -> None:
    """What MessageToJson writes, the loader reads back unchanged (YAML or JSON)."""
    from google.protobuf import json_format

    original = pb.SubmitRequest(idempotency_key="round-trip", submitted_by="me")
    job = original.jobs.add(name="w", task=pb.TASK_MD, temperature_k=280, steps=3000)
    job.system.water_box.box_nm = 2.0
    job.resources.cpu, job.resources.memory_mb = 1.5, 2048
    job.depends_on.append("other-key")
    job.labels["series"] = "t"
    path = tmp_path / "round.json"
    path.write_text(json_format.MessageToJson(original))
    assert load_job_file(path) == original
