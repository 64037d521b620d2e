"""The view ``attempt_usage``: what each attempt used, as its runner measured it.

Each row is one ``usage`` event (``mdq.v1.AttemptUsage``, stored like every event in
``job_events``) with its fields as columns, next to the job's cost-relevant spec fields that the
resource recommender (``mdq.core.recommend``, docs/requests.md) groups history by. A view, not
a table: the projection already keeps every event once (``ON CONFLICT DO NOTHING`` on the event
id ``usage:<job>:<attempt>``), so a redelivered usage event is one row here too, and a rebuild
from the log gives the same rows. Like ``job_events``, its rows age out with the partitions
the watcher detaches (``MDQ_WATCHER_HISTORY_RETENTION_DAYS``).

Revision ID: 0010_attempt_usage
Revises: 0009_console_indexes
Create Date: 2026-12-02
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0010_attempt_usage"
down_revision: str | None = "0009_console_indexes"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ATTEMPT_USAGE_VIEW = """
    SELECT e.job_id, e.attempt, e.time,
           COALESCE((e.body->>'peak_memory_mb')::double precision, 0) AS peak_memory_mb,
           COALESCE((e.body->>'cpu_seconds')::double precision, 0) AS cpu_seconds,
           COALESCE((e.body->>'wall_seconds')::double precision, 0) AS wall_seconds,
           COALESCE((e.body->>'mean_cores')::double precision, 0) AS mean_cores,
           COALESCE((e.body->>'ns_per_day')::double precision, 0) AS ns_per_day,
           COALESCE(e.body->>'source', '') AS source,
           COALESCE((e.body->>'memory_limit_mb')::bigint, 0) AS memory_limit_mb,
           COALESCE((e.body->>'cpu_limit')::double precision, 0) AS cpu_limit,
           COALESCE((e.body->>'exit_code')::integer, 0) AS exit_code,
           COALESCE((e.body->>'steps')::bigint, 0) AS steps
    FROM job_events e
    WHERE e.kind = 'usage'
"""


def _invoker_views_supported() -> bool:
    version = op.get_bind().exec_driver_sql("SHOW server_version_num").scalar()
    return int(str(version)) >= 150000


def upgrade() -> None:
    op.execute(f"CREATE VIEW attempt_usage AS {ATTEMPT_USAGE_VIEW}")
    if _invoker_views_supported():
        op.execute("ALTER VIEW attempt_usage SET (security_invoker = true)")


def downgrade() -> None:
    op.execute("DROP VIEW IF EXISTS attempt_usage")
