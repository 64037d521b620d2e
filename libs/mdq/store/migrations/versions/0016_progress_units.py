"""The units a job's energies, temperature, time and pressure are reported in
(``progress.units``, each report's ``Progress.units``, and ``jobs.units``): NULL when they are
in the units their column names say (kJ/mol, K, ps, bar); "lj" for a LAMMPS job in reduced
Lennard-Jones units, whose stored values are then the reduced ones (docs/engines.md).

Revision ID: 0016_progress_units
Revises: 0015_attempts_started_at
Create Date: 2026-12-04
"""

import importlib.util
from collections.abc import Sequence
from pathlib import Path

import sqlalchemy as sa
from alembic import op

revision: str = "0016_progress_units"
down_revision: str | None = "0015_attempts_started_at"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


KEPT_COLUMNS = "eta_s, done_reason"
"""How revision 0014's roll-up function ends the column lists of the reports it keeps."""


def _rollup_function(*, with_units: bool) -> str:
    """Revision 0014's ``mdq_rollup_progress``, as CREATE OR REPLACE, keeping ``units`` too
    when ``with_units`` (a kept report keeps its units)."""
    path = Path(__file__).with_name("0014_progress_rollups.py")
    spec = importlib.util.spec_from_file_location("mdq_revision_0014", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sql = str(module.ROLLUP_FUNCTION).replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1)
    if with_units:
        if sql.count(KEPT_COLUMNS) != 2:
            raise RuntimeError("revision 0014's roll-up no longer lists the kept columns as known")
        sql = sql.replace(KEPT_COLUMNS, KEPT_COLUMNS + ", units")
    return sql


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
    op.execute(_rollup_function(with_units=True))


def downgrade() -> None:
    op.execute(_rollup_function(with_units=False))
    op.drop_column("jobs", "units")
    op.drop_column("progress", "units")
