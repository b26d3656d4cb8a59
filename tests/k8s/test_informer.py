"""The pod informer against the real kube-apiserver (issue 9 item 5; facts file requirement 11).

Pods run on kwok nodes and finish through the ``kwok.leoflow.test/*`` annotations (tests/k8s/README.md). The
forced 410: the informer reaches the apiserver through a TCP relay the test can cut; while it is cut, pods
change and etcd is compacted past the informer's ``resourceVersion``; once restored, the informer's re-watch
from that version is answered 410 Gone. That needs pods to bypass the apiserver's watch cache
(``--watch-cache-sizes=pods#0`` in scripts/k8senv, next to ``podtemplates#0``): with the cache, a compacted
version is still served from the cache's window and no 410 can be forced deterministically.
"""

from __future__ import annotations

import json
import socket
import threading
import urllib.parse
import urllib.request

import pytest
from kubernetes import client, config

from leoflow_airflow.ledger.states import AttemptRef
from leoflow_airflow.runtime.kubernetes.identity import IDENTITY_ANNOTATION, identity_annotation
from leoflow_airflow.runtime.kubernetes.informer import PodInformer
from leoflow_airflow.runtime.kubernetes.pod import AGENT_CONTAINER

from .conftest import wait_for

pytestmark = pytest.mark.k8s

SELECT = "leoflow.test/informer=yes"
REF = AttemptRef("0190b6c2-7a1e-7000-8000-00000000abcd", 1, 1)


class RecordingApiClient(client.ApiClient):
    """The official ApiClient, recording every request's method and URL (to see what the informer asked)."""

    def __init__(self, configuration: client.Configuration) -> None:
        super().__init__(configuration)
        self.requests: list[tuple[str, str]] = []

    def call_api(self, method, url, *args, **kwargs):
        self.requests.append((method, url))
        return super().call_api(method, url, *args, **kwargs)

    def pod_requests(self) -> list[dict[str, str]]:
        """The query of every pod LIST/WATCH sent, each as a dict (one value per key)."""
        out = []
        for _, url in self.requests:
            parts = urllib.parse.urlsplit(url)
            if parts.path.endswith("/pods"):
                out.append({k: v[0] for k, v in urllib.parse.parse_qs(parts.query, keep_blank_values=True).items()})
        return out


def recording_client(k8s_env, host: str | None = None) -> RecordingApiClient:
    """An admin RecordingApiClient from the session kubeconfig, optionally sent to ``host`` instead."""
    cfg = client.Configuration()
    config.load_kube_config(config_file=str(k8s_env.kubeconfig), client_configuration=cfg)
    if host:
        cfg.host = host
        cfg.refresh_api_key_hook = None  # it re-applies the kubeconfig, server included, before each request
    return RecordingApiClient(cfg)


class CuttableRelay:
    """A TCP relay on 127.0.0.1 to ``target`` that a test can cut (every relayed connection closed, new ones
    closed at accept) and restore."""

    def __init__(self, target: tuple[str, int]) -> None:
        self._target = target
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._open = True
        self._socks: set[socket.socket] = set()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                down, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                if not self._open:
                    down.close()
                    continue
            try:
                up = socket.create_connection(self._target, timeout=5)
                up.settimeout(None)
            except OSError:
                down.close()
                continue
            with self._lock:
                if not self._open:
                    down.close()
                    up.close()
                    continue
                self._socks.update((down, up))
            for src, dst in ((down, up), (up, down)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                _kill(s)

    def cut(self) -> None:
        """Close every relayed connection and refuse new ones until :meth:`restore`."""
        with self._lock:
            self._open = False
            socks, self._socks = self._socks, set()
        for s in socks:
            _kill(s)

    def restore(self) -> None:
        """Relay new connections again."""
        with self._lock:
            self._open = True

    def close(self) -> None:
        """Stop accepting and close everything."""
        self.cut()
        self._listener.close()
        self._thread.join(5)


def _kill(s: socket.socket) -> None:
    try:
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    s.close()


def _pod(name: str, node: str, *, labels: dict | None = None, exit_code: str | None = None,
         message: str | None = None, run_for: str | None = None) -> client.V1Pod:
    """A task-like pod bound to kwok node ``node`` with the agent container; finishing with ``exit_code``."""
    ann = {IDENTITY_ANNOTATION: identity_annotation(REF)}
    for key, value in (("exit-code", exit_code), ("message", message), ("run-for", run_for)):
        if value is not None:
            ann[f"kwok.leoflow.test/{key}"] = value
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, labels={"leoflow.test/informer": "yes"} if labels is None
                                     else labels, annotations=ann),
        spec=client.V1PodSpec(node_name=node, restart_policy="Never",
                              containers=[client.V1Container(name=AGENT_CONTAINER, image="leoflow.test/none:0")]))


def _live(core: client.CoreV1Api, namespace: str) -> dict[str, tuple[str, str]]:
    """name -> (uid, resourceVersion) of the selected pods, by a live LIST."""
    return {p.metadata.name: (p.metadata.uid, p.metadata.resource_version)
            for p in core.list_namespaced_pod(namespace, label_selector=SELECT).items}


def _cached(informer: PodInformer) -> dict[str, tuple[str, str]]:
    """name -> (uid, resourceVersion) of the informer's cache."""
    return {v.name: (v.uid, v.resource_version) for v in informer.views()}


def _delete(core: client.CoreV1Api, name: str, namespace: str, uid: str) -> None:
    core.delete_namespaced_pod(name, namespace, body=client.V1DeleteOptions(
        grace_period_seconds=0, preconditions=client.V1Preconditions(uid=uid)))


def _check_requests(api: RecordingApiClient) -> list[dict[str, str]]:
    """Every pod request: LISTs are consistent reads (no resourceVersion, never "0"); WATCHes resume from a
    real version with bookmarks. Returns the LIST queries."""
    lists = []
    for q in api.pod_requests():
        assert q.get("labelSelector") == SELECT, q
        if q.get("watch") == "true":
            assert q.get("resourceVersion") not in (None, "", "0"), q
            assert q.get("allowWatchBookmarks") == "true", q
        else:
            assert "resourceVersion" not in q, q
            lists.append(q)
    return lists


def test_informer_sees_create_update_delete_keeps_final_status_and_selects_by_label(k8s_env, core, namespace):
    api = recording_client(k8s_env)
    woken = threading.Semaphore(0)
    inf = PodInformer(api, namespace, SELECT, watch_timeout_seconds=30, on_event=woken.release)
    core.create_namespaced_pod(namespace, _pod("before", k8s_env.nodes[0]))
    inf.start()
    try:
        wait_for(lambda: inf.synced, 30, what="first LIST")
        assert inf.get("before") is not None and inf.get("before").ref == REF
        assert woken.acquire(timeout=0)  # the first LIST woke the runtime

        core.create_namespaced_pod(namespace, _pod("unselected", k8s_env.nodes[0], labels={"other": "x"}))
        created = core.create_namespaced_pod(namespace, _pod("task", k8s_env.nodes[1], exit_code="3",
                                                             message="bye", run_for="300ms"))
        uid = created.metadata.uid
        view = wait_for(lambda: (v := inf.get("task")) is not None and v.terminal and v, 30,
                        what="the informer to see the pod fail")
        assert (view.phase, view.node_name, view.uid, view.ref) == ("Failed", k8s_env.nodes[1], uid, REF)
        assert (view.agent.exit_code, view.agent.reason, view.agent.message) == (3, "Error", "bye")
        # events arrive in resourceVersion order: "unselected" was created before "task", so it was filtered
        assert inf.get("unselected") is None
        assert sorted(v.name for v in inf.views()) == ["before", "task"]

        core.patch_namespaced_pod("task", namespace, {"metadata": {"annotations": {"touched": "1"}}})
        live_rv = core.read_namespaced_pod("task", namespace).metadata.resource_version
        wait_for(lambda: inf.get("task").resource_version == live_rv, 30, what="the update")

        _delete(core, "task", namespace, uid)
        wait_for(lambda: inf.get("task") is None, 30, what="the delete")
        tomb = inf.tombstone("task", uid)
        assert tomb is not None and tomb.phase == "Failed"
        assert (tomb.agent.exit_code, tomb.agent.message) == (3, "bye")
        assert inf.tombstone("task", "another-uid") is None and inf.tombstone("before", uid) is None

        # a pod that stops matching the selector leaves the cache like a deleted one
        before_uid = inf.get("before").uid
        core.patch_namespaced_pod("before", namespace, {"metadata": {"labels": {"leoflow.test/informer": "no"}}})
        wait_for(lambda: inf.get("before") is None, 30, what="the relabelled pod to leave")
        assert inf.tombstone("before", before_uid) is not None
        assert inf.views() == [] and woken.acquire(timeout=0)
        assert (inf.relists, inf.last_error) == (0, None)
        assert len(_check_requests(api)) == 1
    finally:
        inf.stop(10)
    assert not inf.running


def test_list_is_paged_and_the_watch_resumes_from_its_snapshot(k8s_env, core, namespace):
    """A LIST of more pods than one page holds (``limit`` 2, five pods) fills the cache with all of them in
    three requests, and the watch that follows from the list's resourceVersion sees a pod created after it and
    every later change of it (the cache converges on a live LIST with no relist)."""
    api = recording_client(k8s_env)
    inf = PodInformer(api, namespace, SELECT, watch_timeout_seconds=30, list_page_size=2)
    names = [f"paged-{i}" for i in range(5)]
    for name in names:
        core.create_namespaced_pod(namespace, _pod(name, k8s_env.nodes[0]))
    inf.start()
    try:
        wait_for(lambda: inf.synced, 30, what="first LIST")
        assert sorted(v.name for v in inf.views()) == names
        lists = _check_requests(api)
        assert [q.get("limit") for q in lists] == ["2", "2", "2"]
        assert ["continue" in q for q in lists] == [False, True, True]
        core.create_namespaced_pod(namespace, _pod("after", k8s_env.nodes[0]))
        wait_for(lambda: inf.get("after") is not None, 30, what="the watch to see a pod created after the LIST")
        # the node (kwok) updates the new pod right after its creation, and a live LIST may see that update
        # before the watch delivers it: the cache must converge on the live LIST, without a relist
        wait_for(lambda: _live(core, namespace) == _cached(inf), 30, what="the cache to match a live LIST")
        assert inf.relists == 0
    finally:
        inf.stop(10)


def test_forced_410_relists_and_loses_or_duplicates_nothing(k8s_env, core, namespace):
    server = urllib.parse.urlsplit(k8s_env.server)
    relay = CuttableRelay((server.hostname, server.port))
    api = recording_client(k8s_env, host=f"https://127.0.0.1:{relay.port}")
    inf = PodInformer(api, namespace, SELECT, watch_timeout_seconds=60, request_timeout_seconds=5,
                      tombstone_seconds=120, max_backoff_seconds=1.0)
    try:
        keep = core.create_namespaced_pod(namespace, _pod("keep", k8s_env.nodes[0]))
        gone = core.create_namespaced_pod(namespace, _pod("gone", k8s_env.nodes[1]))
        inf.start()
        wait_for(lambda: inf.synced and _cached(inf) == _live(core, namespace), 30, what="first sync")
        before_rv = inf.resource_version

        relay.cut()
        wait_for(lambda: inf.last_error is not None, 30, what="the informer to lose its watch")
        events_at_cut = inf.events
        # while the informer is cut off: a create, an update (kwok finishes "keep"), a delete
        core.create_namespaced_pod(namespace, _pod("new", k8s_env.nodes[2]))
        core.patch_namespaced_pod("keep", namespace, {"metadata": {"annotations": {
            "kwok.leoflow.test/exit-code": "0", "kwok.leoflow.test/message": "done"}}})
        wait_for(lambda: core.read_namespaced_pod("keep", namespace).status.phase == "Succeeded", 30,
                 what="kwok to finish keep")
        _delete(core, "gone", namespace, gone.metadata.uid)
        wait_for(lambda: "gone" not in _live(core, namespace), 30, what="gone deleted")
        # compact etcd at the head: the informer's resourceVersion is now expired
        head = core.list_namespaced_pod(namespace).metadata.resource_version
        assert int(head) > int(before_rv) + 1
        req = urllib.request.Request(f"{k8s_env.etcd}/v3/kv/compaction", method="POST",
                                     data=json.dumps({"revision": head, "physical": True}).encode())
        with urllib.request.urlopen(req, timeout=10) as r:
            assert r.status == 200
        assert inf.relists == 0 and inf.events == events_at_cut  # nothing reached it

        relay.restore()
        wait_for(lambda: inf.relists >= 1, 60, what="the informer to relist after 410")
        assert inf.last_error.startswith("410 Gone"), inf.last_error
        wait_for(lambda: _cached(inf) == _live(core, namespace), 30, what="cache to equal a live LIST")
        assert sorted(_cached(inf)) == ["keep", "new"]
        assert inf.get("keep").uid == keep.metadata.uid and inf.get("keep").phase == "Succeeded"
        assert inf.get("keep").agent.message == "done"
        assert inf.tombstone("gone", gone.metadata.uid) is not None  # vanished at the relist
        assert inf.events == events_at_cut  # the relist replaced the cache: no replay of ADDED events

        # the watch goes on from the relist's version
        core.create_namespaced_pod(namespace, _pod("after", k8s_env.nodes[0]))
        wait_for(lambda: inf.get("after") is not None, 30, what="a pod created after the relist")
        assert inf.relists == 1
        assert len(_check_requests(api)) == 2  # the first LIST and one relist, neither from "0"
    finally:
        inf.stop(10)
        relay.close()
    assert not inf.running
