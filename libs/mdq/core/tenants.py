"""Tenants: who submits, and what each may do (pure).

A tenant is a group of users sharing one NATS identity; its request and job ids start with its
name and a dot (``mdq.core.ids``), and the operator's own jobs have no tenant (""). Its
``TenantPolicy`` (the tenants bucket; ``DEFAULT_POLICY`` without one) is checked here: a submit
by ``check_submit`` and ``SubmitRateLimiter``, a job's runaway limits by ``RunawayLimits`` /
``apply_runaway_limits``, the CPU quota by ``tenant_room`` / ``cpu_quota_reason``. What a
tenant may do and how the server keeps tenants apart: docs/security.md, "Tenants";
the quota's effect on placement: docs/placement.md, "Tenant quotas".
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

from mdq.contracts import pb
from mdq.core.ids import REQUEST_ID_HEX, TENANT_SEPARATOR
from mdq.core.spec import MAX_DISK_MB, MAX_WALL_S, SpecError
from mdq.core.state import JobState
from mdq.core.timestamps import EPOCH
from mdq.errors import InvalidInput

_Amount = TypeVar("_Amount", int, float)
"""An amount a runaway limit bounds: whole MiB of disk, or seconds of wall time."""

TENANT_PATTERN = re.compile(r"[a-z][a-z0-9-]{0,30}")
"""A tenant's name (fullmatch): a subject token, a stream-name suffix and a PostgreSQL role
suffix alike."""
_LOOKS_LIKE_JOB_ID = re.compile(r"[0-9a-f]{12}-")
RESERVED = frozenset(
    {"intake", "placement", "watcher", "recovery", "metrics", "agent", "console", "cli"}
    | {"runners", "admin"}
    | {"tenant", "operator"}
)
"""Names no tenant may take: the bus identities (a tenant's runners listen on
``_INBOX_<tenant>.<job>``, which must not fall under an identity's ``_INBOX_<identity>.>``),
``tenant`` (the tenants' own identities are ``tenant.<name>``) and ``operator``."""


class TenantNameError(InvalidInput):
    """A tenant name that cannot be used."""


def validate_tenant_name(name: str) -> str:
    """``name`` if it can name a tenant; raises ``TenantNameError`` saying why not."""
    if not TENANT_PATTERN.fullmatch(name):
        raise TenantNameError(
            f"tenant name {name!r} must be 1 to 31 lowercase letters, digits or '-', "
            "starting with a letter"
        )
    if name in RESERVED:
        raise TenantNameError(f"tenant name {name!r} is reserved (an identity of mdq's own)")
    if _LOOKS_LIKE_JOB_ID.match(name):
        raise TenantNameError(
            f"tenant name {name!r} starts like a job id (12 hex digits and a dash)"
        )
    return name


JOB_ID_PATTERN = re.compile(
    rf"(?:{TENANT_PATTERN.pattern}{re.escape(TENANT_SEPARATOR)})?"
    rf"[0-9a-f]{{{REQUEST_ID_HEX}}}-[a-z][a-z0-9-]{{0,39}}"
)
"""A job id as intake makes them (fullmatch): the operator's ``<hex>-<name>``, a tenant's
``<tenant>.<hex>-<name>``. ASCII letters, digits, ``-`` and at most one ``.``: never a NATS
wildcard (``*``, ``>``), never an identity's name (``intake``), never an inbox prefix."""


class JobIdError(InvalidInput):
    """A value that is not a job id intake could have made."""


def check_job_id(value: str, field: str = "job_id") -> str:
    """``value`` if it is a job id (``JOB_ID_PATTERN``, its tenant not a reserved name);
    raises ``JobIdError`` naming ``field`` otherwise. What a runner's credentials are issued
    to: the server fills the name into the runner's permission template as it is, so a name
    holding a wildcard would grant every job's subjects."""
    shown = value if len(value) <= 80 else value[:80] + "…"
    if not JOB_ID_PATTERN.fullmatch(value):
        raise JobIdError(
            f"{field}: {shown!r} is not a job id ('<12 hex digits>-<name>', or "
            "'<tenant>.<12 hex digits>-<name>'; lowercase letters, digits and '-')"
        )
    tenant, separator, _ = value.partition(TENANT_SEPARATOR)
    if separator and tenant in RESERVED:
        raise JobIdError(f"{field}: {shown!r} names the reserved tenant {tenant!r}")
    return value


# -- policies ----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class TenantPolicy:
    """What one tenant may do; ``None`` is unlimited. The field defaults are ``DEFAULT_POLICY``
    (a tenant the admin wrote no policy for), and so are the keys a stored policy omits."""

    allow_high: bool = False
    """May submit jobs of the ``high`` priority class (the only one that preempts others)."""
    max_queued_jobs: int | None = 1000
    """Jobs of the tenant not running yet (``QUEUED_STATES``), this submit's included."""
    max_running_cpu: float | None = 16.0
    """Sum of ``resources.cpu`` of the tenant's BOUND and RUNNING jobs; placement binds none
    that would take it above this (the job waits, other tenants' jobs bind)."""
    submits_per_minute: float | None = 60.0
    """Submits (requests, whatever their number of jobs) per minute, a token bucket."""
    submit_burst: int | None = None
    """Submits allowed at once after a quiet spell (the bucket's size); ``None``: ten seconds'
    worth of ``submits_per_minute``, at least 1."""
    weight: float = 1.0
    """The tenant's weight in fair share (``mdq.core.fairshare``): when more work waits than
    fits, a tenant of weight 2 gets twice the dominant share of one of weight 1."""
    guaranteed_share: float | None = None
    """A dominant share of the cluster the tenant is due whatever the weights, as far as it has
    work for it (fair share's floor; the guarantees of all tenants should add up to 1 at most)."""
    max_share: float | None = None
    """The most of the cluster (dominant share) the tenant may hold at once; placement binds no
    job that would take it above (the job waits, others' jobs bind)."""
    max_steps_per_job: int | None = None
    """A job's step target at most (at submit and after an extend); null: the operator's
    default (``MDQ_INTAKE_MAX_STEPS_PER_JOB``), not unlimited."""
    max_wall_s: float | None = None
    """The wall time a job may run, seconds (its ``max_wall_s`` is this when unset, and may not
    be more); null: the operator's default (``MDQ_INTAKE_MAX_WALL_S``)."""
    max_disk_mb: int | None = None
    """The disk a job's folder may use, MiB (its ``max_disk_mb`` is this when unset, and may
    not be more); null: the operator's default (``MDQ_INTAKE_MAX_DISK_MB``)."""

    def __post_init__(self) -> None:
        _check_policy(self)

    @property
    def burst(self) -> float:
        """The token bucket's size (meaningless without ``submits_per_minute``)."""
        if self.submit_burst is not None:
            return float(self.submit_burst)
        rate = self.submits_per_minute or 0.0
        return float(max(1, math.ceil(rate / 6)))

    def to_json(self) -> bytes:
        """The policy as the tenants bucket stores it (every field, nulls included)."""
        return json.dumps(
            {name: getattr(self, name) for name in _POLICY_FIELDS}, sort_keys=True
        ).encode()

    @classmethod
    def from_json(cls, data: bytes | str) -> TenantPolicy:
        """A policy from its JSON object; omitted keys take ``DEFAULT_POLICY``'s values, null
        is unlimited. Raises ``ValueError`` naming the field for an unknown key or a value of
        the wrong type or range."""
        try:
            raw = json.loads(data)
        except (ValueError, UnicodeDecodeError) as error:
            raise ValueError(f"tenant policy is not JSON: {error}") from None
        if not isinstance(raw, dict):
            raise ValueError(f"tenant policy must be a JSON object, got {type(raw).__name__}")
        unknown = sorted(set(raw) - set(_POLICY_FIELDS))
        if unknown:
            raise ValueError(
                f"tenant policy: unknown field {unknown[0]!r} (known: {', '.join(_POLICY_FIELDS)})"
            )
        values: dict[str, Any] = {}
        for name, value in raw.items():
            kind = _POLICY_FIELDS[name]
            nullable = name not in _NOT_NULL
            if (value is None and nullable) or _is_a(kind, value):
                values[name] = float(value) if kind is float and value is not None else value
                continue
            what = {bool: "true or false", int: "an integer", float: "a number"}[kind]
            raise ValueError(
                f"tenant policy: {name} must be {what}{' or null' if nullable else ''}, "
                f"got {value!r}"
            )
        return cls(**values)


def _is_a(kind: type, value: object) -> bool:
    """Whether a JSON value is of ``kind`` (a bool is no number here, an integer is a float)."""
    if isinstance(value, bool):
        return kind is bool
    if kind is int:
        return isinstance(value, int)
    return kind is float and isinstance(value, int | float)


_POLICY_FIELDS: dict[str, type] = {
    "allow_high": bool,
    "max_queued_jobs": int,
    "max_running_cpu": float,
    "submits_per_minute": float,
    "submit_burst": int,
    "weight": float,
    "guaranteed_share": float,
    "max_share": float,
    "max_steps_per_job": int,
    "max_wall_s": float,
    "max_disk_mb": int,
}
_NOT_NULL = frozenset({"allow_high", "weight"})
"""Fields without an "unlimited": null is refused for them."""


def _check_policy(policy: TenantPolicy) -> None:
    """ValueError naming the field of a limit out of range (types are the caller's)."""
    checks: tuple[tuple[str, float | None, float], ...] = (
        ("max_queued_jobs", policy.max_queued_jobs, 0),
        ("max_running_cpu", policy.max_running_cpu, 0),
        ("submits_per_minute", policy.submits_per_minute, 0),
        ("submit_burst", policy.submit_burst, 1),
        ("weight", policy.weight, 0),
        ("guaranteed_share", policy.guaranteed_share, 0),
        ("max_share", policy.max_share, 0),
        ("max_steps_per_job", policy.max_steps_per_job, 1),
        ("max_wall_s", policy.max_wall_s, 1),
        ("max_disk_mb", policy.max_disk_mb, 1),
    )
    for name, value, low in checks:
        if value is None:
            continue
        if not math.isfinite(value) or value < low or (name in _POSITIVE and value == 0):
            bound = "more than 0" if name in _POSITIVE else f"at least {low}"
            raise ValueError(f"tenant policy: {name} must be {bound}, got {value!r}")
        if name in _FRACTIONS and value > 1:
            raise ValueError(
                f"tenant policy: {name} is a share of the cluster, 0 to 1, got {value!r}"
            )


_POSITIVE = frozenset({"max_running_cpu", "submits_per_minute", "weight", "max_share"})
_FRACTIONS = frozenset({"guaranteed_share", "max_share"})


DEFAULT_POLICY = TenantPolicy()
"""The policy of a tenant the admin wrote none for: no ``high`` jobs (they preempt other
tenants' work), at most 1,000 jobs waiting, 16 cores running, 60 submits a minute in bursts of
10. The operator's own untenanted jobs ("") are never limited (``policy_applies``)."""


def policy_applies(tenant: str) -> bool:
    """Whether a tenant's policy limits it: every tenant's does; the operator ("") has none."""
    return bool(tenant)


def _number(value: float) -> str:
    return f"{value:g}"


# -- usage -------------------------------------------------------------------------------------
QUEUED_STATES = frozenset({JobState.WAITING, JobState.PENDING, JobState.RECOVERING, JobState.HELD})
"""States of a job that is not running yet (or again), held ones included: what
``max_queued_jobs`` counts."""
RUNNING_STATES = frozenset({JobState.BOUND, JobState.RUNNING})
"""States of a job that holds its CPU on a node: what ``max_running_cpu`` counts."""


@dataclass(frozen=True, slots=True)
class TenantUsage:
    """What a tenant has in the system, as placement last counted it."""

    queued_jobs: int = 0
    """Jobs in ``QUEUED_STATES``."""
    running_cpu: float = 0.0
    """Sum of ``resources.cpu`` of the jobs in ``RUNNING_STATES``."""
    as_of: datetime = EPOCH
    """When placement counted it."""
    running_jobs: int = 0
    """Jobs in ``RUNNING_STATES``."""
    running_memory_mb: float = 0.0
    """Sum of ``resources.memory_mb`` of the jobs in ``RUNNING_STATES``."""
    weight: float = 1.0
    """The tenant's fair-share weight (its policy's) when placement counted."""
    share: float = 0.0
    """Its dominant share now: the larger of its running CPU and memory over the schedulable
    capacity (``mdq.core.fairshare``)."""
    fair_share: float = 0.0
    """The dominant share it is due while what every tenant has queued competes for the
    cluster (``fair_shares``: weighted water-filling; 0 with nothing queued or running)."""

    def to_json(self) -> bytes:
        """The usage as placement writes it (waiting bucket, key ``usage_key(tenant)``)."""
        return json.dumps(
            {
                "queued_jobs": self.queued_jobs,
                "running_cpu": self.running_cpu,
                "as_of": self.as_of.astimezone(UTC).isoformat(),
                **{name: getattr(self, name) for name in _USAGE_EXTRAS},
            },
            sort_keys=True,
        ).encode()

    @classmethod
    def from_json(cls, data: bytes | str) -> TenantUsage:
        """The usage of its JSON; ``ValueError`` naming the field when malformed."""
        try:
            raw = json.loads(data)
        except (ValueError, UnicodeDecodeError) as error:
            raise ValueError(f"tenant usage is not JSON: {error}") from None
        if not isinstance(raw, dict):
            raise ValueError("tenant usage must be a JSON object")
        unknown = sorted(set(raw) - {"queued_jobs", "running_cpu", "as_of", *_USAGE_EXTRAS})
        if unknown:
            raise ValueError(f"tenant usage: unknown field {unknown[0]!r}")
        queued, cpu, as_of = (
            raw.get("queued_jobs", 0),
            raw.get("running_cpu", 0.0),
            raw.get("as_of"),
        )
        if not isinstance(queued, int) or isinstance(queued, bool) or queued < 0:
            raise ValueError(f"tenant usage: queued_jobs must be an integer >= 0, got {queued!r}")
        if not isinstance(cpu, int | float) or isinstance(cpu, bool) or not math.isfinite(cpu):
            raise ValueError(f"tenant usage: running_cpu must be a number, got {cpu!r}")
        if not isinstance(as_of, str):
            raise ValueError(f"tenant usage: as_of must be an ISO 8601 time, got {as_of!r}")
        try:
            at = datetime.fromisoformat(as_of)
        except ValueError:
            raise ValueError(
                f"tenant usage: as_of must be an ISO 8601 time, got {as_of!r}"
            ) from None
        extras: dict[str, Any] = {}
        for name, kind in _USAGE_EXTRAS.items():  # optional: an older placement wrote none
            if name not in raw:
                continue
            value = raw[name]
            if not _is_a(kind, value) or (kind is float and not math.isfinite(value)):
                what = "an integer" if kind is int else "a number"
                raise ValueError(f"tenant usage: {name} must be {what}, got {value!r}")
            extras[name] = float(value) if kind is float else value
        return cls(
            queued_jobs=queued,
            running_cpu=float(cpu),
            as_of=at if at.tzinfo else at.replace(tzinfo=UTC),
            **extras,
        )


_USAGE_EXTRAS: dict[str, type] = {
    "running_jobs": int,
    "running_memory_mb": float,
    "weight": float,
    "share": float,
    "fair_share": float,
}
"""The usage's fields beyond what intake's quota check reads (``mdq queues`` shows them)."""


USAGE_KEY_PREFIX = "tenant."
"""Placement writes each tenant's ``TenantUsage`` into its waiting bucket under
``tenant.<name>`` (no job id has that shape: a tenant's job ids are ``<tenant>.<12 hex>-...``)."""


def usage_key(tenant: str) -> str:
    """The waiting bucket's key of ``tenant``'s usage."""
    return f"{USAGE_KEY_PREFIX}{tenant}"


# -- submits -----------------------------------------------------------------------------------
def check_submit(
    tenant: str,
    policy: TenantPolicy,
    specs: Sequence[pb.JobSpec],
    usage: TenantUsage | None,
) -> SpecError | None:
    """Why ``tenant`` may not submit ``specs`` (normalized: ``mdq.core.spec``) under ``policy``
    with ``usage`` (None: nothing known, counted as nothing queued), or None. The operator
    ("") is never refused here. ``usage`` is placement's last count: intake may add the jobs it
    accepted since."""
    if not policy_applies(tenant):
        return None
    for index, spec in enumerate(specs):
        if spec.priority_class == "high" and not policy.allow_high:
            return SpecError(
                f"jobs[{index}].priority_class",
                f"tenant {tenant} may not submit high-priority jobs (the class that preempts "
                "other work); use normal or low",
            )
        limit = policy.max_running_cpu
        if limit is not None and spec.resources.cpu > limit + CPU_EPSILON:
            return SpecError(
                f"jobs[{index}].resources.cpu",
                f"tenant {tenant} may run at most {_number(limit)} cores at once; this job asks "
                f"for {_number(spec.resources.cpu)}, so it could never run",
            )
    queued_limit = policy.max_queued_jobs
    if queued_limit is not None:
        queued = usage.queued_jobs if usage is not None else 0
        if queued + len(specs) > queued_limit:
            return SpecError(
                "jobs",
                f"tenant {tenant} may have at most {queued_limit} jobs waiting; it has {queued} "
                f"and this submit adds {len(specs)}",
            )
    return None


CPU_EPSILON = 1e-9


# -- runaway limits ---------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class RunawayLimits:
    """What one job may do at most: its step target, its wall time (seconds), its disk (MiB);
    None: no limit."""

    max_steps: int | None = None
    max_wall_s: float | None = None
    max_disk_mb: int | None = None

    @classmethod
    def of(cls, policy: TenantPolicy | None, defaults: RunawayLimits) -> RunawayLimits:
        """The limits of a tenant of ``policy`` (None: the operator): its own where it sets
        them, the operator's ``defaults`` elsewhere."""

        def pick(own: float | None, default: float | None) -> float | None:
            return own if policy is not None and own is not None else default

        steps = pick(policy.max_steps_per_job if policy else None, defaults.max_steps)
        wall = pick(policy.max_wall_s if policy else None, defaults.max_wall_s)
        disk = pick(policy.max_disk_mb if policy else None, defaults.max_disk_mb)
        return cls(
            max_steps=None if steps is None else int(steps),
            max_wall_s=wall,
            max_disk_mb=None if disk is None else int(disk),
        )


def apply_runaway_limits(
    tenant: str, limits: RunawayLimits, spec: pb.JobSpec, path: str
) -> pb.JobSpec:
    """``spec`` (normalized; ``path`` its place in the submit, ``jobs[0]``) held to ``limits``:
    above one it is refused (``SpecError`` naming the field and the limit); without a
    ``max_wall_s`` or ``max_disk_mb`` it gets the limit (a copy; ``spec`` is not changed)."""
    who = f"tenant {tenant}'s" if tenant else "the operator's"
    if limits.max_steps is not None and spec.steps > limits.max_steps:
        raise SpecError(
            f"{path}.steps",
            f"{spec.steps} steps is above {who} limit of {limits.max_steps} steps per job",
        )
    limited = pb.JobSpec()
    limited.CopyFrom(spec)
    limited.max_wall_s = _held_to(
        spec.max_wall_s, limits.max_wall_s, MAX_WALL_S, f"{path}.max_wall_s", "s", who, _number
    )
    limited.max_disk_mb = _held_to(
        spec.max_disk_mb, limits.max_disk_mb, MAX_DISK_MB, f"{path}.max_disk_mb", "MiB", who, str
    )
    return limited


def _held_to(
    asked: _Amount,
    limit: _Amount | None,
    most: _Amount,
    field: str,
    unit: str,
    who: str,
    shown: Callable[[_Amount], str],
) -> _Amount:
    """What a job that ``asked`` this much (0: nothing asked) of a runaway limit gets: ``limit``
    (None: no limit; never above ``most``, what any job may ask) where it asked nothing, what
    it asked within it; above it, a ``SpecError`` on ``field`` (amounts ``shown`` in ``unit``)."""
    if limit is None:
        return asked
    limit = min(limit, most)
    if asked > limit:
        raise SpecError(
            field, f"{shown(asked)} {unit} is above {who} limit of {shown(limit)} {unit} per job"
        )
    return asked or limit


# -- placement ---------------------------------------------------------------------------------
def cpu_room(policy: TenantPolicy, running_cpu: float) -> float | None:
    """CPU the tenant may still bind under ``policy`` (None: unlimited, never below 0)."""
    if policy.max_running_cpu is None:
        return None
    return max(0.0, policy.max_running_cpu - running_cpu)


def cpu_quota_reason(tenant: str, policy: TenantPolicy, running_cpu: float, job_cpu: float) -> str:
    """Why binding a job of ``job_cpu`` cores would take ``tenant`` above its CPU quota with
    ``running_cpu`` cores bound or running, for ``mdq explain``; "" when it would not."""
    limit = policy.max_running_cpu
    if not policy_applies(tenant) or limit is None:
        return ""
    if running_cpu + job_cpu <= limit + CPU_EPSILON:
        return ""
    reason = (
        f"tenant {tenant} is at its CPU quota: {_number(running_cpu)} of {_number(limit)} cores "
        "running"
    )
    if running_cpu + CPU_EPSILON < limit:
        reason += f", this job needs {_number(job_cpu)}"
    return reason


# -- rate limit --------------------------------------------------------------------------------
RATE_LIMIT_TENANTS = 10_000
"""Tenants whose token bucket ``SubmitRateLimiter`` keeps at most (the idlest are forgotten
first; a forgotten bucket is a full one)."""


@dataclass(slots=True)
class _Bucket:
    tokens: float
    at: float
    full_at: float
    """When the bucket is full again if nobody submits (forgetting it then loses nothing)."""


class SubmitRateLimiter:
    """Per-tenant token buckets of ``submits_per_minute`` and ``burst`` (pure: the caller passes
    ``now``, seconds on any monotonic clock). A bucket that refilled is forgotten, so memory
    stays bounded by the tenants that submitted recently (and by ``max_tenants`` anyway).
    Each intake replica keeps its own: with N replicas a tenant may submit N times the rate."""

    def __init__(self, *, max_tenants: int = RATE_LIMIT_TENANTS) -> None:
        self._buckets: dict[str, _Bucket] = {}
        """In the order their tenants last submitted (oldest first)."""
        self._max_tenants = max_tenants

    def __len__(self) -> int:
        return len(self._buckets)

    def acquire(self, tenant: str, policy: TenantPolicy, now: float) -> float:
        """Take one submit's token: 0.0 when the submit may go, else the seconds to wait until
        it may (nothing taken then)."""
        self._forget_full(now)
        rate_per_minute = policy.submits_per_minute
        if not policy_applies(tenant) or rate_per_minute is None:
            return 0.0
        rate, size = rate_per_minute / 60.0, policy.burst
        bucket = self._buckets.pop(tenant, None)
        if bucket is None:
            tokens = size
        else:
            tokens = min(size, bucket.tokens + max(0.0, now - bucket.at) * rate)
        wait = 0.0
        if tokens >= 1.0 - CPU_EPSILON:
            tokens -= 1.0
        else:
            wait = (1.0 - tokens) / rate
        self._buckets[tenant] = _Bucket(tokens, now, now + (size - tokens) / rate)
        while len(self._buckets) > self._max_tenants:
            del self._buckets[next(iter(self._buckets))]
        return wait

    def _forget_full(self, now: float) -> None:
        """Forget the buckets that refilled, from the idlest on (stopping at the first that did
        not: amortised, a few per call)."""
        while self._buckets:
            tenant, bucket = next(iter(self._buckets.items()))
            if bucket.full_at > now:
                return
            del self._buckets[tenant]


class RateRefusal(SpecError):
    """A submit refused for its tenant's rate (``SubmitRateLimiter``). It changed nothing; a
    client that asked by request-reply hears it in the answer and nothing records it (a
    flood of them would otherwise fill the jobs log and the history, docs/security.md)."""

    def __init__(self, field: str, message: str, *, wait_s: float = 0.0) -> None:
        super().__init__(field, message)
        self.wait_s = wait_s
        """Seconds until the tenant may submit again."""


def rate_limit_message(tenant: str, policy: TenantPolicy, wait_s: float) -> str:
    """What a submit refused by ``SubmitRateLimiter`` is told."""
    rate = policy.submits_per_minute or 0.0
    return (
        f"rate limit: tenant {tenant} may submit {_number(rate)} times a minute; try again in "
        f"{max(wait_s, 0.1):.1f} s"
    )
