"""Create the projection's tables: jobs, attempts, events, progress, checkpoints,
placements, rejections, consumer_offsets.

Revision ID: 0001_initial
Revises:
Create Date: 2026-11-29
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0001_initial"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "checkpoints",
        sa.Column("job_id", sa.Text(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("step", sa.BigInteger(), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("sha256", sa.Text(), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("time_ps", sa.Double(), nullable=False),
        sa.Column("time", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("job_id", "attempt", "step", name=op.f("pk_checkpoints")),
    )
    op.create_table(
        "consumer_offsets",
        sa.Column("consumer", sa.Text(), nullable=False),
        sa.Column("stream", sa.Text(), nullable=False),
        sa.Column("last_seq", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("consumer", name=op.f("pk_consumer_offsets")),
    )
    op.create_table(
        "events",
        sa.Column("event_id", sa.Text(), nullable=False),
        sa.Column("stream", sa.Text(), nullable=False),
        sa.Column("stream_seq", sa.BigInteger(), nullable=False),
        sa.Column("job_id", sa.Text(), nullable=True),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column(
            "kind", sa.Text(), nullable=False, comment="Event.body case: submitted, progress ..."
        ),
        sa.Column("time", sa.DateTime(timezone=True), nullable=False),
        sa.Column("producer", sa.Text(), nullable=False),
        sa.Column(
            "body",
            postgresql.JSONB(astext_type=sa.Text()),
            nullable=False,
            comment="The body, protobuf JSON mapping.",
        ),
        sa.PrimaryKeyConstraint("event_id", name=op.f("pk_events")),
    )
    op.create_index(op.f("ix_events_job_id_time"), "events", ["job_id", "time"], unique=False)
    op.create_table(
        "jobs",
        sa.Column("job_id", sa.Text(), nullable=False, comment="request_id-name"),
        sa.Column(
            "request_id", sa.Text(), nullable=False, comment="The submit this job came from."
        ),
        sa.Column(
            "name", sa.Text(), nullable=False, comment="JobSpec.name, unique within the submit."
        ),
        sa.Column("task", sa.Text(), nullable=False, comment="Task enum name, e.g. TASK_MD."),
        sa.Column("state", sa.Text(), nullable=False, comment="mdq.core.state.JobState name."),
        sa.Column("attempt", sa.Integer(), nullable=False, comment="Current attempt, from 1."),
        sa.Column("priority_class", sa.Text(), nullable=False, comment="high, normal or low."),
        sa.Column(
            "node", sa.Text(), nullable=True, comment="Node of the current attempt, if bound."
        ),
        sa.Column("pod_name", sa.Text(), nullable=True, comment="Pod of the current attempt."),
        sa.Column(
            "spec",
            postgresql.JSONB(astext_type=sa.Text()),
            nullable=False,
            comment="JobSpec, protobuf JSON mapping.",
        ),
        sa.Column(
            "depends_on",
            postgresql.ARRAY(sa.Text()),
            nullable=False,
            comment="Job ids this job waits for.",
        ),
        sa.Column("submitted_by", sa.Text(), nullable=True),
        sa.Column("submitted_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column(
            "updated_at",
            sa.DateTime(timezone=True),
            nullable=False,
            comment="Time of the last event applied.",
        ),
        sa.Column(
            "target_steps", sa.BigInteger(), nullable=False, comment="Step target (JobSpec.steps)."
        ),
        sa.Column("last_step", sa.BigInteger(), nullable=False, comment="Last MD step reported."),
        sa.Column("last_potential_kj_mol", sa.Double(), nullable=True),
        sa.Column("last_temperature_k", sa.Double(), nullable=True),
        sa.Column("last_ns_per_day", sa.Double(), nullable=True),
        sa.Column("last_progress_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("done_reason", sa.Text(), nullable=True, comment="steps_reached, converged ..."),
        sa.Column(
            "final_reason", sa.Text(), nullable=True, comment="FailureReason name if FAILED."
        ),
        sa.Column("final_message", sa.Text(), nullable=True),
        sa.Column("latest_checkpoint_step", sa.BigInteger(), nullable=True),
        sa.PrimaryKeyConstraint("job_id", name=op.f("pk_jobs")),
    )
    op.create_index(op.f("ix_jobs_request_id"), "jobs", ["request_id"], unique=False)
    op.create_index(op.f("ix_jobs_state"), "jobs", ["state"], unique=False)
    op.create_index(op.f("ix_jobs_submitted_at"), "jobs", ["submitted_at"], unique=False)
    op.create_table(
        "placements",
        sa.Column("job_id", sa.Text(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("node", sa.Text(), nullable=False),
        sa.Column(
            "candidates",
            postgresql.JSONB(astext_type=sa.Text()),
            nullable=False,
            comment="NodeScore list, JSON mapping.",
        ),
        sa.Column("time", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("job_id", "attempt", name=op.f("pk_placements")),
    )
    op.create_table(
        "progress",
        sa.Column("job_id", sa.Text(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("step", sa.BigInteger(), nullable=False),
        sa.Column("time", sa.DateTime(timezone=True), nullable=False),
        sa.Column("time_ps", sa.Double(), nullable=False),
        sa.Column("potential_kj_mol", sa.Double(), nullable=False),
        sa.Column("kinetic_kj_mol", sa.Double(), nullable=False),
        sa.Column("temperature_k", sa.Double(), nullable=False),
        sa.Column("ns_per_day", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("job_id", "attempt", "step", name=op.f("pk_progress")),
    )
    op.create_table(
        "rejections",
        sa.Column("request_id", sa.Text(), nullable=False),
        sa.Column("idempotency_key", sa.Text(), nullable=True),
        sa.Column("field", sa.Text(), nullable=True),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("time", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("request_id", name=op.f("pk_rejections")),
    )
    op.create_table(
        "attempts",
        sa.Column("job_id", sa.Text(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("node", sa.Text(), nullable=True),
        sa.Column("pod_name", sa.Text(), nullable=True),
        sa.Column("bound_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("failure_reason", sa.Text(), nullable=True, comment="FailureReason name."),
        sa.Column("failure_message", sa.Text(), nullable=True),
        sa.Column(
            "resumed_from_step",
            sa.BigInteger(),
            nullable=False,
            comment="Checkpoint step resumed from.",
        ),
        sa.Column(
            "steps_lost",
            sa.BigInteger(),
            nullable=False,
            comment="Steps beyond the checkpoint, lost.",
        ),
        sa.Column(
            "last_step",
            sa.BigInteger(),
            nullable=False,
            comment="Last MD step this attempt reached.",
        ),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.job_id"], name=op.f("fk_attempts_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("job_id", "attempt", name=op.f("pk_attempts")),
    )


def downgrade() -> None:
    op.drop_table("attempts")
    op.drop_table("rejections")
    op.drop_table("progress")
    op.drop_table("placements")
    op.drop_index(op.f("ix_jobs_submitted_at"), table_name="jobs")
    op.drop_index(op.f("ix_jobs_state"), table_name="jobs")
    op.drop_index(op.f("ix_jobs_request_id"), table_name="jobs")
    op.drop_table("jobs")
    op.drop_index(op.f("ix_events_job_id_time"), table_name="events")
    op.drop_table("events")
    op.drop_table("consumer_offsets")
    op.drop_table("checkpoints")
