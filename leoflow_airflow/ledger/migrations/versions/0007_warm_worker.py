"""Warm pods: the worker table and the in-band outcome record (issue 11).

Revision ID: 7c1e5a9d3b42
Revises: 4f2b8d6e1a37
Create Date: 2026-12-03

``leoflow_warm_worker``: one row per registered warm pod (``pod_uid`` the key), its state (``idle`` |
``assigned`` | ``busy``), the attempt it holds, the SHA-256 hex of its opaque credential (unique), timestamps and
counters (``leoflow_airflow.ledger.models.warm_worker_table``). ``leoflow_attempt.outcome_json`` (nullable text):
the outcome record a warm pod's agent POSTed for the attempt (first write wins). Existing attempt rows keep
NULL; downgrading drops the table and the column (any warm worker then registers again on an upgraded ledger).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "7c1e5a9d3b42"
down_revision = "4f2b8d6e1a37"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Create ``leoflow_warm_worker`` with its two indexes; add ``leoflow_attempt.outcome_json``."""
    # the same column type as 0001's timestamps (models.UtcDateTime's implementation), frozen here
    kind = sa.DateTime(timezone=True).with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
    op.create_table(
        "leoflow_warm_worker",
        sa.Column("pod_uid", sa.String(64), nullable=False),
        sa.Column("pod_name", sa.String(253), nullable=False),
        sa.Column("namespace", sa.String(253), nullable=False),
        sa.Column("dag_version_id", sa.String(36), nullable=False),
        sa.Column("credential_sha256", sa.String(64), nullable=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("ti_id", sa.String(36), nullable=True),
        sa.Column("try_number", sa.Integer(), nullable=True),
        sa.Column("attempt_epoch", sa.Integer(), nullable=True),
        sa.Column("assigned_at", kind, nullable=True),
        sa.Column("taken_at", kind, nullable=True),
        sa.Column("registered_at", kind, nullable=False),
        sa.Column("last_seen_at", kind, nullable=True),
        sa.Column("updated_at", kind, nullable=True),
        sa.Column("attempts_taken", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("row_version", sa.Integer(), nullable=False, server_default="0"),
        sa.PrimaryKeyConstraint("pod_uid", name="pk_leoflow_warm_worker"),
    )
    op.create_index("ix_leoflow_warm_worker_credential_sha256", "leoflow_warm_worker", ["credential_sha256"],
                    unique=True)
    op.create_index("ix_leoflow_warm_worker_dag_version_id_state", "leoflow_warm_worker",
                    ["dag_version_id", "state"])
    with op.batch_alter_table("leoflow_attempt") as batch:
        batch.add_column(sa.Column("outcome_json", sa.Text(), nullable=True))


def downgrade() -> None:
    """Drop ``leoflow_attempt.outcome_json`` and the worker table (its indexes go with it)."""
    with op.batch_alter_table("leoflow_attempt") as batch:
        batch.drop_column("outcome_json")
    op.drop_index("ix_leoflow_warm_worker_dag_version_id_state", table_name="leoflow_warm_worker")
    op.drop_index("ix_leoflow_warm_worker_credential_sha256", table_name="leoflow_warm_worker")
    op.drop_table("leoflow_warm_worker")
