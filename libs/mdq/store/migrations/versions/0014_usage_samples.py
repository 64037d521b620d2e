"""The table ``usage_samples``: one row per measured attempt, by system, for the memory questions.

"How much memory do water boxes of about 2,700 atoms use" (docs/history.md) and the resource
recommender's history (``mdq.store.queries.usage_history``) read the attempts' ``usage`` events.
Through the view ``attempt_usage`` that is a scan of every job event of the year (the view's
``kind = 'usage'`` is no index) and a join with every job's spec to find its system: it grows with
the history (99 ms at 300,000 jobs). ``usage_samples`` holds the same figures, one row per
attempt (key ``job_id, attempt``), with the job's system case (``system_kind``: ``water_box``,
``structure``, …) and a water box's edge (``box_nm``) beside them, so that

* ``ix_usage_samples_system`` (system_kind, box_nm) INCLUDE (peak_memory_mb, memory_limit_mb,
  mean_cores) answers a question about one kind and size of system from the index alone;
* ``ix_usage_samples_time`` (oom_killed, time) gives the recommender the newest measured
  samples and the newest OOM kills first, and each row's ``spec_key`` (the md5 of the fields of the
  job's spec that the cost fingerprint reads, ``FINGERPRINT_INPUTS``) lets it read and parse
  those fields once per distinct key instead of a whole spec per sample
  (``mdq.store.queries.usage_history``).

An OOM-killed attempt reports no usage: it is a row with ``oom_killed`` true, no measured
figures, and the limits it was bound with (its ``bound`` event's resources, else its spec's),
at the attempt's end. It is written by a row trigger on ``attempts``
(``mdq_usage_samples_oom``) when the attempt is stored as ended with ``FAILURE_OOM_KILLED``,
so the recommender reads no ``job_events`` partition for it. The memory question of
docs/history.md counts the measured rows only (``NOT oom_killed``).

It is kept by PostgreSQL, not by the projector's code: an AFTER INSERT statement trigger on
``job_events`` (``mdq_usage_samples_insert``, with the statement's new rows as a transition
table) adds a row for each ``usage`` event inserted, with the system of the job's spec (from
``jobs``, or from the job's ``submitted`` event when the job's row is not written yet: the
projector writes a batch's events before it folds the jobs). The trigger runs as the role that
inserts (the watcher's writer), which may insert into it like every table it writes. A
redelivered usage event is stored once in ``job_events`` and so once here (and the insert is
``ON CONFLICT DO NOTHING``); a rebuild from the log gives the same rows. Unlike the
``job_events`` rows it comes from, a sample is not detached with its month
(``MDQ_WATCHER_HISTORY_RETENTION_DAYS``): it is ~150 bytes per attempt, like ``attempts``, and
it is what the recommender learns from. Existing usage events are copied in by the upgrade.

Row security as on the other tables of per-job rows (revision 0006): a tenant reads its own
jobs' samples (``mdq.store.roles`` makes the policies).

Revision ID: 0014_usage_samples
Revises: 0013_progress_units
Create Date: 2026-12-04
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014_usage_samples"
down_revision: str | None = "0013_progress_units"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

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
    LEFT JOIN jobs j ON j.job_id = n.job_id
    CROSS JOIN LATERAL (
        SELECT COALESCE(j.spec, (
            SELECT e.body->'spec' FROM job_events e
            WHERE e.job_id = n.job_id AND e.kind = 'submitted' LIMIT 1)) AS system_spec
    ) AS s0
    CROSS JOIN LATERAL (SELECT s0.system_spec, s0.system_spec->'system' AS system) AS s
    LEFT JOIN LATERAL (
        SELECT key AS kind FROM jsonb_object_keys(
            CASE WHEN jsonb_typeof(s.system) = 'object' THEN s.system END) AS key
        ORDER BY key LIMIT 1
    ) AS k ON true
    WHERE n.kind = 'usage' AND n.job_id IS NOT NULL
"""
"""The samples of the usage events of ``source`` (a table of ``job_events`` rows)."""

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
    LEFT JOIN jobs j ON j.job_id = n.job_id
    CROSS JOIN LATERAL (
        SELECT COALESCE(j.spec, (
            SELECT e.body->'spec' FROM job_events e
            WHERE e.job_id = n.job_id AND e.kind = 'submitted' LIMIT 1)) AS system_spec
    ) AS s0
    CROSS JOIN LATERAL (SELECT s0.system_spec, s0.system_spec->'system' AS system) AS s
    LEFT JOIN LATERAL (
        SELECT e.body->'resources' AS resources FROM job_events e
        WHERE e.job_id = n.job_id AND e.attempt = n.attempt AND e.kind = 'bound' LIMIT 1
    ) AS b ON true
    LEFT JOIN LATERAL (
        SELECT key AS kind FROM jsonb_object_keys(
            CASE WHEN jsonb_typeof(s.system) = 'object' THEN s.system END) AS key
        ORDER BY key LIMIT 1
    ) AS k ON true
    WHERE n.failure_reason = 'FAILURE_OOM_KILLED' AND n.ended_at IS NOT NULL
"""
"""The samples of the OOM-killed attempts of ``source`` (a table of ``attempts`` rows)."""

TRIGGER_FUNCTION = f"""
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

OOM_TRIGGER_FUNCTION = f"""
CREATE FUNCTION mdq_usage_samples_oom() RETURNS trigger
LANGUAGE plpgsql SET search_path = public, pg_temp AS $$
BEGIN
    INSERT INTO usage_samples ({COLUMNS})
    {OOM_OF.format(source="(SELECT NEW.*) AS")}
    ON CONFLICT (job_id, attempt) DO UPDATE SET time = EXCLUDED.time,
        memory_limit_mb = EXCLUDED.memory_limit_mb, cpu_limit = EXCLUDED.cpu_limit
        WHERE usage_samples.oom_killed;
    RETURN NULL;
END
$$
"""


def upgrade() -> None:
    op.create_table(
        "usage_samples",
        sa.Column("job_id", sa.Text(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("time", sa.DateTime(timezone=True), nullable=False),
        sa.Column(
            "system_kind",
            sa.Text(),
            nullable=False,
            comment="The spec's system case: water_box, structure, lammps, ... ('' none).",
        ),
        sa.Column("box_nm", sa.Double(), nullable=True, comment="A water box's edge, nm."),
        sa.Column("peak_memory_mb", sa.Double(), nullable=False),
        sa.Column("mean_cores", sa.Double(), nullable=False),
        sa.Column("cpu_seconds", sa.Double(), nullable=False),
        sa.Column("wall_seconds", sa.Double(), nullable=False),
        sa.Column("memory_limit_mb", sa.BigInteger(), nullable=False),
        sa.Column("cpu_limit", sa.Double(), nullable=False),
        sa.Column(
            "spec_key",
            sa.Text(),
            nullable=False,
            comment="md5 of the fields of the job's spec that the cost fingerprint reads.",
        ),
        sa.Column(
            "oom_killed",
            sa.Boolean(),
            nullable=False,
            comment="An OOM-killed attempt: no measured figures, the limits it was bound with.",
        ),
        sa.PrimaryKeyConstraint("job_id", "attempt", name="pk_usage_samples"),
        comment="One row per usage event (revision 0014): what each attempt used, by system.",
    )
    op.create_index(
        "ix_usage_samples_system",
        "usage_samples",
        ["system_kind", "box_nm"],
        postgresql_include=["peak_memory_mb", "memory_limit_mb", "mean_cores", "oom_killed"],
    )
    op.create_index("ix_usage_samples_time", "usage_samples", ["oom_killed", "time"])
    op.execute("ALTER TABLE usage_samples ENABLE ROW LEVEL SECURITY")
    op.execute(TRIGGER_FUNCTION)
    op.execute(
        "CREATE TRIGGER usage_samples_from_events AFTER INSERT ON job_events "
        "REFERENCING NEW TABLE AS new_events FOR EACH STATEMENT "
        "EXECUTE FUNCTION mdq_usage_samples_insert()"
    )
    op.execute(OOM_TRIGGER_FUNCTION)
    op.execute(
        "CREATE TRIGGER usage_samples_from_oom_kills AFTER INSERT OR UPDATE OF failure_reason, "
        "ended_at ON attempts FOR EACH ROW WHEN (NEW.failure_reason = 'FAILURE_OOM_KILLED' "
        "AND NEW.ended_at IS NOT NULL) EXECUTE FUNCTION mdq_usage_samples_oom()"
    )
    op.execute(
        f"INSERT INTO usage_samples ({COLUMNS}) {SAMPLES_OF.format(source='job_events')} "
        "ON CONFLICT DO NOTHING"
    )
    op.execute(
        f"INSERT INTO usage_samples ({COLUMNS}) {OOM_OF.format(source='attempts')} "
        "ON CONFLICT DO NOTHING"
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER IF EXISTS usage_samples_from_events ON job_events")
    op.execute("DROP FUNCTION IF EXISTS mdq_usage_samples_insert()")
    op.execute("DROP TRIGGER IF EXISTS usage_samples_from_oom_kills ON attempts")
    op.execute("DROP FUNCTION IF EXISTS mdq_usage_samples_oom()")
    op.drop_index("ix_usage_samples_time", table_name="usage_samples")
    op.drop_index("ix_usage_samples_system", table_name="usage_samples")
    op.drop_table("usage_samples")
