"""Runaway limits at submit (docs/control.md, "Runaway limits"): intake holds each job to its
tenant's limits, or the operator's defaults (``MDQ_LIMITS_*``) where a policy sets none and for
the operator's own jobs; an over-limit submit is refused naming the field and the limit, and a
job that states no wall time or disk gets the limit, which the watcher and the runner enforce
(``test_control_races``, ``test_runner``)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from nats.aio.client import Client

from mdq.bus.subjects import Subjects
from mdq.bus.tenants import ensure_tenants_bucket, put_policy
from mdq.core.tenants import TenantPolicy
from services.intake.app import Intake
from tests.integration.test_intake import settings_for, started
from tests.integration.test_tenants import ask, submitted_events
from tests.tables import named_cases


@pytest.fixture
async def intake(
    nats_url: str, namespace: str, nc: Client, subjects: Subjects, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Intake]:
    monkeypatch.setenv("MDQ_LIMITS_MAX_STEPS_PER_JOB", "1000000")
    monkeypatch.setenv("MDQ_LIMITS_MAX_WALL_S", "3600")
    monkeypatch.setenv("MDQ_LIMITS_MAX_DISK_MB", "2048")
    js = nc.jetstream()
    await ensure_tenants_bucket(js, subjects)
    await put_policy(js, subjects, "alice", TenantPolicy(max_steps_per_job=5000, max_wall_s=600))
    service = await started(settings_for(nats_url, namespace))
    yield service
    await service.stop()


def submit(key: str, **job: object) -> dict[str, object]:
    return {"idempotency_key": key, "jobs": [{"name": "w", **job}]}


REFUSED = [
    ("the operator's steps", "", {"steps": 10**10}, "jobs[0].steps",
     "above the operator's limit of 1000000 steps per job"),
    ("a tenant's own steps limit", "alice", {"steps": 6000}, "jobs[0].steps",
     "above tenant alice's limit of 5000 steps per job"),
    ("a tenant's wall time", "alice", {"steps": 100, "max_wall_s": 601}, "jobs[0].max_wall_s",
     "above tenant alice's limit of 600 s"),
    ("the default disk for a tenant without one", "alice", {"steps": 100, "max_disk_mb": 4096},
     "jobs[0].max_disk_mb", "above tenant alice's limit of 2048 MiB"),
    ("a tenant without a policy gets the defaults", "bob", {"steps": 2_000_000},
     "jobs[0].steps", "tenant bob's limit of 1000000 steps"),
]  # fmt: skip


@named_cases(("tenant", "job", "field", "message"), REFUSED)
async def test_an_over_limit_submit_is_refused_naming_the_limit(
    intake: Intake,
    nc: Client,
    subjects: Subjects,
    tenant: str,
    job: dict[str, object],
    field: str,
    message: str,
) -> None:
    reply = await ask(nc, subjects, tenant, submit("k-over", **job))
    assert (reply.error.field, not reply.job_ids) == (field, True)
    assert message in reply.error.message, reply.error.message


async def test_a_job_within_its_limits_gets_them_filled_in(
    intake: Intake, nc: Client, subjects: Subjects
) -> None:
    mine = await ask(nc, subjects, "alice", submit("k-in", steps=5000))
    ops = await ask(nc, subjects, "", submit("k-ops", steps=1000, max_wall_s=60))
    assert mine.job_ids and ops.job_ids, (mine, ops)
    events = await submitted_events(nc.jetstream(), subjects)
    specs = {event.job_id: event.submitted.spec for event in events.values()}
    alices = specs[mine.job_ids[0]]
    assert (alices.max_wall_s, alices.max_disk_mb) == (600, 2048)
    operators = specs[ops.job_ids[0]]
    assert (operators.max_wall_s, operators.max_disk_mb) == (60, 2048)
    # the same submit again is the same content, whatever the limits filled in
    again = await ask(nc, subjects, "alice", submit("k-in", steps=5000))
    assert list(again.job_ids) == list(mine.job_ids) and not again.error.message
