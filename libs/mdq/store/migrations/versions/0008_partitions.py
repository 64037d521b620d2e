"""``progress`` and ``job_events`` partitioned by month, made ahead, detachable when old.

A year of a busy group is ~20,000,000 progress rows and a few million job events; one table
each means one ever-growing index per key, vacuums of the whole history, and no way to let old
months go but a ``DELETE`` of millions of rows. Both are now native range partitions on their
``time`` column (the event's own time, so a rebuilt projection lands in the same partitions):

* one partition per calendar month (UTC), ``<table>_yYYYYmMM``, and a ``<table>_default`` for a
  time outside every month made so far (a replay of an old log, a runner's clock far off);
* the primary keys gain ``time``, as a partitioned table's unique keys must: ``progress``
  (job_id, attempt, step, time) — a republished report is the same event, with the same time,
  so it still conflicts; ``job_events`` (event_id, time) — a watcher event republished after a
  restart keeps its id but may carry a new time, so the projector looks a batch's ids up before
  it inserts (``mdq.store.projection``) instead of relying on the key;
* ``mdq_make_partitions(since, upto)`` makes the months from ``since`` through ``upto`` that are
  missing (rows of such a month that wait in the default partition are moved into it); the
  watcher calls it at start and every hour for the months ahead
  (``MDQ_WATCHER_PARTITION_MONTHS_AHEAD``). ``mdq_detach_partitions(before)`` detaches the
  months that ended before ``before`` (``MDQ_WATCHER_HISTORY_RETENTION_DAYS``; 0, the default,
  keeps everything): they stay in the database as plain tables, readable by the owner alone,
  to archive (``pg_dump -t``) and drop. Both run as the owner (SECURITY DEFINER, a fixed
  ``search_path``; one at a time, under an advisory lock, however many watcher replicas
  call them): the writer has no DDL, and may execute these two and nothing else
  (``mdq.store.roles`` grants it; PUBLIC may not);
* the views over the two tables (``events``, ``job_timeline``, ``job_outputs``) are made again
  on the new tables, ``security_invoker`` as before. Row security is on the partitioned tables,
  whose policies apply to every read through them; a partition itself is granted to no one.

Existing rows are copied into the new tables (their months are made first).

Revision ID: 0008_partitions
Revises: 0007_history_indexes
Create Date: 2026-12-02
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0008_partitions"
down_revision: str | None = "0007_history_indexes"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

PARTITIONED = {
    "progress": ("job_id", "attempt", "step", "time"),
    "job_events": ("event_id", "time"),
}
"""Each partitioned table and its primary key."""

EVENTS_VIEW = """
    SELECT e.event_id, e.stream, e.stream_seq, e.job_id, e.attempt, e.kind, e.time, e.producer,
           e.body
    FROM job_events e
    UNION ALL
    SELECT p.event_id, p.stream, p.stream_seq, p.job_id, p.attempt, 'progress', p.time,
           p.producer, jsonb_strip_nulls(jsonb_build_object(
        'step', CASE WHEN p.step <> 0 THEN p.step::text END,
        'target_steps', CASE WHEN p.target_steps <> 0 THEN p.target_steps::text END,
        'time_ps', NULLIF(p.time_ps, 0),
        'potential_kj_mol', NULLIF(p.potential_kj_mol, 0),
        'kinetic_kj_mol', NULLIF(p.kinetic_kj_mol, 0),
        'temperature_k', NULLIF(p.temperature_k, 0),
        'ns_per_day', NULLIF(p.ns_per_day, 0),
        'eta_s', NULLIF(p.eta_s, 0),
        'done_reason', NULLIF(p.done_reason, '')))
    FROM progress p
"""
JOB_TIMELINE_VIEW = """
    SELECT e.job_id, e.time, e.attempt, e.kind, e.producer, e.stream, e.stream_seq,
           e.event_id, e.body
    FROM events e
    WHERE e.job_id IS NOT NULL
"""
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
VIEWS = {"events": EVENTS_VIEW, "job_timeline": JOB_TIMELINE_VIEW, "job_outputs": JOB_OUTPUTS_VIEW}
"""The views over the two tables, in the order they are made (dropped in reverse)."""

ADD_PARTITION = r"""
CREATE FUNCTION mdq_add_partition(parent text, month timestamp) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
  name text := format('%s_y%sm%s', parent, to_char(month, 'YYYY'), to_char(month, 'MM'));
  low timestamptz := month AT TIME ZONE 'UTC';
  high timestamptz := (month + interval '1 month') AT TIME ZONE 'UTC';
  fallback text := parent || '_default';
  waiting boolean;
BEGIN
  IF parent NOT IN ('progress', 'job_events') THEN
    RAISE EXCEPTION 'not a partitioned table of mdq: %', parent;
  END IF;
  IF to_regclass(name) IS NOT NULL THEN
    RETURN false;
  END IF;
  EXECUTE format('SELECT EXISTS (SELECT FROM %I WHERE time >= %L AND time < %L)',
                 fallback, low, high) INTO waiting;
  IF waiting THEN  -- rows of that month arrived first: move them into their partition
    EXECUTE format('ALTER TABLE %I DETACH PARTITION %I', parent, fallback);
    EXECUTE format('CREATE TABLE %I PARTITION OF %I FOR VALUES FROM (%L) TO (%L)',
                   name, parent, low, high);
    EXECUTE format('INSERT INTO %I SELECT * FROM %I WHERE time >= %L AND time < %L',
                   name, fallback, low, high);
    EXECUTE format('DELETE FROM %I WHERE time >= %L AND time < %L', fallback, low, high);
    EXECUTE format('ALTER TABLE %I ATTACH PARTITION %I DEFAULT', parent, fallback);
  ELSE
    EXECUTE format('CREATE TABLE %I PARTITION OF %I FOR VALUES FROM (%L) TO (%L)',
                   name, parent, low, high);
  END IF;
  RETURN true;
END $$
"""

MAKE_PARTITIONS = r"""
CREATE FUNCTION mdq_make_partitions(since timestamptz, upto timestamptz) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
  parent text;
  month timestamp;
  made integer := 0;
BEGIN
  IF upto - since > interval '100 years' THEN
    RAISE EXCEPTION 'partitions from % to %: more than a century', since, upto;
  END IF;
  PERFORM pg_advisory_xact_lock(hashtext('mdq partitions'));  -- one watcher replica at a time
  FOREACH parent IN ARRAY ARRAY['progress', 'job_events'] LOOP
    month := date_trunc('month', since AT TIME ZONE 'UTC');
    WHILE month <= upto AT TIME ZONE 'UTC' LOOP
      IF mdq_add_partition(parent, month) THEN
        made := made + 1;
      END IF;
      month := month + interval '1 month';
    END LOOP;
  END LOOP;
  RETURN made;
END $$
"""

DETACH_PARTITIONS = r"""
CREATE FUNCTION mdq_detach_partitions(before timestamptz) RETURNS SETOF text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
  r record;
  month timestamp;
BEGIN
  PERFORM pg_advisory_xact_lock(hashtext('mdq partitions'));
  FOR r IN
    SELECT parent.relname AS parent, child.relname AS child
    FROM pg_inherits i
    JOIN pg_class parent ON parent.oid = i.inhparent
    JOIN pg_class child ON child.oid = i.inhrelid
    JOIN pg_namespace n ON n.oid = parent.relnamespace
    WHERE n.nspname = 'public' AND parent.relname IN ('progress', 'job_events')
      AND child.relname ~ '_y[0-9]{4}m[0-9]{2}$'
    ORDER BY child.relname
  LOOP
    month := to_timestamp(right(r.child, 8), '"y"YYYY"m"MM')::timestamp;
    IF (month + interval '1 month') AT TIME ZONE 'UTC' <= before THEN
      EXECUTE format('ALTER TABLE %I DETACH PARTITION %I', r.parent, r.child);
      RETURN NEXT r.child;
    END IF;
  END LOOP;
END $$
"""

FUNCTIONS = (
    "mdq_add_partition(text, timestamp)",
    "mdq_make_partitions(timestamptz, timestamptz)",
    "mdq_detach_partitions(timestamptz)",
)


def _invoker_views_supported() -> bool:
    version = op.get_bind().exec_driver_sql("SHOW server_version_num").scalar()
    return int(str(version)) >= 150000


def _make_views() -> None:
    for name, query in VIEWS.items():
        op.execute(f"CREATE VIEW {name} AS {query}")
        if _invoker_views_supported():
            op.execute(f"ALTER VIEW {name} SET (security_invoker = true)")


def upgrade() -> None:
    for name in reversed(VIEWS):
        op.execute(f"DROP VIEW IF EXISTS {name}")
    for table, key in PARTITIONED.items():
        old = f"{table}_before_0008"
        op.execute(f"ALTER TABLE {table} RENAME TO {old}")
        op.execute(f"ALTER TABLE {old} RENAME CONSTRAINT pk_{table} TO pk_{old}")
        op.execute(
            f"CREATE TABLE {table} (LIKE {old} INCLUDING DEFAULTS INCLUDING COMMENTS "
            "INCLUDING CONSTRAINTS) PARTITION BY RANGE (time)"
        )
        op.execute(f"ALTER TABLE {table} ADD CONSTRAINT pk_{table} PRIMARY KEY ({', '.join(key)})")
        op.execute(f"CREATE TABLE {table}_default PARTITION OF {table} DEFAULT")
        op.execute(f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY")
    op.execute("DROP INDEX IF EXISTS ix_job_events_job_id_time")
    op.execute("CREATE INDEX ix_job_events_job_id_time ON job_events (job_id, time)")
    for function in (ADD_PARTITION, MAKE_PARTITIONS, DETACH_PARTITIONS):
        op.execute(function)
    for signature in FUNCTIONS:
        op.execute(f"REVOKE ALL ON FUNCTION {signature} FROM PUBLIC")
    # the months the existing rows are in, and the next two, then the rows
    op.execute(
        "SELECT mdq_make_partitions("
        "LEAST(now(), (SELECT min(time) FROM progress_before_0008),"
        " (SELECT min(time) FROM job_events_before_0008)), now() + interval '2 months')"
    )
    for table in PARTITIONED:
        op.execute(f"INSERT INTO {table} SELECT * FROM {table}_before_0008")
        op.execute(f"DROP TABLE {table}_before_0008")
    _make_views()


def downgrade() -> None:
    for name in reversed(VIEWS):
        op.execute(f"DROP VIEW IF EXISTS {name}")
    for signature in reversed(FUNCTIONS):
        op.execute(f"DROP FUNCTION {signature}")
    for table in PARTITIONED:
        old = f"{table}_partitioned"
        op.execute(f"ALTER TABLE {table} RENAME TO {old}")
        op.execute(f"ALTER TABLE {old} RENAME CONSTRAINT pk_{table} TO pk_{old}")
        op.execute(
            f"CREATE TABLE {table} (LIKE {old} INCLUDING DEFAULTS INCLUDING COMMENTS "
            "INCLUDING CONSTRAINTS)"
        )
        unique = ("job_id", "attempt", "step") if table == "progress" else ("event_id",)
        op.execute(
            f"INSERT INTO {table} SELECT DISTINCT ON ({', '.join(unique)}) * FROM {old} "
            "ORDER BY " + ", ".join(unique) + ", time"
        )
        op.execute(f"DROP TABLE {old}")
        op.execute(
            f"ALTER TABLE {table} ADD CONSTRAINT pk_{table} PRIMARY KEY ({', '.join(unique)})"
        )
        op.execute(f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY")
    op.execute("CREATE INDEX ix_job_events_job_id_time ON job_events (job_id, time)")
    _make_views()
