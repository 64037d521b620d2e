"""``ix_attempts_started_at`` (started_at) INCLUDE (node): the attempts started in a window.

The console's nodes page counts, per node, the attempts started in the last hour
(``services.console.reads.node_attempts_last_hour``). The index of revision 0002 on
``(node, started_at)`` cannot range over ``started_at`` alone, so the count read every attempt
of the history (129 ms p50 at 1,000,000 jobs, ``make bench-history --quick``); this one reads
the hour's attempts from the index alone.

Revision ID: 0016_attempts_started_at
Revises: 0015_progress_rollups
Create Date: 2026-12-04
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0016_attempts_started_at"
down_revision: str | None = "0015_progress_rollups"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index(
        "ix_attempts_started_at", "attempts", ["started_at"], postgresql_include=["node"]
    )


def downgrade() -> None:
    op.drop_index("ix_attempts_started_at", table_name="attempts")
