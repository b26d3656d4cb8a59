"""leoflow's Airflow provider info (entry point ``apache_airflow_provider``): the ``[leoflow]`` config
defaults, the ``airflow leoflow`` CLI group and the ledger's DB manager (Airflow's
``provider_info.schema.json``; DESIGN §5).

The plugin (``/leoflow`` on the api-server) is not listed here but under the ``airflow.plugins`` entry point:
Airflow loads providers' plugins only with ``[core] lazy_discover_providers = False`` (default True), and a
plugin listed in both places would be registered twice (the second reported as an import error)."""

from __future__ import annotations

from typing import Any

from leoflow_airflow import __version__


def get_provider_info() -> dict[str, Any]:
    """Return the provider-info dict Airflow's ``ProvidersManager`` reads."""
    from leoflow_airflow.settings import provider_config

    return {
        "package-name": "leoflow",
        "name": "leoflow",
        "description": "An Airflow executor that stops losing work: attempt epochs, durable outcome records, "
        "lost reports recovered, infra faults re-run without spending retries.",
        "versions": [__version__],
        "executors": ["leoflow_airflow.executor.LeoflowExecutor"],
        "cli": ["leoflow_airflow.cli.get_cli_commands"],
        "config": provider_config(),
        "db-managers": ["leoflow_airflow.ledger.db_manager.LeoflowDBManager"],
    }
