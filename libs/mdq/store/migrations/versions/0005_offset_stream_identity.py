"""``consumer_offsets`` records which log it was projected from.

Two nullable columns: ``stream_created`` (the stream's creation time from the server's stream
info) and ``last_digest`` (``mdq.core.log_continuity.message_digest`` of the message at
``last_seq``). The projector compares them with the server on open and when it sees sequences
at or below its offset, so a log that lost its tail or was recreated stops it with a clear
error instead of having new events skipped as if already projected (docs/durability.md).
Offsets stored before this migration have NULLs there and are checked by sequence only, then
recorded at the next batch.

Revision ID: 0005_offset_stream_identity
Revises: 0004_job_outputs
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005_offset_stream_identity"
down_revision: str | None = "0004_job_outputs"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "consumer_offsets",
        sa.Column(
            "stream_created",
            sa.DateTime(timezone=True),
            nullable=True,
            comment="Creation time of the stream the offset was projected from",
        ),
    )
    op.add_column(
        "consumer_offsets",
        sa.Column(
            "last_digest",
            sa.Text(),
            nullable=True,
            comment="sha256 of subject and data of the message at last_seq",
        ),
    )


def downgrade() -> None:
    op.drop_column("consumer_offsets", "last_digest")
    op.drop_column("consumer_offsets", "stream_created")
