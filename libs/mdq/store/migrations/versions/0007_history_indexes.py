"""Indexes (and one function) for the questions docs/history.md asks of a year of history.

``make bench-history`` loads 100,000 jobs (``--quick``) and times every documented query; at
that size three of them already scanned everything (node utilisation 293 ms, the longest
placement waits 188 ms, failures by reason 16 ms) and would grow tenfold at 1,000,000 jobs.

* ``ix_jobs_state_submitted_at`` (state, submitted_at DESC, job_id): ``mdq ls --state S``, the
  newest first, without sorting every job in that state;
* ``ix_attempts_ended_at``: the attempts that ended in a window (failed in the last day, and
  the ones still running: ``ended_at IS NULL`` uses it too);
* ``ix_attempts_failures`` (failure_reason) INCLUDE (job_id, steps_lost, ended_at), only the
  failed attempts: ``failures_by_reason`` reads the index alone;
* the function ``node_utilisation_since(since)``: the rows of ``node_utilisation`` from the
  hour of ``since`` on (``hour >= date_trunc('hour', since)``, the same numbers). The view
  spreads every attempt of the history over its hours before a filter on the hour can apply;
  the function picks the attempts that reach into that hour by ``ended_at`` first.
  It runs with the caller's rights (SECURITY INVOKER, the default), so a tenant counts its own
  attempts only, as with the view.

Revision ID: 0007_history_indexes
Revises: 0006_tenant_rows
Create Date: 2026-12-02
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0007_history_indexes"
down_revision: str | None = "0006_tenant_rows"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

NODE_UTILISATION_SINCE = """
CREATE FUNCTION node_utilisation_since(since timestamptz)
RETURNS TABLE (
    node text, hour timestamptz, attempts bigint, busy_s numeric, cpu_core_s double precision
)
LANGUAGE sql STABLE AS $$
    SELECT a.node, h.hour, count(*) AS attempts,
           sum(EXTRACT(EPOCH FROM (
               LEAST(COALESCE(a.ended_at, now()), h.hour + interval '1 hour')
               - GREATEST(a.started_at, h.hour)))) AS busy_s,
           sum(COALESCE((j.spec->'resources'->>'cpu')::float8, 1.0) * EXTRACT(EPOCH FROM (
               LEAST(COALESCE(a.ended_at, now()), h.hour + interval '1 hour')
               - GREATEST(a.started_at, h.hour)))) AS cpu_core_s
    FROM attempts a
    JOIN jobs j ON j.job_id = a.job_id
    CROSS JOIN LATERAL generate_series(
        date_trunc('hour', GREATEST(a.started_at, since)), COALESCE(a.ended_at, now()),
        interval '1 hour'
    ) AS h(hour)
    WHERE a.started_at IS NOT NULL AND a.node IS NOT NULL
      AND (a.ended_at > date_trunc('hour', since) OR a.ended_at IS NULL)
    GROUP BY a.node, h.hour
$$
"""


def upgrade() -> None:
    op.create_index(
        "ix_jobs_state_submitted_at",
        "jobs",
        ["state", "submitted_at", "job_id"],
        postgresql_ops={"submitted_at": "DESC"},
    )
    op.create_index("ix_attempts_ended_at", "attempts", ["ended_at"])
    op.create_index(
        "ix_attempts_failures",
        "attempts",
        ["failure_reason"],
        postgresql_include=["job_id", "steps_lost", "ended_at"],
        postgresql_where="failure_reason IS NOT NULL",
    )
    op.execute(NODE_UTILISATION_SINCE)


def downgrade() -> None:
    op.execute("DROP FUNCTION node_utilisation_since(timestamptz)")
    op.drop_index("ix_attempts_failures", table_name="attempts")
    op.drop_index("ix_attempts_ended_at", table_name="attempts")
    op.drop_index("ix_jobs_state_submitted_at", table_name="jobs")
