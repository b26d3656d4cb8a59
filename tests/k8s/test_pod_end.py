"""How a task pod's end is settled, from the status a real kube-apiserver holds (issue 10 item 2).

Real parts: the kube-apiserver of ``scripts/k8senv`` and its Eviction API; the ``KubernetesRuntime`` (its pod
informer, its ``evidence()``); the attempt lifecycle over it with the ledger on SQLite; the node harness playing
the kubelet, whose switches report what a kubelet and a container runtime report: an OOM kill (``OOMKilled``, exit
137) and a pod whose ``activeDeadlineSeconds`` ran out (``DeadlineExceeded``). Airflow's side is ``FakeAirflow``
(its rows, the re-drives and replays the lifecycle asked for): what the reconciler decides is read from there and
from the ledger. The pods run ``sleep`` under the harness (no agent); a test that wants a record puts it in the
termination file through an annotation.

The same against a real Airflow (a task that really re-runs, ``max_tries`` up by one, the Log rows in the UI) is
``tests/integration/test_kube_pod_ends_e2e.py`` (and, for a lost Node, ``test_kube_faults_e2e.py``).
"""

from __future__ import annotations

import uuid

import pytest
import sqlalchemy as sa
from kubernetes import client

from fakes.runtime import FakeAirflow
from leoflow_agent import outcome
from leoflow_airflow import settings as leoflow_settings
from leoflow_airflow.dispatch.disposition import Disposition
from leoflow_airflow.ledger.models import metadata
from leoflow_airflow.ledger.states import AttemptRef, AttemptState, Resolution
from leoflow_airflow.ledger.store import LedgerStore
from leoflow_airflow.lifecycle.actions import Fail, TaskEvent
from leoflow_airflow.lifecycle.core import Lifecycle
from leoflow_airflow.runtime.kubernetes.runtime import KubernetesRuntime

from .conftest import wait_for

pytestmark = pytest.mark.k8s

RECORD_ANNOTATION = "leoflow.test/record"
TEMPLATE = """\
apiVersion: v1
kind: Pod
metadata:
  labels: {{leoflow.test/harness: {node}}}
spec:
  nodeName: {node}
  terminationGracePeriodSeconds: 5
  containers:
  - name: base
    image: registry.example/leoflow:test
    command: ["/bin/sh", "-c", 'printf %s "$TEST_RECORD" > /dev/termination-log; exec sleep 3600', "sh"]
    env:
    - name: TEST_RECORD
      valueFrom: {{fieldRef: {{fieldPath: "metadata.annotations['{annotation}']"}}}}
"""
"""The operator's pod template (``{node}``: the harness's Node): on the harness node, the agent container a shell that writes the annotation's
record (if any) as its termination message, then sleeps until it is killed."""


class Scene:
    """One lifecycle over a real ``KubernetesRuntime`` in ``namespace``, the ledger on SQLite, Airflow faked."""

    def __init__(self, k8s_env, harness, namespace: str, tmp_path, **options: str) -> None:
        template = tmp_path / "pod.yaml"
        template.write_text(TEMPLATE.format(node=harness.node_name, annotation=RECORD_ANNOTATION))
        conf = {"runtime": "kubernetes", "image": "registry.example/leoflow:test",
                "exchange_url": "http://127.0.0.1:9/leoflow", "namespace": namespace, "in_cluster": "False",
                "kube_config": str(k8s_env.kubeconfig), "pod_template_file": str(template),
                "runtime_dir": str(tmp_path / "rt"), "reap_grace": "3600",  # no reaper: the pod's end decides
                "sweep_interval": "0", **options}  # every cycle a presence pass, as the checks count cycles
        self.settings = leoflow_settings.load(lambda section, key, fallback: conf.get(key, fallback))
        self.harness, self.namespace = harness, namespace
        self.engine = sa.create_engine(f"sqlite:///{tmp_path / 'ledger.db'}")
        metadata.create_all(self.engine)
        self.ledger = LedgerStore(self.engine)
        self.airflow = FakeAirflow()
        self.runtime = KubernetesRuntime(self.settings, mutation_hook=False)
        self.runtime.start()
        self.life = Lifecycle(ledger=self.ledger, runtime=self.runtime, airflow=self.airflow, settings=self.settings)
        self.actions: list = []

    def close(self) -> None:
        self.runtime.stop(timeout=5)
        self.engine.dispose()

    def cycle(self) -> None:
        self.actions.extend(self.life.cycle())

    def running(self, *, try_number: int = 1, record_state: str | None = None):
        """Dispatch a try of the logical TI (dag, run, task); once its pod runs, Airflow holds it RUNNING.
        ``record_state``: the termination file holds that recorded report. Returns (workload, ref, pod name)."""
        from airflow.executors.workloads import BundleInfo, ExecuteTask
        from airflow.executors.workloads.task import TaskInstanceDTO
        from kubernetes.client import models as k8s

        ti_id = str(uuid.uuid4())
        annotations = {}
        if record_state is not None:
            record = outcome.record_for_state(
                record_state, {"state": record_state, "end_date": "2026-12-01T00:00:00Z", "task_outlets": [],
                               "outlet_events": []},
                attempt=outcome.AttemptIdentity(ti_id, try_number, 1), api_version="2025-09-23")
            annotations[RECORD_ANNOTATION] = outcome.encode(record)
        override = k8s.V1Pod(metadata=k8s.V1ObjectMeta(annotations=annotations))
        ti = TaskInstanceDTO(id=uuid.UUID(ti_id), task_id="task", dag_id="dag", run_id="run", try_number=try_number,
                             dag_version_id=uuid.uuid4(), map_index=-1, pool_slots=1, priority_weight=1,
                             queue="default", executor_config={"pod_override": override})
        workload = ExecuteTask(token="", dag_rel_path="dag.py", bundle_info=BundleInfo(name="dags"), log_path="x.log",
                               ti=ti)
        self.airflow.put(ti_id, "queued", try_number=try_number, logical=("dag", "run", "task", -1))
        wait_for(lambda: self.runtime.admit() is None, 30, what="the runtime to admit launches")
        assert self.life.dispatch_task(workload).disposition is Disposition.DISPATCHED
        ref = self.ledger.current(ti_id).ref

        def live():
            self.cycle()
            row = self.ledger.get(ref)
            if row.state != AttemptState.DISPATCHED or not row.pod_uid:
                return None
            run = self.harness.run_named(self.namespace, row.pod_name)
            view = self.runtime.informer.get(row.pod_name)
            return row if run is not None and view is not None and view.phase == "Running" else None

        row = wait_for(live, 60, what=f"the pod of {ref} running")
        self.airflow.set_state(ti_id, "running")
        return workload, ref, row.pod_name

    def settled(self, ref: AttemptRef):
        """Cycle until the attempt's ledger row is CLOSED; the row."""
        def closed():
            self.cycle()
            row = self.ledger.get(ref)
            return row if row.state == AttemptState.CLOSED else None

        return wait_for(closed, 60, what=f"{ref} settled")


@pytest.fixture
def scene(k8s_env, harness, namespace, tmp_path):
    made = Scene(k8s_env, harness, namespace, tmp_path)
    yield made
    made.close()


def test_an_oom_killed_pod_is_redriven_once_then_fails_through_airflow_naming_it(scene):
    """The harness reports the agent container ``OOMKilled``, exit 137: re-driven on the infra budget with the
    reason in the TI's Log row; the re-driven try OOM-killed again fails through Airflow's own path with it."""
    _, first, pod1 = scene.running()
    scene.harness.oom_kill(scene.namespace, pod1)
    row = scene.settled(first)
    assert row.resolution == Resolution.OOM_REDRIVE
    assert scene.airflow.redrives == [first.ti_id]
    assert scene.airflow.redrive_reasons == [f"OOMKilled, exit 137, container base (pod {pod1})"]
    assert not [a for a in scene.actions if isinstance(a, Fail)]

    w2, second, pod2 = scene.running(try_number=2)  # the try Airflow's reset made
    scene.harness.oom_kill(scene.namespace, pod2)
    row = scene.settled(second)
    assert row.resolution == Resolution.EXECUTOR_FAILED
    assert scene.airflow.redrives == [first.ti_id]  # no second re-drive
    [fail] = [a for a in scene.actions if isinstance(a, Fail)]
    assert fail.key == w2.key and fail.reason.startswith(f"OOMKilled, exit 137, container base (pod {pod2})")
    assert [(e.key, e.event, e.extra) for e in scene.actions if isinstance(e, TaskEvent)] == [
        (w2.key, "leoflow task failed", fail.reason)]


def test_a_success_recorded_then_oom_killed_is_a_success(scene):
    """The termination message holds a recorded success and the container is OOM-killed after it: the record
    wins; the success is replayed, nothing re-runs."""
    _, ref, pod = scene.running(record_state="success")
    scene.harness.oom_kill(scene.namespace, pod)
    row = scene.settled(ref)
    assert row.resolution == Resolution.REPLAYED
    assert [r.state for r in scene.airflow.replays] == ["success"]
    assert scene.airflow.redrives == [] and not [a for a in scene.actions if isinstance(a, Fail)]


def test_an_eviction_through_the_eviction_api_is_an_infra_redrive(scene, api, core):
    """``create_namespaced_pod_eviction`` on a pod no PodDisruptionBudget covers: the API server adds
    ``DisruptionTarget`` (reason ``EvictionByEvictionAPI``) and deletes the pod; the harness stops it as a
    kubelet does (keeping that condition) and removes it. Re-driven on the infra budget, naming the eviction;
    never a task failure."""
    assert client.PolicyV1Api(api).list_namespaced_pod_disruption_budget(scene.namespace).items == []
    _, ref, pod = scene.running()
    core.create_namespaced_pod_eviction(pod, scene.namespace, client.V1Eviction(
        metadata=client.V1ObjectMeta(name=pod, namespace=scene.namespace)))
    row = scene.settled(ref)
    assert row.resolution == Resolution.INFRA_REDRIVE
    assert scene.airflow.redrive_reasons == [
        f"pod {pod} evicted through the Eviction API (a drain, an autoscaler) (DisruptionTarget EvictionByEvictionAPI)"]
    assert not [a for a in scene.actions if isinstance(a, (Fail, TaskEvent))]
    wait_for(lambda: not [p for p in core.list_namespaced_pod(scene.namespace).items if p.metadata.name == pod], 30,
             what="the evicted pod to be removed")


def test_a_pod_past_its_deadline_is_a_task_failure_never_an_infra_loss(scene, core):
    """The harness ends the pod as the kubelet's ``activeDeadlineSeconds`` check does (Failed, reason
    ``DeadlineExceeded``): a task failure through Airflow's path with that reason, never re-driven."""
    w, ref, pod = scene.running()
    scene.harness.exceed_deadline(scene.namespace, pod)
    row = scene.settled(ref)
    status = core.read_namespaced_pod(pod, scene.namespace).status
    assert (status.phase, status.reason) == ("Failed", "DeadlineExceeded")
    assert row.resolution == Resolution.EXECUTOR_FAILED and scene.airflow.redrives == []
    [fail] = [a for a in scene.actions if isinstance(a, Fail)]
    assert fail.key == w.key
    assert fail.reason.startswith(f"DeadlineExceeded: Pod was active on the node longer than the specified deadline "
                                  f"(pod {pod}")
    assert [e.extra for e in scene.actions if isinstance(e, TaskEvent)] == [fail.reason]


VALVE = 4.0
"""``[leoflow] pod_termination_valve`` of the unreachable-node test, seconds."""
DELETE_GRACE = 3
"""The grace of the test's delete (as the agent-lost reaper's kill or the taint manager would send one)."""


def test_a_deleted_pod_on_an_unreachable_node_is_redriven_once_the_valve_opens(k8s_env, api, core, namespace, tmp_path):
    """Issue 10 item 3. A pod runs on a Node of its own; the node becomes unreachable (its harness stops: nothing
    runs, nothing reports, the Node object stays). The pod is deleted with grace 3 s: leoflow's finalizer and the
    missing kubelet keep it, ``deletionTimestamp`` set and phase still Running, for ever. leoflow waits for its
    terminated status (and record) for the grace plus ``[leoflow] pod_termination_valve`` (4 s), never less, then
    settles it as an infra loss naming the pod, its node and the valve: the TI is re-driven on the infra budget,
    never failed; the pod, untouched by anyone else, is still there, Running and deleting."""
    import time

    from .harness import NodeHarness

    node = NodeHarness(api, f"unreachable-{uuid.uuid4().hex[:6]}", tmp_path / "harness").start()
    scene = Scene(k8s_env, node, namespace, tmp_path, pod_termination_valve=str(VALVE))
    try:
        _, ref, pod = scene.running()
        node.become_unreachable()
        deleted_at = time.monotonic()
        core.delete_namespaced_pod(pod, namespace, body=client.V1DeleteOptions(grace_period_seconds=DELETE_GRACE))
        row = scene.settled(ref)
        waited = time.monotonic() - deleted_at
        kept = core.read_namespaced_pod(pod, namespace)
    finally:
        scene.close()
        node.stop()
        core.delete_node(node.node_name)  # PodGC removes its pod, as for a lost machine
    assert waited >= DELETE_GRACE + VALVE, waited  # it waited for the terminated status first
    assert row.resolution == Resolution.INFRA_REDRIVE
    [reason] = scene.airflow.redrive_reasons
    assert reason.startswith(f"pod {pod} on node {node.node_name} was deleted and reported no end "), reason
    assert f"its record could not be read ([leoflow] pod_termination_valve {VALVE:g} s)" in reason, reason
    assert not [a for a in scene.actions if isinstance(a, (Fail, TaskEvent))]
    assert kept.metadata.deletion_timestamp is not None and kept.status.phase == "Running"
