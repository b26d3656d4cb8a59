"""Taking leoflow's finalizer (:data:`.pod.OUTCOME_FINALIZER`) off task pods: the one I/O every caller uses
(issue 10 item 4).

Every task pod carries the finalizer from its creation (:func:`.pod.build_pod` pins it), so a delete -- PodGC's
force delete of a pod on a lost node, a user's ``kubectl delete --grace-period=0 --force``, a kill -- leaves the
pod readable (``deletionTimestamp`` set, its status and termination message intact) until the finalizer is
removed. Who removes it:

* the runtime (:meth:`.runtime.KubernetesRuntime.collect`, on its worker pool, never on the scheduler loop),
  once :func:`.decide.release_due` holds: the attempt's ledger row is closed and the pod is terminal or deleting;
* ``airflow leoflow release-pods`` (:func:`release_pods`), for an uninstall: every leoflow pod of a namespace;
* test fixtures and benchmarks before they delete a namespace (the same :func:`release_pods`).

A removal is a JSON patch that ``test``s the pod's UID and the finalizer's index before it ``remove``s it
(:func:`.decide.release_patch`), so it never touches another pod of the same name nor another finalizer. It is
idempotent: a pod that is gone, has another UID, or no longer holds the finalizer counts as released. A failed
``test`` (HTTP 422: the finalizer list changed since it was read) is answered by reading the pod again and
patching once more; a second 422 is left for the next pass.
"""

from __future__ import annotations

import enum
import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from leoflow_airflow.runtime.kubernetes.decide import finalizer_index, release_patch
from leoflow_airflow.runtime.kubernetes.status import PodView, pod_view

__all__ = ["JSON_PATCH", "Release", "ReleaseOutcome", "release_finalizer", "release_pods"]

log = logging.getLogger(__name__)

JSON_PATCH = "application/json-patch+json"
"""The content type of an RFC 6902 patch."""
LIST_PAGE_SIZE = 500
"""Pods per LIST page of :func:`release_pods`."""


class ReleaseOutcome(enum.StrEnum):
    """What one release did."""

    RELEASED = "released"
    """The patch removed leoflow's finalizer."""
    GONE = "gone"
    """No pod of that name, or one with another UID: nothing to release (done)."""
    NOT_HELD = "not-held"
    """The pod does not hold leoflow's finalizer (released earlier, or never had it): done."""
    WOULD_RELEASE = "would-release"
    """A dry run: the pod holds the finalizer and was left as it is."""
    CONFLICT = "conflict"
    """The patch's ``test`` failed twice (the finalizer list keeps changing): try again later."""
    FAILED = "failed"
    """The API server refused or did not answer (``detail`` says what): try again later."""


@dataclass(frozen=True, slots=True)
class Release:
    """The answer of one release: pod ``name`` (``uid`` when known), its :class:`ReleaseOutcome` and, for a
    failure, what the API server said."""

    name: str
    uid: str | None
    outcome: ReleaseOutcome
    detail: str = ""

    @property
    def done(self) -> bool:
        """Nothing of leoflow holds the pod any more (released now, earlier, or the pod is gone)."""
        return self.outcome in (ReleaseOutcome.RELEASED, ReleaseOutcome.GONE, ReleaseOutcome.NOT_HELD)


def _short(exc: BaseException) -> str:
    code = getattr(exc, "status", None)
    text = f"HTTP {code} {getattr(exc, 'reason', '')}".strip() if isinstance(code, int) and code else str(exc)
    return f"{type(exc).__name__}: {text}"[:300]


def _read(core: Any, namespace: str, name: str, timeout: float) -> PodView | None:
    """GET pod ``name`` as a view; None for 404. Raises the client's exception otherwise."""
    try:
        resp = core.read_namespaced_pod(name, namespace, _preload_content=False, _request_timeout=timeout)
    except Exception as exc:
        if getattr(exc, "status", None) == 404:
            return None
        raise
    return pod_view(json.loads(resp.data))


def release_finalizer(core: Any, namespace: str, name: str, uid: str | None = None, *, index: int | None = None,
                      timeout: float = 30.0) -> Release:
    """Remove leoflow's finalizer from pod ``namespace/name`` -- the one whose UID is ``uid`` -- and nothing else.

    :param core: a ``kubernetes.client.CoreV1Api`` (``get`` and ``patch pods`` in ``namespace``).
    :param uid: the pod's UID; None: whatever pod holds the name now (read first).
    :param index: where the finalizer was last seen in ``metadata.finalizers`` (the cached view's); None: read
        the pod first. A stale index costs one 422 and a read.
    :param timeout: seconds per request.
    :returns: the :class:`Release`; never raises for an API or transport error (``FAILED`` with the error).
    """
    try:
        if uid is None or index is None:
            view = _read(core, namespace, name, timeout)
            if view is None or (uid is not None and view.uid != uid):
                return Release(name, uid, ReleaseOutcome.GONE)
            uid, index = view.uid, finalizer_index(view.finalizers)
            if index is None:
                return Release(name, uid, ReleaseOutcome.NOT_HELD)
        for attempt in (1, 2):
            try:
                core.patch_namespaced_pod(name, namespace, release_patch(uid, index), _request_timeout=timeout,
                                          _content_type=JSON_PATCH)
                return Release(name, uid, ReleaseOutcome.RELEASED)
            except Exception as exc:
                code = getattr(exc, "status", None)
                if code == 404:
                    return Release(name, uid, ReleaseOutcome.GONE)
                if code != 422:
                    return Release(name, uid, ReleaseOutcome.FAILED, _short(exc))
            view = _read(core, namespace, name, timeout)  # a failed test: what does the pod hold now?
            if view is None or view.uid != uid:
                return Release(name, uid, ReleaseOutcome.GONE)
            if (index := finalizer_index(view.finalizers)) is None:
                return Release(name, uid, ReleaseOutcome.NOT_HELD)
        return Release(name, uid, ReleaseOutcome.CONFLICT, "the pod's finalizers kept changing")
    except Exception as exc:  # noqa: BLE001 - a read that failed: the caller tries again later
        return Release(name, uid, ReleaseOutcome.FAILED, _short(exc))


def _held_pods(core: Any, namespace: str, label_selector: str, timeout: float) -> Iterator[PodView]:
    """Every pod of ``namespace`` matching ``label_selector`` that holds leoflow's finalizer (paged LIST)."""
    token: str | None = None
    while True:
        kwargs: dict[str, Any] = {"label_selector": label_selector, "limit": LIST_PAGE_SIZE,
                                  "_preload_content": False, "_request_timeout": timeout}
        if token:
            kwargs["_continue"] = token
        page = json.loads(core.list_namespaced_pod(namespace, **kwargs).data)
        for obj in page.get("items") or []:
            view = pod_view(obj)
            if view is not None and finalizer_index(view.finalizers) is not None:
                yield view
        token = (page.get("metadata") or {}).get("continue")
        if not token:
            return


def release_pods(core: Any, namespace: str, label_selector: str, *, dry_run: bool = False,
                 timeout: float = 30.0) -> list[Release]:
    """Remove leoflow's finalizer from every pod of ``namespace`` matching ``label_selector`` that holds it,
    whatever its state or its attempt's (an uninstall, a test namespace's teardown). Running pods keep running;
    deleting ones then go.

    :param core: a ``kubernetes.client.CoreV1Api`` (``list``, ``get`` and ``patch pods`` in ``namespace``).
    :param label_selector: leoflow's pods (``runtime.label_selector(instance)``).
    :param dry_run: only list them (``WOULD_RELEASE``).
    :returns: one :class:`Release` per pod that held it, in the LIST's order.
    :raises kubernetes.client.ApiException: (or a transport error) when the LIST fails: nothing was released.
    """
    out: list[Release] = []
    for view in _held_pods(core, namespace, label_selector, timeout):
        if dry_run:
            out.append(Release(view.name, view.uid, ReleaseOutcome.WOULD_RELEASE))
        else:
            out.append(release_finalizer(core, namespace, view.name, view.uid,
                                         index=finalizer_index(view.finalizers), timeout=timeout))
    return out
