"""docs/asyncapi.yaml: generated from the code (never drifts), valid AsyncAPI 3.0, and true.

Valid: checked against the official JSON Schema of AsyncAPI 3.0.0 (vendored from the npm
package @asyncapi/specs 6.11.1, Apache-2.0: tests/asyncapi/asyncapi-3.0.0.schema.json), and by
the official parser, @asyncapi/parser (JavaScript; ``npm ci --prefix tests/asyncapi``, which
.ci/run does), which also resolves every reference and applies the spec's own rules.
True: the producers it names are the services that publish each kind in the code, and the
payload schemas accept exactly what the protobuf JSON mapping accepts.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from referencing import Registry
from referencing.jsonschema import DRAFT7

from mdq.bus import asyncapi
from mdq.bus.codec import decode_submit, to_dict
from mdq.bus.subjects import Subjects
from mdq.contracts import pb
from mdq.core.control import EVENT_KINDS as CONTROL_EVENT_KINDS
from mdq.core.events import make_event
from mdq.core.spec import SpecError

ROOT = Path(__file__).resolve().parents[2]
CHECKER = ROOT / "tests" / "asyncapi"
SCHEMA_3_0 = CHECKER / "asyncapi-3.0.0.schema.json"
T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    return asyncapi.generate()


def test_the_committed_document_is_the_generated_one(document: dict[str, Any]) -> None:
    committed = asyncapi.DOCUMENT.read_text()
    assert committed == asyncapi.render(document), "docs/asyncapi.yaml is stale: make asyncapi"
    assert asyncapi.main(["--check"]) == 0


def test_check_reports_a_stale_document(tmp_path: Path) -> None:
    stale = tmp_path / "asyncapi.yaml"
    stale.write_text(asyncapi.DOCUMENT.read_text().replace("mdq.job.", "mdq.jobs.", 1))
    assert asyncapi.main(["--check", str(stale)]) == 1
    assert asyncapi.main([str(stale)]) == 0 and asyncapi.main(["--check", str(stale)]) == 0


# -- valid AsyncAPI 3.0 ---------------------------------------------------------------------------
def _local_refs(node: Any) -> list[str]:
    if isinstance(node, dict):
        found = [node["$ref"]] if isinstance(node.get("$ref"), str) else []
        return found + [ref for value in node.values() for ref in _local_refs(value)]
    if isinstance(node, list):
        return [ref for value in node for ref in _local_refs(value)]
    return []


def _resolve(document: dict[str, Any], ref: str) -> Any:
    assert ref.startswith("#/"), ref
    node: Any = document
    for token in ref[2:].split("/"):
        node = node[token.replace("~1", "/").replace("~0", "~")]
    return node


def test_the_document_is_valid_against_the_asyncapi_3_0_schema() -> None:
    loaded = yaml.safe_load(asyncapi.DOCUMENT.read_text())
    assert loaded["asyncapi"] == "3.0.0"
    validator = jsonschema.Draft7Validator(json.loads(SCHEMA_3_0.read_text()))
    errors = [f"{list(e.absolute_path)}: {e.message[:200]}" for e in validator.iter_errors(loaded)]
    assert errors == []
    for ref in _local_refs(loaded):  # the schema does not follow references: do it here
        _resolve(loaded, ref)
    broken = dict(loaded, operations={"x": {"action": "publish", "channel": {"$ref": "#/c"}}})
    assert list(validator.iter_errors(broken)), "the schema check must be able to fail"


def _parse_with_the_official_parser(path: Path) -> tuple[int, list[dict[str, Any]]]:
    node = shutil.which("node")
    if node is None or not (CHECKER / "node_modules" / "@asyncapi" / "parser").is_dir():
        pytest.skip("the AsyncAPI parser is not installed: npm ci --prefix tests/asyncapi")
    done = subprocess.run(
        [node, str(CHECKER / "validate.mjs"), str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    diagnostics = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert done.returncode in (0, 1), done.stderr
    return done.returncode, diagnostics


def test_the_official_asyncapi_parser_accepts_it(tmp_path: Path) -> None:
    status, diagnostics = _parse_with_the_official_parser(asyncapi.DOCUMENT)
    # severity 0 is an error, 1 a warning; infos (2) and hints (3) are advice, e.g. that
    # AsyncAPI 3.1 exists.
    assert status == 0 and [d for d in diagnostics if d["severity"] <= 1] == [], diagnostics

    # The same parser refuses a document whose operation points at a channel that is not there.
    document = yaml.safe_load(asyncapi.DOCUMENT.read_text())
    document["operations"]["intake_receives_submit"]["channel"] = {"$ref": "#/channels/nowhere"}
    broken = tmp_path / "broken.yaml"
    broken.write_text(yaml.safe_dump(document))
    status, diagnostics = _parse_with_the_official_parser(broken)
    assert status == 1 and any(d["severity"] == 0 for d in diagnostics), diagnostics


# -- true to the code -----------------------------------------------------------------------------
STREAM_OF_CHANNEL = {
    "submit": "MDQ_SUBMIT",
    "submit_tenant": "MDQ_SUBMIT_{tenant}",  # its own, a work queue intake reads
    "progress": "MDQ_PROGRESS",
    "node_load": "MDQ_NODES",
    "node_summary": "MDQ_NODE_SUMMARIES",
}


def test_every_event_kind_has_its_subject_and_stream(document: dict[str, Any]) -> None:
    channels = document["channels"]
    kinds = [f.name for f in pb.Event.DESCRIPTOR.oneofs_by_name["body"].fields]
    submits = {"submit", "api_submit", "api_submit_reply", "submit_tenant", "api_submit_tenant"}
    controls = {"api_control", "api_control_tenant", "api_control_reply"}
    assert set(kinds) | submits | controls == set(channels)
    assert channels["api_control"]["address"] == "mdq.api.control"
    assert channels["api_control_tenant"]["address"] == "mdq.api.control.{tenant}"
    assert channels["submit"]["address"] == "mdq.submit"
    assert channels["api_submit"]["address"] == "mdq.api.submit"
    assert channels["submit_tenant"]["address"] == "mdq.submit.{tenant}"
    assert channels["api_submit_tenant"]["address"] == "mdq.api.submit.{tenant}"
    assert "x-jetstream" not in channels["api_submit"]  # core request-reply, not captured
    assert channels["progress"]["address"] == "mdq.progress.{job_id}"
    assert channels["node_load"]["address"] == "mdq.node.{node}.load"
    assert channels["node_summary"]["address"] == "mdq.node.{node}.summary"
    assert channels["rejected"]["address"] == "mdq.rejected.{request_id}"
    assert channels["bound"]["address"] == "mdq.job.{job_id}.bound"
    for name, channel in channels.items():
        if name.startswith(("api_submit", "api_control")):
            continue  # core request-reply: no stream
        assert channel["x-jetstream"]["stream"] == STREAM_OF_CHANNEL.get(name, "MDQ_JOBS"), name
        for parameter in re.findall(r"\{(\w+)\}", channel["address"]):
            assert channel["parameters"][parameter]["description"], (name, parameter)
    assert document["channels"]["node_load"]["x-jetstream"]["max_msgs_per_subject"] == 1
    tenant_submits = document["channels"]["submit_tenant"]["x-jetstream"]
    assert (tenant_submits["retention"], tenant_submits["max_msgs"]) == ("workqueue", 1000)
    summaries = document["channels"]["node_summary"]["x-jetstream"]
    assert (summaries["max_msgs_per_subject"], summaries["max_age_s"]) == (80, 75 * 60.0)
    # A real event of each kind goes where its channel says.
    subjects = Subjects()
    event = make_event(
        "bound", pb.JobBound(node="n1"), job_id="abc-x", attempt=1, producer="p", at=T0
    )
    assert subjects.for_event(event) == channels["bound"]["address"].format(job_id="abc-x")


EMITS = re.compile(r"\.(?:emit|event|_send)\(\s*\"(\w+)\"")


def published_in_code() -> dict[str, set[str]]:
    """Event kind → the services whose code publishes it (services/<producer>/)."""
    found: dict[str, set[str]] = defaultdict(set)
    for service in (ROOT / "services").iterdir():
        for source in service.rglob("*.py"):
            for kind in EMITS.findall(source.read_text()):
                found[kind].add(service.name)
    # placement publishes the events of job control's decisions (mdq.core.control.Action)
    for kind in CONTROL_EVENT_KINDS:
        found[kind].add("placement")
    return dict(found)


def test_the_producers_are_the_services_that_publish_in_the_code(
    document: dict[str, Any],
) -> None:
    documented: dict[str, set[str]] = defaultdict(set)
    for operation in document["operations"].values():
        if operation["action"] == "send":
            kind = operation["channel"]["$ref"].rsplit("/", 1)[1]
            (tag,) = operation["tags"]
            documented[kind].add(tag["name"])
    assert dict(documented) == published_in_code()
    for kind, services in documented.items():
        producer = document["components"]["schemas"][f"Event.{kind}"]["properties"]["producer"]
        assert set(producer["enum"]) == services, kind


# -- payloads: the JSON Schema of the protobuf JSON mapping ---------------------------------------
def payload_validator(document: dict[str, Any], schema: str) -> jsonschema.Draft7Validator:
    registry: Registry[Any] = Registry().with_resource("urn:mdq", DRAFT7.create_resource(document))
    return jsonschema.Draft7Validator(
        {"$ref": f"urn:mdq#/components/schemas/{schema}"},
        registry=registry,
        format_checker=jsonschema.Draft7Validator.FORMAT_CHECKER,
    )


def _scalar(field: FieldDescriptor) -> Any:
    if field.enum_type is not None:
        return field.enum_type.values[-1].number
    return {
        FieldDescriptor.TYPE_DOUBLE: 2.5,
        FieldDescriptor.TYPE_FLOAT: 0.5,
        FieldDescriptor.TYPE_INT32: -7,
        FieldDescriptor.TYPE_INT64: 9_000_000_000,
        FieldDescriptor.TYPE_BOOL: True,
        FieldDescriptor.TYPE_STRING: "text",
    }[field.type]


def filled(descriptor: Descriptor) -> Message:
    """A message with every field set (the first member of each oneof), recursively."""
    message: Message = getattr(pb, descriptor.name)()
    for field in descriptor.fields:
        oneof = field.containing_oneof
        if oneof is not None and len(oneof.fields) > 1 and oneof.fields[0].name != field.name:
            continue
        target = field.message_type
        if target is not None and target.GetOptions().map_entry:
            getattr(message, field.name)["key"] = _scalar(target.fields_by_name["value"])
        elif target is not None and target.full_name == "google.protobuf.Timestamp":
            getattr(message, field.name).FromSeconds(1_800_000_000)
        elif target is not None:
            child = filled(target)
            if field.is_repeated:
                getattr(message, field.name).add().CopyFrom(child)
            else:
                getattr(message, field.name).CopyFrom(child)
        elif field.is_repeated:
            getattr(message, field.name).append(_scalar(field))
        else:
            setattr(message, field.name, _scalar(field))
    return message


def test_every_message_as_mdq_writes_it_fits_its_schema(document: dict[str, Any]) -> None:
    for name, descriptor in pb.DESCRIPTOR.message_types_by_name.items():
        message = to_dict(filled(descriptor))
        errors = [e.message for e in payload_validator(document, name).iter_errors(message)]
        assert errors == [], (name, message)
    ownership = asyncapi.owners(asyncapi.proto_comments())
    for kind, producers in ownership.items():
        body = filled(getattr(pb.Event(), kind).DESCRIPTOR)
        event = make_event(kind, body, job_id="abc-x", attempt=1, producer=producers[0], at=T0)
        validator = payload_validator(document, f"Event.{kind}")
        assert list(validator.iter_errors(to_dict(event))) == [], kind
        stranger = make_event(kind, body, job_id="abc-x", attempt=1, producer="someone", at=T0)
        assert list(validator.iter_errors(to_dict(stranger))), f"{kind} from anyone"
        other = "progress" if kind != "progress" else "bound"
        mixed = to_dict(event) | {other: {}}
        assert list(validator.iter_errors(mixed)), f"{kind} with a {other} body too"


JOB = {"name": "a", "steps": 1000}
SUBMITS = [  # (case, JSON submit, whether the protobuf JSON mapping accepts it)
    ("minimal", {"jobs": [JOB]}, True),
    ("int64 as a string", {"jobs": [JOB | {"steps": "1000"}]}, True),
    ("int64 not a number", {"jobs": [JOB | {"steps": "many"}]}, False),
    ("int64 with a fraction", {"jobs": [JOB | {"steps": 1.5}]}, False),
    ("int32 out of range", {"jobs": [JOB | {"max_retries": 2**31}]}, False),
    ("enum by name", {"jobs": [JOB | {"task": "TASK_MINIMIZE"}]}, True),
    ("enum by number", {"jobs": [JOB | {"task": 2}]}, True),
    ("unknown enum name", {"jobs": [JOB | {"task": "TASK_NOPE"}]}, False),
    ("one member of a oneof", {"jobs": [JOB | {"system": {"water_box": {"box_nm": 2}}}]}, True),
    (
        "two members of a oneof",
        {"jobs": [JOB | {"system": {"water_box": {}, "lennard_jones": {}}}]},
        False,
    ),
    ("unknown field", {"jobs": [{"nam": "a"}]}, False),
    ("lowerCamelCase JSON name", {"idempotencyKey": "k", "jobs": [JOB]}, True),
    ("a string where a list is", {"jobs": [JOB | {"depends_on": "b"}]}, False),
    ("a number in a string list", {"jobs": [JOB | {"depends_on": [42]}]}, False),
    ("map of strings", {"jobs": [JOB | {"labels": {"team": "md"}}]}, True),
    ("map with a number value", {"jobs": [JOB | {"labels": {"team": 1}}]}, False),
    ("double as a word", {"jobs": [JOB | {"temperature_k": "hot"}]}, False),
]


@pytest.mark.parametrize(
    ("submit", "accepted"), [(s, a) for _, s, a in SUBMITS], ids=[c for c, _, _ in SUBMITS]
)
def test_the_submit_schema_accepts_what_intake_decodes(
    document: dict[str, Any], submit: dict[str, Any], accepted: bool
) -> None:
    try:
        decode_submit(json.dumps(submit).encode())
        decoded = True
    except SpecError:
        decoded = False
    assert decoded is accepted, "the table is wrong about the JSON mapping"
    errors = list(payload_validator(document, "SubmitRequest").iter_errors(submit))
    assert (not errors) is accepted, [e.message for e in errors]
