"""Named scheduler configurations a simulation compares (docs/simulate.md, "Configurations").

Each is a ``PlacementConfig`` and a ``RecoveryPolicy`` of the production core plus the
switches placement's settings hold (priorities, preemption, fair share and its reclaims,
learned requests) and what the simulator itself assumes (pass interval, pod start-up, the
stop grace of a preempted runner).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from mdq.core.placement import PlacementConfig
from mdq.core.recovery import RecoveryPolicy


@dataclass(frozen=True, slots=True)
class SimConfig:
    """One scheduler configuration under simulation."""

    name: str
    placement: PlacementConfig = PlacementConfig()
    recovery: RecoveryPolicy = RecoveryPolicy()
    priorities: bool = True
    """Priority classes and aging order the queue; False: arrival order (FIFO, backfilling)."""
    preemption: bool = False
    """A higher class that fits nowhere stops lower-class work (``plan_preemptions``)."""
    fair_share: bool = False
    """Weighted dominant-resource fair order between tenants (``mdq.core.fairshare``)."""
    fair_share_reclaim: bool = False
    """With fair share: stop over-share tenants' work for under-share ones
    (``plan_fair_reclaims``)."""
    weights: Mapping[str, float] = field(default_factory=dict)
    """Tenants' fair-share weights (1 when not listed)."""
    learned_requests: bool = False
    """Every job's requests come from ``mdq.core.recommend`` over the attempts finished so far."""
    sees_live_load: bool = True
    """Placement is told each node's live load; False: only its reservations (load-blind)."""
    pass_interval_s: float = 5.0
    """Placement passes happen on this grid, when something changed since the last one."""
    start_delay_s: float = 2.0
    """From a binding to the runner stepping (pod creation, imports, system set-up)."""
    stop_grace_s: float = 5.0
    """From a preemption's decision to its victim's exit (it checkpoints on SIGTERM)."""
    preemption_timeout_s: float = 60.0
    """How long room stays held on a node for the job that preempted there."""
    fair_share_min_run_s: float = 120.0
    """Work younger than this is never reclaimed for fair share."""
    queue_window: int = 256
    """Queued jobs of each tenant handed to one pass, head of its queue first."""
    history_limit: int = 200
    """Most recent attempts per kind of job that learned requests read (intake's bound)."""


BINPACK = PlacementConfig(target_load=0.95, overload_penalty=0.0, hard_load_threshold=10.0)
"""Packing nodes up to 95 % of their reservations, blind to live load."""


def presets(weights: Mapping[str, float] | None = None) -> dict[str, SimConfig]:
    """The configurations ``mdq simulate`` knows by name."""
    weights = dict(weights or {})
    return {
        "fifo": SimConfig(
            "fifo", placement=PlacementConfig(aging_per_minute=0.0), priorities=False
        ),
        "priority": SimConfig("priority", preemption=True),
        "load-aware": SimConfig("load-aware"),
        "binpack": SimConfig("binpack", placement=BINPACK, sees_live_load=False),
        "fair-share": SimConfig(
            "fair-share", fair_share=True, fair_share_reclaim=True, weights=weights
        ),
        "learned": SimConfig("learned", learned_requests=True),
    }


def _tunable(name: str, key: str, value: str) -> float | int:
    """A placement tunable's override: a finite number, not negative, whole where the tunable
    counts something. Raises ValueError naming the tunable."""
    if key not in PlacementConfig.__dataclass_fields__:
        raise ValueError(f"configuration {name}: unknown placement tunable {key!r}")
    try:
        number = float(value)
    except ValueError:
        raise ValueError(f"configuration {name}: {key} must be a number, not {value!r}") from None
    if not math.isfinite(number) or number < 0:
        raise ValueError(f"configuration {name}: {key} must be a finite number ≥ 0, not {value!r}")
    if not isinstance(getattr(PlacementConfig(), key), int):
        return number
    if number != int(number):
        raise ValueError(f"configuration {name}: {key} must be a whole number, not {value!r}")
    return int(number)


def named(names: list[str], weights: Mapping[str, float] | None = None) -> list[SimConfig]:
    """The presets called ``names``, in that order; a ``NAME:key=value,...`` overrides the
    preset's placement tunables (``load-aware:target_load=0.7``). Raises ValueError naming an
    unknown preset or tunable, or a value no tunable takes."""
    known = presets(weights)
    configs: list[SimConfig] = []
    for entry in names:
        name, colon, overrides = entry.partition(":")
        if name not in known:
            raise ValueError(f"configuration: unknown {name!r}; known: {', '.join(known)}")
        config = known[name]
        if colon and not overrides:
            raise ValueError(f"configuration {name}: no key=value after ':'")
        if overrides:
            changes: dict[str, float | int] = {}
            for pair in overrides.split(","):
                key, _, value = pair.partition("=")
                changes[key] = _tunable(name, key, value)
            placement = replace(config.placement, **changes)  # type: ignore[arg-type]
            config = replace(config, name=entry, placement=placement)
        configs.append(config)
    return configs
