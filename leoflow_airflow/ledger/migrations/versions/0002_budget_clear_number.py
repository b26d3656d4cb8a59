"""Store the dag run's clear_number with the infra budget (issue 8 hole 16a).

Revision ID: 8c3d2e4f6a71
Revises: 5e0f1a7c2b10
Create Date: 2026-12-01

``leoflow_infra_budget.clear_number`` (nullable): the dag run's ``clear_number`` at the last charge, so a
user's clear resets the budget even when it leaves ``max_tries`` where it was (``redrive.budget_decision``).
Existing rows keep NULL and are judged by ``max_tries`` alone, as before.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "8c3d2e4f6a71"
down_revision = "5e0f1a7c2b10"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Add the nullable ``clear_number`` column."""
    with op.batch_alter_table("leoflow_infra_budget") as batch:
        batch.add_column(sa.Column("clear_number", sa.Integer(), nullable=True))


def downgrade() -> None:
    """Drop ``clear_number`` (budgets fall back to the ``max_tries`` rule)."""
    with op.batch_alter_table("leoflow_infra_budget") as batch:
        batch.drop_column("clear_number")
