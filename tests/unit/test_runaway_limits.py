"""Runaway limits (pure): a tenant's own, else the operator's defaults; a job above one is
refused naming the field; a job without a wall time or disk gets the limit."""

from __future__ import annotations

import pytest

from mdq.contracts import pb
from mdq.core.spec import SpecError, normalize_job
from mdq.core.tenants import RunawayLimits, TenantPolicy, apply_runaway_limits
from tests.tables import named_cases

DEFAULTS = RunawayLimits(max_steps=1000, max_wall_s=3600, max_disk_mb=100)

OF_CASES = [
    ("the operator takes the defaults", None, DEFAULTS),
    ("a policy without limits takes the defaults", TenantPolicy(), DEFAULTS),
    ("a policy's own limit wins", TenantPolicy(max_steps_per_job=50, max_wall_s=60),
     RunawayLimits(max_steps=50, max_wall_s=60, max_disk_mb=100)),
    ("a policy may allow more than the default", TenantPolicy(max_disk_mb=10_000),
     RunawayLimits(max_steps=1000, max_wall_s=3600, max_disk_mb=10_000)),
]  # fmt: skip


@named_cases(("policy", "expected"), OF_CASES)
def test_limits_of(policy: TenantPolicy | None, expected: RunawayLimits) -> None:
    assert RunawayLimits.of(policy, DEFAULTS) == expected


def spec(**fields: object) -> pb.JobSpec:
    return normalize_job(pb.JobSpec(name="w", **fields), "jobs[0]")  # type: ignore[arg-type]


APPLY_CASES = [
    ("within: filled in", spec(steps=1000), "", None, (3600.0, 100)),
    ("its own smaller limits kept", spec(steps=10, max_wall_s=5, max_disk_mb=1), "", None,
     (5.0, 1)),
    ("too many steps", spec(steps=1001), "", "jobs[3].steps", None),
    ("too long", spec(steps=10, max_wall_s=3601), "alice", "jobs[3].max_wall_s", None),
    ("too big", spec(steps=10, max_disk_mb=101), "alice", "jobs[3].max_disk_mb", None),
]  # fmt: skip


@named_cases(("job", "tenant", "field", "filled"), APPLY_CASES)
def test_apply(
    job: pb.JobSpec, tenant: str, field: str | None, filled: tuple[float, int] | None
) -> None:
    if field is not None:
        with pytest.raises(SpecError) as refused:
            apply_runaway_limits(tenant, DEFAULTS, job, "jobs[3]")
        assert refused.value.field == field
        assert ("tenant alice's" if tenant else "the operator's") in refused.value.message
        return
    limited = apply_runaway_limits(tenant, DEFAULTS, job, "jobs[3]")
    assert (limited.max_wall_s, limited.max_disk_mb) == filled
    assert job.max_wall_s in (0, limited.max_wall_s), "the spec given is not changed"


def test_no_limits_change_nothing() -> None:
    job = spec(steps=10**10)
    assert apply_runaway_limits("", RunawayLimits(), job, "jobs[0]") == job


def test_a_policy_reads_and_writes_its_limits() -> None:
    policy = TenantPolicy.from_json(b'{"max_steps_per_job": 5000, "max_wall_s": 60}')
    assert (policy.max_steps_per_job, policy.max_wall_s, policy.max_disk_mb) == (5000, 60.0, None)
    assert TenantPolicy.from_json(policy.to_json()) == policy
    with pytest.raises(ValueError, match="max_disk_mb"):
        TenantPolicy.from_json(b'{"max_disk_mb": 0}')


@pytest.mark.parametrize(
    ("fields", "field"),
    [({"max_wall_s": 0.5}, "jobs[0].max_wall_s"), ({"max_disk_mb": -1}, "jobs[0].max_disk_mb")],
    ids=["wall time below a second", "negative disk"],
)
def test_the_spec_bounds_its_limits(fields: dict[str, object], field: str) -> None:
    with pytest.raises(SpecError) as refused:
        spec(**fields)
    assert refused.value.field == field
