"""Job control in the history (docs/history.md, docs/control.md): the control events are
projected into PostgreSQL by the watcher's projector as every other event, and a projection
rebuilt from the log (``mdq replay --rebuild``) equals the live one."""

from __future__ import annotations

import json

import asyncpg
from nats.js import JetStreamContext

from mdq.bus.subjects import Subjects
from mdq.cli.replay import rebuild
from mdq.contracts import pb
from tests.helpers import OwnersPublisher
from tests.integration.test_projector import History, running, wait_projected
from tests.integration.test_replay import assert_rebuilt_equals_live

ORIGIN = pb.ControlOrigin(control_id="c1", requested_by="ann", reason="typo")


def stopped(history: History, attempt: int, last_step: int) -> pb.Event:
    body = pb.AttemptFailed(
        reason=pb.FAILURE_STOPPED, exit_code=5, message="stopped", node="n1", last_step=last_step
    )
    return history.event("attempt_failed", body, attempt)


def histories() -> tuple[dict[str, History], list[pb.Event]]:
    jobs = {
        name: History(name, request_id=request_id)
        for name, request_id in (
            ("cancelled", "aaaaaaaaaaaa"),
            ("pending", "bbbbbbbbbbbb"),
            ("held", "cccccccccccc"),
            ("released", "dddddddddddd"),
            ("extended", "eeeeeeeeeeee"),
        )
    }
    events: list[pb.Event] = []
    job = jobs["cancelled"]
    events += [job.submitted(), job.bound(1, "n1"), job.started(1, "n1")]
    events += [job.progress(1, step) for step in (100, 200, 300)]
    events += [
        job.event("cancel_requested", pb.CancelRequested(origin=ORIGIN), 1, detail="c1"),
        job.checkpoint(1, 350),
        stopped(job, 1, 350),
        job.event("cancelled", pb.JobCancelled(origin=ORIGIN, message="cancelled by ann"), 1),
    ]
    job = jobs["pending"]
    events += [
        job.submitted(),
        job.event("cancelled", pb.JobCancelled(origin=ORIGIN, message="cancelled by ann"), 1),
    ]
    job = jobs["held"]  # held while running: stopped, requeued HELD
    events += [job.submitted(), job.bound(1, "n1"), job.started(1, "n1"), job.progress(1, 100)]
    events += [
        job.event("held", pb.JobHeld(origin=ORIGIN), 1, detail="c1"),
        job.checkpoint(1, 150),
        stopped(job, 1, 150),
        job.event(
            "requeued",
            pb.JobRequeued(resume_from=job.checkpoint_body(150), after=pb.FAILURE_STOPPED),
            2,
        ),
    ]
    job = jobs["released"]  # held, reprioritized and released before it ran
    events += [
        job.submitted(),
        job.event("held", pb.JobHeld(origin=ORIGIN), 1, detail="c1"),
        job.event(
            "reprioritized",
            pb.JobReprioritized(origin=ORIGIN, priority_class="low", previous="high"),
            1,
            detail="c2",
        ),
        job.event("unheld", pb.JobUnheld(origin=ORIGIN), 1, detail="c3"),
        job.bound(1, "n2"),
    ]
    job = jobs["extended"]
    events += [job.submitted(), job.bound(1, "n1"), job.started(1, "n1")]
    events += [job.progress(1, step) for step in range(100, 1001, 100)]
    events += [job.checkpoint(1, 1000), job.succeeded(1, 1000)]
    spec = pb.JobSpec()
    spec.CopyFrom(job.spec)
    spec.steps = 1500
    extended = pb.JobExtended(
        origin=ORIGIN,
        added_steps=500,
        spec=spec,
        resume_from=job.checkpoint_body(1000),
        request_id=job.request_id,
        resources=job.spec.resources,
    )
    extended.submitted_at.FromDatetime(job.times["submitted:0"])
    events += [job.event("extended", extended, 2), job.bound(2, "n2"), job.started(2, "n2")]
    job.spec.steps = 1500  # what the extension's runner reports as its target
    events += [job.progress(2, step) for step in range(1100, 1501, 100)]
    events += [job.succeeded(2, 1500)]
    return jobs, events


async def test_control_events_project_and_rebuild_equal(
    js: JetStreamContext,
    subjects: Subjects,
    pool: asyncpg.Pool,
    database_url: str,
    spare_database: str,
) -> None:
    jobs, events = histories()
    publisher = OwnersPublisher(js=js, subjects=subjects)
    async with running(js, subjects, pool, batch_size=7):
        for event in events:
            await publisher.publish(event)
        await wait_projected(js, subjects, pool)

    rows = {
        row["job_id"]: row
        for row in await pool.fetch(
            "SELECT job_id, state, attempt, priority_class, target_steps, last_step, "
            "final_reason, final_message, control::text AS control FROM jobs"
        )
    }
    by_name = {name: rows[job.job_id] for name, job in jobs.items()}
    cancelled = by_name["cancelled"]
    assert (cancelled["state"], cancelled["final_reason"], cancelled["final_message"]) == (
        "CANCELLED",
        "CANCELLED",
        "cancelled by ann",
    )
    assert json.loads(cancelled["control"])["stop"] == "cancel"
    assert by_name["pending"]["state"] == "CANCELLED"
    held = by_name["held"]
    assert (held["state"], held["attempt"]) == ("HELD", 2)
    assert json.loads(held["control"]) == {"hold": "PENDING"}
    released = by_name["released"]
    assert (released["state"], released["priority_class"], released["control"]) == (
        "BOUND",
        "low",
        None,
    )
    extended = by_name["extended"]
    assert (extended["state"], extended["attempt"], extended["target_steps"]) == (
        "SUCCEEDED",
        2,
        1500,
    )
    assert extended["last_step"] == 1500
    attempts = await pool.fetch(
        "SELECT job_id, attempt, failure_reason, resumed_from_step FROM attempts "
        "WHERE job_id = ANY($1::text[]) ORDER BY job_id, attempt",
        [jobs["cancelled"].job_id, jobs["extended"].job_id],
    )
    assert [(r["attempt"], r["failure_reason"], r["resumed_from_step"]) for r in attempts] == [
        (1, "FAILURE_STOPPED", 0),
        (1, None, 0),
        (2, None, 1000),
    ]
    kinds = await pool.fetch("SELECT kind, count(*) AS n FROM job_events GROUP BY kind")
    counted = {row["kind"]: row["n"] for row in kinds}
    assert {k: counted[k] for k in ("cancel_requested", "cancelled", "held", "unheld")} == {
        "cancel_requested": 1,
        "cancelled": 2,
        "held": 2,
        "unheld": 1,
    }
    assert (counted["reprioritized"], counted["extended"]) == (1, 1)

    report = await rebuild(js, subjects, spare_database, batch_size=500)
    assert report.events == len(events)
    await assert_rebuilt_equals_live(database_url, spare_database)
