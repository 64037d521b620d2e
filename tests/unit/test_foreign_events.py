"""What consumers skip as not what it claims to be (``mdq.bus.codec.foreign_reason``): an
event without a body, from a producer that may not emit its kind, or on a subject other than
its producer's. A progress report that passed is remembered by (subject, producer, job): what
was remembered must not let another report through."""

from __future__ import annotations

import pytest

from mdq.bus.codec import foreign_reason
from mdq.contracts import pb


def report(job: str = "t.0123456789ab-w", producer: str = "runner") -> pb.Event:
    return pb.Event(job_id=job, producer=producer, progress=pb.Progress(step=10))


CASES: dict[str, tuple[pb.Event, str, str | None]] = {
    "a report on its job's subject": (report(), "mdq.progress.t.0123456789ab-w", None),
    "a report of another job on this one's subject": (
        report("t.0123456789ab-x"),
        "mdq.progress.t.0123456789ab-w",
        "a progress event of t.0123456789ab-x on mdq.progress.t.0123456789ab-w",
    ),
    "a report by a producer that may not report": (
        report(producer="intake"),
        "mdq.progress.t.0123456789ab-w",
        "producer 'intake' may not emit progress",
    ),
    "a report on a lifecycle subject": (
        report(),
        "mdq.job.t.0123456789ab-w.progress",
        "a progress event of t.0123456789ab-w on mdq.job.t.0123456789ab-w.progress",
    ),
    "no body": (pb.Event(job_id="j", producer="runner"), "mdq.progress.j", "no body"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_foreign_reason(case: str) -> None:
    event, subject, expected = CASES[case]
    for _ in range(2):  # again, after whatever the first check remembered
        assert foreign_reason(event, subject) == expected


def test_a_remembered_report_lets_no_other_through() -> None:
    """After a job's report passed, its job's subject still refuses another producer's and
    another job's reports, and the same report on another namespace's subject is checked anew."""
    subject = "mdq.progress.t.0123456789ab-w"
    assert foreign_reason(report(), subject) is None
    assert foreign_reason(report(producer="placement"), subject) is not None
    assert foreign_reason(report("t.0123456789ab-x"), subject) is not None
    assert foreign_reason(report(), "other.progress.t.0123456789ab-w") is None
    assert foreign_reason(report(), "other.job.t.0123456789ab-w.progress") is not None
