"""Texts of ``mdq watch``'s progress bars (``mdq.cli.live``), as tables of named cases, and the
lines it prints about a job's hold and release."""

from __future__ import annotations

import pytest

from mdq.cli.live import describe, format_energy, format_eta, steps_text
from mdq.contracts import pb
from mdq.core.spec import normalize_job
from mdq.core.state import JobBook
from mdq.sdk.client import JobUpdate
from tests.helpers import event

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


JOB = "0123456789ab-md"
ORIGIN = pb.ControlOrigin(requested_by="ada", reason="check [inputs]")


def said(events: list[pb.Event]) -> list[str | None]:
    """What ``mdq watch`` prints above its bars for each of ``events``, folded in order as
    ``MdqClient.watch`` folds them."""
    book = JobBook()
    lines = []
    for each in events:
        book.apply(0, each)
        update = JobUpdate(job_id=JOB, event=each, view=book.jobs.get(JOB))
        lines.append(describe(update, "md"))
    return lines


def submitted() -> pb.Event:
    spec = normalize_job(pb.JobSpec(name="md", steps=1000), "jobs[0]")
    return event(
        "submitted", pb.JobSubmitted(spec=spec, request_id="0123456789ab"), job=JOB, attempt=0
    )


def test_watch_says_when_a_running_job_is_held_and_released() -> None:
    """The attacker sat before a silent watch after "requeued as attempt 2": the hold, the
    stop, the requeue into HELD and the release each say what they mean."""
    lines = said(
        [
            submitted(),
            event("bound", pb.JobBound(node="n1", pod_name=f"mdq-{JOB}-1"), job=JOB, attempt=1),
            event("started", pb.JobStarted(node="n1"), job=JOB, attempt=1),
            event("held", pb.JobHeld(origin=ORIGIN), job=JOB, attempt=1),
            event(
                "attempt_failed",
                pb.AttemptFailed(reason=pb.FAILURE_STOPPED, message="stopped: hold"),
                job=JOB,
                attempt=1,
            ),
            event("requeued", pb.JobRequeued(), job=JOB, attempt=2),
            event(
                "unheld",
                pb.JobUnheld(origin=pb.ControlOrigin(requested_by="ada")),
                job=JOB,
                attempt=2,
            ),
        ]
    )
    assert lines[3] == (
        "md: [yellow]hold[/] by ada: check \\[inputs]: attempt 1 is stopping at a checkpoint, "
        "then held"
    )
    assert lines[5] == "md: requeued as attempt 2, from the start, [yellow]held[/] until released"
    assert lines[6] == "md: released by ada: pending"


def test_watch_says_when_a_pending_job_is_held_and_released() -> None:
    lines = said(
        [
            submitted(),
            event("held", pb.JobHeld(origin=pb.ControlOrigin()), job=JOB, attempt=0),
            event("unheld", pb.JobUnheld(origin=ORIGIN), job=JOB, attempt=0),
        ]
    )
    assert lines[1:] == [
        "md: [yellow]held[/]: not placed until released",
        "md: released by ada: check \\[inputs]: pending",
    ]
