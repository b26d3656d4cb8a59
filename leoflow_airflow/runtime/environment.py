"""The allow-listed environment of the Lite zygote and its agents (DESIGN §3: no JWT secret, no DB URL).

Pure: :func:`agent_environment` maps the scheduler's environment to the one handed down.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

PLAIN_ALLOWED = frozenset({
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TERM",
    "PYTHONPATH", "PYTHONUNBUFFERED", "VIRTUAL_ENV", "AIRFLOW_HOME", "AIRFLOW_CONFIG",
})
"""Non-Airflow variables a task may need to behave as under LocalExecutor."""

AIRFLOW_SECTIONS_ALLOWED = frozenset({
    "CORE", "LOGGING", "DAG_PROCESSOR", "WORKERS", "SDK", "METRICS", "TRACES", "SECRETS",
    "EXECUTION_API", "OPERATORS", "SCHEDULER", "API", "EMAIL", "SMTP", "LINEAGE", "LEOFLOW",
})
"""``AIRFLOW__<SECTION>__*`` sections that reach agents; database, api_auth, webserver, celery ... never do."""

_SECRET_NAME = re.compile(
    r"(SQL_ALCHEMY_CONN|FERNET_KEY|SECRET|PASSWORD|PASSWD|TOKEN|PRIVATE_KEY|JWT|_CMD$|BACKEND_KWARGS|CONN$)",
    re.IGNORECASE,
)


TASK_SECRET_PREFIXES = ("AIRFLOW_CONN_", "AIRFLOW_VAR_")
"""Connections and Variables defined as environment variables: task-level configuration the DAG's own tasks
read through Airflow's ``EnvironmentVariablesBackend`` exactly as under LocalExecutor, so they pass."""


def _allowed(name: str, passthrough: frozenset[str]) -> bool:
    if name in passthrough or name.startswith(TASK_SECRET_PREFIXES):
        return True
    if name in PLAIN_ALLOWED or name.startswith("LC_"):
        return True
    if name.startswith("AIRFLOW__"):
        parts = name.split("__")
        if len(parts) < 3 or parts[1].upper() not in AIRFLOW_SECTIONS_ALLOWED:
            return False
        return not _SECRET_NAME.search("__".join(parts[2:]))
    return False


def agent_environment(environ: Mapping[str, str], passthrough: Iterable[str] = ()) -> dict[str, str]:
    """Return the subset of ``environ`` the zygote (and so every agent and task) may see.

    Allowed: :data:`PLAIN_ALLOWED`, ``LC_*``, ``AIRFLOW_CONN_*`` / ``AIRFLOW_VAR_*`` (the tasks' own
    connections and variables, :data:`TASK_SECRET_PREFIXES`), ``AIRFLOW__<section>__<key>`` for the sections in
    :data:`AIRFLOW_SECTIONS_ALLOWED` unless the key looks secret (connection strings, keys, secrets,
    passwords, tokens, ``*_CMD``), and the names in ``passthrough`` (``[leoflow] agent_env_passthrough``,
    the operator's explicit choice). ``AIRFLOW__API_AUTH__JWT_SECRET`` and
    ``AIRFLOW__DATABASE__SQL_ALCHEMY_CONN`` are never in the result unless passed through by name.
    """
    allowed = frozenset(passthrough)
    return {k: v for k, v in environ.items() if _allowed(k, allowed)}
