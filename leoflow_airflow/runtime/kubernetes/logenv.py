"""The remote-logging settings a task pod gets from the scheduler (issue 12 item 7): the pure decision from the
scheduler's ``[logging]`` options to the ``AIRFLOW__LOGGING__*`` environment of the agent container.

A task's log file lives in its pod and goes with it; Airflow keeps it through remote logging: the Task SDK's
supervisor, at the task's end, hands the file to the remote log handler (``upload``), and the api-server reads it
back from the same handler (``read``/``stream``) once the task is no longer running. Both sides build the handler
from the same ``[logging]`` options (Airflow 3.3.2, ``_shared/logging/factory.py`` ``resolve_remote_task_log``;
DESIGN "Task logs" has the file:line chain). A leoflow pod's Airflow is configured by its image, its pod
template and the environment leoflow gives it, not by the scheduler's ``airflow.cfg``; so when the scheduler's
``[logging] remote_logging`` is on, leoflow forwards the options of :data:`FORWARDED_OPTIONS` that are set, as
``AIRFLOW__LOGGING__<OPTION>`` variables, and the pod uploads where the api-server reads.

What is forwarded is names and places, never a secret: ``remote_log_conn_id`` is a connection *id* (the pod's
supervisor fetches the connection through the Execution API with the task's own token,
``sdk/execution_time/supervisor.py`` ``_fetch_remote_logging_conn``). A value that carries a credential (a URL
with a password, a JSON object with a key such as ``password`` or ``secret_access_key`` holding a value, a PEM
private key, a JWT) is refused (:func:`logging_env` raises :class:`~leoflow_airflow.errors.ConfigError`): put it
in a connection, or give it to the pod through the pod template (a ``secretKeyRef``), which wins.

Pure: no Airflow import; the caller reads the options (:func:`leoflow_airflow.runtime.kubernetes.runtime`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from urllib.parse import urlsplit

from leoflow_airflow.errors import ConfigError

__all__ = ["FORWARDED_OPTIONS", "credential_problem", "env_name", "logging_env"]

FORWARDED_OPTIONS: tuple[str, ...] = (
    "remote_logging",
    "remote_base_log_folder",
    "remote_log_conn_id",
    "remote_task_handler_kwargs",
    "delete_local_logs",
    "encrypt_s3_logs",
    "logging_config_class",
)
"""The ``[logging]`` options forwarded to a task pod (Airflow 3.3.2 ``config_templates/config.yml``), each only
when set (non-empty): what the Task SDK's remote log handler is built from on the worker
(``config_templates/airflow_local_settings.py``: ``remote_logging``, ``remote_base_log_folder``,
``remote_task_handler_kwargs``, ``delete_local_logs``; ``encrypt_s3_logs`` by the S3 handler; ``sdk/log.py``
``load_remote_conn_id``: ``remote_log_conn_id``; ``_shared/logging/factory.py``: ``logging_config_class``, whose
module must then be importable in the image). Not forwarded: ``base_log_folder`` (a path in the pod, the
image's own), ``google_key_path`` (a key file on the scheduler's machine: the pod needs its own, through its
template) and every provider section (``[aws]``, ``[elasticsearch]``...): set them in the pod template."""

_CREDENTIAL_KEY = re.compile(
    r"(password|passwd|secret|token|credential|private[_-]?key|api[_-]?key|access[_-]?key|sas[_-]?key|"
    r"connection[_-]?string|account[_-]?key|auth)", re.IGNORECASE)
"""A JSON key whose value is a credential (``password``, ``aws_secret_access_key``, ``sas_token``, ...)."""
_PEM_KEY = re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----")
_JWT = re.compile(r"eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]+")


def env_name(option: str) -> str:
    """``AIRFLOW__LOGGING__<OPTION>``, the variable Airflow reads ``[logging] <option>`` from."""
    return f"AIRFLOW__LOGGING__{option.upper()}"


def _json_credentials(value: object, where: str) -> str | None:
    """The first ``where.key`` of a JSON value whose key names a credential and whose value is set."""
    if isinstance(value, dict):
        for key, item in value.items():
            if _CREDENTIAL_KEY.search(str(key)) and item not in (None, "", False):
                return f"{where}{key}"
            if (found := _json_credentials(item, f"{where}{key}.")) is not None:
                return found
    elif isinstance(value, list):
        for index, item in enumerate(value):
            if (found := _json_credentials(item, f"{where}{index}.")) is not None:
                return found
    return None


def credential_problem(option: str, value: str) -> str | None:
    """What makes ``value`` of ``[logging] option`` a credential, or None when it carries none.

    A credential is: a URL (any word in it) with a password (``scheme://user:password@host``), a PEM private
    key, a JWT, or, for a value that is a JSON object or list (``remote_task_handler_kwargs``), a key naming a
    credential (:data:`_CREDENTIAL_KEY`: ``password``, ``secret``, ``token``, ``access_key``, ...) with a
    non-empty value. Never raises.
    """
    if _PEM_KEY.search(value):
        return "it holds a PEM private key"
    if _JWT.search(value):
        return "it holds a JWT"
    for word in re.split(r"[\s,;\"']+", value):
        if "://" in word:
            try:
                password = urlsplit(word).password
            except ValueError:
                continue
            if password:
                return "it holds a URL with a password"
    stripped = value.strip()
    if stripped[:1] in ("{", "["):
        try:
            parsed = json.loads(stripped)
        except ValueError:
            return None
        if (key := _json_credentials(parsed, "")) is not None:
            return f"its key {key!r} holds a credential"
    return None


def logging_env(options: Mapping[str, str]) -> dict[str, str]:
    """The agent container's environment for remote logging, from the scheduler's ``[logging]`` options.

    :param options: ``{option: value}`` as the scheduler's Airflow reads them (``conf.get("logging", option)``),
        for at least ``remote_logging``; a missing option counts as unset.
    :returns: ``{}`` when ``remote_logging`` is not on (Airflow's booleans: ``true``/``t``/``1``, any case);
        else ``{AIRFLOW__LOGGING__<OPTION>: value}`` for each of :data:`FORWARDED_OPTIONS` set (non-empty after
        stripping), ``remote_logging`` itself as ``True``. Ordered as :data:`FORWARDED_OPTIONS`.
    :raises ConfigError: naming the option, for a value that carries a credential (:func:`credential_problem`);
        the value in the message is withheld.
    """
    if str(options.get("remote_logging", "")).strip().lower() not in ("true", "t", "1"):
        return {}
    env: dict[str, str] = {}
    for option in FORWARDED_OPTIONS:
        value = str(options.get(option) or "").strip()
        if not value:
            continue
        if option == "remote_logging":
            value = "True"
        if (problem := credential_problem(option, value)) is not None:
            raise ConfigError(f"logging.{option}", "<withheld>", f"{problem}; leoflow forwards [logging] "
                              "remote-logging options to every task pod and never a secret: keep it in an Airflow "
                              "connection (remote_log_conn_id) or give it to the pod through [leoflow] "
                              "pod_template_file (a secretKeyRef)")
        env[env_name(option)] = value
    return env
