"""mdq's schema: the models' tables (``mdq.store.models``), then what the models cannot say
(``mdq.store.schema_sql``): row security, the partitions, the functions, the triggers and the
views.

The tables come from the models as they are, so this migration makes whatever the models
declare. A released version freezes its migrations: before the first release, the
``create_all`` here is written out as the tables it makes, and every later change to the
models is a migration of its own (``tests/integration/test_store.py`` compares the migrated
database with the models).

Downgrade drops everything this made. A month detached by ``mdq_detach_partitions`` is a plain
table of its own by then (to archive and drop); it is left as it is.

Revision ID: 0001_schema
Revises:
Create Date: 2026-12-05
"""

from collections.abc import Sequence

from alembic import op

from mdq.store.models import Base
from mdq.store.roles import TENANT_ROWS
from mdq.store.schema_sql import (
    FUNCTIONS,
    MONTHS_AHEAD,
    OWNER_ONLY_FUNCTIONS,
    PARTITIONED,
    TRIGGERS,
    VIEWS,
)

revision: str = "0001_schema"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _invoker_views_supported() -> bool:
    version = op.get_bind().exec_driver_sql("SHOW server_version_num").scalar()
    return int(str(version)) >= 150000


def upgrade() -> None:
    Base.metadata.create_all(op.get_bind(), checkfirst=False)
    for table in PARTITIONED:
        op.execute(f"CREATE TABLE {table}_default PARTITION OF {table} DEFAULT")
    for table in TENANT_ROWS:
        op.execute(f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY")
    for function in FUNCTIONS.values():
        op.execute(function)
    for signature in OWNER_ONLY_FUNCTIONS:
        op.execute(f"REVOKE ALL ON FUNCTION {signature} FROM PUBLIC")
    for trigger in TRIGGERS:
        op.execute(trigger)
    invoker = " WITH (security_invoker = true)" if _invoker_views_supported() else ""
    for name, query in VIEWS.items():
        op.execute(f"CREATE VIEW {name}{invoker} AS {query}")
    op.execute(MONTHS_AHEAD)


def downgrade() -> None:
    for name in reversed(VIEWS):
        op.execute(f"DROP VIEW {name}")
    Base.metadata.drop_all(op.get_bind(), checkfirst=False)
    for signature in reversed(FUNCTIONS):
        op.execute(f"DROP FUNCTION {signature}")
