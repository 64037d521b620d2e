"""Job control (docs/control.md): ``jobs.control`` holds the control in force on a job, as the
fold keeps it (``mdq.core.state.JobView.control_dict``): ``hold`` (the state a release returns
the job to), ``stop`` (why its attempt is being stopped: cancel, hold, requeue, limit) and who
asked; NULL when none. ``priority_class`` is the job's class now (a reprioritize changes it)
and ``target_steps`` its step target now (an extend raises it); the new states HELD and
CANCELLED need no change (``state`` is text).

Revision ID: 0012_job_control
Revises: 0011_attempt_copies
Create Date: 2026-12-10
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0012_job_control"
down_revision: str | None = "0011_attempt_copies"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # nullable, no default: PostgreSQL adds the column without rewriting the table
    op.add_column(
        "jobs",
        sa.Column(
            "control",
            postgresql.JSONB(),
            nullable=True,
            comment="Job control in force: hold, stop, who asked (JobView.control_dict).",
        ),
    )


def downgrade() -> None:
    op.drop_column("jobs", "control")
