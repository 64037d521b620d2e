"""Attempts resumed from a copied checkpoint: ``resumed_from_copy`` says an attempt
began from a checkpoint fetched from the store every cluster shares (``mdq.bus.copies``), and
``copy_lag_steps`` says how many of an attempt's ``steps_lost`` were the copy's lag (the steps
between its latest checkpoint and the copy its retry resumed from, after its cluster was lost).

Revision ID: 0011_attempt_copies
Revises: 0010_attempt_usage
Create Date: 2026-12-03
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011_attempt_copies"
down_revision: str | None = "0010_attempt_usage"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # A constant default: PostgreSQL adds such a column without rewriting the table.
    op.add_column(
        "attempts",
        sa.Column(
            "resumed_from_copy",
            sa.Boolean(),
            nullable=False,
            server_default=sa.false(),
            comment="Resumed from a checkpoint copied to the shared store.",
        ),
    )
    op.add_column(
        "attempts",
        sa.Column(
            "copy_lag_steps",
            sa.Integer(),
            nullable=False,
            server_default="0",
            comment="Of steps_lost, the steps the resumed-from copy lagged the latest checkpoint.",
        ),
    )


def downgrade() -> None:
    op.drop_column("attempts", "copy_lag_steps")
    op.drop_column("attempts", "resumed_from_copy")
