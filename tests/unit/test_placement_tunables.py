"""Placement's tunables have one source, the pure core's ``PlacementConfig``: the service's
settings take their defaults from it and hand every tunable they hold back to it."""

from __future__ import annotations

from dataclasses import fields

import pytest

from mdq.core.placement import PlacementConfig
from services.placement.settings import TUNABLES, PlacementSettings


def test_the_defaults_are_the_cores() -> None:
    assert PlacementSettings().placement_config() == PlacementConfig()


@pytest.mark.parametrize("name", sorted(TUNABLES & set(PlacementSettings.model_fields)), ids=str)
def test_each_tunable_the_settings_hold_reaches_the_core(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    default = getattr(PlacementConfig(), name)
    changed = default + 1 if isinstance(default, int) else default / 2 + 0.01
    monkeypatch.setenv(f"MDQ_PLACEMENT_{name.upper()}", str(changed))
    config = PlacementSettings().placement_config()
    assert getattr(config, name) == pytest.approx(changed)
    others = {f.name for f in fields(PlacementConfig)} - {name}
    assert all(getattr(config, other) == getattr(PlacementConfig(), other) for other in others)
