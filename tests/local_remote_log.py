"""A ``[logging] logging_config_class`` for tests (tests/integration/test_kube_task_logs.py): Airflow's default
logging config, and as ``REMOTE_TASK_LOG`` a :class:`LocalDirRemoteLogIO` whose "remote" store is a local
directory, ``[logging] remote_base_log_folder`` (a plain path). No cloud, and Airflow's own remote-logging
path end to end: the Task SDK's supervisor calls ``upload`` at the task's end (``sdk/execution_time/
supervisor.py`` ``_upload_logs``), the api-server's ``FileTaskHandler._read_remote_logs`` calls ``read``.

Airflow 3.3.2 finds ``REMOTE_TASK_LOG`` beside the dict a custom ``logging_config_class`` names
(``_shared/logging/remote.py`` ``discover_remote_log_handler``), in the worker (``sdk/log.py``) and in the
api-server (``logging_config.py``) alike. The module must be importable wherever Airflow runs: the stack's
``PYTHONPATH`` holds the repository root; a task pod gets it from its pod template, as an image would ship it.

Airflow's default module (``config_templates/airflow_local_settings.py``) raises at import for a
``remote_base_log_folder`` of no scheme it knows while ``[logging] remote_logging`` is on (its if/elif chain
ends in ``raise AirflowException("Incorrect remote log configuration...")``); so its dict is taken with
``remote_logging`` read as off for that one import, which is what a user's own copy of that dict amounts to.
"""

from __future__ import annotations

import copy
import os
import shutil
from pathlib import Path

from airflow.configuration import conf

__all__ = ["DEFAULT_REMOTE_CONN_ID", "DROP_UPLOADS_OF", "LOGGING_CONFIG", "REMOTE_TASK_LOG", "LocalDirRemoteLogIO"]

DROP_UPLOADS_OF = "LEOFLOW_TEST_DROP_UPLOADS_OF"
"""The environment variable naming a task id whose own uploads are lost (:meth:`LocalDirRemoteLogIO.upload`)."""

SOURCE_PREFIX = "leoflow test remote-log directory: "
"""How :meth:`LocalDirRemoteLogIO.read` names its source in the log view."""


def _default_config() -> dict:
    """A copy of Airflow's ``DEFAULT_LOGGING_CONFIG``, imported with ``[logging] remote_logging`` off."""
    name = "AIRFLOW__LOGGING__REMOTE_LOGGING"
    before = os.environ.get(name)
    os.environ[name] = "False"
    try:
        from airflow.config_templates.airflow_local_settings import DEFAULT_LOGGING_CONFIG
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before
    return copy.deepcopy(DEFAULT_LOGGING_CONFIG)


class LocalDirRemoteLogIO:
    """Airflow 3.3's ``RemoteLogIO`` protocol (``airflow.logging.remote``) over a local directory.

    :param base_log_folder: ``[logging] base_log_folder``: where the task's log file is, and what ``upload``'s
        relative paths are relative to.
    :param remote_base: the "remote" directory; a log ``<rel>`` is kept at ``remote_base/<rel>``.
    """

    processors: tuple = ()
    """No structlog processor in the task's write path (the protocol's ``processors``)."""

    def __init__(self, base_log_folder: str | os.PathLike, remote_base: str | os.PathLike) -> None:
        self.base_log_folder = Path(base_log_folder)
        self.remote_base = Path(remote_base)

    def upload(self, path: str | os.PathLike, ti: object = None) -> None:
        """Copy the log file ``path`` (relative to ``base_log_folder``, or absolute under it) to the remote
        directory, replacing an earlier copy whole (written aside, then renamed). A missing file is skipped.

        In a process whose environment names the task in :data:`DROP_UPLOADS_OF` (a task pod's template sets it),
        that task's upload is lost and its log file removed: the pod's supervisor never reached its upload and
        its disk went with the pod (an OOM kill of the container, a delete past its grace, a lost node)."""
        local = Path(path)
        if not local.is_absolute():
            local = self.base_log_folder / local
        dropped = os.environ.get(DROP_UPLOADS_OF)
        if dropped and getattr(ti, "task_id", None) == dropped:
            local.unlink(missing_ok=True)
            return
        if not local.is_file():
            return
        dest = self.remote_base / local.relative_to(self.base_log_folder)
        dest.parent.mkdir(parents=True, exist_ok=True)
        part = dest.with_name(dest.name + ".part")
        shutil.copyfile(local, part)
        os.replace(part, dest)

    def read(self, relative_path: str, ti: object) -> tuple[list[str], list[str] | None]:
        """``([source], [text])`` of the kept copy of ``relative_path``, ``([], None)`` when there is none."""
        dest = self.remote_base / relative_path
        if not dest.is_file():
            return [], None
        return [SOURCE_PREFIX + str(dest)], [dest.read_text(encoding="utf-8", errors="replace")]


LOGGING_CONFIG = _default_config()
REMOTE_TASK_LOG = LocalDirRemoteLogIO(conf.get("logging", "base_log_folder"),
                                      conf.get("logging", "remote_base_log_folder", fallback="") or "/nonexistent")
DEFAULT_REMOTE_CONN_ID = None
