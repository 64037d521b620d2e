"""``mdq_job_since(job_id)``: from when a job's rows can exist, so its reads prune partitions.

``progress`` and ``job_events`` are partitioned by month of ``time`` (revision 0008). A read of
one job's rows by ``job_id`` alone probes the ``job_id`` index of every partition, a year's
history and more: thirteen and more index probes for rows that lie in one or two months. No row
of a job is older than its submission, so a per-job read adds
``time >= mdq_job_since(job_id)``, and PostgreSQL skips every partition that ends before it.

The function returns the job's ``submitted_at`` a day early: the events and progress reports are
stamped by the clocks of the services and runners that produced them, which may lag intake's a
little. For a job with no row in ``jobs`` (not projected yet) it returns ``-infinity``: nothing
is pruned, nothing is missed. It is ``STABLE`` (one value per statement), so the bound is
known when the statement starts and the partitions are pruned then; it runs as the caller,
under the caller's row policies (a tenant's bound is for its own jobs only; another's job gives
``-infinity`` and its rows stay invisible to it all the same).

Revision ID: 0017_job_since
Revises: 0016_attempts_started_at
Create Date: 2026-12-04
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0017_job_since"
down_revision: str | None = "0016_attempts_started_at"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JOB_SINCE = """
CREATE FUNCTION mdq_job_since(job text) RETURNS timestamptz
LANGUAGE sql STABLE PARALLEL SAFE SET search_path = public, pg_temp AS $$
    SELECT coalesce((SELECT submitted_at FROM jobs WHERE job_id = job) - interval '1 day',
                    '-infinity'::timestamptz)
$$
"""


def upgrade() -> None:
    op.execute(JOB_SINCE)


def downgrade() -> None:
    op.execute("DROP FUNCTION IF EXISTS mdq_job_since(text)")
