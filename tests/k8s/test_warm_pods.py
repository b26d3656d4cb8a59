"""Kubernetes warm pods against the real kube-apiserver and kube-controller-manager of ``scripts/k8senv`` (issue 11;
``runtime/kubernetes/warmpods.py``): the pool creates ``min_idle`` warm pods with the contract's labels, one
ownerReference to their anchor ConfigMap and the lifetime + ceiling deadline; a lagging cache never pushes the pool
past ``max_pool_size``; deleting the anchor makes the controller-manager's garbage collector remove every warm pod
of it (the "lost control plane" acceptance case: no scheduler is needed for a pool to go); and the anchors of a
scheduler job that is not alive are deleted at start, their pods following.

Last, the runtime itself: an attempt is placed on a registered idle warm pod (``Started`` with its name and UID),
the pod's ``activeDeadlineSeconds`` is PATCHed down to its age + the credential ceiling by the real API server,
and a kill deletes the warm pod, after which the attempt reads GONE.

The warm pods run on kwok nodes (the pod template binds them to ``kwok-node-0``): kwok makes them Running without
running anything, so no agent and no plugin app are involved; the ledger is an in-memory stand-in with the
contract's methods (branch warm-server owns the real one).
"""

from __future__ import annotations

import uuid
from datetime import datetime, timezone
from types import SimpleNamespace

import pytest
from kubernetes import client
from kubernetes.client import models as k8s

from leoflow_airflow import settings as leoflow_settings
from leoflow_airflow.dispatch.disposition import Disposition
from leoflow_airflow.ledger.states import AttemptRef
from leoflow_airflow.lifecycle.runtime import Exited, LaunchSpec, Presence, Started, launch_id
from leoflow_airflow.runtime.kubernetes import warmpods
from leoflow_airflow.runtime.kubernetes.informer import PodInformer
from leoflow_airflow.runtime.kubernetes.runtime import KubernetesRuntime
from tests.fakes.warm_ledger import MemoryLedger, Row

from .conftest import wait_for

pytestmark = pytest.mark.k8s

V1 = "0192f0c4-1111-7222-8333-444455556666"
TEMPLATE = k8s.V1Pod(spec=k8s.V1PodSpec(node_name="kwok-node-0", containers=[
    k8s.V1Container(name="base", image="registry.example/leoflow:test")]))


class Lagging:
    """A warm informer that has synced but shows nothing (its watch events are late)."""

    synced = True

    def views(self):
        return []


@pytest.fixture
def pool_for(api, k8s_env):
    """``pool_for(namespace, job_id, informer=None, **options) -> WarmPool`` with a started warm informer of the
    namespace (stopped at the end) and one active version ``V1``."""
    informers: list[PodInformer] = []

    def make(namespace: str, job_id: str = "41", *, informer=None, **options: str) -> warmpods.WarmPool:
        conf = {"runtime": "kubernetes", "image": "registry.example/leoflow:test", "namespace": namespace,
                "exchange_url": "http://127.0.0.1:9/leoflow", "in_cluster": "False",
                "kube_config": str(k8s_env.kubeconfig), **options}
        s = leoflow_settings.load(lambda section, key, fallback: conf.get(key, fallback))
        if informer is None:
            informer = PodInformer(api, namespace, warmpods.warm_selector(None))
            informer.start()
            informers.append(informer)
            wait_for(lambda: informer.synced, 30, what="the warm informer to sync")
        versions = [warmpods.PoolVersion(V1, "etl", "dags", "", "etl.py", active_run=True)]
        return warmpods.WarmPool(client.CoreV1Api(api), s.kubernetes, s.warm, job_id=job_id, ledger=MemoryLedger(),
                                 informer=informer, versions=lambda: versions, template=TEMPLATE,
                                 heartbeats=lambda jobs: {})  # no Airflow here: a job not alive has no row

    yield make
    for informer in informers:
        informer.stop(1)


def warm_pods(core, namespace):
    return core.list_namespaced_pod(namespace, label_selector=warmpods.warm_selector(None)).items


def _pool_gauges(statsd) -> dict[str, float]:
    """``{state: value}`` of the last ``leoflow.warm.kubernetes.pods.<state>`` gauges received."""
    out = {}
    for state in ("idle", "starting", "busy", "draining"):
        values = statsd.gauges(f"airflow.leoflow.warm.kubernetes.pods.{state}")
        if values:
            out[state] = values[-1]
    return out


def test_the_pool_keeps_min_idle_warm_pods_with_labels_owner_and_deadline(pool_for, namespace, core, statsd):
    """Also: every synced tick sends this job's warm pods by state (``leoflow.warm.kubernetes.pods.<state>``
    gauges, through Airflow's Stats to a StatsD listener): none before the first create, two starting once the
    cache shows them, one idle and one starting once one registered."""
    pool = pool_for(namespace, warm_min_idle="2", warm_max_pool_size="3", warm_max_lifetime_seconds="1800")
    report = pool.tick()
    assert len(report.created) == 2 and not report.errors, report
    zeros = {"idle": 0, "starting": 0, "busy": 0, "draining": 0}
    wait_for(lambda: _pool_gauges(statsd) == zeros, 5, what="the first tick's gauges (no pod seen yet)")
    wait_for(lambda: len([v for v in pool.informer.views() if v.phase == "Running"]) == 2, 30,
             what="kwok to run both warm pods")
    for _ in range(3):
        assert pool.tick().created == []  # two Starting pods (no ledger row yet) fill min_idle
    wait_for(lambda: _pool_gauges(statsd) == {**zeros, "starting": 2}, 5, what="two starting warm pods gauged")
    first = next(v for v in pool.informer.views())
    pool.ledger.rows[first.uid] = Row(first.uid, first.name, registered_at=datetime.now(timezone.utc),
                                      last_seen_at=datetime.now(timezone.utc))
    pool.tick()
    wait_for(lambda: _pool_gauges(statsd) == {**zeros, "idle": 1, "starting": 1}, 5,
             what="one idle and one starting warm pod gauged")
    anchor = core.read_namespaced_config_map(warmpods.anchor_name("41", V1), namespace)
    assert anchor.metadata.labels[warmpods.ANCHOR_LABEL] == "true"
    assert anchor.metadata.labels[warmpods.JOB_LABEL] == "41" and anchor.metadata.labels[warmpods.VERSION_LABEL] == V1
    pods = warm_pods(core, namespace)
    assert len(pods) == 2
    for pod in pods:
        labels = pod.metadata.labels
        assert (labels["leoflow.io/warm"], labels["leoflow.io/dag-version"], labels["leoflow.io/scheduler-job"]) == \
            ("true", V1, "41")
        assert labels["leoflow.io/tenant"] and "leoflow.io/ti-id" not in labels
        (owner,) = pod.metadata.owner_references
        assert (owner.kind, owner.name, owner.uid, owner.controller, owner.block_owner_deletion) == (
            "ConfigMap", anchor.metadata.name, anchor.metadata.uid, True, False)
        assert pod.spec.active_deadline_seconds == 1800 + 604800
        assert pod.spec.containers[0].args == ["python", "-m", "leoflow_agent", "warm-pod"]


def test_a_lagging_cache_never_pushes_the_pool_past_max_pool_size(pool_for, namespace, core):
    pool = pool_for(namespace, informer=Lagging(), warm_min_idle="3", warm_max_pool_size="3")
    created = []
    for _ in range(5):  # none of its creates ever shows in the cache: the expectations hold the places
        created += pool.tick().created
    assert len(created) == 3
    assert len(warm_pods(core, namespace)) == 3


def test_deleting_the_anchor_makes_the_garbage_collector_remove_its_warm_pods(pool_for, namespace, core):
    pool = pool_for(namespace, warm_min_idle="2", warm_max_pool_size="2")
    assert len(pool.tick().created) == 2
    wait_for(lambda: len(warm_pods(core, namespace)) == 2, 10, what="two warm pods")
    core.delete_namespaced_config_map(warmpods.anchor_name("41", V1), namespace)  # the scheduler is gone
    wait_for(lambda: not warm_pods(core, namespace), 60, what="the garbage collector to remove the warm pods")


def test_the_anchors_of_a_dead_scheduler_job_are_deleted_at_start_and_their_idle_pods_follow(pool_for, namespace,
                                                                                            core):
    """Job 900 is not alive: its anchor goes and its idle warm pod with it, while its pod that holds an attempt
    is moved under the successor's anchor and keeps running; job 901 is alive: untouched."""
    dead = pool_for(namespace, job_id="900", warm_min_idle="2", warm_max_pool_size="2")
    alive = pool_for(namespace, job_id="901", warm_min_idle="1", warm_max_pool_size="1")
    assert len(dead.tick().created) == 2 and len(alive.tick().created) == 1
    wait_for(lambda: len([p for p in warm_pods(core, namespace) if p.status.phase == "Running"]) == 3, 30,
             what="three Running warm pods")
    busy, idle = sorted((p for p in warm_pods(core, namespace)
                         if p.metadata.labels["leoflow.io/scheduler-job"] == "900"), key=lambda p: p.metadata.name)
    successor = pool_for(namespace, job_id="902", warm_min_idle="1")
    successor.ledger.rows[busy.metadata.uid] = Row(busy.metadata.uid, busy.metadata.name, state="busy",
                                                   ref=AttemptRef(str(uuid.uuid4()), 1, 1), namespace=namespace)
    deleted = successor.sweep_dead_anchors(lambda jobs: {"901"} & jobs)  # Airflow: job 900 is not alive
    assert deleted == [warmpods.anchor_name("900", V1)]
    names = {cm.metadata.name for cm in core.list_namespaced_config_map(namespace).items}
    assert warmpods.anchor_name("901", V1) in names and warmpods.anchor_name("900", V1) not in names
    assert warmpods.anchor_name("902", V1) in names  # the busy pod's new owner
    wait_for(lambda: idle.metadata.uid not in {p.metadata.uid for p in warm_pods(core, namespace)}, 60,
             what="the dead job's idle warm pod to be garbage collected")
    # the busy pod was re-owned before the anchor went, so the collector never saw it as the anchor's dependent
    kept = core.read_namespaced_pod(busy.metadata.name, namespace)
    assert kept.metadata.uid == busy.metadata.uid and kept.metadata.deletion_timestamp is None
    assert kept.metadata.labels["leoflow.io/scheduler-job"] == "902"
    (owner,) = kept.metadata.owner_references
    assert (owner.name, owner.controller) == (warmpods.anchor_name("902", V1), True)
    assert {p.metadata.labels["leoflow.io/scheduler-job"] for p in warm_pods(core, namespace)} == {"901", "902"}


def test_the_runtime_places_an_attempt_on_a_warm_pod_lowers_its_deadline_and_a_kill_deletes_it(
        k8s_env, namespace, core, tmp_path, statsd):
    """Also counted through Airflow's Stats: the placement as ``leoflow.warm.kubernetes.hit``, and an attempt whose
    ``executor_config`` asks for its own pod template as ``leoflow.warm.kubernetes.miss`` (it goes cold, where the
    pod builder refuses that key)."""
    template = tmp_path / "pod.yaml"
    template.write_text("spec:\n  nodeName: kwok-node-0\n  containers:\n  - name: base\n")
    conf = {"runtime": "kubernetes", "image": "registry.example/leoflow:test", "namespace": namespace,
            "exchange_url": "http://127.0.0.1:9/leoflow", "in_cluster": "False",
            "kube_config": str(k8s_env.kubeconfig), "pod_template_file": str(template),
            "warm_min_idle": "1", "warm_max_pool_size": "1"}
    s = leoflow_settings.load(lambda section, key, fallback: conf.get(key, fallback))
    ledger = MemoryLedger()
    versions = [warmpods.PoolVersion(V1, "etl", "dags", "", "etl.py", active_run=True)]
    rt = KubernetesRuntime(s, mutation_hook=False, warm_ledger_factory=lambda: ledger, warm_versions=lambda: versions,
                           jobs_alive=lambda jobs: set())
    rt.job_id = 77
    rt.start()
    events: list = []

    def poll():
        events.extend(rt.poll())

    try:
        wait_for(lambda: rt.admit() is None, 30, what="the runtime to admit launches")

        def running_warm_pod():
            poll()
            views = [v for v in rt.warm_informer.views() if v.phase == "Running"]
            return views[0] if views else None

        pod = wait_for(running_warm_pod, 30, interval=0.05, what="a Running warm pod")
        now = datetime.now(timezone.utc)
        ledger.rows[pod.uid] = Row(pod.uid, pod.name, registered_at=now, last_seen_at=now, namespace=namespace)
        wait_for(lambda: poll() or rt.warm.row(pod.uid)[0] is not None, 10, interval=0.05,
                 what="a tick to read the registered row")

        ref = AttemptRef(str(uuid.uuid4()), 1, 1)
        ti = SimpleNamespace(dag_id="etl", task_id="t", run_id="r", map_index=-1, executor_config=None,
                             dag_version_id=uuid.UUID(V1))
        assert rt.launch(LaunchSpec(launch_id(ref), ref, SimpleNamespace(ti=ti))).disposition is \
            Disposition.DISPATCHED
        wait_for(lambda: poll() or any(isinstance(e, Started) for e in events), 10, interval=0.05,
                 what="Started")
        started = next(e for e in events if isinstance(e, Started))
        assert started.facts == {"pod_name": pod.name, "pod_uid": pod.uid}
        assert "leoflow.warm.kubernetes.hit" in statsd.wait_names({"leoflow.warm.kubernetes.hit"})
        assert "leoflow.warm.kubernetes.miss" not in statsd.names("airflow.")
        cold_ref = AttemptRef(str(uuid.uuid4()), 1, 1)
        cold_ti = SimpleNamespace(**{**vars(ti), "executor_config": {"pod_template_file": "/etc/other.yaml"}})
        assert rt.launch(LaunchSpec(launch_id(cold_ref), cold_ref, SimpleNamespace(ti=cold_ti))).disposition is \
            Disposition.REFUSED
        assert "leoflow.warm.kubernetes.miss" in statsd.wait_names({"leoflow.warm.kubernetes.miss"})
        ceiling = s.kubernetes.credential_ceiling_seconds
        created_with = 3600 + ceiling

        def lowered():
            got = core.read_namespaced_pod(pod.name, namespace).spec.active_deadline_seconds
            return got if got < created_with else None

        deadline = wait_for(lowered, 10, what="the deadline PATCH")
        assert ceiling <= deadline <= ceiling + 120  # the pod's age (seconds) + the ceiling, never raised

        ledger.rows[pod.uid] = Row(pod.uid, pod.name, state="busy", ref=ref, registered_at=now, taken_at=now,
                                   namespace=namespace)
        attempt = SimpleNamespace(ref=ref, pod_name=pod.name, pod_uid=pod.uid)
        wait_for(lambda: poll() or rt.observe([attempt])[ref] is Presence.LIVE, 10, interval=0.05,
                 what="the attempt to read LIVE on its busy warm pod")
        assert rt.kill(attempt, grace=0) is Presence.LIVE
        wait_for(lambda: not [p for p in warm_pods(core, namespace) if p.metadata.uid == pod.uid], 30,
                 what="the killed attempt's warm pod to be deleted")
        wait_for(lambda: poll() or rt.observe([attempt])[ref] is Presence.GONE, 15, interval=0.05,
                 what="the attempt to read GONE")
        # the pod is gone with no kubelet's word of its end (grace 0, kwok): poll(), which knows no heartbeat, does not
        # end the attempt on that (a partitioned node runs such a pod on); observe() with the heartbeat does, above
        poll()
        assert not [e for e in events if isinstance(e, Exited) and e.launch_id == launch_id(ref)]
    finally:
        rt.stop(timeout=5)
