"""The view ``job_outputs``: every file a job's runner reported at its end, one row each.

The runner publishes ``job.<id>.outputs`` (``JobOutputs``: the output folder, the final step
and each file with its kind, format, size, sha256 and frame count); the projection stores it in
``job_events``. This view unpacks it, so "where is the trajectory of this job, and is it the
one that was written" is one query (docs/history.md).

Revision ID: 0004_job_outputs
Revises: 0003_progress_once
Create Date: 2026-11-29
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0004_job_outputs"
down_revision: str | None = "0003_progress_once"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JOB_OUTPUTS_VIEW = """
    SELECT e.job_id, e.attempt, e.time,
           e.body->>'output_dir' AS output_dir,
           COALESCE((e.body->>'final_step')::bigint, 0) AS final_step,
           f->>'kind' AS kind,
           f->>'path' AS path,
           f->>'format' AS format,
           COALESCE((f->>'size_bytes')::bigint, 0) AS size_bytes,
           f->>'sha256' AS sha256,
           COALESCE((f->>'frames')::bigint, 0) AS frames
    FROM job_events e
    CROSS JOIN LATERAL jsonb_array_elements(COALESCE(e.body->'files', '[]'::jsonb)) AS f
    WHERE e.kind = 'outputs'
"""


def upgrade() -> None:
    op.execute(f"CREATE VIEW job_outputs AS {JOB_OUTPUTS_VIEW}")


def downgrade() -> None:
    op.execute("DROP VIEW IF EXISTS job_outputs")
