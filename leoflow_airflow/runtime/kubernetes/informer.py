"""STUB (wip/kruntime): a minimal stand-in for wip/kinformer's ``informer.py`` so the runtime can run before theirs
lands; the lead merges theirs over this one. Same interface: a list + watch pod cache on one daemon thread,
relisting on 410 (never from "0"), with tombstones of deleted pods."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from leoflow_airflow.runtime.kubernetes.status import PodView, pod_view

__all__ = ["PodInformer"]

log = logging.getLogger(__name__)


class PodInformer:
    """A cache of the pods matching ``label_selector`` in ``namespace`` (see the module docstring)."""

    def __init__(self, api_client: Any, namespace: str, label_selector: str, *, watch_timeout_seconds: int = 300,
                 request_timeout_seconds: float = 30.0, tombstone_seconds: float = 600.0,
                 on_event: Callable[[str, PodView], None] | None = None) -> None:
        from kubernetes import client

        self._core = client.CoreV1Api(api_client)
        self._ns, self._sel = namespace, label_selector
        self._watch_timeout, self._timeout, self._tomb_life = watch_timeout_seconds, request_timeout_seconds, tombstone_seconds
        self._on_event = on_event
        self._lock = threading.Lock()
        self._pods: dict[str, PodView] = {}
        self._tombs: dict[tuple[str, str], tuple[float, PodView]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._synced = False
        self.relists = 0
        self.events = 0
        self.last_error: str | None = None

    @property
    def synced(self) -> bool:
        """True once the first list is in the cache."""
        return self._synced

    def start(self) -> None:
        """Start the list + watch thread; returns at once."""
        self._thread = threading.Thread(target=self._run, name="leoflow-pod-informer", daemon=True)
        self._thread.start()

    def stop(self, timeout: float) -> None:
        """Ask the thread to end; wait at most ``timeout`` seconds (a watch in flight ends at its timeout)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def get(self, name: str) -> PodView | None:
        """The cached view of pod ``name``, or None."""
        with self._lock:
            return self._pods.get(name)

    def tombstone(self, name: str, uid: str) -> PodView | None:
        """The last view of deleted pod ``name`` with ``uid``, kept ``tombstone_seconds``."""
        with self._lock:
            hit = self._tombs.get((name, uid))
        return None if hit is None else hit[1]

    def views(self) -> list[PodView]:
        """Every cached view."""
        with self._lock:
            return list(self._pods.values())

    def _run(self) -> None:
        rv: str | None = None
        while not self._stop.is_set():
            try:
                if rv is None:
                    rv = self._list()
                rv = self._watch(rv)
            except Exception as exc:  # noqa: BLE001 - logged; relist after a pause
                if getattr(exc, "status", None) == 410:
                    rv = None
                    continue
                self.last_error = f"{type(exc).__name__}: {str(exc)[:200]}"
                log.warning("leoflow pod informer: %s; relisting", self.last_error)
                rv = None
                self._stop.wait(1.0)

    def _list(self) -> str:
        resp = self._core.list_namespaced_pod(self._ns, label_selector=self._sel, _preload_content=False,
                                              _request_timeout=self._timeout)
        data = json.loads(resp.data)
        fresh = {v.name: v for item in data.get("items") or [] if (v := pod_view(item)) is not None}
        now = time.monotonic()
        with self._lock:
            for name, old in self._pods.items():
                if name not in fresh or fresh[name].uid != old.uid:
                    self._tombs[(name, old.uid)] = (now, old)
            self._pods = fresh
        self.relists += 1
        self._synced = True
        return str((data.get("metadata") or {}).get("resourceVersion") or "")

    def _watch(self, rv: str) -> str | None:
        from kubernetes import watch

        w = watch.Watch()
        for event in w.stream(self._core.list_namespaced_pod, self._ns, label_selector=self._sel,
                              resource_version=rv, allow_watch_bookmarks=True,
                              timeout_seconds=self._watch_timeout, _request_timeout=self._watch_timeout + 10):
            if self._stop.is_set():
                w.stop()
                return rv
            raw = event.get("raw_object") or {}
            kind = event.get("type")
            rv = str((raw.get("metadata") or {}).get("resourceVersion") or rv)
            if kind == "BOOKMARK":
                continue
            if kind == "ERROR":
                return None
            view = pod_view(raw)
            if view is None:
                continue
            self.events += 1
            now = time.monotonic()
            with self._lock:
                if kind == "DELETED":
                    self._pods.pop(view.name, None)
                    self._tombs[(view.name, view.uid)] = (now, view)
                else:
                    self._pods[view.name] = view
                self._tombs = {k: v for k, v in self._tombs.items() if now - v[0] < self._tomb_life}
            if self._on_event is not None:
                self._on_event(kind, view)
        return rv
