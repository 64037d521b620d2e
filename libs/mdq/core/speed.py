"""How fast an MD job runs, from its progress reports (pure).

A runner reports ``Progress.ns_per_day`` as the speed since its attempt started stepping:
an average that climbs for a long while after the start (setting up, the first steps) and
hides a slow-down later. What a chart of a running job shows is the speed over the interval
since the report before: the simulated time between two reports over the wall time between
them. The metrics service, the runner's own endpoint and the console compute it so
(``interval_ns_per_day``; the console's charts in services/console/static/console.js).
"""

from __future__ import annotations

SECONDS_PER_DAY = 86_400.0


def interval_ns_per_day(
    *, time_ps: float, at_s: float, previous_time_ps: float, previous_at_s: float
) -> float | None:
    """ns/day simulated between two progress reports of one attempt (their simulated time in
    ps, and their wall times in seconds); None when no simulated time or no wall time passed
    between them (a minimisation, an analysis, two reports in one clock tick)."""
    simulated_ns = (time_ps - previous_time_ps) / 1000.0
    elapsed_s = at_s - previous_at_s
    if simulated_ns <= 0 or elapsed_s <= 0:
        return None
    return simulated_ns / elapsed_s * SECONDS_PER_DAY
