"""An ended attempt's log kept where Airflow's log view reads it (issue 33 item 11; apache/airflow#50007, #29963).

Airflow 3.3 asks the executor for a task's log only while the task instance is RUNNING
(``FileTaskHandler._read``); once an attempt ended, the log view and the REST API read the remote store
(``[logging] remote_logging``) or the api-server's own ``base_log_folder``. Inside a pod, the Task SDK's
supervisor uploads the log when the task ends: a pod whose supervisor never got there (an OOM kill of the
container, a delete past its grace, a lost node) leaves its log in the pod, and the page shows nothing once the
pod is gone, though leoflow kept the pod for ``[leoflow] pod_retention_failure``.

leoflow holds every task pod with its finalizer until the attempt's ledger row is closed. Just before it takes the
finalizer off, the runtime reads the pod's agent-container log (``pods/log``: the last
:data:`.tasklog.TAIL_LINES` lines, at most :data:`.tasklog.LIMIT_BYTES` bytes) and keeps it where the task's own
log would be (the workload's ``log_path``), unless that place holds a log already (:func:`salvage_place`):

* ``remote_logging`` on: uploaded through Airflow's ``REMOTE_TASK_LOG`` (``RemoteLogIO.upload``), from a file
  written under the scheduler's ``base_log_folder`` and removed after the upload (a file there already, on a folder
  the pods share, is uploaded as it is and kept); a remote copy that exists (``RemoteLogIO.read`` answers lines) is
  left alone: it is the task's own;
* off: nothing is kept. The api-server reads its own ``base_log_folder``: where it shares that folder with the pods
  (the official chart's logs volume) the task's file is there already, and where it does not, a copy on the
  scheduler's disk would be read by nobody and only fill that disk.

The kept text starts with one line saying where it came from (:func:`salvaged_text`), so the page says which: the
source line Airflow prints names the store, leoflow's line names the pod. A salvage that fails (no ``get
pods/log``, the pod's log is gone, the store refuses) is logged and never holds the pod: the finalizer is released
all the same. Warm pods outlive their attempts and upload their own logs: not salvaged.
"""

from __future__ import annotations

import enum
import json
import logging
import os
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from leoflow_airflow.runtime.kubernetes.podlog import read_pod_log
from leoflow_airflow.runtime.kubernetes.pod import AGENT_CONTAINER
from leoflow_airflow.runtime.kubernetes.tasklog import LIMIT_BYTES, TAIL_LINES, Seen

if TYPE_CHECKING:
    from leoflow_airflow.ledger.states import AttemptRef

__all__ = ["Place", "SalvageTarget", "Salvaged", "salvage_place", "salvaged_text", "salvage_pod_log",
           "salvage_target"]

log = logging.getLogger(__name__)

HEADER_PREFIX = "leoflow: this log was kept from pod "
"""How the first line of a kept log starts (tests and operators grep for it)."""


class Place(enum.Enum):
    """Where one salvaged log goes (:func:`salvage_place`)."""

    REMOTE = "remote"
    """Uploaded through Airflow's ``REMOTE_TASK_LOG``."""


def salvage_place(*, remote_logging: bool, remote_has_log: bool | None) -> Place | None:
    """Where an ended attempt's pod log goes, or None to leave it (module docstring): the remote store, when remote
    logging is on and the store answered that it holds no log at that path.

    :param remote_logging: ``[logging] remote_logging`` is on and Airflow has a ``REMOTE_TASK_LOG``.
    :param remote_has_log: the remote store answered lines for the log path (True), none (False), or could not be
        read (None: never overwritten blind).
    """
    return Place.REMOTE if remote_logging and remote_has_log is False else None


def salvaged_text(*, namespace: str, pod: str, container: str, ref: AttemptRef, text: str, now: datetime) -> str:
    """The kept log: one line naming the pod, the container, the attempt and when, then the pod's log ``text``
    as read (ends with a newline)."""
    head = (f"{HEADER_PREFIX}{namespace}/{pod} (container {container}) at {now.isoformat(timespec='seconds')}, "
            f"when attempt try {ref.try_number} epoch {ref.attempt_epoch} ended without its own log upload: the "
            f"last {TAIL_LINES} lines and at most {LIMIT_BYTES} bytes of its container log")
    body = text if text.endswith("\n") or not text else text + "\n"
    return f"{head}\n{body}"


@dataclass(frozen=True)
class SalvageTarget:
    """What one salvage needs of the attempt's workload (its ledger row's ``workload_json``).

    :param log_path: the workload's ``log_path``, relative to ``[logging] base_log_folder``.
    :param ti: the workload's ``ti`` mapping (``id``, ``dag_id``, ``task_id``, ``run_id``, ``try_number``,
        ``map_index``, …), handed to ``RemoteLogIO.read``/``upload`` as an object with those attributes.
    """

    log_path: str
    ti: dict[str, Any]


def salvage_target(workload_json: str | None) -> SalvageTarget | None:
    """The :class:`SalvageTarget` of a ledger row's ``workload_json``, None when it has no usable ``log_path``
    (a callback workload, a malformed row: nothing to keep, never an error)."""
    try:
        workload = json.loads(workload_json or "")
    except ValueError:
        return None
    if not isinstance(workload, dict):
        return None
    log_path, ti = workload.get("log_path"), workload.get("ti")
    if not isinstance(log_path, str) or not log_path or not isinstance(ti, dict):
        return None
    if Path(log_path).is_absolute() or ".." in Path(log_path).parts:  # stays under base_log_folder
        return None
    return SalvageTarget(log_path=log_path, ti=ti)


@dataclass(frozen=True)
class Salvaged:
    """The result of one :func:`salvage_pod_log`: ``place`` where the log went (None: left), ``why`` in one line."""

    place: Place | None
    why: str


class _TI:
    """The workload's ``ti`` mapping as attributes (``RemoteLogIO`` implementations read ``ti.dag_id`` …)."""

    def __init__(self, fields: dict[str, Any]) -> None:
        self.__dict__.update(fields)


def salvage_pod_log(core: Any, namespace: str, name: str, uid: str, ref: AttemptRef, target: SalvageTarget, *,
                    base_log_folder: str, remote: Any | None, now: datetime, timeout: float) -> Salvaged:
    """Keep pod ``namespace/name`` (UID ``uid``)'s agent-container log for ``ref`` at ``target`` (module
    docstring).

    :param core: a ``kubernetes.client.CoreV1Api``.
    :param remote: Airflow's ``RemoteLogIO`` (``read(path, ti)``, ``upload(path, ti)``) when ``[logging]
        remote_logging`` is on, else None (then nothing is kept).
    :param timeout: seconds each Kubernetes call may take in all.
    :returns: where the log went, or why it was left; never raises (every failure is a :class:`Salvaged` with
        ``place`` None).
    """
    if remote is None:
        return Salvaged(None, "remote logging is off")
    ti = _TI(target.ti)
    local = Path(base_log_folder) / target.log_path
    try:
        _, lines = remote.read(target.log_path, ti)
    except Exception as exc:  # noqa: BLE001 - an unreadable store is never overwritten blind
        return Salvaged(None, f"the remote log store could not be read: {type(exc).__name__}: {str(exc)[:200]}")
    place = salvage_place(remote_logging=True, remote_has_log=bool(lines))
    if place is None:
        return Salvaged(None, "the task's own log is there already")
    try:
        local_has = local.is_file() and local.stat().st_size > 0
    except OSError:
        local_has = False
    read = read_pod_log(core, namespace, name, uid=uid, ref=ref, container=AGENT_CONTAINER, timeout=timeout)
    if read.seen is not Seen.LOG:
        return Salvaged(None, read.error or "the pod is gone")
    text = salvaged_text(namespace=namespace, pod=name, container=AGENT_CONTAINER, ref=ref, text=read.text, now=now)
    written = False
    try:
        if not local_has:  # a file there is the task's own, on a folder the pods share: uploaded as it is
            local.parent.mkdir(parents=True, exist_ok=True)
            part = local.with_name(local.name + ".leoflow-part")
            part.write_text(text, encoding="utf-8")
            os.replace(part, local)
            written = True
        remote.upload(target.log_path, ti)
    except Exception as exc:  # noqa: BLE001 - a full disk, a refused upload: said, never raised
        return Salvaged(None, f"the log could not be kept ({place.value}): {type(exc).__name__}: {str(exc)[:200]}")
    finally:
        if written:
            local.unlink(missing_ok=True)  # only the file leoflow wrote for the upload
    return Salvaged(place, f"kept {len(text)} characters ({place.value})" if written else
                    f"uploaded the task's own file ({place.value})")
