"""Record the Kubernetes token exchange of each attempt (issue 9 item 3).

Revision ID: 6d1f0a8e2c93
Revises: 3b7e9d1c4f20
Create Date: 2026-12-01

``leoflow_attempt.exchanged_at`` and ``leoflow_attempt.exchange_credential_id`` (both nullable): when the
attempt's pod exchanged its projected ServiceAccount token for the workload, and that token's TokenReview
``credential-id`` (``JTI=…``). The exchange sets both in one guarded write that requires ``exchanged_at`` to be
NULL, so a second exchange of one attempt is refused and the first is auditable. Rows written before this
revision keep NULL: Lite attempts, which never exchange.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "6d1f0a8e2c93"
down_revision = "3b7e9d1c4f20"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Add the nullable ``exchanged_at`` and ``exchange_credential_id`` columns."""
    with op.batch_alter_table("leoflow_attempt") as batch:
        # the same column type as 0001's timestamps (models.UtcDateTime's implementation), frozen here
        kind = sa.DateTime(timezone=True).with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
        batch.add_column(sa.Column("exchanged_at", kind, nullable=True))
        batch.add_column(sa.Column("exchange_credential_id", sa.String(256), nullable=True))


def downgrade() -> None:
    """Drop both columns (no attempt is marked exchanged any more)."""
    with op.batch_alter_table("leoflow_attempt") as batch:
        batch.drop_column("exchange_credential_id")
        batch.drop_column("exchanged_at")
