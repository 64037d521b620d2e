"""``ix_usage_samples_recent``: what one kind of system used in a recent window, from one index.

docs/history.md's memory question ("how much memory water boxes of about 2,700 atoms really
peak at") read every measured sample of that system and size the history holds, through
``ix_usage_samples_system`` (``system_kind, box_nm``): a read that grows with the history. The
question now asks about the last week (what today's software and machines use), and this index,
``(system_kind, time)`` with the figures it reads and only the measured samples, serves a window
of any system from the index alone; its cost follows the window, not the history. It replaces
``ix_usage_samples_system``, which served that question alone.

Revision ID: 0021_usage_samples_recent
Revises: 0020_node_hours
Create Date: 2026-12-04
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0021_usage_samples_recent"
down_revision: str | None = "0020_node_hours"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index(
        "ix_usage_samples_recent",
        "usage_samples",
        ["system_kind", "time"],
        postgresql_include=["box_nm", "peak_memory_mb", "memory_limit_mb", "mean_cores"],
        postgresql_where=sa.text("NOT oom_killed"),
    )
    op.drop_index("ix_usage_samples_system", table_name="usage_samples")


def downgrade() -> None:
    op.create_index(
        "ix_usage_samples_system",
        "usage_samples",
        ["system_kind", "box_nm"],
        postgresql_include=["peak_memory_mb", "memory_limit_mb", "mean_cores", "oom_killed"],
    )
    op.drop_index("ix_usage_samples_recent", table_name="usage_samples")
