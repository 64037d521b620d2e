"""The units a job's energies, temperature, time and pressure are reported in
(``progress.units``, each report's ``Progress.units``, and ``jobs.units``): NULL when they are
in the units their column names say (kJ/mol, K, ps, bar); "lj" for a LAMMPS job in reduced
Lennard-Jones units, whose stored values are then the reduced ones (docs/engines.md).

Revision ID: 0013_progress_units
Revises: 0012_job_control
Create Date: 2026-12-04
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013_progress_units"
down_revision: str | None = "0012_job_control"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # nullable, no default: PostgreSQL adds the columns without rewriting the tables (the
    # partitioned progress table passes it on to every partition)
    op.add_column(
        "progress",
        sa.Column(
            "units",
            sa.Text(),
            nullable=True,
            comment="Progress.units: NULL as the column names say; lj: reduced LJ units.",
        ),
    )
    op.add_column(
        "jobs",
        sa.Column(
            "units",
            sa.Text(),
            nullable=True,
            comment="Units of the job's reported figures: NULL as the column names say; "
            "lj: reduced Lennard-Jones units (docs/engines.md).",
        ),
    )


def downgrade() -> None:
    op.drop_column("jobs", "units")
    op.drop_column("progress", "units")
