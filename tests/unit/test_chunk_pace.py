"""The runner's chunk pace: steps per chunk so that a chunk lasts about its target time."""

from __future__ import annotations

import pytest

from services.runner.md import PROBE_STEPS, ChunkPace


@pytest.mark.parametrize(
    ("timed", "max_steps", "expected"),
    [
        pytest.param([], 1000, PROBE_STEPS, id="nothing timed yet: a probe of a few steps"),
        pytest.param([], 4, 4, id="a probe never past the most steps allowed"),
        pytest.param([(10, 0.001)], 1000, 1000, id="a fast system: the most steps allowed"),
        pytest.param([(10, 1.0)], 1000, 20, id="a large system: 0.1 s a step, 2 s a chunk"),
        pytest.param([(10, 50.0)], 1000, 1, id="slower than a chunk a step: one step"),
        pytest.param([(10, 1.0), (20, 0.2)], 1000, 200, id="the latest chunk's speed counts"),
        pytest.param([(10, 0.0)], 1000, 1000, id="too fast to time"),
        pytest.param([(0, 5.0)], 1000, PROBE_STEPS, id="a chunk of no steps tells nothing"),
    ],
)
def test_a_chunk_lasts_about_its_target(
    timed: list[tuple[int, float]], max_steps: int, expected: int
) -> None:
    pace = ChunkPace(target_s=2.0, max_steps=max_steps)
    for steps, seconds in timed:
        pace.observe(steps, seconds)
    assert pace.max_steps() == expected
