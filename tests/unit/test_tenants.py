"""Tenant policies: their JSON, the submit checks, the rate limiter, the CPU quota placement
applies (``mdq.core.tenants``, and ``plan``'s ``tenant_room``), as tables of named cases."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from mdq.contracts import pb
from mdq.core.placement import NodeState, PlacementConfig, QueuedJob, plan
from mdq.core.tenants import (
    DEFAULT_POLICY,
    SubmitRateLimiter,
    TenantNameError,
    TenantPolicy,
    TenantUsage,
    check_submit,
    cpu_quota_reason,
    cpu_room,
    rate_limit_message,
    usage_key,
    validate_tenant_name,
)
from tests.tables import named_cases

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
UNLIMITED = TenantPolicy(
    allow_high=True, max_queued_jobs=None, max_running_cpu=None, submits_per_minute=None
)


def test_tenant_names_still_validate() -> None:
    assert validate_tenant_name("alice") == "alice"
    with pytest.raises(TenantNameError):
        validate_tenant_name("Alice")


# -- JSON --------------------------------------------------------------------------------------
POLICY_JSON_CASES = [
    ("empty object is the default policy", "{}", DEFAULT_POLICY),
    (
        "omitted keys take the defaults",
        '{"max_running_cpu": 8}',
        TenantPolicy(max_running_cpu=8.0),
    ),
    (
        "null is unlimited",
        '{"allow_high": true, "max_queued_jobs": null, "max_running_cpu": null, '
        '"submits_per_minute": null}',
        UNLIMITED,
    ),
    (
        "an integer is a number of cores",
        '{"max_running_cpu": 3, "submits_per_minute": 1.5, "submit_burst": 4}',
        TenantPolicy(max_running_cpu=3.0, submits_per_minute=1.5, submit_burst=4),
    ),
    (
        "zero queued jobs suspends submits",
        '{"max_queued_jobs": 0}',
        TenantPolicy(max_queued_jobs=0),
    ),
    ("a fair-share weight", '{"weight": 2}', TenantPolicy(weight=2.0)),
    (
        "a guaranteed and a maximum share",
        '{"guaranteed_share": 0.2, "max_share": 0.5}',
        TenantPolicy(guaranteed_share=0.2, max_share=0.5),
    ),
]


@named_cases(("text", "expected"), POLICY_JSON_CASES)
def test_policy_from_json(text: str, expected: TenantPolicy) -> None:
    policy = TenantPolicy.from_json(text)
    assert policy == expected
    assert TenantPolicy.from_json(policy.to_json()) == policy


BAD_POLICY_CASES = [
    ("not JSON", "{", "not JSON"),
    ("not an object", "[1]", "must be a JSON object"),
    ("unknown key", '{"max_gpus": 1}', "unknown field 'max_gpus'"),
    ("allow_high not a bool", '{"allow_high": "yes"}', "allow_high must be true or false"),
    ("allow_high null", '{"allow_high": null}', "allow_high must be true or false, got None"),
    ("a bool is no number", '{"max_running_cpu": true}', "max_running_cpu must be a number"),
    ("queued jobs a float", '{"max_queued_jobs": 2.5}', "max_queued_jobs must be an integer"),
    ("cpu a string", '{"max_running_cpu": "8"}', "max_running_cpu must be a number or null"),
    ("negative queued jobs", '{"max_queued_jobs": -1}', "max_queued_jobs must be at least 0"),
    ("zero cpu", '{"max_running_cpu": 0}', "max_running_cpu must be more than 0"),
    ("zero rate", '{"submits_per_minute": 0}', "submits_per_minute must be more than 0"),
    ("NaN rate", '{"submits_per_minute": NaN}', "submits_per_minute must be more than 0"),
    ("zero burst", '{"submit_burst": 0}', "submit_burst must be at least 1"),
    ("zero weight", '{"weight": 0}', "weight must be more than 0"),
    ("weight null", '{"weight": null}', "weight must be a number, got None"),
    ("weight infinite", '{"weight": Infinity}', "weight must be more than 0"),
    ("share above 1", '{"max_share": 1.5}', "max_share is a share of the cluster, 0 to 1"),
    ("zero maximum share", '{"max_share": 0}', "max_share must be more than 0"),
    ("negative guarantee", '{"guaranteed_share": -0.1}', "guaranteed_share must be at least 0"),
]


@named_cases(("text", "message"), BAD_POLICY_CASES)
def test_bad_policy_json_names_the_field(text: str, message: str) -> None:
    with pytest.raises(ValueError, match="tenant policy") as raised:
        TenantPolicy.from_json(text)
    assert message in str(raised.value)


def test_default_policy_is_conservative() -> None:
    assert TenantPolicy() == DEFAULT_POLICY
    assert not DEFAULT_POLICY.allow_high
    assert DEFAULT_POLICY.max_queued_jobs == 1000
    assert DEFAULT_POLICY.max_running_cpu == 16.0
    assert (DEFAULT_POLICY.submits_per_minute, DEFAULT_POLICY.burst) == (60.0, 10.0)


USAGE_JSON_CASES = [
    ("nothing", TenantUsage(as_of=NOW)),
    ("some", TenantUsage(queued_jobs=98, running_cpu=7.5, as_of=NOW)),
    (
        "with its fair share",
        TenantUsage(
            queued_jobs=40,
            running_cpu=6.0,
            as_of=NOW,
            running_jobs=6,
            running_memory_mb=6144.0,
            weight=2.0,
            share=0.75,
            fair_share=0.5,
        ),
    ),
]


def test_usage_written_by_an_older_placement_reads_with_defaults() -> None:
    usage = TenantUsage.from_json('{"queued_jobs": 3, "as_of": "2026-01-01T00:00:00+00:00"}')
    assert (usage.queued_jobs, usage.weight, usage.share, usage.fair_share) == (3, 1.0, 0.0, 0.0)


@named_cases(("usage",), USAGE_JSON_CASES)
def test_usage_json_round_trip(usage: TenantUsage) -> None:
    assert TenantUsage.from_json(usage.to_json()) == usage


BAD_USAGE_CASES = [
    ("unknown key", '{"queued_jobs": 1, "as_of": "2026-01-01T00:00:00+00:00", "x": 1}', "'x'"),
    ("negative queued", '{"queued_jobs": -1, "as_of": "2026-01-01T00:00:00+00:00"}', "queued"),
    ("cpu a string", '{"running_cpu": "1", "as_of": "2026-01-01T00:00:00+00:00"}', "running_cpu"),
    ("no time", '{"queued_jobs": 1}', "as_of"),
    ("bad time", '{"as_of": "yesterday"}', "as_of"),
    ("share a string", '{"as_of": "2026-01-01T00:00:00+00:00", "share": "half"}', "share"),
    ("jobs a float", '{"as_of": "2026-01-01T00:00:00+00:00", "running_jobs": 1.5}', "running_jobs"),
]


@named_cases(("text", "field"), BAD_USAGE_CASES)
def test_bad_usage_json_names_the_field(text: str, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        TenantUsage.from_json(text)


def test_usage_key_cannot_be_a_job_id() -> None:
    assert usage_key("alice") == "tenant.alice"


# -- submits -----------------------------------------------------------------------------------
def spec(priority_class: str = "normal", cpu: float = 1.0) -> pb.JobSpec:
    job = pb.JobSpec(name="j", priority_class=priority_class)
    job.resources.cpu = cpu
    return job


SMALL = TenantPolicy(max_queued_jobs=100, max_running_cpu=8.0)
SUBMIT_CASES: list[tuple[str, str, TenantPolicy, list[pb.JobSpec], TenantUsage | None, str]] = [
    ("normal job within every limit", "alice", SMALL, [spec()], None, ""),
    (
        "high without allow_high",
        "alice",
        SMALL,
        [spec(), spec("high")],
        None,
        "jobs[1].priority_class: tenant alice may not submit high-priority jobs",
    ),
    ("high with allow_high", "alice", TenantPolicy(allow_high=True), [spec("high")], None, ""),
    (
        "a job bigger than the whole CPU quota",
        "alice",
        SMALL,
        [spec(cpu=2), spec(cpu=8.5)],
        None,
        "jobs[1].resources.cpu: tenant alice may run at most 8 cores at once; this job asks "
        "for 8.5, so it could never run",
    ),
    ("a job the size of the quota", "alice", SMALL, [spec(cpu=8)], None, ""),
    (
        "queued quota exceeded",
        "alice",
        SMALL,
        [spec()] * 5,
        TenantUsage(queued_jobs=98, as_of=NOW),
        "jobs: tenant alice may have at most 100 jobs waiting; it has 98 and this submit adds 5",
    ),
    (
        "queued quota reached exactly",
        "alice",
        SMALL,
        [spec()] * 2,
        TenantUsage(queued_jobs=98, as_of=NOW),
        "",
    ),
    (
        "no usage known counts as none queued",
        "alice",
        SMALL,
        [spec()] * 101,
        None,
        "it has 0 and this submit adds 101",
    ),
    (
        "the priority is checked before the queue",
        "bob",
        SMALL,
        [spec("high")],
        TenantUsage(queued_jobs=100, as_of=NOW),
        "jobs[0].priority_class: tenant bob",
    ),
    (
        "the operator is never limited",
        "",
        SMALL,
        [spec("high", cpu=64)] * 3,
        TenantUsage(queued_jobs=1000, as_of=NOW),
        "",
    ),
    ("unlimited tenant", "carol", UNLIMITED, [spec("high", cpu=256)] * 500, None, ""),
]


@named_cases(("tenant", "policy", "specs", "usage", "refusal"), SUBMIT_CASES)
def test_check_submit(
    tenant: str,
    policy: TenantPolicy,
    specs: list[pb.JobSpec],
    usage: TenantUsage | None,
    refusal: str,
) -> None:
    error = check_submit(tenant, policy, specs, usage)
    if not refusal:
        assert error is None
    else:
        assert error is not None
        assert refusal in str(error)
        assert str(error).startswith(f"{error.field}: ")


# -- rate limit --------------------------------------------------------------------------------
PER_MINUTE_60 = TenantPolicy(submits_per_minute=60, submit_burst=3)
RATE_CASES: list[tuple[str, str, TenantPolicy, list[float], list[float]]] = [
    ("a burst goes at once", "alice", PER_MINUTE_60, [0, 0, 0], [0, 0, 0]),
    ("past the burst: wait for a token", "alice", PER_MINUTE_60, [0, 0, 0, 0], [0, 0, 0, 1.0]),
    (
        "a refused submit takes nothing",
        "alice",
        PER_MINUTE_60,
        [0, 0, 0, 0, 0.5],
        [0, 0, 0, 1, 0.5],
    ),
    ("the bucket refills", "alice", PER_MINUTE_60, [0, 0, 0, 1.0], [0, 0, 0, 0]),
    (
        "refills no further than the burst",
        "alice",
        PER_MINUTE_60,
        [0, 100, 100, 100, 100],
        [0, 0, 0, 0, 1.0],
    ),
    (
        "default burst: ten seconds' worth",
        "alice",
        TenantPolicy(submits_per_minute=6),
        [0, 0],
        [0, 10.0],
    ),
    ("the operator is never paced", "", PER_MINUTE_60, [0] * 10, [0] * 10),
    ("no rate, no pacing", "alice", UNLIMITED, [0] * 10, [0] * 10),
    ("a clock going back refills nothing", "alice", PER_MINUTE_60, [5, 5, 5, 4], [0, 0, 0, 1.0]),
]


@named_cases(("tenant", "policy", "times", "waits"), RATE_CASES)
def test_rate_limiter(
    tenant: str, policy: TenantPolicy, times: list[float], waits: list[float]
) -> None:
    limiter = SubmitRateLimiter()
    got = [limiter.acquire(tenant, policy, now) for now in times]
    assert got == pytest.approx(waits)


def test_rate_limiter_keeps_tenants_apart() -> None:
    limiter = SubmitRateLimiter()
    policy = TenantPolicy(submits_per_minute=60, submit_burst=1)
    assert limiter.acquire("alice", policy, 0) == 0
    assert limiter.acquire("alice", policy, 0) > 0
    assert limiter.acquire("bob", policy, 0) == 0


def test_rate_limiter_forgets_idle_tenants() -> None:
    limiter = SubmitRateLimiter()
    policy = TenantPolicy(submits_per_minute=60, submit_burst=2)
    for index in range(1000):
        limiter.acquire(f"t{index}", policy, 0.0)
    assert len(limiter) == 1000
    limiter.acquire("late", policy, 1.0)  # everyone else's bucket is full again by now
    assert len(limiter) == 1


def test_rate_limiter_memory_is_capped() -> None:
    limiter = SubmitRateLimiter(max_tenants=10)
    policy = TenantPolicy(submits_per_minute=1, submit_burst=1)
    for index in range(100):
        limiter.acquire(f"t{index}", policy, 0.0)
    assert len(limiter) == 10


def test_rate_limit_message() -> None:
    assert rate_limit_message("alice", TenantPolicy(submits_per_minute=60), 2.08) == (
        "rate limit: tenant alice may submit 60 times a minute; try again in 2.1 s"
    )


# -- CPU quota ---------------------------------------------------------------------------------
EIGHT = TenantPolicy(max_running_cpu=8.0)
QUOTA_CASES = [
    ("room left", "alice", EIGHT, 4.0, 2.0, ""),
    ("exactly to the quota", "alice", EIGHT, 6.0, 2.0, ""),
    (
        "at the quota",
        "alice",
        EIGHT,
        8.0,
        1.0,
        "tenant alice is at its CPU quota: 8 of 8 cores running",
    ),
    (
        "too little room left",
        "alice",
        EIGHT,
        6.5,
        2.0,
        "tenant alice is at its CPU quota: 6.5 of 8 cores running, this job needs 2",
    ),
    ("no CPU quota", "alice", UNLIMITED, 1000.0, 64.0, ""),
    ("the operator", "", EIGHT, 100.0, 4.0, ""),
]


@named_cases(("tenant", "policy", "running", "cpu", "reason"), QUOTA_CASES)
def test_cpu_quota_reason(
    tenant: str, policy: TenantPolicy, running: float, cpu: float, reason: str
) -> None:
    assert cpu_quota_reason(tenant, policy, running, cpu) == reason


ROOM_CASES = [
    ("room is what is left", EIGHT, 3.0, 5.0),
    ("never below zero", EIGHT, 9.0, 0.0),
    ("unlimited", UNLIMITED, 3.0, None),
]


@named_cases(("policy", "running", "room"), ROOM_CASES)
def test_cpu_room(policy: TenantPolicy, running: float, room: float | None) -> None:
    assert cpu_room(policy, running) == room


def node(name: str, cpu: float = 64) -> NodeState:
    return NodeState(
        name=name,
        cpu_capacity=cpu,
        memory_capacity_mb=1_000_000,
        ready=True,
        cpu_load=0.0,
        memory_load=0.0,
        reported_at=NOW - timedelta(seconds=1),
    )


def queued(job_id: str, tenant: str, cpu: float = 2, seconds_ago: int = 0) -> QueuedJob:
    return QueuedJob(
        job_id=job_id,
        cpu=cpu,
        memory_mb=512,
        priority=500,
        submitted_at=NOW - timedelta(seconds=seconds_ago),
        tenant=tenant,
    )


PLAN_CASES: list[tuple[str, list[QueuedJob], dict[str, float], set[str], dict[str, float]]] = [
    (
        "the quota stops a tenant; later jobs of others still bind",
        [queued(f"a{i}", "alice", seconds_ago=10 - i) for i in range(4)] + [queued("b0", "bob")],
        {"alice": 4.0},
        {"a0", "a1", "b0"},
        {"alice": 0.0},
    ),
    (
        "a smaller job behind a held one still fits the room",
        [queued("big", "alice", cpu=3, seconds_ago=5), queued("small", "alice", cpu=1)],
        {"alice": 2.0},
        {"small"},
        {"alice": 1.0},
    ),
    (
        "unlisted tenants and the operator are unlimited",
        [queued("b0", "bob", cpu=30), queued("op", "", cpu=30)],
        {"alice": 0.0},
        {"b0", "op"},
        {"alice": 0.0},
    ),
    (
        "no room at all",
        [queued("a0", "alice")],
        {"alice": 0.0},
        set(),
        {"alice": 0.0},
    ),
]


@named_cases(("queue", "room", "bound", "room_after"), PLAN_CASES)
def test_plan_honours_tenant_room(
    queue: list[QueuedJob],
    room: dict[str, float],
    bound: set[str],
    room_after: dict[str, float],
) -> None:
    decisions = plan([node("n1")], queue, NOW, PlacementConfig(), tenant_room=room)
    assert {decision.job_id for decision in decisions} == bound
    assert room == room_after


def test_plan_without_tenant_room_binds_everything_that_fits() -> None:
    queue = [queued(f"a{i}", "alice") for i in range(4)]
    assert len(plan([node("n1")], queue, NOW, PlacementConfig())) == 4
