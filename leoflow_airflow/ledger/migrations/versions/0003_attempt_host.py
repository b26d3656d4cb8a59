"""Stamp each attempt with the host it runs on (issue 8 hole 14).

Revision ID: 3b7e9d1c4f20
Revises: 8c3d2e4f6a71
Create Date: 2026-12-01

``leoflow_attempt.host`` (nullable): ``<hostname>/<boot id>`` of the scheduler that claimed the attempt
(``leoflow_airflow.hosts.this_host``). Another host's pids mean nothing here, so the Lite runtime answers
UNKNOWN for such an attempt. Rows written before this revision keep NULL and are treated as this host's
(one host was the only supported set-up before it), so an upgrade changes no decision about them.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "3b7e9d1c4f20"
down_revision = "8c3d2e4f6a71"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Add the nullable ``host`` column."""
    with op.batch_alter_table("leoflow_attempt") as batch:
        batch.add_column(sa.Column("host", sa.String(300), nullable=True))


def downgrade() -> None:
    """Drop ``host`` (every attempt is judged as this host's again)."""
    with op.batch_alter_table("leoflow_attempt") as batch:
        batch.drop_column("host")
