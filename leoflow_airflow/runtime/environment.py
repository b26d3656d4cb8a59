"""The environment of the Lite zygote and its agents (DESIGN §3; issue 8 hole 15): the scheduler's environment
minus Airflow's own secrets.

A DAG must see what it sees under LocalExecutor (whose workers inherit the scheduler's environment whole):
proxies, cloud-SDK credentials, ``JAVA_HOME``, ``[secrets] backend_kwargs``, its own variables. What no task
ever needs is the key material of Airflow itself: the metadata DB URL, the JWT signing secret or key, the
fernet key and the api-server's session secret. Those are dropped, in every form Airflow reads them.

Pure: :func:`agent_environment` maps the scheduler's environment to the one handed down.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from leoflow_agent.proc import ATTEMPT_ENV

AIRFLOW_OWN_SECRETS: tuple[tuple[str, str], ...] = (
    ("database", "sql_alchemy_conn"),
    ("database", "sql_alchemy_conn_async"),
    ("database", "sql_alchemy_engine_args"),
    ("core", "sql_alchemy_conn"),
    ("core", "fernet_key"),
    ("api", "secret_key"),
    ("webserver", "secret_key"),
    ("api_auth", "jwt_secret"),
    ("api_auth", "jwt_private_key_path"),
)
"""``(section, key)`` of Airflow's own secrets, never handed to a task.

Source: Airflow 3.3.2 ``airflow/config_templates/config.yml``. Marked ``sensitive: true`` there:
``[database] sql_alchemy_conn``, ``sql_alchemy_conn_async``, ``sql_alchemy_engine_args`` (may carry connect
arguments with a password), ``[core] fernet_key``, ``[api] secret_key``, ``[api_auth] jwt_secret``. Their
deprecated locations, still read (``_shared/configuration/parser.py`` ``deprecated_options``): ``[core]
sql_alchemy_conn`` and ``[webserver] secret_key``. Not marked sensitive but the path of the key that signs
every execution token: ``[api_auth] jwt_private_key_path``.

Deliberately *not* listed, although ``sensitive: true``, because tasks read them under LocalExecutor:
``[secrets] backend_kwargs`` and ``[workers] secrets_backend_kwargs`` (the Task SDK builds the secrets backend
from them on workers, ``sdk/_shared/configuration/parser.py``), ``[logging] remote_task_handler_kwargs``
(remote task logs), ``[sentry] sentry_dsn`` (the task's Sentry integration) and ``[core]
asset_manager_kwargs``. ``[celery] broker_url`` / ``result_backend`` belong to the Celery provider's config,
not Airflow 3.3.2's; add them with ``[leoflow] agent_env_deny`` where CeleryExecutor shares the machine.
"""

PROCESS_MARKERS: frozenset[str] = frozenset({"_AIRFLOW_PROCESS_CONTEXT", ATTEMPT_ENV})
"""Variables that describe the scheduler process, not the task's world. ``_AIRFLOW_PROCESS_CONTEXT=server`` is
set by ``SchedulerJobRunner._execute``; inherited, it makes the agent's supervisor pick the server secrets
chain with the metastore (``sdk/execution_time/supervisor.py`` ``ensure_secrets_backend_loaded``), which it
cannot reach. ``LEOFLOW_ATTEMPT`` is leoflow's per-agent marker (:data:`leoflow_agent.proc.ATTEMPT_ENV`); a
zygote inheriting one would be taken for a leftover of that attempt."""

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_FALLBACK_SUFFIXES = ("", "_CMD", "_SECRET")  # Airflow reads a sensitive option from all three forms
_AIRFLOW_PREFIX = "AIRFLOW__"


def deny_entry_problem(entry: str) -> str | None:
    """Return what is wrong with one ``[leoflow] agent_env_deny`` entry, or ``None`` when it is usable.

    An entry is an environment variable name (``[A-Za-z_][A-Za-z0-9_]*``), optionally ending in ``*`` to deny
    every name with that prefix. ``*`` alone is refused: a task with no environment cannot even find Python.
    """
    if not entry:
        return "empty entry"
    if entry == "*":
        return "'*' would deny every variable, PATH and AIRFLOW_HOME included"
    if not _ENV_NAME.fullmatch(entry.removesuffix("*")):
        return f"{entry!r} is not an environment variable name (letters, digits, '_', optional trailing '*')"
    return None


def _option_tail(name: str) -> str | None:
    """``SECTION__KEY`` for ``AIRFLOW__SECTION__KEY``, else ``None``."""
    if not name.startswith(_AIRFLOW_PREFIX):
        return None
    tail = name[len(_AIRFLOW_PREFIX):]
    return tail if "__" in tail.strip("_") else None


class _Deny:
    """The compiled deny-list: option tails (with their _CMD/_SECRET and team-scoped forms), exact names and
    prefixes, all compared in upper case (Airflow upper-cases section and key to build a variable's name)."""

    def __init__(self, extra: Iterable[str]) -> None:
        self.tails = {f"{s}__{k}".upper() for s, k in AIRFLOW_OWN_SECRETS}
        self.names = {m.upper() for m in PROCESS_MARKERS}
        self.prefixes: list[str] = []
        for entry in extra:
            upper = entry.upper()
            if upper.endswith("*"):
                self.prefixes.append(upper[:-1])
            elif (tail := _option_tail(upper)) is not None:
                self.tails.add(tail)
            else:
                self.names.add(upper)

    def __call__(self, name: str) -> bool:
        upper = name.upper()
        if upper in self.names or upper.startswith(tuple(self.prefixes)):
            return True
        if not upper.startswith(_AIRFLOW_PREFIX):
            return False
        for tail in self.tails:
            for suffix in _FALLBACK_SUFFIXES:
                form = tail + suffix
                if upper == _AIRFLOW_PREFIX + form:
                    return True
                # a team-scoped override: AIRFLOW__<TEAM>___<SECTION>__<KEY>, with a non-empty team name
                # (parser.py ``_env_var_name``, ``_names_sensitive_team_env_var``)
                if upper.endswith("___" + form) and len(upper) > len(_AIRFLOW_PREFIX) + 3 + len(form):
                    return True
        return False


def withheld(name: str, deny: Iterable[str] = ()) -> bool:
    """Whether environment variable ``name`` is one a task never gets: a form of :data:`AIRFLOW_OWN_SECRETS`
    (any letter case, ``_CMD``/``_SECRET``, team-scoped), a :data:`PROCESS_MARKERS` name, or matched by ``deny``
    (entries as in :func:`agent_environment`). The Kubernetes pod builder refuses a pod that sets one.

    :raises ValueError: for a malformed ``deny`` entry.
    """
    deny = tuple(deny)
    for entry in deny:
        if (problem := deny_entry_problem(entry)) is not None:
            raise ValueError(f"agent_env_deny entry {entry!r}: {problem}")
    return _Deny(deny)(name)


def agent_environment(
    environ: Mapping[str, str], passthrough: Iterable[str] = (), deny: Iterable[str] = (),
) -> dict[str, str]:
    """Return the environment the zygote (and so every agent and task) gets: ``environ`` minus denied names.

    Denied: every form of :data:`AIRFLOW_OWN_SECRETS` (``AIRFLOW__<SECTION>__<KEY>``, its ``_CMD`` and
    ``_SECRET`` forms, and team-scoped ``AIRFLOW__<TEAM>___<SECTION>__<KEY>`` ones, in any letter case), the
    :data:`PROCESS_MARKERS`, and ``deny`` (``[leoflow] agent_env_deny``: exact names, ``PREFIX*``; an
    ``AIRFLOW__S__K`` entry denies its other forms too). Names in ``passthrough`` (``[leoflow]
    agent_env_passthrough``, the operator's explicit choice) pass even when denied. Everything else passes,
    as it does to LocalExecutor's workers. ``environ`` is not modified.

    :raises ValueError: for a malformed ``deny`` entry (see :func:`deny_entry_problem`); ``[leoflow]
        agent_env_deny`` is validated at settings load, so this only guards direct callers.
    """
    deny = tuple(deny)
    for entry in deny:
        if (problem := deny_entry_problem(entry)) is not None:
            raise ValueError(f"agent_env_deny entry {entry!r}: {problem}")
    denied = _Deny(deny)
    allowed = frozenset(passthrough)
    return {k: v for k, v in environ.items() if k in allowed or not denied(k)}
