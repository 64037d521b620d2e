"""A job's summary line (``mdq.store.queries.JobSummary``), the one ``mdq ls`` and the console's
lists both show: whose it is, the reason a line shows and how far it got, and the ``mdq ls``
row made of it. Named cases. Pure."""

from __future__ import annotations

import io
from dataclasses import replace
from datetime import UTC, datetime

import pytest
from rich.console import Console

from mdq.cli.history import summary_table
from mdq.store.queries import JobSummary

AT = datetime(2026, 11, 29, 12, tzinfo=UTC)
LINE = JobSummary(
    job_id="0123456789ab-relax",
    name="relax",
    task="TASK_MD",
    state="RUNNING",
    attempt=1,
    priority_class="normal",
    node="n1",
    submitted_at=AT,
    updated_at=AT,
    target_steps=1000,
    last_step=250,
    last_ns_per_day=12.5,
    labels={},
    done_reason=None,
    final_reason=None,
)


@pytest.mark.parametrize(
    "name, done, final, shown",
    [
        ("running", None, None, ""),
        ("succeeded", "steps_reached", None, "steps_reached"),
        ("failed", None, "FAILURE_UNSTABLE", "FAILURE_UNSTABLE"),
        ("failed after a done report", "steps_reached", "FAILURE_LOST", "FAILURE_LOST"),
        ("blank columns", "", "", ""),
    ],
)
def test_the_reason_a_line_shows(
    name: str, done: str | None, final: str | None, shown: str
) -> None:
    assert replace(LINE, done_reason=done, final_reason=final).reason == shown, name


@pytest.mark.parametrize(
    "job_id, tenant",
    [("0123456789ab-relax", ""), ("lab.0123456789ab-relax", "lab")],
)
def test_the_tenant_is_the_one_the_id_carries(job_id: str, tenant: str) -> None:
    assert replace(LINE, job_id=job_id).tenant == tenant


@pytest.mark.parametrize(
    "target, last, fraction",
    [(1000, 250, 0.25), (1000, 1200, 1.0), (0, 10, 0.0), (-1, 0, 0.0)],
)
def test_the_fraction_done_is_within_0_and_1(target: int, last: int, fraction: float) -> None:
    assert replace(LINE, target_steps=target, last_step=last).fraction_done == fraction


def test_mdq_ls_prints_the_tenant_and_the_reason_of_a_line() -> None:
    lines = [
        replace(LINE, job_id="lab.0123456789ab-relax", final_reason="FAILURE_UNSTABLE"),
        replace(LINE, done_reason="steps_reached"),
    ]
    buffer = io.StringIO()
    Console(file=buffer, width=200, color_system=None).print(summary_table(lines, title="jobs"))
    printed = buffer.getvalue()
    assert "│ lab  " in printed and "FAILURE_UNSTABLE" in printed
    assert "(operator)" in printed and "steps_reached" in printed
