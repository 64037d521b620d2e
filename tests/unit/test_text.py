"""NULs in protobuf strings (``mdq.core.text``): found with their field path, scrubbed at any
depth (plain, repeated, map keys and values, nested messages)."""

from __future__ import annotations

import pytest
from google.protobuf import descriptor_pb2, struct_pb2, timestamp_pb2
from google.protobuf.message import Message

from mdq.contracts import pb
from mdq.core.text import REPLACEMENT, first_nul, scrub_nul


def dirty() -> pb.Event:
    spec = pb.JobSpec(name="md", depends_on=["ok", "b\x00d"], labels={"k\x00": "v", "t": "x\x00"})
    return pb.Event(
        event_id="e", job_id="j", submitted=pb.JobSubmitted(spec=spec, submitted_by="a\x00")
    )


def test_the_first_nul_is_named_by_its_path() -> None:
    assert first_nul(dirty()) == "submitted.spec.depends_on[1]"
    assert first_nul(pb.Event(event_id="clean", submitted=pb.JobSubmitted())) is None


def test_every_nul_is_scrubbed() -> None:
    event = dirty()
    assert scrub_nul(event)
    spec = event.submitted.spec
    assert list(spec.depends_on) == ["ok", f"b{REPLACEMENT}d"]
    assert dict(spec.labels) == {f"k{REPLACEMENT}": "v", "t": f"x{REPLACEMENT}"}
    assert event.submitted.submitted_by == f"a{REPLACEMENT}"
    assert first_nul(event) is None
    assert not scrub_nul(event)  # nothing left to change


def struct(**fields: struct_pb2.Value) -> struct_pb2.Struct:
    return struct_pb2.Struct(fields=fields)


# (message, path of its first NUL): every kind of field, at depth; the first in field-number
# order (not the order the message was built in) wins
FIRST_NUL_CASES = [
    pytest.param(pb.SubmitRequest(submitted_by="a\x00"), "submitted_by", id="plain-string"),
    pytest.param(
        pb.SubmitRequest(jobs=[pb.JobSpec(), pb.JobSpec(depends_on=["a", "b", "c\x00"])]),
        "jobs[1].depends_on[2]",
        id="repeated-string-in-a-repeated-message",
    ),
    pytest.param(
        pb.SubmitRequest(jobs=[pb.JobSpec(labels={"k": "v\x00"})]),
        "jobs[0].labels['k']",
        id="map-value",
    ),
    pytest.param(
        pb.SubmitRequest(jobs=[pb.JobSpec(labels={"k\x00": "v"})]),
        "jobs[0].labels['k\\x00']",
        id="map-key",
    ),
    pytest.param(
        pb.SubmitRequest(
            jobs=[
                pb.JobSpec(
                    resources=pb.Resources(cpu=2),
                    system=pb.System(structure=pb.Structure(force_fields=["a.xml", "b\x00"])),
                )
            ]
        ),
        "jobs[0].system.structure.force_fields[1]",
        id="repeated-string-in-a-oneof-message",
    ),
    pytest.param(
        pb.SubmitRequest(
            jobs=[pb.JobSpec(labels={"k": "\x00"}, depends_on=["\x00"], name="a\x00")],
            idempotency_key="\x00",
        ),
        "idempotency_key",
        id="field-number-order",
    ),
    pytest.param(
        pb.SubmitRequest(jobs=[pb.JobSpec(labels={"k": "\x00"}, depends_on=["\x00"])]),
        "jobs[0].depends_on[0]",
        id="field-number-order-in-a-nested-message",
    ),
    pytest.param(
        pb.Event(bound=pb.JobBound(filtered_counts={"ok": 1, "n\x00": 2})),
        "bound.filtered_counts['n\\x00']",
        id="map-key-with-number-values",
    ),
    pytest.param(
        pb.Event(
            time=timestamp_pb2.Timestamp(seconds=5),
            bound=pb.JobBound(
                resources=pb.Resources(cpu=1),
                candidates=[pb.NodeScore(node="a"), pb.NodeScore(node="b", filtered="x\x00")],
            ),
        ),
        "bound.candidates[1].filtered",
        id="past-messages-without-strings",
    ),
    pytest.param(
        struct(
            a=struct_pb2.Value(
                list_value=struct_pb2.ListValue(
                    values=[
                        struct_pb2.Value(number_value=1),
                        struct_pb2.Value(
                            struct_value=struct(x=struct_pb2.Value(string_value="y\x00"))
                        ),
                    ]
                )
            )
        ),
        "fields['a'].list_value.values[1].struct_value.fields['x'].string_value",
        id="message-map-values-of-a-recursive-type",
    ),
    pytest.param(
        struct(**{"k\x00": struct_pb2.Value(number_value=1)}),
        "fields['k\\x00']",
        id="map-key-with-message-values",
    ),
    pytest.param(
        descriptor_pb2.FileDescriptorProto(
            message_type=[
                descriptor_pb2.DescriptorProto(
                    name="M", field=[descriptor_pb2.FieldDescriptorProto(name="f\x00")]
                )
            ],
            options=descriptor_pb2.FileOptions(java_package="p\x00"),
        ),
        "message_type[0].field[0].name",
        id="proto2-with-extension-ranges",
    ),
    pytest.param(
        descriptor_pb2.FileDescriptorProto(
            options=descriptor_pb2.FileOptions(java_package="p\x00")
        ),
        "options.java_package",
        id="proto2-options",
    ),
    pytest.param(
        pb.Event(event_id="e", time=timestamp_pb2.Timestamp(seconds=5), bound=pb.JobBound()),
        None,
        id="none",
    ),
]


@pytest.mark.parametrize(("message", "path"), FIRST_NUL_CASES)
def test_first_nul_paths(message: Message, path: str | None) -> None:
    assert first_nul(message) == path
    assert first_nul(message, "top") == (None if path is None else f"top.{path}")


def test_nuls_are_scrubbed_in_map_keys_and_message_map_values() -> None:
    message = struct(
        **{
            "k\x00": struct_pb2.Value(string_value="v\x00"),
            "n": struct_pb2.Value(struct_value=struct(x=struct_pb2.Value(string_value="\x00"))),
        }
    )
    assert scrub_nul(message)
    assert message == struct(
        **{
            f"k{REPLACEMENT}": struct_pb2.Value(string_value=f"v{REPLACEMENT}"),
            "n": struct_pb2.Value(
                struct_value=struct(x=struct_pb2.Value(string_value=REPLACEMENT))
            ),
        }
    )
    event = pb.Event(bound=pb.JobBound(filtered_counts={"n\x00": 2}, resources=pb.Resources(cpu=1)))
    assert scrub_nul(event)
    assert dict(event.bound.filtered_counts) == {f"n{REPLACEMENT}": 2}
    assert not scrub_nul(event)
