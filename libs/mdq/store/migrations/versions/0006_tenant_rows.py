"""Row-level security on every table of per-job rows, so a tenant reads only its own jobs.

A tenant's job and request ids start with its name and a dot (``alice.3f2a9c0d1e4b-relax``,
``mdq.core.ids``); its PostgreSQL login is ``<prefix>_tenant_<name>`` (``mdq.store.roles``).
This revision makes the schema ready for that, for any role prefix:

* the function ``mdq_current_tenant()``: the tenant the connected role (``current_user``) is,
  read from the end of its name (``_tenant_<name>``), NULL for any other role. Tenant names
  have no ``_``, so the last ``_tenant_`` of a role name is the one that counts whatever the
  prefix is;
* row-level security enabled (not forced) on ``TABLES``. The owner, who runs the migrations,
  is not subject to it (it must see every row to migrate them); a role with BYPASSRLS (the
  writer, whose progress COPY PostgreSQL refuses under row security) neither;
* every view ``security_invoker`` (PostgreSQL 15 or newer), so a view reads its tables with
  the rights, and under the row policies, of whoever queries it, not of its owner.

The policies themselves name roles, which depend on the installation's prefix, so they are
made with the grants (``mdq.store.roles.grant``, run as the owner right after the
migrations): the reader sees every row, the tenants' group only the rows whose id starts with
``mdq_current_tenant() || '.'``; a role with no policy sees no row at all.

Downgrade takes every privilege on the schema's tables away from the roles a tenant policy
names (so no tenant reads unfiltered tables afterwards), drops the policies, disables row
security and the views' ``security_invoker``, and drops the function.

Revision ID: 0006_tenant_rows
Revises: 0005_offset_stream_identity
Create Date: 2026-12-02
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0006_tenant_rows"
down_revision: str | None = "0005_offset_stream_identity"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLES = ("jobs", "attempts", "job_events", "progress", "checkpoints", "placements", "rejections")
"""The tables whose rows belong to one job (``job_id``) or one submit (``request_id``)."""
VIEWS = (
    "events",
    "job_timeline",
    "attempt_history",
    "failures_by_reason",
    "node_utilisation",
    "job_outputs",
)
TENANT_POLICY = "tenant_rows"
"""The policy ``mdq.store.roles`` makes for the tenants' group (downgrade finds it by name)."""

CURRENT_TENANT = r"""
CREATE FUNCTION mdq_current_tenant() RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE
SET search_path = pg_catalog
AS $$ SELECT substring(current_user::text FROM '_tenant_([a-z][a-z0-9-]{0,30})$') $$
"""

REVOKE_FROM_TENANTS = f"""
DO $$
DECLARE r record;
BEGIN
  FOR r IN
    SELECT DISTINCT role_oid::regrole::text AS role
    FROM pg_policy p CROSS JOIN LATERAL unnest(p.polroles) AS role_oid
    WHERE p.polname = '{TENANT_POLICY}' AND role_oid <> 0
  LOOP
    EXECUTE format('REVOKE ALL ON ALL TABLES IN SCHEMA public FROM %s', r.role);
  END LOOP;
END $$
"""

DROP_POLICIES = """
DO $$
DECLARE r record;
BEGIN
  FOR r IN SELECT policyname, tablename FROM pg_policies WHERE schemaname = 'public'
  LOOP
    EXECUTE format('DROP POLICY %I ON public.%I', r.policyname, r.tablename);
  END LOOP;
END $$
"""


def _invoker_views_supported() -> bool:
    version = op.get_bind().exec_driver_sql("SHOW server_version_num").scalar()
    return int(str(version)) >= 150000


def upgrade() -> None:
    op.execute(CURRENT_TENANT)
    for table in TABLES:
        op.execute(f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY")
    # Before PostgreSQL 15 views run as their owner: mdq.store.roles then grants the tenants no
    # view (it grants a view only when it is security_invoker).
    if _invoker_views_supported():
        for view in VIEWS:
            op.execute(f"ALTER VIEW {view} SET (security_invoker = true)")


def downgrade() -> None:
    op.execute(REVOKE_FROM_TENANTS)
    op.execute(DROP_POLICIES)
    if _invoker_views_supported():
        for view in reversed(VIEWS):
            op.execute(f"ALTER VIEW {view} RESET (security_invoker)")
    for table in reversed(TABLES):
        op.execute(f"ALTER TABLE {table} DISABLE ROW LEVEL SECURITY")
    op.execute("DROP FUNCTION mdq_current_tenant()")
