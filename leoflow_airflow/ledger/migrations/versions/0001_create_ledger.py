"""Create the attempt ledger (leoflow_attempt) and the infra re-drive budget (leoflow_infra_budget).

Revision ID: 5e0f1a7c2b10
Revises:
Create Date: 2025-11-29

A frozen copy of the schema in ``leoflow_airflow/ledger/models.py`` at leoflow 0.1.0: later revisions
alter it; this file never changes.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "5e0f1a7c2b10"
down_revision = None
branch_labels = None
depends_on = None

_ID_LEN = 250


def _ts(name: str, nullable: bool = True) -> sa.Column:
    kind = sa.DateTime(timezone=True).with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
    return sa.Column(name, kind, nullable=nullable)


def upgrade() -> None:
    """Create both tables with their unique key and indexes."""
    op.create_table(
        "leoflow_attempt",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False),
        sa.Column("ti_id", sa.String(36), nullable=False),
        sa.Column("try_number", sa.Integer(), nullable=False),
        sa.Column("attempt_epoch", sa.Integer(), nullable=False),
        sa.Column("dag_id", sa.String(_ID_LEN), nullable=False),
        sa.Column("task_id", sa.String(_ID_LEN), nullable=False),
        sa.Column("run_id", sa.String(_ID_LEN), nullable=False),
        sa.Column("map_index", sa.Integer(), server_default="-1", nullable=False),
        sa.Column("state", sa.String(20), nullable=False),
        sa.Column("runtime", sa.String(20), nullable=False),
        sa.Column("workload_json", sa.Text(), nullable=False),
        sa.Column("scheduler_job_id", sa.Integer(), nullable=True),
        sa.Column("pid", sa.Integer(), nullable=True),
        sa.Column("proc_start_time", sa.BigInteger(), nullable=True),
        sa.Column("record_path", sa.Text(), nullable=True),
        sa.Column("pod_name", sa.String(253), nullable=True),
        sa.Column("pod_uid", sa.String(64), nullable=True),
        sa.Column("reported_state", sa.String(32), nullable=True),
        sa.Column("exit_status", sa.Integer(), nullable=True),
        sa.Column("resolution", sa.String(32), nullable=True),
        sa.Column("detail", sa.Text(), nullable=True),
        _ts("created_at", nullable=False),
        _ts("dispatched_at"),
        _ts("reported_at"),
        _ts("exited_at"),
        _ts("closed_at"),
        _ts("updated_at", nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_leoflow_attempt"),
        sa.UniqueConstraint("ti_id", "attempt_epoch", name="uq_leoflow_attempt_ti_id_attempt_epoch"),
    )
    op.create_index("ix_leoflow_attempt_state", "leoflow_attempt", ["state"])
    op.create_index(
        "ix_leoflow_attempt_dag_id_run_id_task_id_map_index",
        "leoflow_attempt",
        ["dag_id", "run_id", "task_id", "map_index"],
    )
    op.create_index("ix_leoflow_attempt_closed_at", "leoflow_attempt", ["closed_at"])
    op.create_table(
        "leoflow_infra_budget",
        sa.Column("dag_id", sa.String(_ID_LEN), nullable=False),
        sa.Column("run_id", sa.String(_ID_LEN), nullable=False),
        sa.Column("task_id", sa.String(_ID_LEN), nullable=False),
        sa.Column("map_index", sa.Integer(), nullable=False),
        sa.Column("spent", sa.Integer(), server_default="0", nullable=False),
        sa.Column("seen_max_tries", sa.Integer(), nullable=False),
        _ts("updated_at", nullable=False),
        sa.PrimaryKeyConstraint("dag_id", "run_id", "task_id", "map_index", name="pk_leoflow_infra_budget"),
    )


def downgrade() -> None:
    """Drop both tables (and so every attempt recorded in them)."""
    op.drop_table("leoflow_infra_budget")
    op.drop_index("ix_leoflow_attempt_closed_at", table_name="leoflow_attempt")
    op.drop_index("ix_leoflow_attempt_dag_id_run_id_task_id_map_index", table_name="leoflow_attempt")
    op.drop_index("ix_leoflow_attempt_state", table_name="leoflow_attempt")
    op.drop_table("leoflow_attempt")
