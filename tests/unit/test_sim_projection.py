"""Pure parts of the history export and of the validation: the projection of rows into a
workload, and the start-order discordance (named cases)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from mdq.sim.history import DEFAULT_DOWN_S, HistoryOptions, project
from tools.sim_validation import discordance

T0 = datetime(2026, 12, 1, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def job(job_id: str, submitted: float, **extra: Any) -> dict[str, Any]:
    return {
        "job_id": job_id,
        "submitted_at": at(submitted),
        "spec": {"name": job_id, "steps": "1000", "resources": {"cpu": 1, "memoryMb": 512}},
        "depends_on": [],
        "priority_class": "normal",
        "target_steps": 1000,
        **extra,
    }


def attempt(
    job_id: str,
    number: int,
    node: str,
    bound: float,
    start: float,
    end: float,
    failure: str = "",
    resumed: int = 0,
    last: int = 1000,
) -> dict[str, Any]:
    return {
        "job_id": job_id,
        "attempt": number,
        "node": node,
        "bound_at": at(bound),
        "started_at": at(start),
        "ended_at": at(end),
        "failure_reason": failure or None,
        "resumed_from_step": resumed,
        "last_step": last,
        "peak_memory_mb": None,
        "mean_cores": None,
    }


def test_a_lost_node_is_down_until_its_next_attempt_there() -> None:
    workload = project(
        [job("a", 0.0), job("b", 5.0, depends_on=["a", "gone"])],
        [
            attempt("a", 1, "n1", 0.0, 2.0, 12.0, "FAILURE_NODE_LOST", last=300),
            attempt("a", 2, "n2", 12.0, 14.0, 24.0, resumed=0),
            attempt("b", 1, "n1", 40.0, 42.0, 52.0),
            attempt("b", 0, "n3", 1.0, 1.0, 1.0, "FAILURE_NODE_LOST", last=0),
        ],
        HistoryOptions(extra_nodes=1),
    )
    a, b = workload.jobs
    assert a.steps_per_s == pytest.approx(100.0)  # 1000 steps in 10 s, its successful attempt
    assert b.depends_on == ("a",)  # a dependency outside the window is dropped
    assert b.peak_memory_mb == 256.0  # unmeasured: half its request
    outages = {(o.node, o.at_s, o.down_s) for o in workload.outages}
    assert outages == {("n1", 12.0, 30.0), ("n3", 1.0, DEFAULT_DOWN_S)}
    assert [node.name for node in workload.nodes] == ["n1", "n2", "n3", "extra-0"]
    assert workload.notes["start_delay_s"] == "2.000"


def test_a_job_never_measured_gets_the_default_speed() -> None:
    workload = project([job("a", 0.0)], [attempt("a", 1, "n1", 0, 1, 1)], HistoryOptions())
    assert workload.jobs[0].steps_per_s == 100.0
    assert workload.notes["jobs_without_measured_speed"] == "1"


@pytest.mark.parametrize(
    "real, simulated, expected",
    [
        ({"a": 0.0, "b": 5.0, "c": 9.0}, {"a": 0.0, "b": 4.0, "c": 8.0}, 0.0),
        ({"a": 0.0, "b": 5.0, "c": 9.0}, {"a": 9.0, "b": 4.0, "c": 0.0}, 1.0),
        ({"a": 0.0, "b": 5.0, "c": 9.0}, {"a": 0.0, "b": 9.0, "c": 5.0}, 1 / 3),
        ({"a": 0.0, "b": 0.5, "c": 9.0}, {"a": 0.5, "b": 0.0, "c": 9.0}, 0.0),
        ({"a": 0.0, "b": 0.5}, {"a": 1.0, "b": 0.0}, 0.0),
    ],
    ids=["same order", "reversed", "one pair swapped", "ties within a second", "no pair"],
)
def test_discordance(real: dict[str, float], simulated: dict[str, float], expected: float) -> None:
    assert discordance(real, simulated) == pytest.approx(expected)
