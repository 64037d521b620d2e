"""Progress months past an age rolled up: per-job summaries plus every Nth report.

A big site's year is ~200,000,000 progress reports, most of the history's disk (docs/history.md,
"What is kept, and what it costs"). Past an age the operator sets
(``MDQ_WATCHER_PROGRESS_ROLLUP_DAYS``; 0, the default, rolls nothing up), the watcher calls
``mdq_rollup_progress(before, keep_every)`` every hour, which, for each monthly partition of
``progress`` that ended before ``before`` and is not rolled up yet:

* adds one row per job, attempt and month to ``progress_rollups``: how many reports the month
  held and how many it keeps, the first and last step and time, the potential energy's minimum,
  maximum and mean, the mean temperature and speed;
* keeps, of each attempt's reports of that month, the first and every ``keep_every``-th after
  it (``MDQ_WATCHER_PROGRESS_ROLLUP_KEEP_EVERY``, 10), the last one and any that ended the run
  (``done_reason``): the partition is rewritten with those rows only (a TRUNCATE and an insert,
  so its disk is given back at once, where a DELETE would leave it to VACUUM), in the same
  transaction as the summaries;
* marks the partition rolled up (its comment says with which ``keep_every``), so a later call
  passes it by.

``mdq plot`` and the console's curves of such a job draw the kept reports; ``mdq show``'s last
report is kept. Every report stays in the ``NS_PROGRESS`` stream for as long as the log keeps
it (``mdq replay JOB``). The function runs as the owner (SECURITY DEFINER, a fixed search_path,
under the partitions' advisory lock); the writer may execute it, PUBLIC may not
(``mdq.store.roles``). ``progress_rollups`` is under row security as the other tables of
per-job rows (a tenant reads its own jobs').

Revision ID: 0015_progress_rollups
Revises: 0014_usage_samples
Create Date: 2026-12-04
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015_progress_rollups"
down_revision: str | None = "0014_usage_samples"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ROLLED_UP = "rolled up by mdq_rollup_progress: kept every %s-th report"
"""The comment of a rolled-up partition (``%s``: keep_every)."""

ROLLUP_FUNCTION = f"""
CREATE FUNCTION mdq_rollup_progress(before timestamptz, keep_every integer) RETURNS SETOF text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
  r record;
  month_start timestamp;
BEGIN
  IF keep_every IS NULL OR keep_every < 1 THEN
    RAISE EXCEPTION 'keep_every must be at least 1, not %', keep_every;
  END IF;
  PERFORM pg_advisory_xact_lock(hashtext('mdq partitions'));
  FOR r IN
    SELECT child.relname AS child, child.oid AS oid
    FROM pg_inherits i
    JOIN pg_class parent ON parent.oid = i.inhparent
    JOIN pg_class child ON child.oid = i.inhrelid
    JOIN pg_namespace n ON n.oid = parent.relnamespace
    WHERE n.nspname = 'public' AND parent.relname = 'progress'
      AND child.relname ~ '_y[0-9]{{4}}m[0-9]{{2}}$'
      AND coalesce(obj_description(child.oid, 'pg_class'), '') NOT LIKE 'rolled up by %'
    ORDER BY child.relname
  LOOP
    month_start := to_timestamp(right(r.child, 8), '"y"YYYY"m"MM')::timestamp;
    CONTINUE WHEN (month_start + interval '1 month') AT TIME ZONE 'UTC' > before;
    EXECUTE format($q$
      CREATE TEMPORARY TABLE mdq_rollup ON COMMIT DROP AS
      SELECT p.*, (n - 1) %% %s = 0 OR n = last OR p.done_reason <> '' AS keep
      FROM (SELECT q.*, row_number() OVER w AS n, count(*) OVER (PARTITION BY job_id, attempt)
                  AS last
            FROM %I q WINDOW w AS (PARTITION BY job_id, attempt ORDER BY step, time)) AS p
    $q$, keep_every, r.child);
    INSERT INTO progress_rollups (job_id, attempt, month, reports, kept, first_step, last_step,
        first_time, last_time, min_potential_kj_mol, max_potential_kj_mol,
        mean_potential_kj_mol, mean_temperature_k, mean_ns_per_day)
    SELECT job_id, attempt, month_start::date, count(*), count(*) FILTER (WHERE keep), min(step),
        max(step), min(time), max(time), min(potential_kj_mol), max(potential_kj_mol),
        avg(potential_kj_mol), avg(temperature_k), avg(ns_per_day)
    FROM mdq_rollup GROUP BY job_id, attempt
    ON CONFLICT (job_id, attempt, month) DO NOTHING;
    EXECUTE format('TRUNCATE %I', r.child);
    EXECUTE format($q$
      INSERT INTO %I (job_id, attempt, step, time, time_ps, potential_kj_mol, kinetic_kj_mol,
          temperature_k, ns_per_day, event_id, stream, stream_seq, producer, target_steps,
          eta_s, done_reason, units)
      SELECT job_id, attempt, step, time, time_ps, potential_kj_mol, kinetic_kj_mol,
          temperature_k, ns_per_day, event_id, stream, stream_seq, producer, target_steps,
          eta_s, done_reason, units
      FROM mdq_rollup WHERE keep ORDER BY job_id, attempt, step
    $q$, r.child);
    DROP TABLE mdq_rollup;
    EXECUTE format('COMMENT ON TABLE %I IS %L', r.child, format('{ROLLED_UP}', keep_every));
    RETURN NEXT r.child;
  END LOOP;
END $$
"""


def upgrade() -> None:
    op.create_table(
        "progress_rollups",
        sa.Column("job_id", sa.Text(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("month", sa.Date(), nullable=False, comment="The month's first day (UTC)."),
        sa.Column("reports", sa.BigInteger(), nullable=False, comment="Reports the month held."),
        sa.Column("kept", sa.BigInteger(), nullable=False, comment="Of those, kept in progress."),
        sa.Column("first_step", sa.BigInteger(), nullable=False),
        sa.Column("last_step", sa.BigInteger(), nullable=False),
        sa.Column("first_time", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_time", sa.DateTime(timezone=True), nullable=False),
        sa.Column("min_potential_kj_mol", sa.Double(), nullable=False),
        sa.Column("max_potential_kj_mol", sa.Double(), nullable=False),
        sa.Column("mean_potential_kj_mol", sa.Double(), nullable=False),
        sa.Column("mean_temperature_k", sa.Double(), nullable=False),
        sa.Column("mean_ns_per_day", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("job_id", "attempt", "month", name="pk_progress_rollups"),
        comment="A rolled-up month of progress, per job and attempt (revision 0015).",
    )
    op.execute("ALTER TABLE progress_rollups ENABLE ROW LEVEL SECURITY")
    op.execute(ROLLUP_FUNCTION)


def downgrade() -> None:
    op.execute("DROP FUNCTION IF EXISTS mdq_rollup_progress(timestamptz, integer)")
    op.drop_table("progress_rollups")
