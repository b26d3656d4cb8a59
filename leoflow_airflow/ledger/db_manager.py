"""``LeoflowDBManager``: lets a plain ``airflow db migrate`` create and upgrade leoflow's ledger tables.

Airflow 3.3's ``RunDBManager`` runs every DB manager a provider lists under ``db-managers`` in its
``get_provider_info()`` (Airflow 3.3.2's ``airflow/utils/db_manager.py``). This manager
points Airflow's ``BaseDBManager`` at leoflow's own MetaData, alembic environment (``migrations/``) and
version table, so leoflow never shares Airflow's ``alembic_version``.
"""

from __future__ import annotations

from pathlib import Path

from airflow.utils.db_manager import BaseDBManager

from leoflow_airflow.ledger.models import metadata as ledger_metadata

__all__ = ["LeoflowDBManager"]

_MIGRATIONS = Path(__file__).resolve().parent / "migrations"


class LeoflowDBManager(BaseDBManager):
    """Creates, upgrades, downgrades and drops the ``leoflow_*`` tables in Airflow's metadata DB.

    A fresh database gets the tables from the models and is stamped at head (``BaseDBManager``); an
    existing one is upgraded through ``migrations/versions``. ``airflow db reset`` drops them too
    (``supports_table_dropping``). Constructed by Airflow with its ORM session.
    """

    metadata = ledger_metadata
    migration_dir = str(_MIGRATIONS)
    alembic_file = str(_MIGRATIONS / "alembic.ini")
    version_table_name = "leoflow_alembic_version"
    supports_table_dropping = True
    revision_heads_map = {"0.1.0": "5e0f1a7c2b10", "0.2.0": "6d1f0a8e2c93", "0.3.0": "9a4c7e2b5d18",
                         "0.4.0": "4f2b8d6e1a37", "0.5.0": "7c1e5a9d3b42"}

    def downgrade(self, to_revision: str, from_revision: str | None = None, show_sql_only: bool = False) -> None:
        """Downgrade leoflow's tables to ``to_revision`` ("base" drops them).

        ``from_revision`` is only meaningful with ``show_sql_only`` (offline SQL, printed instead of run),
        as in Airflow's own downgrade. Raises alembic's ``CommandError`` for an unknown revision.
        """
        from alembic import command

        self._release_metadata_locks_if_needed()
        config = self.get_alembic_config()
        if show_sql_only:
            start = from_revision or self.get_current_revision()
            command.downgrade(config, revision=f"{start}:{to_revision}", sql=True)
        else:
            command.downgrade(config, revision=to_revision)
        self.log.info("Downgraded the %s database to %s", type(self).__name__, to_revision)
