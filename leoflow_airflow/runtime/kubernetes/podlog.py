"""The I/O of ``get_task_log`` on pods (issue 9 item 6): find a running attempt's pod and read its agent
container's log through the Kubernetes API; what to say about it is :func:`.tasklog.task_log_answer` (pure).

Called in the api-server, by an executor that was never started: :class:`PodLogReader` builds its Kubernetes
client on first use from the same ``[leoflow] in_cluster`` / ``kube_config`` the runtime uses
(:func:`.review.api_client_from_config`), and every call is bounded (:data:`READ_TIMEOUT_SECONDS`). The
api-server's identity needs ``get pods`` and ``get pods/log`` in the task namespace
(:data:`.access.EXCHANGE_RULES`).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from leoflow_airflow.runtime.kubernetes.identity import IDENTITY_ANNOTATION, parse_identity_annotation
from leoflow_airflow.runtime.kubernetes.pod import AGENT_CONTAINER
from leoflow_airflow.runtime.kubernetes.tasklog import (
    LIMIT_BYTES,
    TAIL_LINES,
    LogPlace,
    PodLogRead,
    Seen,
    task_log_answer,
)

if TYPE_CHECKING:
    from leoflow_airflow.ledger.states import AttemptRef
    from leoflow_airflow.ledger.store import Attempt
    from leoflow_airflow.settings import KubernetesSettings

__all__ = ["READ_TIMEOUT_SECONDS", "PodLogReader", "read_pod_log"]

log = logging.getLogger(__name__)

READ_TIMEOUT_SECONDS = 10.0
"""Seconds each of the two calls of one log read (the pod GET, the ``pods/log`` GET) may take in all."""


def read_pod_log(core: Any, namespace: str, name: str, *, uid: str | None, ref: AttemptRef,
                 container: str = AGENT_CONTAINER, tail_lines: int = TAIL_LINES, limit_bytes: int = LIMIT_BYTES,
                 timeout: float = READ_TIMEOUT_SECONDS) -> PodLogRead:
    """Read pod ``namespace/name`` and, when it is the attempt's, the log of its ``container``.

    The pod is the attempt's when its UID is ``uid`` or, with ``uid`` None (not recorded yet), when its identity
    annotation names ``ref``. Then one ``pods/log`` GET: the last ``tail_lines`` lines, at most ``limit_bytes``
    bytes, decoded as UTF-8 (invalid bytes replaced). A 404 on either call, or another pod under the name, is
    ``GONE``; any other failure is ``ERROR`` naming the call and the status or transport error.

    :param core: a ``kubernetes.client.CoreV1Api``.
    :param timeout: seconds each call may take in all.
    :returns: the evidence for :func:`.tasklog.task_log_answer`; never raises.
    """
    try:
        pod = core.read_namespaced_pod(name, namespace, _request_timeout=timeout)
    except Exception as exc:  # noqa: BLE001 - a log read never fails the page
        if getattr(exc, "status", None) == 404:
            return PodLogRead(Seen.GONE, namespace, name)
        return PodLogRead(Seen.ERROR, namespace, name, error=_describe(exc, "pod GET"))
    meta = pod.metadata
    theirs = (meta.uid == uid) if uid else \
        parse_identity_annotation((meta.annotations or {}).get(IDENTITY_ANNOTATION)) == ref
    if not theirs:
        return PodLogRead(Seen.GONE, namespace, name, other_uid=meta.uid or "?")
    try:
        resp = core.read_namespaced_pod_log(name, namespace, container=container, tail_lines=tail_lines,
                                            limit_bytes=limit_bytes, _preload_content=False,
                                            _request_timeout=timeout)
        data = resp.data
    except Exception as exc:  # noqa: BLE001 - a log read never fails the page
        if getattr(exc, "status", None) == 404:
            return PodLogRead(Seen.GONE, namespace, name)
        return PodLogRead(Seen.ERROR, namespace, name, error=_describe(exc, "pods/log GET"))
    return PodLogRead(Seen.LOG, namespace, name, text=data.decode("utf-8", errors="replace"))


def _describe(exc: BaseException, what: str) -> str:
    """One line naming the call and the API server's status and message, or the transport error."""
    status = getattr(exc, "status", None)
    if isinstance(status, int) and status:
        message = ""
        try:
            message = str(json.loads(getattr(exc, "body", None) or "{}").get("message") or "")
        except (ValueError, AttributeError):
            pass
        hint = " (the api-server's Kubernetes identity needs get pods and get pods/log)" \
            if status in (401, 403) else ""
        text = f"{what}: HTTP {status} {getattr(exc, 'reason', '') or ''}".strip()
        return (f"{text}: {message}" if message else text)[:500] + hint
    return f"{what}: {type(exc).__name__}: {str(exc)[:300]}"


class PodLogReader:
    """The log of an attempt's pod for ``LeoflowExecutor.get_task_log`` (module docstring).

    :param settings: ``[leoflow]``'s Kubernetes options (``namespace``, ``in_cluster``, ``kube_config``).
    :param api_client_factory: ``() -> kubernetes.client.ApiClient``; default :func:`.review.api_client_from_config`
        on ``settings``. Called once, on the first read (never at construction).
    :param timeout: seconds each API call may take in all.

    Thread-safe (the api-server may serve log requests on several threads).
    """

    def __init__(self, settings: KubernetesSettings, *, api_client_factory: Callable[[], Any] | None = None,
                 timeout: float = READ_TIMEOUT_SECONDS) -> None:
        self.kube = settings
        self._factory = api_client_factory
        self._timeout = timeout
        self._core: Any = None
        self._lock = threading.Lock()

    def _api(self) -> Any:
        """The ``CoreV1Api``, built on first use. :raises Exception: the client configuration cannot be loaded."""
        with self._lock:
            if self._core is None:
                from kubernetes import client

                if self._factory is not None:
                    api = self._factory()
                else:
                    from leoflow_airflow.runtime.kubernetes.review import api_client_from_config

                    api = api_client_from_config(in_cluster=self.kube.in_cluster, kube_config=self.kube.kube_config)
                self._core = client.CoreV1Api(api)
            return self._core

    def task_log(self, attempt: Attempt, place: LogPlace) -> tuple[list[str], list[str]]:
        """``([source], [text])`` of ``attempt``'s pod (:func:`.tasklog.task_log_answer`): its log while the pod
        is there, else where the log went, else the error. The pod is the ledger's (``pod_name``, ``pod_uid``)
        or, before they are recorded, the attempt's deterministic name and identity annotation. Never raises:
        a client configuration that cannot be loaded is an ``ERROR`` answer too."""
        from leoflow_airflow.runtime.kubernetes.runtime import attempt_pod_name

        name = attempt.pod_name or attempt_pod_name(attempt)
        namespace = self.kube.namespace
        try:
            core = self._api()
        except Exception as exc:  # noqa: BLE001 - ConfigException, OSError: said on the page, never raised
            read = PodLogRead(Seen.ERROR, namespace, name,
                              error=f"the Kubernetes client configuration cannot be loaded ([leoflow] in_cluster "
                                    f"/ kube_config): {type(exc).__name__}: {str(exc)[:300]}")
        else:
            read = read_pod_log(core, namespace, name, uid=attempt.pod_uid, ref=attempt.ref, timeout=self._timeout)
        if read.seen is Seen.ERROR:
            log.warning("task log of attempt %s: %s", attempt.ref, read.error)
        return task_log_answer(read, place)
