"""The table ``failure_tallies``: failed attempts counted per owner and reason, as they happen.

The view ``failures_by_reason`` (docs/history.md: "Failures by reason") counted every failed
attempt of the whole history each time it was read, ``count(DISTINCT job_id)`` included: a
read that grows with the history, past 300 ms at a big site's year. This table keeps, per owner
(``tenant_prefix``: ``alice.`` for tenant alice's jobs, '' for the operator's) and failure
reason, the figures the view shows (attempts, distinct jobs, steps lost, the latest end), and the
view adds up its few rows instead.

It is kept by PostgreSQL: statement triggers on ``attempts`` (after INSERT, UPDATE and DELETE,
each with its changed rows as transition tables) add what a statement changed. An attempt
row counts where its ``failure_reason`` is set; an update is paired with the row it replaced by
the key (``job_id``, ``attempt``), and a rewrite with the same reason, steps lost and end adds
nothing (the watcher writes a job's attempts back whole). A job counts once per reason: for each
job and reason the statement touched, the job's attempts with that reason are counted after the
statement (an index probe by ``job_id``) and before it (after, less what the statement added,
plus what it took away). Tallies are added to in key order, so two writers cannot deadlock on
them; the watcher writes a job's rows under that job's row lock, so two writers never count the
same job's attempts at once. When the attempt that held a tally's latest end goes away (an
update moved it, or a delete), the latest end is read again from that reason's failed attempts.

The tally depends on the attempts alone, not on the order they were written in: a projection
rebuilt from the log has the same tallies (``mdq replay --compare`` compares them). Row security
shows a tenant its own tallies (``tenant_prefix`` starts with its name and a dot), as on
``attempts``. Existing attempts are tallied by the upgrade; the downgrade restores the view that
counts ``attempts`` itself.

Revision ID: 0019_failure_tallies
Revises: 0018_usage_summaries
Create Date: 2026-12-04
"""

import importlib
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0019_failure_tallies"
down_revision: str | None = "0018_usage_summaries"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TENANT_PREFIX = "(CASE WHEN strpos({j}, '.') > 0 THEN split_part({j}, '.', 1) || '.' ELSE '' END)"
"""The owner of a job id ``{j}`` as a prefix of its ids: ``alice.`` for tenant alice's,
'' for the operator's (``mdq.core.ids``)."""

TALLY = f"""
    WITH changed AS (
        SELECT COALESCE(o.job_id, n.job_id) AS job_id,
               o.failure_reason AS old_reason, o.steps_lost AS old_lost, o.ended_at AS old_end,
               n.failure_reason AS new_reason, n.steps_lost AS new_lost, n.ended_at AS new_end
        FROM {{old}} o FULL JOIN {{new}} n ON n.job_id = o.job_id AND n.attempt = o.attempt
        WHERE (o.failure_reason IS NOT NULL OR n.failure_reason IS NOT NULL)
          AND (o.failure_reason, o.steps_lost, o.ended_at)
              IS DISTINCT FROM (n.failure_reason, n.steps_lost, n.ended_at)
    ), sides AS (
        SELECT job_id, old_reason AS reason, -1 AS sign, old_lost AS lost, old_end AS ended_at
        FROM changed WHERE old_reason IS NOT NULL
        UNION ALL
        SELECT job_id, new_reason, 1, new_lost, new_end FROM changed WHERE new_reason IS NOT NULL
    ), per_job AS (
        SELECT s.job_id, s.reason, sum(s.sign) AS added,
               (SELECT count(*) FROM attempts a
                WHERE a.job_id = s.job_id AND a.failure_reason = s.reason) AS after
        FROM sides s GROUP BY s.job_id, s.reason
    ), job_counts AS (
        SELECT {TENANT_PREFIX.format(j="job_id")} AS tenant_prefix, reason,
               sum((after > 0)::int - (after - added > 0)::int) AS jobs
        FROM per_job GROUP BY 1, 2
    ), deltas AS (
        SELECT {TENANT_PREFIX.format(j="job_id")} AS tenant_prefix, reason,
               sum(sign) AS attempts,
               sum(sign * lost) AS steps_lost,
               max(ended_at) FILTER (WHERE sign > 0) AS last_at
        FROM sides GROUP BY 1, 2
    )
    INSERT INTO failure_tallies AS t (tenant_prefix, reason, attempts, jobs, steps_lost, last_at)
    SELECT d.tenant_prefix, d.reason, d.attempts, j.jobs, d.steps_lost, d.last_at
    FROM deltas d JOIN job_counts j USING (tenant_prefix, reason)
    ORDER BY d.tenant_prefix, d.reason
    ON CONFLICT (tenant_prefix, reason) DO UPDATE SET
        attempts = t.attempts + EXCLUDED.attempts,
        jobs = t.jobs + EXCLUDED.jobs,
        steps_lost = t.steps_lost + EXCLUDED.steps_lost,
        last_at = GREATEST(t.last_at, EXCLUDED.last_at);

    UPDATE failure_tallies t SET last_at = (
        SELECT max(a.ended_at) FROM attempts a
        WHERE a.failure_reason = t.reason
          AND {TENANT_PREFIX.format(j="a.job_id")} = t.tenant_prefix)
    FROM (SELECT {TENANT_PREFIX.format(j="o.job_id")} AS tenant_prefix,
                 o.failure_reason AS reason, max(o.ended_at) AS newest_gone
          FROM {{old}} o LEFT JOIN {{new}} n ON n.job_id = o.job_id AND n.attempt = o.attempt
          WHERE o.failure_reason IS NOT NULL
            AND (n.failure_reason, n.ended_at) IS DISTINCT FROM (o.failure_reason, o.ended_at)
          GROUP BY 1, 2) gone
    WHERE t.tenant_prefix = gone.tenant_prefix AND t.reason = gone.reason
      AND gone.newest_gone >= t.last_at
"""
"""Add to the tallies what one statement on ``attempts`` changed: ``{old}`` the rows it took
away or replaced, ``{new}`` the rows it wrote."""

NO_ROWS = "(SELECT * FROM attempts WHERE false)"
"""The transition table an event has not (an INSERT replaces no row, a DELETE writes none)."""

TRANSITIONS = {
    "INSERT": ("REFERENCING NEW TABLE AS new_attempts", NO_ROWS, "new_attempts"),
    "UPDATE": (
        "REFERENCING OLD TABLE AS old_attempts NEW TABLE AS new_attempts",
        "old_attempts",
        "new_attempts",
    ),
    "DELETE": ("REFERENCING OLD TABLE AS old_attempts", "old_attempts", NO_ROWS),
}
"""Per event: the trigger's transition tables, and what stands for ``{old}`` and ``{new}``."""

TALLY_EXISTING = f"""
    INSERT INTO failure_tallies (tenant_prefix, reason, attempts, jobs, steps_lost, last_at)
    SELECT {TENANT_PREFIX.format(j="job_id")}, failure_reason, count(*), count(DISTINCT job_id),
           sum(steps_lost), max(ended_at)
    FROM attempts WHERE failure_reason IS NOT NULL
    GROUP BY 1, 2
"""
"""Tally every attempt there is (the upgrade, and a test's check of the triggers)."""

FAILURES_BY_REASON = """
    SELECT reason, sum(attempts)::bigint AS attempts, sum(jobs)::bigint AS jobs,
           sum(steps_lost)::numeric AS steps_lost,
           max(last_at) AS last_at
    FROM failure_tallies
    WHERE attempts > 0
    GROUP BY reason
"""
"""Failed attempts by reason, from the tallies (the same columns and types as before)."""

FAILURES_BY_REASON_FROM_ATTEMPTS: str = importlib.import_module(
    "mdq.store.migrations.versions.0002_history_views"
).VIEWS["failures_by_reason"]
"""The view as revision 0002 made it (the downgrade's)."""


def replace_view(name: str, query: str) -> None:
    """Define the view ``name`` as ``query`` (the same columns), reading its tables with its
    caller's rights and row policies (``security_invoker``, PostgreSQL 15 or newer)."""
    op.execute(f"CREATE OR REPLACE VIEW {name} AS {query}")
    version = op.get_bind().exec_driver_sql("SHOW server_version_num").scalar()
    if int(str(version)) >= 150000:
        op.execute(f"ALTER VIEW {name} SET (security_invoker = true)")


def upgrade() -> None:
    op.create_table(
        "failure_tallies",
        sa.Column(
            "tenant_prefix",
            sa.Text(),
            nullable=False,
            comment="Whose attempts: 'alice.' for tenant alice's jobs, '' for the operator's.",
        ),
        sa.Column("reason", sa.Text(), nullable=False, comment="FailureReason name."),
        sa.Column("attempts", sa.BigInteger(), nullable=False, comment="Failed attempts."),
        sa.Column("jobs", sa.BigInteger(), nullable=False, comment="Jobs they belong to."),
        sa.Column(
            "steps_lost", sa.BigInteger(), nullable=False, comment="Sum of their steps lost."
        ),
        sa.Column("last_at", sa.DateTime(timezone=True), nullable=True, comment="The latest end."),
        sa.PrimaryKeyConstraint("tenant_prefix", "reason", name="pk_failure_tallies"),
        comment="Failed attempts per owner and reason (revision 0019), kept by triggers.",
    )
    op.execute("ALTER TABLE failure_tallies ENABLE ROW LEVEL SECURITY")
    for event, (referencing, old, new) in TRANSITIONS.items():
        name = event.lower()
        op.execute(
            f"CREATE FUNCTION mdq_failure_tallies_{name}() RETURNS trigger "
            "LANGUAGE plpgsql SET search_path = public, pg_temp AS $$\nBEGIN\n"
            f"{TALLY.format(old=old, new=new)};\nRETURN NULL;\nEND\n$$"
        )
        op.execute(
            f"CREATE TRIGGER failure_tallies_on_{name} AFTER {event} ON attempts "
            f"{referencing} FOR EACH STATEMENT EXECUTE FUNCTION mdq_failure_tallies_{name}()"
        )
    op.execute(TALLY_EXISTING)
    replace_view("failures_by_reason", FAILURES_BY_REASON)


def downgrade() -> None:
    replace_view("failures_by_reason", FAILURES_BY_REASON_FROM_ATTEMPTS)
    for event in TRANSITIONS:
        name = event.lower()
        op.execute(f"DROP TRIGGER IF EXISTS failure_tallies_on_{name} ON attempts")
        op.execute(f"DROP FUNCTION IF EXISTS mdq_failure_tallies_{name}()")
    op.drop_table("failure_tallies")
