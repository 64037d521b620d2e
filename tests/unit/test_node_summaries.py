"""Each node's recent load: the metrics service's summaries of it (``LoadSummaries``, one per
node and interval), as tables of named cases."""

from __future__ import annotations

import pytest

from mdq.contracts import pb
from services.metrics.folding import LoadSummaries

T0 = 1_764_417_600.0
"""A whole hour since the epoch (2025-11-29 12:00 UTC)."""

Round = tuple[float, dict[str, tuple[float, float]]]
"""(seconds after T0, {node: (cpu load, memory load)}): one sampling round."""
Summary = tuple[str, float, float, int, float, float, float, float]
"""(node, start and end in seconds after T0, samples, CPU mean and peak, memory mean and
peak)."""

SUMMARY_CASES: list[tuple[str, list[Round], list[Summary]]] = [
    (
        "the-open-interval-gives-nothing",
        [(0, {"a": (0.2, 0.1)}), (2, {"a": (0.4, 0.1)}), (58, {"a": (0.6, 0.1)})],
        [],
    ),
    (
        "the-next-interval-closes-it-with-mean-and-peak",
        [(0, {"a": (0.2, 0.5)}), (30, {"a": (0.6, 0.25)}), (60, {"a": (0.9, 0.9)})],
        [("a", 0, 60, 2, 0.4, 0.6, 0.375, 0.5)],
    ),
    (
        "each-node-its-own-in-name-order",
        [(1, {"b": (0.5, 0.5), "a": (0.1, 0.2)}), (61, {"a": (0.0, 0.0)})],
        [("a", 0, 60, 1, 0.1, 0.1, 0.2, 0.2), ("b", 0, 60, 1, 0.5, 0.5, 0.5, 0.5)],
    ),
    (
        "a-node-not-sampled-in-an-interval-has-no-summary-of-it",
        [
            (0, {"a": (0.1, 0.1)}),
            (60, {"a": (0.2, 0.2), "b": (0.3, 0.3)}),
            (120, {"a": (0.0, 0.0)}),
        ],
        [
            ("a", 0, 60, 1, 0.1, 0.1, 0.1, 0.1),
            ("a", 60, 120, 1, 0.2, 0.2, 0.2, 0.2),
            ("b", 60, 120, 1, 0.3, 0.3, 0.3, 0.3),
        ],
    ),
    (
        "a-gap-in-sampling-leaves-no-empty-summaries",
        [(10, {"a": (0.4, 0.4)}), (185, {"a": (0.8, 0.8)})],
        [("a", 0, 60, 1, 0.4, 0.4, 0.4, 0.4)],
    ),
    (
        "started-mid-interval-it-summarises-what-it-saw-on-the-minute",
        [(45, {"a": (0.3, 0.7)}), (47, {"a": (0.5, 0.1)}), (60.5, {"a": (0.0, 0.0)})],
        [("a", 0, 60, 2, 0.4, 0.5, 0.4, 0.7)],
    ),
    (
        "the-peak-is-the-highest-sample-not-the-last",
        [(0, {"a": (0.9, 0.05)}), (1, {"a": (0.1, 0.25)}), (60, {"a": (0.0, 0.0)})],
        [("a", 0, 60, 2, 0.5, 0.9, 0.15, 0.25)],
    ),
]


def load(node: str, cpu: float, memory: float) -> pb.NodeLoad:
    return pb.NodeLoad(node=node, cpu_load=cpu, memory_load=memory, cluster="lab")


def as_row(summary: pb.NodeLoadSummary) -> Summary:
    return (
        summary.node,
        summary.start.ToMilliseconds() / 1000 - T0,
        summary.end.ToMilliseconds() / 1000 - T0,
        summary.samples,
        round(summary.cpu_load_mean, 9),
        summary.cpu_load_max,
        round(summary.memory_load_mean, 9),
        summary.memory_load_max,
    )


@pytest.mark.parametrize(
    ("rounds", "expected"),
    [case[1:] for case in SUMMARY_CASES],
    ids=[case[0] for case in SUMMARY_CASES],
)
def test_load_summaries(rounds: list[Round], expected: list[Summary]) -> None:
    summaries = LoadSummaries(60.0)
    closed: list[pb.NodeLoadSummary] = []
    for seconds, loads in rounds:
        taken = [load(node, cpu, memory) for node, (cpu, memory) in loads.items()]
        closed += summaries.add(taken, T0 + seconds)
    assert [as_row(summary) for summary in closed] == expected
    assert {summary.cluster for summary in closed} <= {"lab"}


def test_intervals_line_up_on_whole_multiples_of_their_length() -> None:
    """Whenever a metrics process started, its intervals are every other one's."""
    summaries = LoadSummaries(0.25)
    summaries.add([load("a", 0.5, 0.5)], T0 + 0.3)
    [summary] = summaries.add([load("a", 0.5, 0.5)], T0 + 0.6)
    assert (summary.start.ToMilliseconds(), summary.end.ToMilliseconds()) == (
        int(T0 * 1000) + 250,
        int(T0 * 1000) + 500,
    )


def test_an_interval_must_be_positive() -> None:
    with pytest.raises(ValueError, match="interval_s"):
        LoadSummaries(0)
