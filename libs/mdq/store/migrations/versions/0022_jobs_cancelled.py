"""``ix_jobs_cancelled``: the jobs cancelled in a window, without reading every cancelled job.

docs/history.md asks which jobs were cancelled in the last week, by whom and why. Through
``ix_jobs_state_submitted_at`` that reads every cancelled job of the history (it is ordered by
submission, the question by the cancel's time, ``updated_at``): a read that grows with the
history. This index holds the cancelled jobs by ``updated_at`` alone. A cancelled job is never
updated again (a terminal state accepts no event), so the index costs one entry per cancelled
job, written once, and no other job's update touches it.

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


def upgrade() -> None:
    op.create_index(
        "ix_jobs_cancelled",
        "jobs",
        ["updated_at"],
        postgresql_where=sa.text("state = 'CANCELLED'"),
    )


def downgrade() -> None:
    op.drop_index("ix_jobs_cancelled", table_name="jobs")
