"""Store each progress report once: in ``progress``, not also in the events table.

Progress reports are nearly all of the log (one every few hundred MD steps per running job).
Until now each was written twice, as a JSONB row of ``events`` (a text primary key and an
index on ``(job_id, time)``) and as a row of ``progress``; the first write was more than half
of the watcher's cost per report. Now:

* the table ``events`` is renamed ``job_events`` and holds the events of the JOBS stream;
* ``progress`` gains what the envelope and the body carried beyond the energies
  (``event_id``, ``stream_seq``, ``producer``, ``target_steps``, ``eta_s``, ``done_reason``),
  filled from the stored events for existing rows, whose events rows are then deleted;
* the view ``events`` is every event of both streams as before: ``job_events`` plus the
  progress rows with their body rebuilt as the protobuf JSON mapping (defaults left out,
  int64 as strings), so queries, ``job_timeline`` and plain SQL keep working unchanged.

Revision ID: 0003_progress_once
Revises: 0002_history_views
Create Date: 2026-11-29
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003_progress_once"
down_revision: str | None = "0002_history_views"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

PROGRESS_BODY = """jsonb_strip_nulls(jsonb_build_object(
        'step', CASE WHEN p.step <> 0 THEN p.step::text END,
        'target_steps', CASE WHEN p.target_steps <> 0 THEN p.target_steps::text END,
        'time_ps', NULLIF(p.time_ps, 0),
        'potential_kj_mol', NULLIF(p.potential_kj_mol, 0),
        'kinetic_kj_mol', NULLIF(p.kinetic_kj_mol, 0),
        'temperature_k', NULLIF(p.temperature_k, 0),
        'ns_per_day', NULLIF(p.ns_per_day, 0),
        'eta_s', NULLIF(p.eta_s, 0),
        'done_reason', NULLIF(p.done_reason, '')))"""

EVENTS_VIEW = f"""
    SELECT e.event_id, e.stream, e.stream_seq, e.job_id, e.attempt, e.kind, e.time, e.producer,
           e.body
    FROM job_events e
    UNION ALL
    SELECT p.event_id, p.stream, p.stream_seq, p.job_id, p.attempt, 'progress', p.time,
           p.producer, {PROGRESS_BODY}
    FROM progress p
"""

JOB_TIMELINE_VIEW = """
    SELECT e.job_id, e.time, e.attempt, e.kind, e.producer, e.stream, e.stream_seq,
           e.event_id, e.body
    FROM events e
    WHERE e.job_id IS NOT NULL
"""

NEW_PROGRESS_COLUMNS: tuple[sa.Column[object], ...] = (
    sa.Column(
        "event_id", sa.Text(), nullable=False, server_default="", comment="The report's event id."
    ),
    sa.Column(
        "stream",
        sa.Text(),
        nullable=False,
        server_default="",
        comment="The PROGRESS stream it was read from.",
    ),
    sa.Column("stream_seq", sa.BigInteger(), nullable=False, server_default="0"),
    sa.Column("producer", sa.Text(), nullable=False, server_default=""),
    sa.Column("target_steps", sa.BigInteger(), nullable=False, server_default="0"),
    sa.Column("eta_s", sa.Double(), nullable=False, server_default="0"),
    sa.Column(
        "done_reason",
        sa.Text(),
        nullable=False,
        server_default="",
        comment="'' until the report that ends the run.",
    ),
)


def upgrade() -> None:
    op.execute("DROP VIEW IF EXISTS job_timeline")
    op.rename_table("events", "job_events")
    op.execute("ALTER INDEX pk_events RENAME TO pk_job_events")
    op.execute("ALTER INDEX ix_events_job_id_time RENAME TO ix_job_events_job_id_time")
    for column in NEW_PROGRESS_COLUMNS:
        op.add_column("progress", column)
    op.execute(
        """
        UPDATE progress p SET
            event_id = e.event_id, stream = e.stream, stream_seq = e.stream_seq,
            producer = e.producer,
            target_steps = COALESCE((e.body->>'target_steps')::bigint, 0),
            eta_s = COALESCE((e.body->>'eta_s')::float8, 0),
            done_reason = COALESCE(e.body->>'done_reason', '')
        FROM job_events e
        WHERE e.kind = 'progress' AND e.job_id = p.job_id AND e.attempt = p.attempt
          AND COALESCE((e.body->>'step')::bigint, 0) = p.step
        """
    )
    op.execute(
        "UPDATE progress SET event_id = 'progress:' || job_id || ':' || attempt || ':' || step "
        "WHERE event_id = ''"
    )
    op.execute("DELETE FROM job_events WHERE kind = 'progress'")
    op.alter_column(
        "job_events",
        "kind",
        existing_type=sa.Text(),
        comment="Event.body case: submitted, bound ...",
        existing_comment="Event.body case: submitted, progress ...",
    )
    for column in NEW_PROGRESS_COLUMNS:
        op.alter_column("progress", column.name, server_default=None)
    op.execute(f"CREATE VIEW events AS {EVENTS_VIEW}")
    op.execute(f"CREATE VIEW job_timeline AS {JOB_TIMELINE_VIEW}")


def downgrade() -> None:
    op.execute("DROP VIEW IF EXISTS job_timeline")
    op.execute("DROP VIEW IF EXISTS events")
    op.execute(
        f"""
        INSERT INTO job_events (event_id, stream, stream_seq, job_id, attempt, kind, time,
                                producer, body)
        SELECT p.event_id, p.stream, p.stream_seq, p.job_id, p.attempt, 'progress', p.time,
               p.producer, {PROGRESS_BODY}
        FROM progress p
        ON CONFLICT (event_id) DO NOTHING
        """
    )
    for column in reversed(NEW_PROGRESS_COLUMNS):
        op.drop_column("progress", column.name)
    op.alter_column(
        "job_events",
        "kind",
        existing_type=sa.Text(),
        comment="Event.body case: submitted, progress ...",
        existing_comment="Event.body case: submitted, bound ...",
    )
    op.execute("ALTER INDEX ix_job_events_job_id_time RENAME TO ix_events_job_id_time")
    op.execute("ALTER INDEX pk_job_events RENAME TO pk_events")
    op.rename_table("job_events", "events")
    op.execute(f"CREATE VIEW job_timeline AS {JOB_TIMELINE_VIEW}")
