"""Dispatch-lost for pods (issue 10 item 1), through the real ``KubernetesRuntime`` and the attempt lifecycle,
from the status a real kube-apiserver holds.

Real parts: the kube-apiserver of ``scripts/k8senv``; the ``KubernetesRuntime`` (its informer, its
``start_progress()``, its UID-pinned deletes); the lifecycle over it with the ledger on SQLite; the node harness
playing the kubelet (``hold_pods`` keeps a pod Pending as a node still pulling its image does; released, it runs
the pod and reports its container ``running.startedAt``). Airflow's side is ``FakeAirflow``; the TI stays QUEUED
throughout (no agent reaches ``/run``: the pods run ``sleep``).

Statuses the test writes itself, as their owners would (k8senv runs no kube-scheduler and the harness pulls no
image): a kubelet's ``waiting`` reason (``ContainerCreating`` while it pulls, ``ErrImagePull`` with the
runtime's message; as ``test_kube_runtime.py`` does), and kube-scheduler's ``PodScheduled`` False
``Unschedulable`` condition (a status patch with its message and ``lastTransitionTime``, as the scheduler's
``updatePod`` writes it on a failed scheduling cycle).

The reapers' clock (``Lifecycle(utcnow=…)``) is moved ahead instead of sleeping through thresholds: what each
test shows is what the reaper decides at a given age, from the pod's real status.

The same scene drives ``LeoflowExecutor``'s dispatch step (``_process_workloads``) to each disposition it can
reach in one process (``dispatched``, ``deferred``, ``stale``, ``refused``), each counted by name at a StatsD
listener.
"""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timedelta, timezone

import pytest
import sqlalchemy as sa

from fakes.runtime import FakeAirflow
from leoflow_airflow import settings as leoflow_settings
from leoflow_airflow.dispatch.disposition import Disposition
from leoflow_airflow.ledger.models import metadata
from leoflow_airflow.ledger.states import AttemptState, Resolution
from leoflow_airflow.ledger.store import LedgerStore
from leoflow_airflow.lifecycle.actions import Fail, Reoffer, TaskEvent
from leoflow_airflow.lifecycle.core import Lifecycle
from leoflow_airflow.lifecycle.runtime import StartState
from leoflow_airflow.runtime.kubernetes.runtime import KubernetesRuntime

from .conftest import HARNESS_NODE, wait_for

pytestmark = pytest.mark.k8s

IMAGE = "registry.example/leoflow:huge"
LOG_PATH = "dag_id=dag/run_id=run/task_id=task/attempt=1.log"


def template(*, bound: bool) -> str:
    """The operator's pod template: the agent container sleeps (no agent: the TI stays QUEUED); bound to the
    harness node, or unbound (no scheduler runs here: it stays Pending)."""
    node = f"  nodeName: {HARNESS_NODE}\n" if bound else ""
    return f"""\
apiVersion: v1
kind: Pod
metadata:
  labels: {{leoflow.test/harness: {HARNESS_NODE}}}
spec:
{node}  terminationGracePeriodSeconds: 5
  containers:
  - name: base
    image: {IMAGE}
    command: ["/bin/sh", "-c", "exec sleep 3600"]
"""


class Scene:
    """One lifecycle over a real ``KubernetesRuntime`` whose reapers' clock runs ``ahead`` seconds early."""

    def __init__(self, k8s_env, harness, namespace: str, tmp_path, *, bound: bool = True) -> None:
        path = tmp_path / "pod.yaml"
        path.write_text(template(bound=bound))
        conf = {"runtime": "kubernetes", "image": IMAGE, "exchange_url": "http://127.0.0.1:9/leoflow",
                "namespace": namespace, "in_cluster": "False", "kube_config": str(k8s_env.kubeconfig),
                "pod_template_file": str(path), "runtime_dir": str(tmp_path / "rt"), "reap_grace": "0",
                "dispatch_lost_threshold": "120", "pod_unschedulable_timeout": "300",
                "sweep_interval": "0"}  # every cycle a presence pass: the reapers' checks count cycles
        self.settings = leoflow_settings.load(lambda section, key, fallback: conf.get(key, fallback))
        self.harness, self.namespace = harness, namespace
        self.engine = sa.create_engine(f"sqlite:///{tmp_path / 'ledger.db'}")
        metadata.create_all(self.engine)
        self.ledger = LedgerStore(self.engine)
        self.airflow = FakeAirflow()
        self.runtime = KubernetesRuntime(self.settings, mutation_hook=False)
        self.runtime.start()
        self.ahead = 0.0
        self.life = Lifecycle(ledger=self.ledger, runtime=self.runtime, airflow=self.airflow, settings=self.settings,
                              utcnow=lambda: datetime.now(timezone.utc) + timedelta(seconds=self.ahead))
        self.actions: list = []

    def close(self) -> None:
        self.runtime.stop(timeout=5)
        self.engine.dispose()

    def cycle(self) -> list:
        out = self.life.cycle()
        self.actions.extend(out)
        return out

    def workload(self, *, state: str = "queued", task_id: str = "task", executor_config: dict | None = None):
        """A new ``ExecuteTask`` (try 1) whose TI row ``FakeAirflow`` holds in ``state``."""
        from airflow.executors.workloads import BundleInfo, ExecuteTask
        from airflow.executors.workloads.task import TaskInstanceDTO

        ti = TaskInstanceDTO(id=uuid.uuid4(), task_id=task_id, dag_id="dag", run_id="run", try_number=1,
                             dag_version_id=uuid.uuid4(), map_index=-1, pool_slots=1, priority_weight=1,
                             queue="default", executor_config=executor_config)
        self.airflow.put(str(ti.id), state, try_number=1, logical=("dag", "run", task_id, -1))
        return ExecuteTask(token="", dag_rel_path="dag.py", bundle_info=BundleInfo(name="dags"), log_path=LOG_PATH,
                           ti=ti)

    def dispatch(self, workload=None):
        """Dispatch a QUEUED TI (or re-dispatch ``workload``); once its pod is created, return (workload, ledger
        row)."""
        if workload is None:
            workload = self.workload()
        wait_for(lambda: self.runtime.admit() is None, 30, what="the runtime to admit launches")
        assert self.life.dispatch_task(workload).disposition is Disposition.DISPATCHED
        ref = self.ledger.current(str(workload.ti.id)).ref

        def created():
            self.cycle()
            row = self.ledger.get(ref)
            return row if row.state == AttemptState.DISPATCHED and row.pod_uid and \
                self.runtime.informer.get(row.pod_name) is not None else None

        return workload, wait_for(created, 60, what=f"the pod of {ref} created")

    def progress(self, row, state: StartState, *, waiting: str | None = None):
        """Cycle until the runtime reports ``state`` for the attempt of ``row`` (its pod's status reached the
        informer); that progress."""
        def reached():
            self.cycle()
            view = self.runtime.informer.get(row.pod_name)
            if waiting is not None and (view is None or view.waiting_reason != waiting):
                return None
            got = self.runtime.start_progress([row]).get(row.ref)
            return got if got is not None and got.state is state else None

        return wait_for(reached, 30, what=f"{row.ref} {state}")

    def reap_passes(self, row, passes: int = 5) -> None:
        """Run ``passes`` full cycles (reconcile and reap) and check the attempt was left alone."""
        for _ in range(passes):
            self.cycle()
        assert self.ledger.get(row.ref).state == AttemptState.DISPATCHED
        assert not [a for a in self.actions if isinstance(a, (TaskEvent, Fail, Reoffer))]
        assert self.runtime.informer.get(row.pod_name).deleting is False

    def settled(self, ref):
        def closed():
            self.cycle()
            got = self.ledger.get(ref)
            return got if got.state == AttemptState.CLOSED else None

        return wait_for(closed, 60, what=f"{ref} settled")

    def kubelet_waiting(self, core, name: str, reason: str, message: str = "") -> None:
        """Write the agent container's ``waiting`` state as a kubelet does (the pod stays Pending)."""
        state = {"reason": reason, **({"message": message} if message else {})}
        core.patch_namespaced_pod_status(name, self.namespace, {"status": {"phase": "Pending", "containerStatuses": [{
            "name": "base", "image": IMAGE, "imageID": "", "ready": False, "restartCount": 0,
            "state": {"waiting": state}}]}})


@pytest.fixture
def scene(k8s_env, harness, namespace, tmp_path):
    made = Scene(k8s_env, harness, namespace, tmp_path)
    yield made
    harness.hold_pods(None)
    harness.release_held()
    made.close()


def test_a_pod_slow_to_pull_its_image_is_not_dispatch_lost_and_its_clock_starts_when_the_agent_runs(scene, core,
                                                                                                     statsd):
    """Held Pending (the node pulls a large image: ``ContainerCreating``) an hour past the dispatch: progress, never
    killed. Released, its agent container runs: the dispatch-lost clock starts at its ``startedAt``, so it is left
    alone within ``dispatch_lost_threshold`` of that and killed past it (its agent never reached /run), counted
    as ``leoflow.reaper.dispatch-lost`` and ``leoflow.recovery.redispatched`` (Airflow's Stats, a StatsD
    listener)."""
    scene.harness.hold_pods(lambda pod: True)
    _, row = scene.dispatch()
    scene.kubelet_waiting(core, row.pod_name, "ContainerCreating")
    scene.ahead = 3600.0  # an hour after the dispatch (dispatch_lost_threshold: 120 s)
    pulling = scene.progress(row, StartState.STARTING, waiting="ContainerCreating")
    assert "waiting ContainerCreating" in pulling.reason
    scene.reap_passes(row)

    scene.ahead = 0.0
    [uid] = scene.harness.release_held(row.pod_uid)
    assert uid == row.pod_uid
    started = scene.progress(row, StartState.STARTED)
    assert abs((datetime.now(timezone.utc) - started.since).total_seconds()) < 30  # the harness's startedAt
    scene.reap_passes(row)

    scene.ahead = 121.0  # 121 s after the agent container started
    done = scene.settled(row.ref)
    [event] = [a for a in scene.actions if isinstance(a, TaskEvent)]
    assert event.event == "leoflow dispatch-lost" and "after its agent started" in event.extra
    assert done.resolution == Resolution.REDISPATCHED  # the reconciler's path, as before
    assert [a for a in scene.actions if isinstance(a, Reoffer)]
    want = {"leoflow.reaper.dispatch-lost", "leoflow.recovery.redispatched"}
    assert want <= statsd.wait_names(want), statsd.names("airflow.")


def test_an_image_that_cannot_be_pulled_fails_the_ti_with_the_kubelets_reason_in_its_task_log(
        scene, core, tmp_path, monkeypatch, statsd):
    """``ErrImagePull``: within the grace nothing happens; past it the pod is deleted (UID precondition) and the TI
    fails through Airflow's path with ``image "…" cannot be pulled: <message>``, which the executor writes into
    the task log the UI reads, and a Log row names it; ``leoflow.reaper.start-rejected`` is counted then, not
    within the grace."""
    from airflow.utils.state import TaskInstanceState

    from leoflow_airflow.executor import LeoflowExecutor

    scene.harness.hold_pods(lambda pod: True)
    w, row = scene.dispatch()
    said = f'failed to pull and unpack image "{IMAGE}": not found'
    scene.kubelet_waiting(core, row.pod_name, "ErrImagePull", said)
    stuck = scene.progress(row, StartState.REJECTED, waiting="ErrImagePull")
    reason = f'image "{IMAGE}" cannot be pulled: {said} (ErrImagePull, pod {row.pod_name})'
    assert stuck.reason == reason
    scene.reap_passes(row)  # within the grace: the kubelet may still pull it
    scene.kubelet_waiting(core, row.pod_name, "ImagePullBackOff", f'Back-off pulling image "{IMAGE}"')
    backoff = scene.progress(row, StartState.REJECTED, waiting="ImagePullBackOff")
    assert backoff.since == stuck.since  # the kubelet's back-off is the same failure: its grace runs on
    scene.kubelet_waiting(core, row.pod_name, "ErrImagePull", said)
    scene.progress(row, StartState.REJECTED, waiting="ErrImagePull")

    assert "leoflow.reaper.start-rejected" not in statsd.names("airflow.")
    scene.ahead = 61.0
    done = scene.settled(row.ref)
    assert (done.resolution, done.detail) == (Resolution.EXECUTOR_FAILED, reason)
    want = {"leoflow.reaper.start-rejected", "leoflow.attempt.settled.executor_failed"}
    assert want <= statsd.wait_names(want), statsd.names("airflow.")
    assert [(e.event, e.extra) for e in scene.actions if isinstance(e, TaskEvent)] == [
        ("leoflow start-rejected", reason)]
    [fail] = [a for a in scene.actions if isinstance(a, Fail)]
    assert (fail.key, fail.reason, fail.log_path) == (w.key, reason, LOG_PATH)
    assert not [a for a in scene.actions if isinstance(a, Reoffer)] and scene.airflow.redrives == []
    # deleted (UID precondition); leoflow's finalizer keeps it until the settled attempt's next collect
    def gone() -> bool:
        scene.cycle()
        return not core.list_namespaced_pod(scene.namespace).items

    wait_for(gone, 60, what="the rejected pod released and gone")

    # the executor performs the Fail: Airflow's failure path, and the reason in the task log
    monkeypatch.setenv("AIRFLOW__LOGGING__BASE_LOG_FOLDER", str(tmp_path / "logs"))
    monkeypatch.setenv("AIRFLOW__LOGGING__REMOTE_LOGGING", "False")
    executor = LeoflowExecutor()
    executor._perform([fail])
    assert executor.event_buffer[w.key] == (TaskInstanceState.FAILED, reason)
    lines = (tmp_path / "logs" / LOG_PATH).read_text().splitlines()
    assert [json.loads(line)["event"] for line in lines] == [reason]


def test_an_unschedulable_pod_waits_as_backpressure_then_is_deleted_and_reoffered(
        k8s_env, harness, namespace, tmp_path, core, statsd):
    """Unbound, and kube-scheduler's condition says no node fits: backpressure within ``[leoflow]
    pod_unschedulable_timeout`` (300 s), even past ``dispatch_lost_threshold``; past it the pod is deleted (UID
    precondition, ``leoflow.reaper.start-backpressure`` counted) and the workload re-offered, the TI never
    failed, no retry and no re-dispatch spent; its re-dispatch is a new epoch with a new pod."""
    scene = Scene(k8s_env, harness, namespace, tmp_path, bound=False)
    try:
        w, row = scene.dispatch()
        now = datetime.now(timezone.utc).replace(microsecond=0)
        message = "0/3 nodes are available: 3 Insufficient memory. preemption: 0/3 nodes are available: " \
                  "3 No preemption victims found for incoming pod."
        core.patch_namespaced_pod_status(row.pod_name, namespace, {"status": {"phase": "Pending", "conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message,
             "lastTransitionTime": now.isoformat().replace("+00:00", "Z")}]}})
        scene.ahead = 200.0  # past dispatch_lost_threshold (120 s), within pod_unschedulable_timeout (300 s)
        waiting = scene.progress(row, StartState.NO_ROOM)
        assert waiting.since == now and waiting.until == now + timedelta(seconds=300)
        assert message in waiting.reason
        scene.reap_passes(row)

        scene.ahead = 301.0
        done = scene.settled(row.ref)
        assert done.resolution == Resolution.LAUNCH_FAILED
        [event] = [a for a in scene.actions if isinstance(a, TaskEvent)]
        assert event.event == "leoflow start-backpressure" and message in event.extra
        want = {"leoflow.reaper.start-backpressure"}
        assert want <= statsd.wait_names(want), statsd.names("airflow.")
        [reoffer] = [a for a in scene.actions if isinstance(a, Reoffer)]
        assert reoffer.key == w.key
        assert not [a for a in scene.actions if isinstance(a, Fail)] and scene.airflow.redrives == []
        wait_for(lambda: not [p for p in core.list_namespaced_pod(namespace).items if p.metadata.uid == row.pod_uid],
                 30, what="the unschedulable pod deleted")

        _, again = scene.dispatch(reoffer.workload)  # the next trigger_tasks
        assert (again.ref.ti_id, again.ref.attempt_epoch) == (row.ref.ti_id, 2) and again.pod_uid != row.pod_uid
    finally:
        scene.close()


def test_each_dispatch_disposition_is_counted_by_name_through_the_executor(scene, statsd, tmp_path, monkeypatch):
    """``LeoflowExecutor._process_workloads`` over the scene's lifecycle (the scheduler's dispatch step: Airflow's
    ``trigger_tasks`` hands it the queued workloads) counts each dispatch as ``leoflow.dispatch.<disposition>``
    (Airflow's Stats, a StatsD listener) and acts on it as Airflow sees it: ``dispatched`` (a pod created, its
    key running), ``deferred`` (the same ti_id offered again while its epoch is on its way: it stays queued),
    ``stale`` (a TI no longer QUEUED: dropped, never failed) and ``refused`` (a ``pod_override`` outside
    ``[leoflow] pod_override_allow``: failed at once, the reason naming the field; its epoch closed
    ``launch_failed``, no pod).

    The executor is built as the scheduler builds it but not ``start()``-ed (that reads Airflow's metadata DB):
    its ledger and lifecycle are the scene's, so what it dispatches to is the real runtime on the real API
    server."""
    from airflow.utils.state import TaskInstanceState
    from kubernetes.client import models as k8s

    from leoflow_airflow.executor import LeoflowExecutor

    monkeypatch.setenv("AIRFLOW__LOGGING__BASE_LOG_FOLDER", str(tmp_path / "logs"))
    monkeypatch.setenv("AIRFLOW__LOGGING__REMOTE_LOGGING", "False")
    executor = LeoflowExecutor()
    executor._ledger, executor._life, executor._started = scene.ledger, scene.life, True
    wait_for(lambda: scene.runtime.admit() is None, 30, what="the runtime to admit launches")

    def offer(workload, disposition: str) -> None:
        """Queue ``workload`` as Airflow's ``queue_workload`` does, run one dispatch step, and check the listener
        received ``leoflow.dispatch.<disposition>``."""
        executor.queued_tasks[workload.key] = workload
        executor._process_workloads([workload])
        want = {f"leoflow.dispatch.{disposition}"}
        assert want <= statsd.wait_names(want), statsd.names("airflow.")

    first = scene.workload()
    offer(first, "dispatched")
    assert first.key in executor.running and first.key not in executor.queued_tasks

    again = first.model_copy()  # Airflow offering the same ti_id again before its epoch is settled
    offer(again, "deferred")
    assert executor.queued_tasks[first.key] is again  # re-offered on the next heartbeat
    assert [a.ref.attempt_epoch for a in scene.ledger.attempts_of_task("dag", "run", "task", -1)] == [1]

    moved_on = scene.workload(state="success", task_id="moved_on")
    offer(moved_on, "stale")
    assert moved_on.key not in executor.queued_tasks and moved_on.key not in executor.event_buffer
    assert scene.ledger.current(str(moved_on.ti.id)) is None

    override = k8s.V1Pod(spec=k8s.V1PodSpec(host_network=True, containers=[]))
    refused = scene.workload(task_id="refused", executor_config={"pod_override": override})
    offer(refused, "refused")
    state, reason = executor.event_buffer[refused.key]
    assert state == TaskInstanceState.FAILED and "spec.hostNetwork" in reason, reason
    assert refused.key not in executor.queued_tasks and refused.key not in executor.running
    assert scene.ledger.current(str(refused.ti.id)).resolution == Resolution.LAUNCH_FAILED
