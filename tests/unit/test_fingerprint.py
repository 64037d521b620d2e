"""Tables of named cases for the content of a submit (``mdq.core.fingerprint``): which
resubmits under a key are the same content, and how a changed one is described. Pure."""

from __future__ import annotations

import pytest

from mdq.bus.codec import decode_submit
from mdq.contracts import pb
from mdq.core.fingerprint import MAX_CHANGES_SHOWN, Earlier, changes, content_of

FIRST = (
    b'{"idempotency_key": "k", "submitted_by": "alice", "jobs": [{"name": "md", "steps": 1000}]}'
)


def content(data: bytes | pb.SubmitRequest) -> bytes | None:
    request = data if isinstance(data, pb.SubmitRequest) else decode_submit(data)
    return content_of(request).fingerprint


def earlier_of(data: bytes) -> Earlier:
    """The first submit as intake sees it again: names, normalized specs, submitter."""
    first = content_of(decode_submit(data))
    return Earlier(
        names=[job.name for job in first.jobs],
        specs=list(first.jobs),
        submitted_by=first.submitted_by,
    )


SAME = {
    "the same bytes": FIRST,
    "another key": FIRST.replace(b'"k"', b'"other"'),
    "camelCase and a string for an int64": (
        b'{"idempotencyKey": "k", "submittedBy": "alice", '
        b'"jobs": [{"name": "md", "steps": "1000"}]}'
    ),
    "defaults written out": (
        b'{"idempotency_key": "k", "submitted_by": "alice", "jobs": [{"name": "md", '
        b'"steps": 1000, "temperature_k": 300, "task": "TASK_MD", "max_retries": 3, '
        b'"system": {"water_box": {"box_nm": 2}}, "resources": {"cpu": 1, "memory_mb": 1024}}]}'
    ),
    "protobuf binary": pb.SubmitRequest(
        idempotency_key="k", submitted_by="alice", jobs=[pb.JobSpec(name="md", steps=1000)]
    ),
}


@pytest.mark.parametrize("case", list(SAME))
def test_the_same_content_has_the_same_fingerprint(case: str) -> None:
    fingerprint = content(SAME[case])  # type: ignore[arg-type]
    assert fingerprint is not None and fingerprint == content(FIRST)


def test_labels_in_another_order_are_the_same_content() -> None:
    one = b'{"jobs": [{"name": "a", "labels": {"x": "1", "y": "2"}}]}'
    other = b'{"jobs": [{"name": "a", "labels": {"y": "2", "x": "1"}}]}'
    assert content(one) == content(other)


# (the later submit, fragments the description must hold, fragments it must not)
CHANGED = {
    "more steps": (FIRST.replace(b"1000", b"9000"), ["jobs[0].steps: 1000 → 9000"], ["name"]),
    "another temperature": (
        FIRST.replace(b'"steps": 1000', b'"steps": 1000, "temperature_k": 350'),
        ["jobs[0].temperature_k: 300 → 350"],
        ["steps"],
    ),
    "another name": (FIRST.replace(b'"md"', b'"eq"'), ["jobs[0].name: 'md' → 'eq'"], []),
    "one more job": (
        FIRST.replace(b"}]}", b'}, {"name": "x"}]}'),
        ["jobs: 1 → 2 jobs"],
        ["jobs[0]"],
    ),
    "another submitter": (
        FIRST.replace(b"alice", b"bob"),
        ["submitted_by: 'alice' → 'bob'"],
        ["jobs"],
    ),
    "a label added": (
        FIRST.replace(b'"steps": 1000', b'"steps": 1000, "labels": {"team": "md"}'),
        ["jobs[0].labels['team']: (none) → 'md'"],
        [],
    ),
    "another task, by its enum name": (
        FIRST.replace(b'"steps": 1000', b'"steps": 1000, "task": "TASK_MINIMIZE"'),
        ["jobs[0].task: TASK_MD → TASK_MINIMIZE"],
        [],
    ),
    "another system": (
        FIRST.replace(b'"steps": 1000', b'"steps": 1000, "system": {"lennard_jones": {}}'),
        ["jobs[0].system.water_box: set → (unset)", "jobs[0].system.lennard_jones: (unset) → set"],
        [],
    ),
    "dependencies added": (
        FIRST.replace(b"}]}", b', "depends_on": ["prep"]}]}'),
        ["jobs[0].depends_on: [] → ['prep']"],
        [],
    ),
    "a value that does not validate, compared as sent": (
        FIRST.replace(b"1000", b"-5"),
        ["jobs[0].steps: 1000 → -5"],
        ["temperature_k", "resources"],  # unset fields mean their defaults, not zero
    ),
}


@pytest.mark.parametrize("case", list(CHANGED))
def test_a_change_is_named(case: str) -> None:
    later, present, absent = CHANGED[case]
    request = decode_submit(later)
    if "does not validate" not in case:
        assert content(later) != content(FIRST)
    else:
        assert content(later) is None  # no accepted submit has that content
    described = "; ".join(changes(earlier_of(FIRST), content_of(request)))
    for fragment in present:
        assert fragment in described, described
    for fragment in absent:
        assert fragment not in described, described


def test_many_changes_are_cut_short() -> None:
    later = FIRST.replace(
        b'"steps": 1000',
        b'"steps": 2, "temperature_k": 310, "timestep_fs": 1, "friction_per_ps": 2, '
        b'"priority_class": "high", "max_retries": 5, "seed": 7',
    )
    described = changes(earlier_of(FIRST), content_of(decode_submit(later)))
    assert len(described) == MAX_CHANGES_SHOWN + 1
    assert described[-1].startswith("and ") and described[-1].endswith(" more")


def test_without_the_first_submit_s_events_only_names_are_compared() -> None:
    earlier = Earlier(names=["md"], specs=[None], submitted_by=None)
    assert changes(earlier, content_of(decode_submit(FIRST.replace(b"1000", b"9000")))) == []
    renamed = content_of(decode_submit(FIRST.replace(b'"md"', b'"eq"')))
    assert changes(earlier, renamed) == ["jobs[0].name: 'md' → 'eq'"]
