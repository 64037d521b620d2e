"""A local pod's removal, read by a watch that last saw the pod as ``last_seen``: a table of
named cases of what the watch reports (``mdq.backends.local.api.removal_update``)."""

from __future__ import annotations

import pytest

from mdq.backends.local.api import removal_update
from mdq.backends.port import PodUpdate
from mdq.contracts import pb


def seen(phase: pb.PodPhase, exit_code: int = 0, reason: str = "") -> PodUpdate:
    return PodUpdate("mdq-j-1", "j", 1, "n1", phase, exit_code, reason)


CASES: dict[str, tuple[PodUpdate | None, tuple[pb.PodPhase, str] | None]] = {
    "never seen: nothing to end": (None, None),
    "seen running, its end overwritten by the removal": (
        seen(pb.POD_RUNNING),
        (pb.POD_FAILED, "Deleted"),
    ),
    "seen pending, deleted before it started": (seen(pb.POD_PENDING), (pb.POD_FAILED, "Deleted")),
    "its success was seen: the removal says nothing": (seen(pb.POD_SUCCEEDED), None),
    "its failure was seen: the removal says nothing": (
        seen(pb.POD_FAILED, 137, "OOMKilled"),
        None,
    ),
}


@pytest.mark.parametrize(("last_seen", "expected"), CASES.values(), ids=CASES.keys())
def test_a_removal_ends_a_pod_only_when_its_end_was_not_seen(
    last_seen: PodUpdate | None, expected: tuple[pb.PodPhase, str] | None
) -> None:
    update = removal_update(last_seen)
    if expected is None:
        assert update is None
        return
    assert update is not None and last_seen is not None
    assert (update.phase, update.reason) == expected
    assert (update.pod_name, update.job_id, update.attempt, update.node) == (
        last_seen.pod_name,
        last_seen.job_id,
        last_seen.attempt,
        last_seen.node,
    )
