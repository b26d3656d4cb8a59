"""Alembic environment for leoflow's ledger tables (run by ``LeoflowDBManager`` under ``airflow db migrate``).

Only leoflow's own tables are in scope (``include_object``), versioned in ``leoflow_alembic_version`` so
Airflow's ``alembic_version`` is never touched. Online mode reuses a connection handed in through
``config.attributes["connection"]`` or else opens one on Airflow's engine.
"""

from __future__ import annotations

import contextlib

from alembic import context

from airflow import settings
from leoflow_airflow.ledger.db_manager import LeoflowDBManager

config = context.config
target_metadata = LeoflowDBManager.metadata
VERSION_TABLE = LeoflowDBManager.version_table_name


def include_object(obj, name, type_, reflected, compare_to) -> bool:
    """Keep autogenerate and comparisons to leoflow's own tables (Airflow's share the database)."""
    if type_ == "table":
        return name in target_metadata.tables
    return True


def run_migrations_offline() -> None:
    """Emit the migration SQL for Airflow's configured URL without connecting."""
    context.configure(
        url=settings.SQL_ALCHEMY_CONN,
        target_metadata=target_metadata,
        literal_binds=True,
        render_as_batch=True,
        include_object=include_object,
        version_table=VERSION_TABLE,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    """Run the migrations on a live connection, one transaction per revision."""
    with contextlib.ExitStack() as stack:
        connection = config.attributes.get("connection")
        if connection is None:
            connection = stack.enter_context(settings.get_engine().connect())
        context.configure(
            connection=connection,
            target_metadata=target_metadata,
            transaction_per_migration=True,
            render_as_batch=True,
            compare_type=True,
            include_object=include_object,
            version_table=VERSION_TABLE,
        )
        with context.begin_transaction():
            context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
