"""The SQL of mdq's schema that the models (``mdq.store.models``) cannot say: its views, its
functions, the triggers that keep the summaries, row security and the partitions. The initial
migration runs it after making the models' tables; tests read the same fragments.

Who owns a job: its id starts with its tenant's name and a dot (``alice.3f2a9c0d1e4b-relax``,
``mdq.core.ids``), no dot for the operator's. Row security is enabled (not forced) on every table
of per-job rows (``mdq.store.roles.TENANT_ROWS``), whose policies ``mdq.store.roles`` makes with
the grants (they name roles); the owner and a role with BYPASSRLS (the writer) are not subject to
it. Every view reads with its caller's rights and row policies (``security_invoker``, PostgreSQL
15 or newer; before that a view runs as its owner and ``mdq.store.roles`` grants it no tenant).

The summaries (``usage_samples``, ``usage_summaries``, ``failure_tallies``, ``node_hours``) are
kept by PostgreSQL, not by the projector: triggers add what each statement changed, and a summary
depends on the rows alone, not on the order they were written in, so a projection rebuilt from
the log (``mdq replay --rebuild``) has the same summaries. Each trigger takes its row locks in key
order, one statement per trigger, and the triggers run in name order (``failure_tallies``,
``node_hours``, ``usage_samples`` and from it ``usage_summaries``): two transactions writing
attempts or usage events of different jobs at once cannot deadlock on them.
"""

from __future__ import annotations

TENANT_PREFIX = "(CASE WHEN strpos({j}, '.') > 0 THEN split_part({j}, '.', 1) || '.' ELSE '' END)"
"""The owner of a job id ``{j}`` as a prefix of its ids: ``alice.`` for tenant alice's,
'' for the operator's."""

OWNER = "(CASE WHEN strpos({j}, '.') > 0 THEN split_part({j}, '.', 1) ELSE '' END)"
"""The owner of a job id ``{j}``: its tenant, '' for the operator's."""

# -- row security --------------------------------------------------------------------------------
CURRENT_TENANT = r"""
CREATE FUNCTION mdq_current_tenant() RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE
SET search_path = pg_catalog
AS $$ SELECT substring(current_user::text FROM '_tenant_([a-z][a-z0-9-]{0,30})$') $$
"""
"""The tenant the connected role is (its name ends in ``_tenant_<name>``; tenant names have no
``_``, so the last ``_tenant_`` counts whatever the prefix), NULL for any other role: what the
tenants' policies compare a row's owner with."""

# -- partitions ----------------------------------------------------------------------------------
PARTITIONED = ("progress", "job_events")
"""The tables partitioned by month of ``time`` (the event's own time, so a rebuilt projection
lands in the same partitions): one partition per calendar month (UTC), ``<table>_yYYYYmMM``,
and ``<table>_default`` for a time outside every month made so far."""

MONTHS_AHEAD = "SELECT mdq_make_partitions(now(), now() + interval '2 months')"
"""This month's partitions and the next two's (the watcher makes more as it runs)."""

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
"""Make one month's partition of ``parent`` unless it exists (rows of that month that wait in
the default partition are moved into it)."""

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
"""Make the months from ``since`` through ``upto`` that are missing; the watcher calls it at
start and every hour for the months ahead (``MDQ_WATCHER_PARTITION_MONTHS_AHEAD``)."""

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
"""Detach the months that ended before ``before`` (``MDQ_WATCHER_HISTORY_RETENTION_DAYS``):
they stay in the database as plain tables, readable by the owner alone, to archive
(``pg_dump -t``) and drop."""

ROLLED_UP = "rolled up by mdq_rollup_progress: kept every %s-th report"
"""The comment of a rolled-up partition (``%s``: keep_every)."""

ROLLUP_PROGRESS = f"""
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
"""Roll up the months of ``progress`` that ended before ``before`` and are not rolled up yet
(``MDQ_WATCHER_PROGRESS_ROLLUP_DAYS``): one row per job, attempt and month in
``progress_rollups``, and of each attempt's reports the first, every ``keep_every``-th after it,
the last and any that ended the run, the partition rewritten with those alone (a TRUNCATE and an
insert: its disk is given back at once) and marked rolled up (``ROLLED_UP``)."""

JOB_SINCE = """
CREATE FUNCTION mdq_job_since(job text) RETURNS timestamptz
LANGUAGE sql STABLE PARALLEL SAFE SET search_path = public, pg_temp AS $$
    SELECT coalesce((SELECT submitted_at FROM jobs WHERE job_id = job) - interval '1 day',
                    '-infinity'::timestamptz)
$$
"""
"""From when a job's rows in the partitioned tables can exist: its submission a day early (the
clocks of the services and runners may lag intake's), ``-infinity`` for a job with no row (or
another tenant's). A per-job read adds ``time >= mdq_job_since(job_id)``; being STABLE, the
bound is known when the statement starts, and PostgreSQL prunes the partitions before it."""

# -- usage samples -------------------------------------------------------------------------------
FINGERPRINT_INPUTS = """jsonb_strip_nulls(jsonb_build_object(
    'task', {s}->'task', 'system', {s}->'system',
    'nonbonded_method', {s}->'nonbonded_method', 'cutoff_nm', {s}->'cutoff_nm',
    'barostat', {s}->'barostat', 'integrator', {s}->'integrator', 'platform', {s}->'platform',
    'resources', jsonb_build_object('cpu', {s}->'resources'->'cpu'),
    'trajectory_interval_steps', {s}->'trajectory_interval_steps',
    'checkpoint_interval_steps', {s}->'checkpoint_interval_steps', 'inputs', {s}->'inputs'))"""
"""The fields of a spec (JSON ``{s}``) that the cost fingerprint reads
(``mdq.core.recommend.fingerprint_of``); ``mdq.store.queries`` reads the same."""

SPEC_KEY = f"md5(({FINGERPRINT_INPUTS.format(s='s.system_spec')})::text)"
"""The sample's ``spec_key``: what ``usage_history`` groups the samples' specs by."""

SPEC_OF_ROW = """LEFT JOIN jobs j ON j.job_id = n.job_id
    CROSS JOIN LATERAL (
        SELECT COALESCE(j.spec, (
            SELECT e.body->'spec' FROM job_events e
            WHERE e.job_id = n.job_id AND e.kind = 'submitted' LIMIT 1)) AS system_spec
    ) AS s0
    CROSS JOIN LATERAL (SELECT s0.system_spec, s0.system_spec->'system' AS system) AS s"""
"""Joins to a row ``n`` of a job the job's spec (``s.system_spec``) and its system
(``s.system``): from ``jobs``, or from the job's ``submitted`` event when its row is not written
yet (the projector writes a batch's events before it folds the jobs)."""

SYSTEM_KIND_OF = """LEFT JOIN LATERAL (
        SELECT key AS kind FROM jsonb_object_keys(
            CASE WHEN jsonb_typeof(s.system) = 'object' THEN s.system END) AS key
        ORDER BY key LIMIT 1
    ) AS k ON true"""
"""Joins the kind of that system (``k.kind``: its one key, ``water_box`` ...)."""

SAMPLES_OF = f"""
    SELECT n.job_id, n.attempt, n.time, COALESCE(k.kind, '') AS system_kind,
           CASE WHEN k.kind = 'water_box'
                THEN (s.system->'water_box'->>'box_nm')::double precision END AS box_nm,
           COALESCE((n.body->>'peak_memory_mb')::double precision, 0),
           COALESCE((n.body->>'mean_cores')::double precision, 0),
           COALESCE((n.body->>'cpu_seconds')::double precision, 0),
           COALESCE((n.body->>'wall_seconds')::double precision, 0),
           COALESCE((n.body->>'memory_limit_mb')::bigint, 0),
           COALESCE((n.body->>'cpu_limit')::double precision, 0),
           {SPEC_KEY}, false
    FROM {{source}} n
    {SPEC_OF_ROW}
    {SYSTEM_KIND_OF}
    WHERE n.kind = 'usage' AND n.job_id IS NOT NULL
"""
"""The samples of the usage events of ``source`` (a table of ``job_events`` rows), with the
system of the job's spec (``SPEC_OF_ROW``)."""

COLUMNS = (
    "job_id, attempt, time, system_kind, box_nm, peak_memory_mb, mean_cores, cpu_seconds, "
    "wall_seconds, memory_limit_mb, cpu_limit, spec_key, oom_killed"
)

OOM_OF = f"""
    SELECT n.job_id, n.attempt, n.ended_at, COALESCE(k.kind, ''),
           CASE WHEN k.kind = 'water_box'
                THEN (s.system->'water_box'->>'box_nm')::double precision END,
           0, 0, 0, 0,
           COALESCE((b.resources->>'memory_mb')::bigint,
                    (s.system_spec->'resources'->>'memory_mb')::bigint, 0),
           COALESCE((b.resources->>'cpu')::double precision,
                    (s.system_spec->'resources'->>'cpu')::double precision, 0),
           {SPEC_KEY}, true
    FROM {{source}} n
    {SPEC_OF_ROW}
    LEFT JOIN LATERAL (
        SELECT e.body->'resources' AS resources FROM job_events e
        WHERE e.job_id = n.job_id AND e.attempt = n.attempt AND e.kind = 'bound' LIMIT 1
    ) AS b ON true
    {SYSTEM_KIND_OF}
    WHERE n.failure_reason = 'FAILURE_OOM_KILLED' AND n.ended_at IS NOT NULL
"""
"""The samples of the OOM-killed attempts of ``source`` (a table of ``attempts`` rows): no
measured figures, the limits the attempt was bound with (its ``bound`` event's resources, else
its spec's), at its end."""

USAGE_SAMPLES = f"""
CREATE FUNCTION mdq_usage_samples_insert() RETURNS trigger
LANGUAGE plpgsql SET search_path = public, pg_temp AS $$
BEGIN
    INSERT INTO usage_samples ({COLUMNS})
    {SAMPLES_OF.format(source="new_events")}
    ON CONFLICT DO NOTHING;
    RETURN NULL;
END
$$
"""
"""A sample for each usage event a statement inserted (a redelivered one is stored once in
``job_events``, and so once here)."""

OOM_SAMPLES = f"""
    INSERT INTO usage_samples ({COLUMNS})
    {{samples}}
    ORDER BY 1, 2
    ON CONFLICT (job_id, attempt) DO UPDATE SET time = EXCLUDED.time,
        memory_limit_mb = EXCLUDED.memory_limit_mb, cpu_limit = EXCLUDED.cpu_limit
        WHERE usage_samples.oom_killed
"""
"""The sample of each OOM-killed attempt of ``{samples}``, in key order."""

CHANGED = (
    "(SELECT n.* FROM new_attempts n LEFT JOIN old_attempts o "
    "ON o.job_id = n.job_id AND o.attempt = n.attempt "
    "WHERE (o.failure_reason, o.ended_at) IS DISTINCT FROM (n.failure_reason, n.ended_at)) AS"
)
"""The rows an UPDATE of ``attempts`` gave a new reason or end."""

OOM_TRANSITIONS = {
    "INSERT": ("REFERENCING NEW TABLE AS new_attempts", "new_attempts"),
    "UPDATE": ("REFERENCING OLD TABLE AS old_attempts NEW TABLE AS new_attempts", CHANGED),
}
"""Per event on ``attempts``: the trigger's transition tables, and the rows to sample."""

# -- usage summaries -----------------------------------------------------------------------------
SAMPLES_PER_KIND = 32
"""The newest samples a kind's summary keeps (measured and OOM-killed apart)."""

SUMMARIZE = f"""
    INSERT INTO usage_summaries AS u (spec_key, cpu_limit, oom_killed, owner, job_id, newest,
                                      spec, peak_memory_mb, mean_cores, memory_limit_mb)
    SELECT k.spec_key, k.cpu_limit, k.oom_killed, k.owner, top.job_id, top.newest,
           (SELECT ({FINGERPRINT_INPUTS.format(s="s.spec")})::text
            FROM (SELECT COALESCE(
                    (SELECT j.spec FROM jobs j WHERE j.job_id = top.job_id),
                    (SELECT e.body->'spec' FROM job_events e
                     WHERE e.job_id = top.job_id AND e.kind = 'submitted' LIMIT 1)) AS spec) s),
           top.peaks, top.cores, top.limits
    FROM (SELECT DISTINCT spec_key, cpu_limit, oom_killed, {OWNER.format(j="job_id")} AS owner
          FROM {{source}}) k
    CROSS JOIN LATERAL (
        SELECT (array_agg(n.job_id ORDER BY n.time DESC, n.job_id DESC, n.attempt DESC))[1]
                   AS job_id,
               max(n.time) AS newest,
               array_agg(n.peak_memory_mb ORDER BY n.time DESC, n.job_id DESC, n.attempt DESC)
                   AS peaks,
               array_agg(n.mean_cores ORDER BY n.time DESC, n.job_id DESC, n.attempt DESC)
                   AS cores,
               array_agg(n.memory_limit_mb::double precision
                         ORDER BY n.time DESC, n.job_id DESC, n.attempt DESC) AS limits
        FROM (SELECT s.job_id, s.attempt, s.time, s.peak_memory_mb, s.mean_cores,
                     s.memory_limit_mb
              FROM usage_samples s
              WHERE s.spec_key = k.spec_key AND s.cpu_limit = k.cpu_limit
                AND s.oom_killed = k.oom_killed AND {OWNER.format(j="s.job_id")} = k.owner
              ORDER BY s.time DESC, s.job_id DESC, s.attempt DESC
              LIMIT {SAMPLES_PER_KIND}) n
    ) top
    WHERE top.job_id IS NOT NULL
    ORDER BY k.spec_key, k.cpu_limit, k.oom_killed, k.owner
    ON CONFLICT (spec_key, cpu_limit, oom_killed, owner) DO UPDATE SET
        job_id = EXCLUDED.job_id, newest = EXCLUDED.newest,
        spec = COALESCE(u.spec, EXCLUDED.spec), peak_memory_mb = EXCLUDED.peak_memory_mb,
        mean_cores = EXCLUDED.mean_cores, memory_limit_mb = EXCLUDED.memory_limit_mb
"""
"""Summarize again, in key order, every kind (``spec_key``, CPU limit, measured or OOM-killed,
owner) of the samples in ``{source}`` from ``usage_samples`` itself (``ix_usage_samples_kind``:
that kind's newest rows): its ``SAMPLES_PER_KIND`` newest samples as arrays, newest first, and
its fingerprint inputs. ``job_id`` is the kind's newest sample's job, so row security shows a
tenant its own kinds only."""

USAGE_SUMMARIES = f"""
CREATE FUNCTION mdq_usage_summaries() RETURNS trigger
LANGUAGE plpgsql SET search_path = public, pg_temp AS $$
BEGIN
    {SUMMARIZE.format(source="changed_samples")};
    RETURN NULL;
END
$$
"""

# -- failure tallies -----------------------------------------------------------------------------
FAILURE_TALLY = f"""
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
away or replaced, ``{new}`` the rows it wrote.

An attempt counts where its ``failure_reason`` is set; an update is paired with the row it
replaced by the key, and a rewrite with the same reason, steps lost and end adds nothing (the
watcher writes a job's attempts back whole). A job counts once per reason: for each job and
reason the statement touched, its attempts with that reason are counted after the statement (an
index probe by ``job_id``) and before it (after, less what the statement added). The watcher
writes a job's rows under that job's row lock, so two writers never count the same job's
attempts at once. When the attempt that held a tally's latest end goes away, the latest end is
read again from that reason's failed attempts (``ix_attempts_failures``)."""

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
"""Per event on ``attempts``: the trigger's transition tables, and what stands for ``{old}``
and ``{new}`` (the tallies' triggers and the node hours')."""

# -- node hours ----------------------------------------------------------------------------------
CORES = "COALESCE((j.spec->'resources'->>'cpu')::float8, 1.0)"
"""The cores the job ``j`` requested (its spec's ``resources.cpu``; 1 when unset)."""

SPREAD = f"""
    SELECT a.node, h.hour, {TENANT_PREFIX.format(j="a.job_id")} AS tenant_prefix, {{sign}} AS sign,
           EXTRACT(EPOCH FROM (LEAST({{end}}, h.hour + interval '1 hour')
                               - GREATEST(a.started_at, h.hour))) AS busy_s,
           (SELECT {CORES}::numeric FROM jobs j WHERE j.job_id = a.job_id) AS cores
    FROM {{attempts}} a
    CROSS JOIN LATERAL generate_series(
        date_trunc('hour', GREATEST(a.started_at, {{since}})), {{end}}, interval '1 hour'
    ) AS h(hour)
"""
"""Each attempt of ``{attempts}`` (``job_id``, ``node``, ``started_at``) spread over the hours
from its start (or from ``{since}``'s hour) to ``{end}``: its seconds in each hour and its job's
cores, counted ``{sign}`` times."""

SPREAD_SIDES = SPREAD.format(
    attempts="sides", sign="a.sign", end="a.ended_at", since="a.started_at"
)

NODE_HOURS_TALLY = f"""
    WITH changed AS (
        SELECT o.job_id AS old_job, o.node AS old_node, o.started_at AS old_start,
               o.ended_at AS old_end,
               n.job_id AS new_job, n.node AS new_node, n.started_at AS new_start,
               n.ended_at AS new_end
        FROM {{old}} o FULL JOIN {{new}} n ON n.job_id = o.job_id AND n.attempt = o.attempt
        WHERE (o.node, o.started_at, o.ended_at)
              IS DISTINCT FROM (n.node, n.started_at, n.ended_at)
    ), sides AS (
        SELECT old_job AS job_id, old_node AS node, old_start AS started_at,
               old_end AS ended_at, -1 AS sign
        FROM changed
        WHERE old_node IS NOT NULL AND old_start IS NOT NULL AND old_end IS NOT NULL
        UNION ALL
        SELECT new_job, new_node, new_start, new_end, 1
        FROM changed
        WHERE new_node IS NOT NULL AND new_start IS NOT NULL AND new_end IS NOT NULL
    ), spread AS ({SPREAD_SIDES})
    INSERT INTO node_hours AS t (hour, node, tenant_prefix, attempts, busy_s, cpu_core_s)
    SELECT hour, node, tenant_prefix, sum(sign), sum(sign * busy_s), sum(sign * busy_s * cores)
    FROM spread
    GROUP BY hour, node, tenant_prefix
    ORDER BY hour, node, tenant_prefix
    ON CONFLICT (hour, node, tenant_prefix) DO UPDATE SET
        attempts = t.attempts + EXCLUDED.attempts,
        busy_s = t.busy_s + EXCLUDED.busy_s,
        cpu_core_s = t.cpu_core_s + EXCLUDED.cpu_core_s
"""
"""Add to ``node_hours`` what one statement on ``attempts`` changed: ``{old}`` the rows it took
away or replaced, ``{new}`` the rows it wrote. A row contributes once it has a node, a start and
an end; a rewrite with the same node, start and end changes nothing. The cores come from the
job's spec, which never changes after the job's row is written (mdq never deletes a job's row).
Seconds and core-seconds are ``numeric``: exact, whatever the order the attempts came in."""

NODE_UTILISATION_SINCE = f"""
CREATE FUNCTION node_utilisation_since(since timestamptz)
RETURNS TABLE (
    node text, hour timestamptz, attempts bigint, busy_s numeric, cpu_core_s double precision
)
LANGUAGE sql STABLE AS $$
    SELECT node, hour, sum(attempts)::bigint, sum(busy_s), sum(cpu_core_s)::float8
    FROM (
        SELECT t.node, t.hour, t.attempts, t.busy_s, t.cpu_core_s
        FROM node_hours t
        WHERE t.hour >= date_trunc('hour', since) AND t.attempts > 0
        UNION ALL
        SELECT node, hour, 1, busy_s, busy_s * cores
        FROM ({SPREAD.format(attempts="attempts", sign="1", end="now()", since="since")}
              WHERE a.ended_at IS NULL AND a.node IS NOT NULL AND a.started_at IS NOT NULL
             ) running
    ) hours
    GROUP BY node, hour
$$
"""
"""Per node and hour from the hour of ``since`` on: the ended attempts' tallies and the running
attempts (``ix_attempts_ended_at``) spread up to now. It runs with the caller's rights (SECURITY
INVOKER, the default), so a tenant counts its own attempts only, as with the view."""

# -- views ---------------------------------------------------------------------------------------
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
"""A ``progress`` row ``p`` as its event's body: the protobuf JSON mapping (defaults left out,
int64 as strings)."""

VIEWS = {
    # Every event of both streams: the JOBS stream's (job_events) and the progress reports, each
    # stored once, in progress, with its body rebuilt.
    "events": f"""
        SELECT e.event_id, e.stream, e.stream_seq, e.job_id, e.attempt, e.kind, e.time,
               e.producer, e.body
        FROM job_events e
        UNION ALL
        SELECT p.event_id, p.stream, p.stream_seq, p.job_id, p.attempt, 'progress', p.time,
               p.producer, {PROGRESS_BODY}
        FROM progress p
    """,
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
    # Failed attempts by reason: how many, of how many jobs, MD steps lost, the latest one;
    # the few rows of the tallies added up.
    "failures_by_reason": """
        SELECT reason, sum(attempts)::bigint AS attempts, sum(jobs)::bigint AS jobs,
               sum(steps_lost)::numeric AS steps_lost,
               max(last_at) AS last_at
        FROM failure_tallies
        WHERE attempts > 0
        GROUP BY reason
    """,
    # Per node and hour: attempts running, seconds busy, CPU core-seconds requested by them.
    "node_utilisation": "SELECT * FROM node_utilisation_since('-infinity')",
    # Every file a job's runner reported at its end (JobOutputs), one row each.
    "job_outputs": """
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
    """,
    # What each attempt used, as its runner measured it: one row per usage event.
    "attempt_usage": """
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
    """,
}
"""The views of docs/history.md, in the order they are made (dropped in reverse)."""

# -- what the migration makes --------------------------------------------------------------------
_TRIGGER_FUNCTION = (
    "CREATE FUNCTION {name}() RETURNS trigger "
    "LANGUAGE plpgsql SET search_path = public, pg_temp AS $$\nBEGIN\n"
    "{body};\nRETURN NULL;\nEND\n$$"
)

FUNCTIONS: dict[str, str] = {
    "mdq_current_tenant()": CURRENT_TENANT,
    "mdq_add_partition(text, timestamp)": ADD_PARTITION,
    "mdq_make_partitions(timestamptz, timestamptz)": MAKE_PARTITIONS,
    "mdq_detach_partitions(timestamptz)": DETACH_PARTITIONS,
    "mdq_rollup_progress(timestamptz, integer)": ROLLUP_PROGRESS,
    "mdq_job_since(text)": JOB_SINCE,
    "mdq_usage_samples_insert()": USAGE_SAMPLES,
    **{
        f"mdq_usage_samples_oom_{event.lower()}()": _TRIGGER_FUNCTION.format(
            name=f"mdq_usage_samples_oom_{event.lower()}",
            body=OOM_SAMPLES.format(samples=OOM_OF.format(source=source)),
        )
        for event, (_, source) in OOM_TRANSITIONS.items()
    },
    "mdq_usage_summaries()": USAGE_SUMMARIES,
    **{
        f"mdq_failure_tallies_{event.lower()}()": _TRIGGER_FUNCTION.format(
            name=f"mdq_failure_tallies_{event.lower()}",
            body=FAILURE_TALLY.format(old=old, new=new),
        )
        for event, (_, old, new) in TRANSITIONS.items()
    },
    **{
        f"mdq_node_hours_{event.lower()}()": _TRIGGER_FUNCTION.format(
            name=f"mdq_node_hours_{event.lower()}",
            body=NODE_HOURS_TALLY.format(old=old, new=new),
        )
        for event, (_, old, new) in TRANSITIONS.items()
    },
    "node_utilisation_since(timestamptz)": NODE_UTILISATION_SINCE,
}
"""Every function of the schema by its signature, with the statement that makes it, in order."""

OWNER_ONLY_FUNCTIONS = (
    "mdq_add_partition(text, timestamp)",
    "mdq_make_partitions(timestamptz, timestamptz)",
    "mdq_detach_partitions(timestamptz)",
    "mdq_rollup_progress(timestamptz, integer)",
)
"""The functions PUBLIC may not execute: they run as the owner (SECURITY DEFINER, a fixed
``search_path``, under an advisory lock), and the writer, with no DDL of its own, may execute
those of ``mdq.store.roles.WRITER_FUNCTIONS`` alone (``mdq.store.roles`` grants them)."""

TRIGGERS = (
    "CREATE TRIGGER usage_samples_from_events AFTER INSERT ON job_events "
    "REFERENCING NEW TABLE AS new_events FOR EACH STATEMENT "
    "EXECUTE FUNCTION mdq_usage_samples_insert()",
    *(
        f"CREATE TRIGGER usage_samples_from_oom_kills_on_{event.lower()} AFTER {event} "
        f"ON attempts {referencing} FOR EACH STATEMENT "
        f"EXECUTE FUNCTION mdq_usage_samples_oom_{event.lower()}()"
        for event, (referencing, _) in OOM_TRANSITIONS.items()
    ),
    *(
        f"CREATE TRIGGER usage_summaries_on_{event.lower()} AFTER {event} ON usage_samples "
        "REFERENCING NEW TABLE AS changed_samples FOR EACH STATEMENT "
        "EXECUTE FUNCTION mdq_usage_summaries()"
        for event in ("INSERT", "UPDATE")
    ),
    *(
        f"CREATE TRIGGER {table}_on_{event.lower()} AFTER {event} ON attempts "
        f"{referencing} FOR EACH STATEMENT EXECUTE FUNCTION mdq_{table}_{event.lower()}()"
        for table in ("failure_tallies", "node_hours")
        for event, (referencing, _, _) in TRANSITIONS.items()
    ),
)
"""The triggers that keep the summaries."""
