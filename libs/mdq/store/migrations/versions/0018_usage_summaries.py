"""The table ``usage_summaries``: the newest attempts of each kind of job, one row per kind.

The resource recommender (``mdq.store.queries.usage_history``) learns from the attempts of each
kind of job (``spec_key``: the fields of a spec the cost fingerprint reads, revision 0014). Read
from ``usage_samples`` that is a scan of the newest samples, a sort by kind and a look-up of
each kind's spec in ``jobs``, every time intake or ``mdq recommend`` asks. This table keeps,
per kind (``spec_key``, CPU limit, measured or OOM-killed, owner), the ``SAMPLES_PER_KIND``
newest samples as arrays and the kind's fingerprint inputs, so the recommender reads one row
per kind (docs/requests.md, "Where the history comes from").

It is kept by PostgreSQL: a statement trigger on ``usage_samples`` (``mdq_usage_summaries``,
after INSERT or UPDATE, with the changed rows as a transition table) computes the summary of
each kind it touched again from ``usage_samples`` itself (``ix_usage_samples_kind``: that kind's
newest rows), so a summary depends on the samples alone, not on the order they came in: a
projection rebuilt from the log has the same summaries. The owner (a tenant, '' for the
operator) is part of the kind, and ``job_id`` is the kind's newest sample's job, so row
security shows a tenant its own kinds only, as on ``usage_samples``. Existing samples are
summarized by the upgrade.

Revision ID: 0018_usage_summaries
Revises: 0017_job_since
Create Date: 2026-12-04
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0018_usage_summaries"
down_revision: str | None = "0017_job_since"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SAMPLES_PER_KIND = 32
"""The newest samples a kind's summary keeps (measured and OOM-killed apart)."""

FINGERPRINT_INPUTS = """jsonb_strip_nulls(jsonb_build_object(
    'task', {s}->'task', 'system', {s}->'system',
    'nonbonded_method', {s}->'nonbonded_method', 'cutoff_nm', {s}->'cutoff_nm',
    'barostat', {s}->'barostat', 'integrator', {s}->'integrator', 'platform', {s}->'platform',
    'resources', jsonb_build_object('cpu', {s}->'resources'->'cpu'),
    'trajectory_interval_steps', {s}->'trajectory_interval_steps',
    'checkpoint_interval_steps', {s}->'checkpoint_interval_steps', 'inputs', {s}->'inputs'))"""
"""The fields of a spec (JSON ``{s}``) that the cost fingerprint reads: revision 0014's, as
``mdq.store.queries`` reads them."""

OWNER = "(CASE WHEN strpos({j}, '.') > 0 THEN split_part({j}, '.', 1) ELSE '' END)"
"""The owner of a job id ``{j}``: its tenant, '' for the operator's (``mdq.core.ids``)."""

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
    ON CONFLICT (spec_key, cpu_limit, oom_killed, owner) DO UPDATE SET
        job_id = EXCLUDED.job_id, newest = EXCLUDED.newest,
        spec = COALESCE(u.spec, EXCLUDED.spec), peak_memory_mb = EXCLUDED.peak_memory_mb,
        mean_cores = EXCLUDED.mean_cores, memory_limit_mb = EXCLUDED.memory_limit_mb
"""
"""Summarize again every kind of the samples in ``{source}`` from ``usage_samples``."""

TRIGGER_FUNCTION = f"""
CREATE FUNCTION mdq_usage_summaries() RETURNS trigger
LANGUAGE plpgsql SET search_path = public, pg_temp AS $$
BEGIN
    {SUMMARIZE.format(source="changed_samples")};
    RETURN NULL;
END
$$
"""


def upgrade() -> None:
    op.create_table(
        "usage_summaries",
        sa.Column("spec_key", sa.Text(), nullable=False, comment="usage_samples.spec_key."),
        sa.Column("cpu_limit", sa.Double(), nullable=False),
        sa.Column("oom_killed", sa.Boolean(), nullable=False),
        sa.Column(
            "owner",
            sa.Text(),
            nullable=False,
            comment="The tenant whose jobs these are ('' the operator's).",
        ),
        sa.Column(
            "job_id",
            sa.Text(),
            nullable=False,
            comment="The job of the kind's newest sample (whose rows these are).",
        ),
        sa.Column("newest", sa.DateTime(timezone=True), nullable=False),
        sa.Column(
            "spec",
            sa.Text(),
            nullable=True,
            comment="The fingerprint inputs of the kind's spec (JSON); NULL: none found.",
        ),
        sa.Column("peak_memory_mb", postgresql.ARRAY(sa.Double()), nullable=False),
        sa.Column("mean_cores", postgresql.ARRAY(sa.Double()), nullable=False),
        sa.Column("memory_limit_mb", postgresql.ARRAY(sa.Double()), nullable=False),
        sa.PrimaryKeyConstraint(
            "spec_key", "cpu_limit", "oom_killed", "owner", name="pk_usage_summaries"
        ),
        comment="The newest samples of each kind of job (revision 0018), newest first.",
    )
    op.create_index("ix_usage_summaries_newest", "usage_summaries", ["newest"])
    op.execute(
        "CREATE INDEX ix_usage_samples_kind ON usage_samples "
        f"(spec_key, cpu_limit, oom_killed, {OWNER.format(j='job_id')}, time DESC)"
    )
    op.execute("ALTER TABLE usage_summaries ENABLE ROW LEVEL SECURITY")
    op.execute(TRIGGER_FUNCTION)
    for event in ("INSERT", "UPDATE"):
        op.execute(
            f"CREATE TRIGGER usage_summaries_on_{event.lower()} AFTER {event} ON usage_samples "
            "REFERENCING NEW TABLE AS changed_samples FOR EACH STATEMENT "
            "EXECUTE FUNCTION mdq_usage_summaries()"
        )
    op.execute(SUMMARIZE.format(source="usage_samples"))


def downgrade() -> None:
    for event in ("insert", "update"):
        op.execute(f"DROP TRIGGER IF EXISTS usage_summaries_on_{event} ON usage_samples")
    op.execute("DROP FUNCTION IF EXISTS mdq_usage_summaries()")
    op.execute("DROP INDEX IF EXISTS ix_usage_samples_kind")
    op.drop_index("ix_usage_summaries_newest", table_name="usage_summaries")
    op.drop_table("usage_summaries")
