"""The watcher's silence clock: seconds since a job's latest sign of life was first seen."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from services.watcher.silence import Sign, SilenceClock

T0 = datetime(2026, 1, 1, tzinfo=UTC)
FIRST = Sign(attempt=1, step=100, stamped_at=T0)


@pytest.mark.parametrize(
    ("later", "at", "silent_s"),
    [
        pytest.param(FIRST, 107.0, 7.0, id="the same sign: silent since it was first seen"),
        pytest.param(Sign(1, 200, T0 + timedelta(seconds=5)), 107.0, 0.0, id="a new report"),
        pytest.param(Sign(1, 100, T0 + timedelta(seconds=5)), 107.0, 0.0, id="same step, new time"),
        pytest.param(Sign(1, 200, T0), 107.0, 0.0, id="new step, a frozen runner clock"),
        pytest.param(Sign(2, 100, T0), 107.0, 0.0, id="a new attempt"),
        pytest.param(
            Sign(1, 100, T0 - timedelta(minutes=10)), 107.0, 0.0, id="stamped in the past"
        ),
    ],
)
def test_silence_counts_from_the_first_sight_of_each_sign(
    later: Sign, at: float, silent_s: float
) -> None:
    clock = SilenceClock()
    assert clock.silent_for("j", FIRST, 100.0) == 0.0
    assert clock.silent_for("j", later, at) == silent_s


def test_a_job_forgotten_starts_a_new_window() -> None:
    clock = SilenceClock()
    clock.silent_for("j", FIRST, 100.0)
    clock.silent_for("k", FIRST, 100.0)
    clock.forget_all_but({"k"})
    assert clock.silent_for("j", FIRST, 150.0) == 0.0
    assert clock.silent_for("k", FIRST, 150.0) == 50.0
