"""The table ``node_hours``: how busy each node was per hour, added up as attempts end.

``node_utilisation`` and ``node_utilisation_since(t)`` (docs/history.md: "Node utilisation over
the last 24 hours") spread every attempt of the window over its hours and looked each one's
requested cores up in its job's spec, at every read: a read that grows with the number of
attempts a day, about 27,000 at a big site. This table keeps, per node, hour and owner
(``tenant_prefix``: ``alice.`` for tenant alice's jobs, '' for the operator's), what the ended
attempts contributed to that hour: how many overlapped it, their seconds in it, and those
seconds times the cores their jobs requested. The view and the function add those rows up and
spread only the attempts still running (``ended_at`` NULL, ``ix_attempts_ended_at``) over their
hours, as before: the same rows, columns and types.

It is kept by PostgreSQL: statement triggers on ``attempts`` (after INSERT, UPDATE and DELETE,
with the changed rows as transition tables) subtract what a replaced or deleted row contributed
and add what a written row contributes. A row contributes once it has a node, a start and an
end; an update is paired with the row it replaced by the key (``job_id``, ``attempt``), and a
rewrite with the same node, start and end changes nothing. The cores come from the job's spec
(``resources.cpu``, 1 when unset), which never changes after the job's row is written; mdq never
deletes a job's row. Seconds and core-seconds are ``numeric`` (exact, whatever the order the
attempts were written in: a projection rebuilt from the log has the same rows, and ``mdq replay
--compare`` compares them). Tallies are added to in key order, so two writers cannot deadlock on
them. Row security shows a tenant its own rows, as on ``attempts``. Existing attempts are
tallied by the upgrade; the downgrade restores the view and function that spread every attempt.

Revision ID: 0020_node_hours
Revises: 0019_failure_tallies
Create Date: 2026-12-04
"""

import importlib
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0020_node_hours"
down_revision: str | None = "0019_failure_tallies"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_views = importlib.import_module("mdq.store.migrations.versions.0002_history_views")
_indexes = importlib.import_module("mdq.store.migrations.versions.0007_history_indexes")
_tallies = importlib.import_module("mdq.store.migrations.versions.0019_failure_tallies")

TENANT_PREFIX: str = _tallies.TENANT_PREFIX
"""The owner of a job id ``{j}`` as a prefix of its ids (revision 0019's)."""
TRANSITIONS: dict[str, tuple[str, str, str]] = _tallies.TRANSITIONS
"""Per event: the trigger's transition tables, and what stands for ``{old}`` and ``{new}``
(revision 0019's)."""

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

TALLY = f"""
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
away or replaced, ``{new}`` the rows it wrote."""

ENDED = "a.node IS NOT NULL AND a.started_at IS NOT NULL AND a.ended_at IS NOT NULL"

TALLY_EXISTING = f"""
    INSERT INTO node_hours (hour, node, tenant_prefix, attempts, busy_s, cpu_core_s)
    SELECT hour, node, tenant_prefix, count(*), sum(busy_s), sum(busy_s * cores)
    FROM ({SPREAD.format(attempts="attempts", sign="1", end="a.ended_at", since="a.started_at")}
          WHERE {ENDED}) spread
    GROUP BY hour, node, tenant_prefix
"""
"""Tally every ended attempt there is (the upgrade, and a test's check of the triggers)."""

NODE_UTILISATION_SINCE = f"""
CREATE OR REPLACE FUNCTION node_utilisation_since(since timestamptz)
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
attempts spread up to now (the caller's rights: a tenant counts its own attempts only)."""

NODE_UTILISATION = "SELECT * FROM node_utilisation_since('-infinity')"

NODE_UTILISATION_SINCE_SPREAD: str = _indexes.NODE_UTILISATION_SINCE.replace(
    "CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1
)
"""The function as revision 0007 made it (the downgrade's)."""

NODE_UTILISATION_SPREAD: str = _views.VIEWS["node_utilisation"]
"""The view as revision 0002 made it (the downgrade's)."""


def upgrade() -> None:
    op.create_table(
        "node_hours",
        sa.Column("hour", sa.DateTime(timezone=True), nullable=False, comment="The hour's start."),
        sa.Column("node", sa.Text(), nullable=False),
        sa.Column(
            "tenant_prefix",
            sa.Text(),
            nullable=False,
            comment="Whose attempts: 'alice.' for tenant alice's jobs, '' for the operator's.",
        ),
        sa.Column(
            "attempts", sa.BigInteger(), nullable=False, comment="Ended attempts in the hour."
        ),
        sa.Column("busy_s", sa.Numeric(), nullable=False, comment="Their seconds in the hour."),
        sa.Column(
            "cpu_core_s",
            sa.Numeric(),
            nullable=False,
            comment="Their seconds in the hour times their jobs' requested cores.",
        ),
        sa.PrimaryKeyConstraint("hour", "node", "tenant_prefix", name="pk_node_hours"),
        comment="What ended attempts added to each node's hours (revision 0020), by triggers.",
    )
    op.execute("ALTER TABLE node_hours ENABLE ROW LEVEL SECURITY")
    for event, (referencing, old, new) in TRANSITIONS.items():
        name = event.lower()
        op.execute(
            f"CREATE FUNCTION mdq_node_hours_{name}() RETURNS trigger "
            "LANGUAGE plpgsql SET search_path = public, pg_temp AS $$\nBEGIN\n"
            f"{TALLY.format(old=old, new=new)};\nRETURN NULL;\nEND\n$$"
        )
        op.execute(
            f"CREATE TRIGGER node_hours_on_{name} AFTER {event} ON attempts "
            f"{referencing} FOR EACH STATEMENT EXECUTE FUNCTION mdq_node_hours_{name}()"
        )
    op.execute(TALLY_EXISTING)
    op.execute(NODE_UTILISATION_SINCE)
    _tallies.replace_view("node_utilisation", NODE_UTILISATION)


def downgrade() -> None:
    _tallies.replace_view("node_utilisation", NODE_UTILISATION_SPREAD)
    op.execute(NODE_UTILISATION_SINCE_SPREAD)
    for event in TRANSITIONS:
        name = event.lower()
        op.execute(f"DROP TRIGGER IF EXISTS node_hours_on_{name} ON attempts")
        op.execute(f"DROP FUNCTION IF EXISTS mdq_node_hours_{name}()")
    op.drop_table("node_hours")
