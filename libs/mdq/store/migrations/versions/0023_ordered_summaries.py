"""The summaries kept by triggers take their row locks in key order, whoever writes at once.

Two transactions that write attempts or usage events of different jobs at the same time (the
bench loading a year on several connections; two watchers, were their batches not serialized
by the consumer's offset row) must not deadlock on the rows the triggers keep. Revisions 0019
and 0020 add to their tallies in key order, one statement per trigger. Two triggers did not:

* the OOM kills' samples (revision 0014) came from a row trigger on ``attempts``, so each
  OOM-killed attempt inserted its sample, and ``usage_summaries`` (revision 0018) summarized its
  kind, in a statement of its own: two transactions could lock two kinds in opposite orders.
  They now come from statement triggers on ``attempts`` (after INSERT, and after UPDATE for the
  rows whose reason or end changed), one insert per statement, as the tallies do;
* ``usage_summaries``' trigger wrote the kinds in no particular order; it now writes them in
  key order (``spec_key, cpu_limit, oom_killed, owner``).

Locks are then taken table by table in one order (the triggers run in name order:
``failure_tallies``, ``node_hours``, ``usage_samples`` and from it ``usage_summaries``), and in
key order within each table, so no cycle of waits can form.

Revision ID: 0023_ordered_summaries
Revises: 0022_jobs_cancelled
Create Date: 2026-12-04
"""

import importlib
from collections.abc import Sequence

from alembic import op

revision: str = "0023_ordered_summaries"
down_revision: str | None = "0022_jobs_cancelled"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_samples = importlib.import_module("mdq.store.migrations.versions.0014_usage_samples")
_summaries = importlib.import_module("mdq.store.migrations.versions.0018_usage_summaries")

ORDERED_SUMMARIZE = _summaries.SUMMARIZE.replace(
    "    ON CONFLICT (spec_key, cpu_limit, oom_killed, owner) DO UPDATE SET",
    "    ORDER BY k.spec_key, k.cpu_limit, k.oom_killed, k.owner\n"
    "    ON CONFLICT (spec_key, cpu_limit, oom_killed, owner) DO UPDATE SET",
)
"""Revision 0018's summary of the kinds of ``{source}``, written in key order."""
if ORDERED_SUMMARIZE == _summaries.SUMMARIZE:
    raise AssertionError("revision 0018's summary has no ON CONFLICT clause to order before")

SUMMARIES_FUNCTION = """
CREATE OR REPLACE FUNCTION mdq_usage_summaries() RETURNS trigger
LANGUAGE plpgsql SET search_path = public, pg_temp AS $$
BEGIN
    {summarize};
    RETURN NULL;
END
$$
"""

OOM_SAMPLES = f"""
    INSERT INTO usage_samples ({_samples.COLUMNS})
    {{samples}}
    ORDER BY 1, 2
    ON CONFLICT (job_id, attempt) DO UPDATE SET time = EXCLUDED.time,
        memory_limit_mb = EXCLUDED.memory_limit_mb, cpu_limit = EXCLUDED.cpu_limit
        WHERE usage_samples.oom_killed
"""
"""Revision 0014's sample of each OOM-killed attempt of ``{samples}``."""

CHANGED = (
    "(SELECT n.* FROM new_attempts n LEFT JOIN old_attempts o "
    "ON o.job_id = n.job_id AND o.attempt = n.attempt "
    "WHERE (o.failure_reason, o.ended_at) IS DISTINCT FROM (n.failure_reason, n.ended_at)) AS"
)
"""The rows an UPDATE of ``attempts`` gave a new reason or end."""

TRANSITIONS = {
    "INSERT": ("REFERENCING NEW TABLE AS new_attempts", "new_attempts"),
    "UPDATE": ("REFERENCING OLD TABLE AS old_attempts NEW TABLE AS new_attempts", CHANGED),
}


def upgrade() -> None:
    op.execute(
        SUMMARIES_FUNCTION.format(summarize=ORDERED_SUMMARIZE.format(source="changed_samples"))
    )
    op.execute("DROP TRIGGER IF EXISTS usage_samples_from_oom_kills ON attempts")
    op.execute("DROP FUNCTION IF EXISTS mdq_usage_samples_oom()")
    for event, (referencing, source) in TRANSITIONS.items():
        name = event.lower()
        samples = _samples.OOM_OF.format(source=source)
        op.execute(
            f"CREATE FUNCTION mdq_usage_samples_oom_{name}() RETURNS trigger "
            "LANGUAGE plpgsql SET search_path = public, pg_temp AS $$\nBEGIN\n"
            f"{OOM_SAMPLES.format(samples=samples)};\nRETURN NULL;\nEND\n$$"
        )
        op.execute(
            f"CREATE TRIGGER usage_samples_from_oom_kills_on_{name} AFTER {event} ON attempts "
            f"{referencing} FOR EACH STATEMENT EXECUTE FUNCTION mdq_usage_samples_oom_{name}()"
        )


def downgrade() -> None:
    for event in TRANSITIONS:
        name = event.lower()
        op.execute(f"DROP TRIGGER IF EXISTS usage_samples_from_oom_kills_on_{name} ON attempts")
        op.execute(f"DROP FUNCTION IF EXISTS mdq_usage_samples_oom_{name}()")
    op.execute(_samples.OOM_TRIGGER_FUNCTION)
    op.execute(
        "CREATE TRIGGER usage_samples_from_oom_kills AFTER INSERT OR UPDATE OF failure_reason, "
        "ended_at ON attempts FOR EACH ROW WHEN (NEW.failure_reason = 'FAILURE_OOM_KILLED' "
        "AND NEW.ended_at IS NOT NULL) EXECUTE FUNCTION mdq_usage_samples_oom()"
    )
    op.execute(
        SUMMARIES_FUNCTION.format(summarize=_summaries.SUMMARIZE.format(source="changed_samples"))
    )
