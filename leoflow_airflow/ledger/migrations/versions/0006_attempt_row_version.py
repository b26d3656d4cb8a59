"""Count the writes to each attempt row, so a scheduler loop re-reads only the rows that changed (issue 10,
"Benchmark").

Revision ID: 4f2b8d6e1a37
Revises: 9a4c7e2b5d18
Create Date: 2026-12-02

``leoflow_attempt.row_version`` (integer, not null, 0 for every existing row): every guarded write of the
ledger (``LedgerStore._guarded_update``: transitions, facts, the exchange) sets it to ``row_version + 1`` in the
same ``UPDATE``. ``LedgerStore.open_page`` reads a keyset page of the LIVE attempts as ``(id, row_version)``
pairs and fetches whole rows only for those it has not read at that version, so a sweep over ten thousand
running attempts does not rebuild ten thousand rows from their columns every time. The row version is
SQLAlchemy's optimistic-concurrency idea (the ORM's ``version_id_col``), counted in the guarded writes the
ledger already makes. Rows keep everything else; downgrading drops the column.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "4f2b8d6e1a37"
down_revision = "9a4c7e2b5d18"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Add ``row_version`` (not null, server default 0: every existing row starts at version 0)."""
    with op.batch_alter_table("leoflow_attempt") as batch:
        batch.add_column(sa.Column("row_version", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    """Drop ``row_version``."""
    with op.batch_alter_table("leoflow_attempt") as batch:
        batch.drop_column("row_version")
