"""Texts of ``mdq watch``'s progress bars (``mdq.cli.live``), as tables of named cases."""

from __future__ import annotations

import pytest

from mdq.cli.live import format_energy, format_eta, steps_text

STEPS_CASES = {
    "under way": (1500, 5000.0, ("1500/5000", 5000.0)),
    "done": (5000, 5000.0, ("5000/5000", 5000.0)),
    "no target known yet": (0, None, ("0", None)),
    "minimisation past its per-round limit": (614, 200.0, ("614 it", 614.0)),
}


@pytest.mark.parametrize(
    ("step", "target", "expected"), STEPS_CASES.values(), ids=STEPS_CASES.keys()
)
def test_steps_text(step: int, target: float | None, expected: tuple[str, float | None]) -> None:
    assert steps_text(step, target) == expected


def test_format_eta_is_hours_minutes_seconds() -> None:
    assert format_eta(3725.4) == "1:02:05"


def test_energies_carry_their_unit() -> None:
    assert format_energy(-1234.56) == "-1,234.6 kJ/mol"
    assert format_energy(-1234.56, "lj") == "-1,234.6 ε (lj)"  # LAMMPS reduced units
    assert format_energy(None, "lj") == "-"
