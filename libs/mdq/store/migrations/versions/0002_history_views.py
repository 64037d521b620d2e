"""Views for the common questions about the history: one job's timeline, failures by reason,
node utilisation over time, and attempts with their placement.

Revision ID: 0002_history_views
Revises: 0001_initial
Create Date: 2026-11-30
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0002_history_views"
down_revision: str | None = "0001_initial"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

VIEWS = {
    # Every event of every job in the order it happened; filter by job_id.
    "job_timeline": """
        SELECT e.job_id, e.time, e.attempt, e.kind, e.producer, e.stream, e.stream_seq,
               e.event_id, e.body
        FROM events e
        WHERE e.job_id IS NOT NULL
    """,
    # One row per attempt with where it ran, how it ended, what it resumed from and lost, and
    # the score placement gave the chosen node.
    "attempt_history": """
        SELECT a.job_id, a.attempt, a.node, a.pod_name, a.bound_at, a.started_at, a.ended_at,
               EXTRACT(EPOCH FROM (a.ended_at - a.started_at)) AS run_s,
               EXTRACT(EPOCH FROM (a.started_at - a.bound_at)) AS start_delay_s,
               a.exit_code, a.failure_reason, a.failure_message,
               a.resumed_from_step AS checkpoint_step_used, a.steps_lost, a.last_step,
               (SELECT (c->>'score')::float8 FROM jsonb_array_elements(p.candidates) AS c
                 WHERE c->>'node' = a.node LIMIT 1) AS placement_score,
               jsonb_array_length(p.candidates) AS placement_candidates
        FROM attempts a
        LEFT JOIN placements p ON p.job_id = a.job_id AND p.attempt = a.attempt
    """,
    # Failed attempts by reason: how many, of how many jobs, MD steps lost, the latest one.
    "failures_by_reason": """
        SELECT a.failure_reason AS reason, count(*) AS attempts,
               count(DISTINCT a.job_id) AS jobs, sum(a.steps_lost) AS steps_lost,
               max(a.ended_at) AS last_at
        FROM attempts a
        WHERE a.failure_reason IS NOT NULL
        GROUP BY a.failure_reason
    """,
    # Per node and hour: attempts running, seconds busy, CPU core-seconds requested by them.
    "node_utilisation": """
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
            date_trunc('hour', a.started_at), COALESCE(a.ended_at, now()), interval '1 hour'
        ) AS h(hour)
        WHERE a.started_at IS NOT NULL AND a.node IS NOT NULL
        GROUP BY a.node, h.hour
    """,
}


def upgrade() -> None:
    op.create_index("ix_attempts_node_started_at", "attempts", ["node", "started_at"])
    for name, query in VIEWS.items():
        op.execute(f"CREATE OR REPLACE VIEW {name} AS {query}")


def downgrade() -> None:
    for name in reversed(VIEWS):
        op.execute(f"DROP VIEW IF EXISTS {name}")
    op.drop_index("ix_attempts_node_started_at", table_name="attempts")
