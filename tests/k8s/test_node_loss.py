"""Node loss and taint eviction on the real control plane (issue 10 items 2 and 7): the node harness loses its
Node (:meth:`~harness.NodeHarness.lose_node`) and kube-controller-manager's real PodGC fails and removes the pods
that were bound to it; a ``NoExecute`` taint makes the real taint-eviction controller evict a pod.

Each test serves a Node of its own (a second :class:`~harness.NodeHarness`), so the session's ``harness-node``
and the kwok Nodes are never touched.
"""

from __future__ import annotations

import threading
import time
import uuid

import pytest
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from .harness import NodeHarness

pytestmark = pytest.mark.k8s

PODGC_BOUND = 100.0
"""Seconds PodGC may take to act once the Node is deleted: a pass every 20 s and a 40 s quarantine
(``gc_controller.go`` ``gcCheckPeriod``, ``quarantineTime``) make 40-60 s, 80 s if the quarantine ends just after a
pass; the rest is margin for a loaded host."""


class PodHistory:
    """Every version of one pod a watch sees, from its creation to its DELETED event (a thread)."""

    def __init__(self, core: client.CoreV1Api, namespace: str, name: str) -> None:
        self.core, self.namespace, self.name = core, namespace, name
        self.versions: list[tuple[float, str, dict]] = []  # (monotonic time, event type, pod as the API serialized it)
        self.deleted = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self, resource_version: str) -> "PodHistory":
        self._rv = resource_version
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set() and not self.deleted.is_set():
            w = watch.Watch()
            for ev in w.stream(self.core.list_namespaced_pod, self.namespace, field_selector=f"metadata.name={self.name}",
                               resource_version=self._rv, timeout_seconds=5):
                raw = ev["raw_object"]
                self._rv = raw["metadata"]["resourceVersion"]
                self.versions.append((time.monotonic(), ev["type"], raw))
                if ev["type"] == "DELETED":
                    self.deleted.set()
                if self._stop.is_set() or self.deleted.is_set():
                    w.stop()
                    break

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


def _sleeper(h: NodeHarness, name: str, marker: str) -> client.V1Pod:
    """A pod for harness ``h`` whose one container touches ``marker`` every 0.1 s until it is killed."""
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, labels=h.pod_labels),
        spec=client.V1PodSpec(
            node_name=h.node_name, restart_policy="Never", termination_grace_period_seconds=5,
            containers=[client.V1Container(name="base", image="leoflow.test/agent:0", command=[
                "/bin/sh", "-c", f"while :; do date +%s.%N > {marker}; sleep 0.1; done"])]))


def _running(core, namespace: str, name: str, timeout: float = 60) -> client.V1Pod:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pod = core.read_namespaced_pod(name, namespace)
        if pod.status.phase == "Running":
            return pod
        time.sleep(0.2)
    raise AssertionError(f"pod {namespace}/{name} not Running after {timeout}s")


def _disruption(pod: dict) -> dict | None:
    return next((c for c in (pod.get("status") or {}).get("conditions") or [] if c["type"] == "DisruptionTarget"), None)


@pytest.fixture
def second_harness(api, tmp_path):
    """A harness serving a Node of its own (``lost-node-<random>``), stopped (and its Node deleted) at the end."""
    h = NodeHarness(api, f"lost-node-{uuid.uuid4().hex[:6]}", tmp_path / "harness")
    h.start()
    try:
        yield h
    finally:
        h.stop()
        try:
            client.CoreV1Api(api).delete_node(h.node_name)
        except ApiException as e:
            if e.status != 404:
                raise
    assert not h.errors, f"node harness errors: {h.errors}"


def test_a_lost_node_s_pod_is_failed_by_podgc_with_deletion_by_podgc_then_removed(core, namespace, second_harness,
                                                                                  tmp_path, k8s_env):
    """The harness runs a pod, then loses its Node: the pod's process is dead at once, yet nothing is reported (the
    pod stays Running in the API server, as with a vanished kubelet); the Node is deleted. The real PodGC then
    marks the pod Failed with ``DisruptionTarget`` (reason ``DeletionByPodGC``, "PodGC: node no longer exists")
    and deletes it with grace 0, within its 40-80 s; the other Nodes are still there."""
    h = second_harness
    marker = tmp_path / "alive"
    created = core.create_namespaced_pod(namespace, _sleeper(h, "lost", str(marker)))
    history = PodHistory(core, namespace, "lost").start(created.metadata.resource_version)
    try:
        _running(core, namespace, "lost")
        h.lose_node()
        lost_at = time.monotonic()
        beat = marker.read_text()
        time.sleep(0.5)  # the loop writes every 0.1 s: five missed beats show it is dead (nothing to wait for)
        assert marker.read_text() == beat, "the pod's process must die with the node"
        assert core.read_namespaced_pod("lost", namespace).status.phase == "Running"  # no kubelet says otherwise
        assert not [n for n in core.list_node().items if n.metadata.name == h.node_name]

        assert history.deleted.wait(PODGC_BOUND), f"PodGC did not delete the pod within {PODGC_BOUND}s"
    finally:
        history.stop()
    after = [(t - lost_at, kind, pod) for t, kind, pod in history.versions if t >= lost_at]
    failed = [(dt, pod) for dt, kind, pod in after if (pod.get("status") or {}).get("phase") == "Failed"]
    assert failed, f"the pod was never seen Failed: {[(k, p['status'].get('phase')) for _, k, p in after]}"
    first_dt, first_failed = failed[0]
    cond = _disruption(first_failed)
    assert cond is not None and (cond["status"], cond["reason"], cond["message"]) == (
        "True", "DeletionByPodGC", "PodGC: node no longer exists")
    # no kubelet wrote that end: the container's last status is not terminated, so the phase alone is no proof of
    # death while the task instance still heartbeats (a partitioned node runs it on; k8s review §14)
    from leoflow_airflow.runtime.kubernetes.status import pod_view

    assert pod_view(first_failed).agent is None, first_failed["status"].get("containerStatuses")
    assert after[-1][1] == "DELETED" and after[-1][2]["metadata"].get("deletionGracePeriodSeconds") == 0
    # 40 s quarantine at least; the measured figure is printed for the record (-s)
    assert first_dt >= 35, f"PodGC acted after {first_dt:.1f}s: sooner than its 40 s quarantine"
    print(f"PodGC failed the pod {first_dt:.1f}s and removed it {after[-1][0]:.1f}s after the Node's deletion")
    assert {n.metadata.name for n in core.list_node().items} >= set(k8s_env.nodes)  # the kwok Nodes are untouched


def test_a_no_execute_taint_evicts_a_pod_through_the_taint_eviction_controller(core, namespace, second_harness,
                                                                               tmp_path):
    """A ``NoExecute`` taint the pod does not tolerate, put on its Node: the real taint-eviction controller marks it
    with ``DisruptionTarget`` (reason ``DeletionByTaintManager``) and deletes it; the harness stops it as a kubelet
    does (the condition kept), reports it Failed and removes it."""
    h = second_harness
    created = core.create_namespaced_pod(namespace, _sleeper(h, "tainted", str(tmp_path / "alive")))
    history = PodHistory(core, namespace, "tainted").start(created.metadata.resource_version)
    try:
        _running(core, namespace, "tainted")
        core.patch_node(h.node_name, {"spec": {"taints": [
            {"key": "leoflow.test/drain", "value": "now", "effect": "NoExecute"}]}})
        assert history.deleted.wait(60), "the tainted pod was not removed within 60 s"
    finally:
        history.stop()
    marked = [pod for _, _, pod in history.versions if _disruption(pod)]
    assert marked, "no version carried DisruptionTarget"
    cond = _disruption(marked[-1])
    assert (cond["status"], cond["reason"]) == ("True", "DeletionByTaintManager")
    assert marked[-1]["status"]["phase"] == "Failed"  # the harness's final write kept the condition
