"""Index the ledger's attempts on (state, id) for keyset paging (issue 10 item 1).

Revision ID: 9a4c7e2b5d18
Revises: 6d1f0a8e2c93
Create Date: 2026-12-01

Each scheduler loop reads the attempts that need action now by state, and one keyset page of the LIVE ones
(``state = :s AND id > :cursor ORDER BY id LIMIT :n``, ``LedgerStore.open_page``). An index on ``state`` alone
makes PostgreSQL fetch and sort every row of that state for the ``ORDER BY``, so a page would cost as much as all
running attempts; on ``(state, id)`` a page is a bounded range scan. It replaces ``ix_leoflow_attempt_state``
(its leading column serves every read by state alone). No row changes.
"""

from __future__ import annotations

from alembic import op

revision = "9a4c7e2b5d18"
down_revision = "6d1f0a8e2c93"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Create ``ix_leoflow_attempt_state_id`` on (state, id), then drop ``ix_leoflow_attempt_state``."""
    op.create_index("ix_leoflow_attempt_state_id", "leoflow_attempt", ["state", "id"])
    op.drop_index("ix_leoflow_attempt_state", table_name="leoflow_attempt")


def downgrade() -> None:
    """Put the index on ``state`` back and drop the (state, id) one."""
    op.create_index("ix_leoflow_attempt_state", "leoflow_attempt", ["state"])
    op.drop_index("ix_leoflow_attempt_state_id", table_name="leoflow_attempt")
