"""When an MD run is done: energy convergence and the step target, as tables of named cases."""

from __future__ import annotations

import math

from mdq.core.convergence import ConvergenceTracker, done_reason
from tests.tables import named_cases

NAN = math.nan
INF = math.inf

# (name, tolerance, reports, energies fed in order, what observe() answers for each)
TRACKER_CASES: list[tuple[str, float, int, list[float], list[bool]]] = [
    (
        "zero tolerance disables convergence",
        0.0,
        3,
        [10.0, 10.0, 10.0, 10.0, 10.0],
        [False] * 5,
    ),
    ("negative tolerance disables convergence", -1.0, 1, [5.0, 5.0, 5.0], [False] * 3),
    ("a first report alone never converges", 10.0, 1, [5.0], [False]),
    ("one small change is enough with reports=1", 10.0, 1, [100.0, 105.0], [False, True]),
    (
        "needs `reports` consecutive small changes",
        1.0,
        3,
        [0.0, 0.5, 0.7, 0.9],
        [False, False, False, True],
    ),
    (
        "a large jump resets the streak",
        1.0,
        2,
        [0.0, 0.1, 5.0, 5.1, 5.2],
        [False, False, False, False, True],
    ),
    ("a change equal to the tolerance does not count", 1.0, 1, [0.0, 1.0], [False, False]),
    (
        "energy differences are absolute (falling energy)",
        1.0,
        1,
        [-100.0, -100.5, -103.0],
        [False, True, False],
    ),
    ("stays converged while the energy stays flat", 1.0, 1, [0.0, 0.0, 0.0], [False, True, True]),
    (
        "NaN is never converged and restarts the comparison",
        1.0,
        1,
        [0.0, NAN, 0.1, 0.2],
        [False, False, False, True],
    ),
    (
        "infinity resets a streak in progress",
        1.0,
        2,
        [0.0, 0.1, INF, 0.2, 0.3, 0.4],
        [False, False, False, False, False, True],
    ),
    (
        "large tolerance converges after `reports` + 1 reports",
        1e6,
        2,
        [-4000.0, -3500.0, -3900.0],
        [False, False, True],
    ),
]


@named_cases(("tolerance", "reports", "energies", "expected"), TRACKER_CASES)
def test_convergence_tracker(
    tolerance: float, reports: int, energies: list[float], expected: list[bool]
) -> None:
    tracker = ConvergenceTracker(tolerance=tolerance, reports=reports)
    assert [tracker.observe(energy) for energy in energies] == expected


# (name, step, target_steps, converged, reason)
DONE_CASES: list[tuple[str, int, int, bool, str]] = [
    ("below the target and not converged goes on", 500, 1000, False, ""),
    ("converged before the target stops early", 500, 1000, True, "converged"),
    ("reaching the target stops", 1000, 1000, False, "steps_reached"),
    ("past the target (resumed beyond it) stops", 1200, 1000, False, "steps_reached"),
    ("the target wins over convergence at the same report", 1000, 1000, True, "steps_reached"),
    ("step zero of a one-step job goes on", 0, 1, False, ""),
]


@named_cases(("step", "target_steps", "converged", "reason"), DONE_CASES)
def test_done_reason(step: int, target_steps: int, converged: bool, reason: str) -> None:
    assert done_reason(step=step, target_steps=target_steps, converged=converged) == reason
