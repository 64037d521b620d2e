"""NULs in protobuf strings (``mdq.core.text``): found with their field path, scrubbed at any
depth (plain, repeated, map keys and values, nested messages)."""

from __future__ import annotations

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
