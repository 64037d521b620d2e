"""Indexes for the web console's jobs list at a year's size (docs/console.md).

* ``ix_jobs_submitted_at_job_id`` (submitted_at, job_id): the jobs list, newest first, pages
  by keyset (``(submitted_at, job_id) < (last row's)``): one index range scan per page, however
  deep; the index on ``submitted_at`` alone could not take the job id part of the cursor;
* ``ix_jobs_labels``: a GIN index (``jsonb_path_ops``) on the spec's labels, so "the jobs with
  label key=value" (a campaign page, the list's label filter: ``spec->'labels' @> …``) reads the
  matching jobs instead of every job's spec.

Revision ID: 0009_console_indexes
Revises: 0008_partitions
Create Date: 2026-12-02
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009_console_indexes"
down_revision: str | None = "0008_partitions"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index("ix_jobs_submitted_at_job_id", "jobs", ["submitted_at", "job_id"])
    op.create_index(
        "ix_jobs_labels",
        "jobs",
        [sa.text("(spec -> 'labels') jsonb_path_ops")],
        postgresql_using="gin",
    )


def downgrade() -> None:
    op.drop_index("ix_jobs_labels", table_name="jobs")
    op.drop_index("ix_jobs_submitted_at_job_id", table_name="jobs")
