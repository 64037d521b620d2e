"""Each node's recent load: the metrics service's summaries of it (``LoadSummaries``, one per
node and interval) and the console's last hour of them (``NodeBoard``), as tables of named
cases."""

from __future__ import annotations

import pytest

from mdq.contracts import pb
from services.console.live import NODE_HISTORY_S, NODE_MAX_POINTS, NodeBoard
from services.metrics.folding import LoadSummaries
from tests.tables import named_cases

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


@named_cases(("rounds", "expected"), SUMMARY_CASES)
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


# -- the console's hour ------------------------------------------------------------------------
class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def summary(node: str, end: float, cpu: float = 0.5, peak: float = 0.75) -> pb.NodeLoadSummary:
    """A one-minute summary of ``node`` ending ``end`` seconds after T0."""
    made = pb.NodeLoadSummary(
        node=node,
        samples=30,
        cpu_load_mean=cpu,
        cpu_load_max=peak,
        memory_load_mean=cpu / 2,
        memory_load_max=peak / 2,
    )
    made.start.FromMilliseconds(int((T0 + end - 60) * 1000))
    made.end.FromMilliseconds(int((T0 + end) * 1000))
    return made


HOUR = int(NODE_HISTORY_S)
# (name, summary ends in the order they arrive, the latest report's time or None, the clock
# while they arrive, the clock when the page is drawn, the times the page shows): all in
# seconds after T0
BOARD_CASES: list[tuple[str, list[float], float | None, float, float, list[float]]] = [
    (
        "the-hour-before-the-page",
        [float(end) for end in range(60, HOUR + 120, 60)],
        None,
        HOUR + 60,
        HOUR + 90,
        [float(end) for end in range(120, HOUR + 120, 60)],
    ),
    ("older-than-the-hour-is-not-kept", [100, 200], None, 3750, 3750, [200]),
    ("aging-out-while-the-console-runs", [100, 200, 300], None, 300, 3850, [300]),
    ("the-latest-report-is-the-last-point", [60, 120], 150, 150, 160, [60, 120, 150]),
    ("a-report-older-than-the-last-summary-is-not", [60, 120], 110, 150, 160, [60, 120]),
    ("a-report-older-than-the-hour-is-not", [], 100, 100, 3750, []),
    ("out-of-order-goes-in-its-place", [60, 180, 120], None, 200, 200, [60, 120, 180]),
    ("the-same-interval-twice-is-one-point", [60, 120, 120, 60], None, 200, 200, [60, 120]),
]


@named_cases(("ends", "latest_at", "arriving", "now", "shown"), BOARD_CASES)
def test_the_consoles_hour_of_a_node(
    ends: list[float], latest_at: float | None, arriving: float, now: float, shown: list[float]
) -> None:
    clock = Clock(T0 + arriving)
    board = NodeBoard(clock=clock)
    for end in ends:
        board.apply_summary(summary("a", end))
    if latest_at is not None:
        board.apply_load(load("a", 0.9, 0.8), T0 + latest_at)
    clock.now = T0 + now
    history = board.history("a")
    assert [t - T0 for t in history.t] == shown
    assert len(history.cpu) == len(history.cpu_max) == len(history.memory) == len(shown)


def test_the_page_gets_mean_and_peak_of_each_point_then_the_latest_report() -> None:
    clock = Clock(T0 + 130)
    board = NodeBoard(clock=clock)
    board.apply_summary(summary("a", 120, cpu=0.5, peak=0.75))
    board.apply_load(load("a", 0.9, 0.8), T0 + 125)
    assert board.history("a").columns() == {
        "t": [T0 + 120, T0 + 125],
        "cpu": [0.5, 0.9],
        "cpu_max": [0.75, 0.9],
        "memory": [0.25, 0.8],
        "memory_max": [0.375, 0.8],
    }
    assert board.history("unknown").columns()["t"] == []


def test_a_node_keeps_at_most_its_share_of_points() -> None:
    """A summary interval far shorter than a minute keeps the newest points only."""
    clock = Clock(T0)
    board = NodeBoard(clock=clock)
    for tenth in range(NODE_MAX_POINTS + 50):
        clock.now = T0 + tenth / 10
        board.apply_summary(summary("a", tenth / 10))
    shown = board.history("a").t
    assert len(shown) == NODE_MAX_POINTS
    assert shown[-1] == T0 + (NODE_MAX_POINTS + 49) / 10
