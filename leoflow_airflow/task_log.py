"""leoflow's own line in a task instance's log, for an attempt that never started.

When the runtime refuses a launch (a ``pod_override`` field outside ``[leoflow] pod_override_allow``, a pod the
API server's Pod Security admission or RBAC refuses, an environment naming one of Airflow's secrets), no agent
ever runs, so the task log Airflow shows in the UI's Logs tab does not exist: the reader answers "Could not read
served logs". Airflow itself puts the executor's reason only in the audit log (its ``state mismatch`` Log row).
leoflow also writes that reason where the Logs tab looks (issue 9: "the TI fails at once and its log names the
field"): one JSON line in the Task SDK's own shape (``timestamp``, ``level``, ``event``, ``logger``: what
``FileTaskHandler`` parses into a ``StructuredLogMessage``) appended to ``[logging] base_log_folder`` /
``<the workload's log_path>``, then, when ``[logging] remote_logging`` is on, handed to Airflow's remote log
handler (``airflow.logging_config.get_remote_task_log().upload``, as the Task SDK does at a task's end).

The local file is read by an api-server that shares the scheduler's log folder (one machine, a shared volume);
with remote logging the upload is what reaches the UI.
"""

from __future__ import annotations

import json
import logging
import os
from datetime import datetime, timezone
from pathlib import Path

__all__ = ["note_line", "write_note"]

log = logging.getLogger(__name__)

LOGGER_NAME = "leoflow.executor"
"""The ``logger`` field of leoflow's lines in a task log."""


def note_line(message: str, *, now: datetime, level: str = "error") -> str:
    """One task-log line (JSON, no newline) in the Task SDK's shape: ``{"timestamp": ISO-8601 UTC,
    "level": level, "event": message, "logger": "leoflow.executor"}``. ``now`` must be timezone-aware.

    Raises ValueError for a naive ``now``.
    """
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware")
    stamp = now.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")
    return json.dumps({"timestamp": stamp, "level": level, "event": message, "logger": LOGGER_NAME})


def write_note(log_path: str | None, message: str, *, base_log_folder: str, remote_logging: bool,
               now: datetime | None = None) -> bool:
    """Append :func:`note_line` of ``message`` to ``base_log_folder/log_path`` (parent folders created, mode as
    Airflow's file handler leaves them) and, when ``remote_logging``, upload that file with Airflow's remote log
    handler. Returns True when the local line was written.

    ``log_path`` is the workload's relative ``log_path`` (``ExecuteTask.log_path``); None, empty, absolute or
    escaping the folder (``..``) writes nothing. Never raises: a failure is logged (the note helps the operator;
    the task's failure it explains is reported to Airflow either way).
    """
    if not log_path or os.path.isabs(log_path):
        return False
    base = Path(base_log_folder).resolve()
    path = (base / log_path).resolve()
    if base not in path.parents:
        log.warning("not writing leoflow's note to task log %r: it is outside %s", log_path, base)
        return False
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(note_line(message, now=now or datetime.now(timezone.utc)) + "\n")
    except OSError as exc:
        log.warning("could not write leoflow's note to task log %s: %s", path, exc)
        return False
    if remote_logging:
        _upload(log_path)
    return True


def _upload(log_path: str) -> None:
    """Hand the file to Airflow's remote log handler (``upload(relative_path, ti=None)``); never raises."""
    try:
        from airflow.logging_config import get_remote_task_log

        handler = get_remote_task_log()
        if handler is not None:
            handler.upload(log_path, None)
    except Exception:  # noqa: BLE001 - a remote store that fails must never break the scheduler loop
        log.warning("could not upload leoflow's note in task log %s to the remote log store", log_path,
                    exc_info=True)
