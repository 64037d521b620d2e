"""The job page's spec as a person reads it (``services.console.app.plain_numbers``): the
protobuf JSON mapping writes 64-bit integers as strings, the page shows numbers. Named
cases. Pure."""

from __future__ import annotations

from typing import Any, cast

from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor

from mdq.contracts import pb
from services.console.app import plain_numbers
from tests.tables import named_cases

JOB_SPEC = cast(Descriptor, pb.JobSpec.DESCRIPTOR)

CASES: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    ("steps", {"name": "a", "steps": "15000"}, {"name": "a", "steps": 15000}),
    (
        "nested-memory",
        {"resources": {"memory_mb": "1024", "cpu": 1.5}},
        {"resources": {"memory_mb": 1024, "cpu": 1.5}},
    ),
    ("32-bit-stay", {"max_retries": 3, "seed": 7}, {"max_retries": 3, "seed": 7}),
    ("label-values-are-text", {"labels": {"run": "12"}}, {"labels": {"run": "12"}}),
    ("name-that-looks-like-a-number", {"name": "123"}, {"name": "123"}),
    ("an-unknown-key-stays", {"future_field": "9"}, {"future_field": "9"}),
    ("a-negative-number", {"steps": "-5"}, {"steps": -5}),
]


@named_cases(("stored", "shown"), CASES)
def test_spec_numbers_are_numbers(stored: dict[str, Any], shown: dict[str, Any]) -> None:
    assert plain_numbers(stored, JOB_SPEC) == shown


def test_a_whole_spec_as_the_mapping_writes_it() -> None:
    spec = pb.JobSpec(
        name="w", steps=20_000, resources=pb.Resources(cpu=1, memory_mb=2048), labels={"a": "1"}
    )
    stored = json_format.MessageToDict(spec, preserving_proto_field_name=True)
    assert stored["steps"] == "20000"
    shown = plain_numbers(stored, JOB_SPEC)
    assert (shown["steps"], shown["resources"]["memory_mb"], shown["labels"]) == (
        20_000,
        2048,
        {"a": "1"},
    )
