"""Indexes for the documented questions about a recent window of ends (cancels, failures).

Two questions of docs/history.md read every row of their kind in the history, a read that grows
with it:

* which jobs were cancelled in the last week, by whom and why: through
  ``ix_jobs_state_submitted_at`` every cancelled job (that index is ordered by submission, the
  question by the cancel's time, ``updated_at``). ``ix_jobs_cancelled`` holds the cancelled jobs
  by ``updated_at`` alone. A cancelled job is never updated again (a terminal state accepts no
  event), so it costs one entry per cancelled job, written once; no other job's update touches
  it.
* which nodes the environment failed attempts on in the last 30 days: ``ix_attempts_failures``
  held the failed attempts by reason alone; it now holds them by reason and end
  (``failure_reason, ended_at``, still only the failed attempts, with ``job_id`` and
  ``steps_lost``), so a window of one reason is a range of it. It also gives a reason's latest
  end (``failure_tallies``, revision 0019) from its last entry.

Revision ID: 0022_jobs_cancelled
Revises: 0021_usage_samples_recent
Create Date: 2026-12-04
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0022_jobs_cancelled"
down_revision: str | None = "0021_usage_samples_recent"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

FAILED = sa.text("failure_reason IS NOT NULL")


def upgrade() -> None:
    op.create_index(
        "ix_jobs_cancelled",
        "jobs",
        ["updated_at"],
        postgresql_where=sa.text("state = 'CANCELLED'"),
    )
    op.drop_index("ix_attempts_failures", table_name="attempts")
    op.create_index(
        "ix_attempts_failures",
        "attempts",
        ["failure_reason", "ended_at"],
        postgresql_include=["job_id", "steps_lost"],
        postgresql_where=FAILED,
    )


def downgrade() -> None:
    op.drop_index("ix_attempts_failures", table_name="attempts")
    op.create_index(
        "ix_attempts_failures",
        "attempts",
        ["failure_reason"],
        postgresql_include=["job_id", "steps_lost", "ended_at"],
        postgresql_where=FAILED,
    )
    op.drop_index("ix_jobs_cancelled", table_name="jobs")
