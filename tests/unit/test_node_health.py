"""Node health: when failures of different jobs cordon a node, as tables of named cases."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from mdq.contracts import pb
from mdq.core.node_health import NodeHealth, NodeHealthPolicy

T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
CRASH, LOST, OOM, UNSTABLE = (
    pb.FAILURE_CRASHED,
    pb.FAILURE_LOST,
    pb.FAILURE_OOM_KILLED,
    pb.FAILURE_UNSTABLE,
)

# (name, failures as (seconds after T0, node, job, reason), node asked, seconds after T0, cordoned)
CASES = [
    (
        "three jobs crash on one node",
        [(0, "n1", "a", CRASH), (10, "n1", "b", CRASH), (20, "n1", "c", LOST)],
        "n1",
        30,
        True,
    ),
    (
        "the cordon lapses",
        [(0, "n1", "a", CRASH), (10, "n1", "b", CRASH), (20, "n1", "c", CRASH)],
        "n1",
        20 + 301,
        False,
    ),
    (
        "one job crashing three times is the job",
        [(0, "n1", "a", CRASH), (10, "n1", "a", CRASH), (20, "n1", "a", CRASH)],
        "n1",
        30,
        False,
    ),
    (
        "failures spread over nodes",
        [(0, "n1", "a", CRASH), (10, "n2", "b", CRASH), (20, "n1", "c", CRASH)],
        "n1",
        30,
        False,
    ),
    (
        "old failures fall out of the window",
        [(0, "n1", "a", CRASH), (10, "n1", "b", CRASH), (700, "n1", "c", CRASH)],
        "n1",
        710,
        False,
    ),
    (
        "OOM and NaN are the jobs' fault",
        [(0, "n1", "a", OOM), (10, "n1", "b", UNSTABLE), (20, "n1", "c", CRASH)],
        "n1",
        30,
        False,
    ),
    (
        "other nodes are unaffected",
        [(0, "n1", "a", CRASH), (10, "n1", "b", CRASH), (20, "n1", "c", CRASH)],
        "n2",
        30,
        False,
    ),
]


@pytest.mark.parametrize(
    ("name", "failures", "node", "at", "cordoned"), CASES, ids=[c[0] for c in CASES]
)
def test_cordon(
    name: str, failures: list[tuple[int, str, str, int]], node: str, at: int, cordoned: bool
) -> None:
    health = NodeHealth(policy=NodeHealthPolicy())
    for seconds, where, job, reason in failures:
        health.record(node=where, job_id=job, reason=reason, at=T0 + timedelta(seconds=seconds))  # type: ignore[arg-type]
    assert health.cordoned(node, T0 + timedelta(seconds=at)) is cordoned


def test_disabled_policy_never_cordons() -> None:
    health = NodeHealth(policy=NodeHealthPolicy(failures_to_cordon=0))
    for job in "abcdef":
        health.record(node="n1", job_id=job, reason=CRASH, at=T0)
    assert health.cordons(T0) == {}
