"""What the task log view says about a running attempt's pod (issue 9 item 6, ``get_task_log`` on pods): the
pure decision from what one read of the pod found (:class:`PodLogRead`) to Airflow's ``([source], [text])``.

Airflow's ``FileTaskHandler._read`` asks the executor (in the api-server, un-started) for the log of a RUNNING
task instance; a non-empty source list makes it skip the served-logs fetch from the worker's hostname, as for a
KubernetesExecutor pod. So every answer here has exactly one source line, and only a pod that is there gives
text:

* the pod exists with the attempt's UID (or, before its UID is recorded, its identity annotation): its
  agent container's log, read through the Kubernetes API (``pods/log``), at most the last :data:`TAIL_LINES`
  lines and :data:`LIMIT_BYTES` bytes; the source line names ``namespace/pod`` and says so;
* the pod is gone (404, or the name holds another UID): no text; the source line says where the log went:
  the remote location when ``[logging] remote_logging`` is on (``remote_base_log_folder`` + the workload's
  ``log_path``), else that the log file lived in the pod at ``<base_log_folder>/<log_path>`` and left with the
  pod, and how to keep logs;
* the read failed (API server unreachable, a 403 for want of ``get pods/log``, a container still waiting to
  start): no text; the source line names the error. A log read never fails the page.

Pure: no I/O, no Kubernetes client (:mod:`.podlog` does the reads).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["LIMIT_BYTES", "TAIL_LINES", "LogPlace", "PodLogRead", "Seen", "task_log_answer"]

TAIL_LINES = 10_000
"""The pod log read returns at most the last this many lines (``pods/log`` ``tailLines``)."""
LIMIT_BYTES = 4 * 1024 * 1024
"""… and at most this many bytes of them, 4 MiB (``pods/log`` ``limitBytes``: the kubelet stops there)."""


class Seen(enum.Enum):
    """What one read of an attempt's pod found."""

    LOG = "log"
    """The attempt's pod is there; ``text`` is its agent container's log (bounded)."""
    GONE = "gone"
    """The pod is not there: 404, or the name now holds another pod (another UID, or not this attempt's)."""
    ERROR = "error"
    """No usable answer; ``error`` says why."""


@dataclass(frozen=True)
class PodLogRead:
    """The evidence of one read: ``seen``, the pod's ``namespace`` and ``name``, the log ``text`` (``LOG``),
    the ``error`` (``ERROR``: the call and the API server's status or the transport error, one line), and for
    ``GONE`` the ``other_uid`` the name holds now ("" when it is 404)."""

    seen: Seen
    namespace: str
    name: str
    text: str = ""
    error: str = ""
    other_uid: str = ""


@dataclass(frozen=True)
class LogPlace:
    """Where Airflow's logging puts a task's log file: ``[logging] base_log_folder`` (as the pod's Airflow reads
    it: the same configuration), ``remote_logging``, ``remote_base_log_folder``, and the workload's
    ``log_path`` (relative, rendered by the scheduler from ``log_filename_template``; "" when unknown)."""

    base_log_folder: str
    log_path: str
    remote_logging: bool = False
    remote_base_log_folder: str = ""


def _join(base: str, rel: str) -> str:
    """``base/rel`` with one slash between them (a URL such as ``s3://bucket/logs`` stays one)."""
    if not base:
        return rel
    if not rel:
        return base
    return base.rstrip("/") + "/" + rel.lstrip("/")


def task_log_answer(read: PodLogRead, place: LogPlace) -> tuple[list[str], list[str]]:
    """``([source], [text])`` for Airflow's log view from ``read`` (module docstring); ``[text]`` is empty
    unless the pod's log was read. Never raises."""
    pod = f"{read.namespace}/{read.name}"
    if read.seen is Seen.LOG:
        return ([f"pod {pod}: log of its agent container through the Kubernetes API (pods/log; the last "
                 f"{TAIL_LINES} lines, at most {LIMIT_BYTES // (1024 * 1024)} MiB)"], [read.text])
    if read.seen is Seen.ERROR:
        return [f"pod {pod}: its log could not be read through the Kubernetes API: {read.error}"], []
    gone = f"pod {pod} is gone" + (f" (the name now holds another pod, uid {read.other_uid})"
                                   if read.other_uid else "")
    if place.remote_logging and place.remote_base_log_folder and place.log_path:
        return [f"{gone}; its log was uploaded by [logging] remote_logging to "
                f"{_join(place.remote_base_log_folder, place.log_path)}"], []
    if place.remote_logging:
        return [f"{gone}; [logging] remote_logging is on, but [logging] remote_base_log_folder or the "
                "workload's log_path is empty, so where its log went cannot be said"], []
    where = _join(place.base_log_folder, place.log_path) if place.log_path else place.base_log_folder
    return [f"{gone}; its log file lived in the pod at {where} and left with the pod, as did its container's "
            "stdout. Set [logging] remote_logging (with remote_base_log_folder) to keep task logs after their "
            "pods"], []
