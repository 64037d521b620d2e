"""When is an MD run done: the step target, or energy convergence (pure)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass(slots=True)
class ConvergenceTracker:
    """Energy convergence: |ΔE| below ``tolerance`` for ``reports`` consecutive reports.

    ``tolerance <= 0`` disables it. Feed it the potential energy of every progress report.
    """

    tolerance: float
    reports: int
    _previous: float | None = field(default=None, init=False)
    _streak: int = field(default=0, init=False)

    def observe(self, energy: float) -> bool:
        """Record one report; return True once the energy has converged."""
        if self.tolerance <= 0 or not math.isfinite(energy):
            self._previous = energy if math.isfinite(energy) else None
            self._streak = 0
            return False
        if self._previous is not None and abs(energy - self._previous) < self.tolerance:
            self._streak += 1
        else:
            self._streak = 0
        self._previous = energy
        return self._streak >= self.reports


def done_reason(*, step: int, target_steps: int, converged: bool) -> str:
    """Why a run stops now ("steps_reached" or "converged"), or "" if it goes on."""
    if step >= target_steps:
        return "steps_reached"
    if converged:
        return "converged"
    return ""
