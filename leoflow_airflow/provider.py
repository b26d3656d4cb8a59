"""Airflow provider info for leoflow (entry point ``apache_airflow_provider``, DESIGN §5).

Minimal for now: it registers the ledger's DB manager so ``airflow db migrate`` creates leoflow's tables.
The config defaults, CLI group and plugin are added as they land.
"""

from __future__ import annotations

from typing import Any


def get_provider_info() -> dict[str, Any]:
    """Return the provider-info mapping Airflow's ProvidersManager reads (keys as Airflow's schema names them)."""
    return {
        "package-name": "leoflow",
        "name": "leoflow",
        "description": "Airflow executor with attempt epochs, durable outcome records and task-scoped tokens.",
        "db-managers": ["leoflow_airflow.ledger.db_manager.LeoflowDBManager"],
    }
