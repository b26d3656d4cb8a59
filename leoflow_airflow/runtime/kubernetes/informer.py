"""A watch-based cache of the task pods of one namespace (issue 9 item 5; facts file requirement 11).

:class:`PodInformer` LISTs the pods matching a label selector, then WATCHes them from the list's
``resourceVersion`` with bookmarks, on one daemon thread, and keeps the latest :class:`~.status.PodView` of
each. It is the Kubernetes runtime's way to answer ``observe``/``evidence`` without a request per attempt: the
apiserver cost is one open watch whatever the number of pods in flight.

How it differs from the cncf KubernetesExecutor's watcher (facts §3.4): a ``410 Gone`` (an expired
``resourceVersion``: etcd compacted, the watch cache moved on) arrives with the python client either as an
HTTP 410 to the watch request or as an ``ERROR`` event carrying a Status with code 410; both make this
informer **relist** (a consistent LIST, no ``resourceVersion``) and re-watch from the new list's
``resourceVersion``. It never watches or lists from ``"0"`` (which would replay every pod from the apiserver's
cache as ``ADDED`` and may go back in time), and it never dies: any other error (transport, 5xx, a bad line)
is logged, counted in :attr:`last_error`, and retried after a capped, jittered backoff, re-watching from the
last ``resourceVersion`` it applied (a stale one then answers 410 and the relist follows).

Cost per event: the watch stream and the LIST are read as raw JSON (``_preload_content=False``) and each pod
dict becomes an immutable ``PodView`` (:func:`~.status.pod_view`); nothing is deserialized into ``V1Pod``.

Trust: the cache is eventually consistent and only ever used to **defer** (wait, report LIVE/UNKNOWN, skip a
pass). A destructive decision -- settling an attempt as lost, deleting a pod, re-dispatching a ``ti_id`` --
is confirmed by the runtime with a live read (GET by name, compared by UID) first; the informer never
deletes anything.
"""

from __future__ import annotations

import collections
import json
import logging
import random
import threading
import time
from collections.abc import Callable
from typing import Any

from kubernetes import client as k8s_client
from kubernetes.client.rest import ApiException

from leoflow_airflow.runtime.kubernetes.status import PodView, pod_view

__all__ = ["LIST_PAGE_SIZE", "PodInformer"]

log = logging.getLogger(__name__)

_GONE = 410
_MIN_BACKOFF = 0.5
"""First retry delay after an error, in seconds (doubled per consecutive error, capped, jittered)."""
LIST_PAGE_SIZE = 500
"""Pods per LIST page (``limit``): a relist of thousands of pods is several bounded answers, not one."""
_QUICK_END = 1.0
"""A watch that ends cleanly within this many seconds having applied nothing counts as a failure (backoff), so
a server that closes watches at once cannot make the thread spin."""


class _Gone(Exception):
    """The apiserver answered 410 Gone: the ``resourceVersion`` the watch started from has expired."""


class _StreamError(Exception):
    """The watch stream carried an ``ERROR`` event other than 410, or a line that is not a JSON event."""


class PodInformer:
    """A thread-safe cache of the pods of ``namespace`` matching ``label_selector``, kept by LIST + WATCH.

    :param api_client: the official client's ``ApiClient`` (shared; urllib3's pool is thread-safe). The watch
        holds one pooled connection while open.
    :param namespace: the namespace watched.
    :param label_selector: a Kubernetes label selector (e.g. ``app.kubernetes.io/managed-by=leoflow``); pods
        not matching it are never seen, and a pod that stops matching is seen DELETED.
    :param watch_timeout_seconds: the server-side ``timeoutSeconds`` of each watch request; the watch is then
        reopened from the last ``resourceVersion`` (no LIST).
    :param request_timeout_seconds: connect timeout of every request and read timeout of a LIST; a watch's read
        timeout is ``watch_timeout_seconds + request_timeout_seconds`` so the server ends it first.
    :param tombstone_seconds: how long the last view of a deleted pod stays readable by :meth:`tombstone`.
    :param on_event: called with no argument, outside the lock, on the informer thread, after each applied
        change (an event, or a LIST that changed the cache); it should only wake someone up. Its exceptions are
        logged and swallowed.
    :param max_backoff_seconds: cap of the retry delay after errors, in seconds.
    :param list_page_size: pods per LIST page (``limit``; default :data:`LIST_PAGE_SIZE`).

    Observable counters (read without the lock; each is one int/str assignment): :attr:`relists` (LISTs
    applied after the first: one per 410 or per error that needed a new list), :attr:`events` (watch events
    applied to the cache: ADDED/MODIFIED/DELETED; bookmarks are not counted), :attr:`last_error` (the last
    error met, ``None`` until one is).
    """

    def __init__(
        self,
        api_client: k8s_client.ApiClient,
        namespace: str,
        label_selector: str,
        *,
        watch_timeout_seconds: int = 300,
        request_timeout_seconds: float = 30.0,
        tombstone_seconds: float = 600.0,
        on_event: Callable[[], None] | None = None,
        max_backoff_seconds: float = 10.0,
        list_page_size: int = LIST_PAGE_SIZE,
    ) -> None:
        self._core = k8s_client.CoreV1Api(api_client)
        self.namespace = namespace
        self.label_selector = label_selector
        self._watch_timeout = int(watch_timeout_seconds)
        self._request_timeout = float(request_timeout_seconds)
        self._tombstone_seconds = float(tombstone_seconds)
        self._on_event = on_event
        self._max_backoff = float(max_backoff_seconds)
        self._page_size = int(list_page_size)
        self._lock = threading.Lock()
        self._pods: dict[str, PodView] = {}
        self._ending: set[str] = set()  # names of cached pods that are terminal or being deleted
        self._uids: set[str] = set()  # UIDs of the cached pods
        self._tombstones: collections.OrderedDict[str, tuple[PodView, float]] = collections.OrderedDict()
        self._changed: set[str] = set()  # pod names an event touched since the last take_changed()
        self._all_changed = True  # a LIST was applied since then: any pod may have changed
        self._rv: str | None = None
        self._synced = False
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._resp: Any = None
        self.relists = 0
        self.events = 0
        self.last_error: str | None = None

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Start the informer thread (a daemon): LIST, then WATCH, for ever until :meth:`stop`. Returns at once;
        :attr:`synced` turns True once the first LIST is applied. Raises RuntimeError if already started."""
        if self._thread is not None:
            raise RuntimeError("PodInformer already started")
        self._thread = threading.Thread(target=self._run, name=f"leoflow-pod-informer-{self.namespace}",
                                        daemon=True)
        self._thread.start()

    def stop(self, timeout: float) -> None:
        """Stop the thread: close the open watch (its blocking read ends at once) and wait up to ``timeout``
        seconds for the thread to end. The cache stays readable. Idempotent."""
        self._stopping.set()
        with self._lock:
            resp = self._resp
        if resp is not None:
            _abort(resp)
        if self._thread is not None:
            self._thread.join(timeout)

    # ------------------------------------------------------------------ reading

    @property
    def synced(self) -> bool:
        """One full LIST has been applied since :meth:`start` (until then :meth:`get` proves nothing)."""
        return self._synced

    @property
    def running(self) -> bool:
        """The informer thread is alive (started and not yet stopped)."""
        return self._thread is not None and self._thread.is_alive()

    @property
    def resource_version(self) -> str | None:
        """The ``resourceVersion`` the cache is at (of the last LIST, event or bookmark applied), or None."""
        return self._rv

    def get(self, name: str) -> PodView | None:
        """The current view of pod ``name``, or None when the cache holds no such pod.

        Lock-free: one ``dict.get`` on the current mapping is atomic in CPython, the watch thread only sets,
        deletes or swaps whole mappings (a relist), and a view is immutable; the scheduler loop asks this for
        every attempt of a page (issue 10, "Benchmark")."""
        return self._pods.get(name)

    def tombstone(self, name: str, uid: str) -> PodView | None:
        """The last view of pod ``name`` with UID ``uid`` once it was seen DELETED (the final object the watch
        carried: its terminal status and termination message survive the delete) or vanished from a relist
        (then its last view before the gap), within ``tombstone_seconds``; None otherwise."""
        with self._lock:
            self._prune(time.monotonic())
            entry = self._tombstones.get(uid)
        if entry is None or entry[0].name != name:
            return None
        return entry[0]

    def take_changed(self) -> set[str] | None:
        """The names of the pods that a watch event added, modified or deleted since the last call, and
        forget them; None when a LIST was applied since (the first one, or a relist after a 410 or an error):
        then any cached pod may have changed. Lets a reader re-examine only what moved (the cost of a
        scheduler loop does not grow with the pods that did not)."""
        with self._lock:
            if self._all_changed:
                self._all_changed = False
                self._changed = set()
                return None
            changed, self._changed = self._changed, set()
            return changed

    def views(self) -> list[PodView]:
        """A snapshot of every cached pod's view (tombstones excluded), in no particular order."""
        with self._lock:
            return list(self._pods.values())

    def ending(self) -> list[PodView]:
        """A snapshot of the cached views that are terminal (``PodView.terminal``) or being deleted
        (``PodView.deleting``), in no particular order: what a garbage collector has to look at. Kept as an
        index by every event and LIST, so its cost follows those pods, not every cached one (issue 10,
        "Benchmark")."""
        with self._lock:
            return [self._pods[name] for name in self._ending]

    def has_uid(self, uid: str) -> bool:
        """Whether a cached pod (tombstones excluded) has UID ``uid``."""
        with self._lock:
            return uid in self._uids

    # ------------------------------------------------------------------ the thread

    def _run(self) -> None:
        """The informer thread: LIST when needed, WATCH, handle 410 and errors; never raises."""
        need_list, failures, gone = True, 0, 0
        while not self._stopping.is_set():
            try:
                if need_list:
                    self._list()
                    need_list = False
                if self._watch():
                    failures = gone = 0
                else:
                    failures += 1
            except _Gone as e:
                self.last_error = f"410 Gone: {e}"
                log.info("pod informer %s: %s; relisting", self.namespace, self.last_error)
                need_list = True
                gone += 1
                if gone > 1:  # the first 410 relists at once; 410 again right after a relist backs off
                    failures += 1
            except Exception as e:  # noqa: BLE001 - the informer never dies; every error is retried
                if self._stopping.is_set():
                    break
                self.last_error = f"{type(e).__name__}: {e}"[:500]
                log.warning("pod informer %s: %s (retrying)", self.namespace, self.last_error)
                failures += 1
                if not self._synced:
                    need_list = True
            if failures and not self._stopping.is_set():
                self._stopping.wait(self._backoff(failures))
        with self._lock:
            self._resp = None

    def _backoff(self, failures: int) -> float:
        """Seconds to wait after ``failures`` consecutive failures: doubling from 0.5 s, capped, jittered
        (50-100 % of the step) so many schedulers do not retry in step."""
        step = min(self._max_backoff, _MIN_BACKOFF * (2 ** min(failures - 1, 16)))
        return step * (0.5 + random.random() / 2)

    def _list(self) -> None:
        """One consistent LIST (no ``resourceVersion``: never ``"0"``), in pages of ``list_page_size`` pods
        (``limit`` + ``continue``: one snapshot at the first page's ``resourceVersion``), applied as a
        replacement of the cache; pods the list no longer holds become tombstones. Raises on any error
        (ApiException 410, e.g. an expired ``continue`` token, as _Gone: the relist starts over)."""
        items: list[Any] = []
        rv: str | None = None
        token: str | None = None
        while True:
            doc = self._list_page(token)
            meta = doc.get("metadata") if isinstance(doc, dict) else None
            page = doc.get("items") if isinstance(doc, dict) else None
            page_rv = meta.get("resourceVersion") if isinstance(meta, dict) else None
            if not isinstance(page_rv, str) or not page_rv or not isinstance(page, list):
                raise _StreamError("pod LIST answer has no resourceVersion or items")
            rv = rv or page_rv
            items.extend(page)
            token = meta.get("continue") or None
            if not token:
                break
            if self._stopping.is_set():
                raise _StreamError("stopped during a paged LIST")
        fresh: dict[str, PodView] = {}
        for item in items:
            view = pod_view(item)
            if view is not None:
                fresh[view.name] = view
        now = time.monotonic()
        with self._lock:
            changed = fresh != self._pods
            for name, old in self._pods.items():
                new = fresh.get(name)
                if new is None or new.uid != old.uid:
                    self._bury(old, now)
            self._pods = fresh
            self._ending = {name for name, view in fresh.items() if view.terminal or view.deleting}
            self._uids = {view.uid for view in fresh.values()}
            self._rv = rv
            self._all_changed = True
            if self._synced:
                self.relists += 1
            first, self._synced = not self._synced, True
        log.debug("pod informer %s: listed %d pods at resourceVersion %s", self.namespace, len(fresh), rv)
        if changed or first:
            self._notify()

    def _list_page(self, token: str | None) -> Any:
        """One page of the pod LIST (``token``: the previous page's ``continue``, None for the first), as
        parsed JSON. Raises _Gone on 410, anything else on other errors."""
        kwargs: dict[str, Any] = {"limit": self._page_size}
        if token:
            kwargs["_continue"] = token
        try:
            resp = self._core.list_namespaced_pod(
                self.namespace, label_selector=self.label_selector, _preload_content=False,
                _request_timeout=(self._request_timeout, self._request_timeout), **kwargs)
        except ApiException as e:
            if e.status == _GONE:
                raise _Gone(e.reason) from e
            raise
        try:
            return json.loads(resp.data)
        finally:
            resp.release_conn()

    def _watch(self) -> bool:
        """One WATCH from the cache's ``resourceVersion`` until the server ends it (True) or it ends at once
        having applied nothing (False: back off). Raises _Gone on 410, anything else on other errors."""
        started = time.monotonic()
        try:
            resp = self._core.list_namespaced_pod(
                self.namespace, label_selector=self.label_selector, watch=True, resource_version=self._rv,
                allow_watch_bookmarks=True, timeout_seconds=self._watch_timeout, _preload_content=False,
                _request_timeout=(self._request_timeout, self._watch_timeout + self._request_timeout))
        except ApiException as e:
            if e.status == _GONE:
                raise _Gone(e.reason) from e
            raise
        with self._lock:
            self._resp = resp
        if self._stopping.is_set():
            _abort(resp)
        applied = 0
        try:
            buffer = bytearray()
            for chunk in resp.stream(None, decode_content=True):
                buffer.extend(chunk)
                start = 0
                while (end := buffer.find(b"\n", start)) >= 0:
                    line = bytes(buffer[start:end]).strip()
                    start = end + 1
                    if line:
                        applied += self._apply_line(line)
                del buffer[:start]
                if self._stopping.is_set():
                    return True
        finally:
            with self._lock:
                self._resp = None
            resp.release_conn()
        return applied > 0 or time.monotonic() - started >= _QUICK_END

    def _apply_line(self, line: bytes) -> int:
        """Apply one watch event line; 1 if it changed the cache, else 0. Raises _Gone / _StreamError."""
        try:
            event = json.loads(line)
            kind, obj = event["type"], event["object"]
        except (ValueError, TypeError, KeyError) as e:
            raise _StreamError(f"watch line is not an event: {line[:200]!r}") from e
        if not isinstance(obj, dict):
            raise _StreamError(f"watch event without an object: {line[:200]!r}")
        if kind == "ERROR":
            code = obj.get("code")
            text = f"{obj.get('reason')}: {obj.get('message')}"
            if code == _GONE:
                raise _Gone(text)
            raise _StreamError(f"watch ERROR event {code} {text}"[:500])
        meta = obj.get("metadata")
        rv = meta.get("resourceVersion") if isinstance(meta, dict) else None
        if kind == "BOOKMARK":
            if isinstance(rv, str) and rv:
                with self._lock:
                    self._rv = rv
            return 0
        if kind not in ("ADDED", "MODIFIED", "DELETED"):
            return 0
        view = pod_view(obj)
        with self._lock:
            if isinstance(rv, str) and rv:
                self._rv = rv
            if view is None:
                return 0
            old = self._pods.get(view.name)
            self._changed.add(view.name)
            if kind == "DELETED":
                if old is not None and old.uid == view.uid:
                    del self._pods[view.name]
                    self._ending.discard(view.name)
                    self._uids.discard(view.uid)
                self._bury(view, time.monotonic())
            else:
                if old is not None and old.uid != view.uid:
                    self._bury(old, time.monotonic())
                    self._uids.discard(old.uid)
                self._pods[view.name] = view
                self._uids.add(view.uid)
                if view.terminal or view.deleting:
                    self._ending.add(view.name)
                else:
                    self._ending.discard(view.name)
            self.events += 1
        self._notify()
        return 1

    def _bury(self, view: PodView, now: float) -> None:
        """Keep ``view`` as its pod's tombstone until ``now + tombstone_seconds`` (caller holds the lock)."""
        self._tombstones[view.uid] = (view, now + self._tombstone_seconds)
        self._tombstones.move_to_end(view.uid)
        self._prune(now)

    def _prune(self, now: float) -> None:
        """Drop expired tombstones (oldest first; caller holds the lock)."""
        while self._tombstones:
            uid, (_, expires) = next(iter(self._tombstones.items()))
            if expires > now:
                break
            del self._tombstones[uid]

    def _notify(self) -> None:
        """Call ``on_event`` (outside the lock), logging and swallowing what it raises."""
        if self._on_event is None:
            return
        try:
            self._on_event()
        except Exception:  # noqa: BLE001 - a wake-up hook must not kill the informer
            log.exception("pod informer %s: on_event raised", self.namespace)


def _abort(resp: Any) -> None:
    """End a streaming response's blocking read from another thread (socket shut down, then closed)."""
    try:
        resp.shutdown()  # urllib3 >= 2.3: wakes a reader blocked in recv
    except Exception:  # noqa: BLE001 - already released or an older urllib3: close instead
        pass
    try:
        resp.close()
    except Exception:  # noqa: BLE001 - closing a dead response has nothing left to report
        pass
