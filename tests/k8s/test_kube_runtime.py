"""``KubernetesRuntime`` driven directly against the real kube-apiserver of ``scripts/k8senv`` (issue 9 items 2
and 6), its pods on kwok nodes: the operator's pod template binds them to ``kwok-node-0`` and each task's
``executor_config`` ``pod_override`` carries kwok's annotations (``kwok.leoflow.test/exit-code``, ``run-for``,
``message``: tests/k8s/README.md), so pods run and finish without an agent.

Every scheduler-side call (``launch``, ``poll``, ``observe``, ``admit``, ``kill``, ``evidence``, ``collect``) is
timed: each must return in milliseconds, also while the API server is frozen (SIGSTOP; the control plane must
be this session's own, or ``K8SENV_FREEZE_OK=1``).
"""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from datetime import datetime, timezone
from types import SimpleNamespace

import pytest
from kubernetes import client
from kubernetes.client import models as k8s

from leoflow_agent import outcome
from leoflow_airflow import settings as leoflow_settings
from leoflow_airflow.dispatch.disposition import Disposition
from leoflow_airflow.ledger.states import AttemptRef, AttemptState
from leoflow_airflow.ledger.store import Attempt
from leoflow_airflow.lifecycle.runtime import Exited, LaunchFailed, LaunchSpec, Presence, Started, launch_id
from leoflow_airflow.runtime.kubernetes.pod import PodAttempt, build_pod, pod_name
from leoflow_airflow.runtime.kubernetes.runtime import KubernetesRuntime

from .conftest import wait_for

pytestmark = pytest.mark.k8s

FAST = 0.25
"""Seconds any scheduler-side call may take at most (they read memory only; generous for a loaded 2-core box)."""
TEMPLATE = """\
apiVersion: v1
kind: Pod
metadata:
  labels: {team: data}
spec:
  nodeName: kwok-node-0
  containers:
  - name: base
    image: registry.example/leoflow:test
"""


class Driver:
    """One runtime under test, every call timed (``slowest`` per method)."""

    def __init__(self, runtime: KubernetesRuntime) -> None:
        self.rt = runtime
        self.slowest: dict[str, float] = {}
        self.events: list = []

    def call(self, name: str, *args, **kwargs):
        t0 = time.monotonic()
        out = getattr(self.rt, name)(*args, **kwargs)
        took = time.monotonic() - t0
        self.slowest[name] = max(self.slowest.get(name, 0.0), took)
        assert took < FAST, f"{name} took {took:.3f} s"
        return out

    def poll_until(self, predicate, timeout: float, what: str):
        """Poll (every 50 ms) until ``predicate(event)`` holds for one event not taken yet; take and return it."""
        def step():
            self.events.extend(self.call("poll"))
            for i, ev in enumerate(self.events):
                if predicate(ev):
                    return self.events.pop(i)
            return None
        return wait_for(step, timeout, interval=0.05, what=what)

    def launch(self, ref: AttemptRef, *, annotations: dict[str, str] | None = None, override: k8s.V1Pod | None = None):
        pod = override or k8s.V1Pod(metadata=k8s.V1ObjectMeta(annotations=annotations or {}))
        ti = SimpleNamespace(dag_id="dag", task_id="task", run_id="run", map_index=-1,
                             executor_config={"pod_override": pod})
        return self.call("launch", LaunchSpec(launch_id(ref), ref, SimpleNamespace(ti=ti)))

    def started(self, ref: AttemptRef, timeout: float = 30) -> Started:
        lid = launch_id(ref)
        ev = self.poll_until(lambda e: e.launch_id == lid, timeout, f"the create of {ref}")
        assert isinstance(ev, Started), ev
        return ev


def attempt(ref: AttemptRef, ev: Started | None = None, state: AttemptState = AttemptState.DISPATCHED) -> Attempt:
    """The ledger row the lifecycle holds for ``ref`` (facts from its ``Started``)."""
    now = datetime.now(timezone.utc)
    facts = ev.facts if ev is not None else {}
    return Attempt(ref=ref, dag_id="dag", task_id="task", run_id="run", map_index=-1, state=state,
                   runtime="kubernetes", workload_json="{}", scheduler_job_id=None, host=None, pid=None,
                   proc_start_time=None, record_path=None, pod_name=facts.get("pod_name"),
                   pod_uid=facts.get("pod_uid"), reported_state=None, exit_status=None, resolution=None,
                   detail=None, created_at=now, dispatched_at=now, reported_at=None, exited_at=None,
                   closed_at=None, updated_at=now)


def new_ref(epoch: int = 1, ti_id: str | None = None) -> AttemptRef:
    return AttemptRef(ti_id or str(uuid.uuid4()), 1, epoch)


@pytest.fixture
def make_runtime(k8s_env, tmp_path):
    """``make_runtime(namespace, **options) -> Driver``: a started runtime whose ``admit()`` answers None (unless
    ``admit=False``);
    stopped at the end (its pods are left to the namespace's deletion)."""
    made: list[KubernetesRuntime] = []
    template = tmp_path / "pod.yaml"

    def make(namespace: str, *, node: str = "kwok-node-0", admit: bool = True, **options: str) -> Driver:
        template.write_text(TEMPLATE.replace("kwok-node-0", node))
        conf = {"runtime": "kubernetes", "image": "registry.example/leoflow:test",
                "exchange_url": "http://127.0.0.1:9/leoflow", "namespace": namespace, "in_cluster": "False",
                "kube_config": str(k8s_env.kubeconfig), "pod_template_file": str(template), **options}
        s = leoflow_settings.load(lambda section, key, fallback: conf.get(key, fallback))
        rt = KubernetesRuntime(s, mutation_hook=False)
        made.append(rt)
        rt.start()
        driver = Driver(rt)
        if admit:
            wait_for(lambda: driver.call("admit") is None, 30, what="the runtime to admit launches")
        return driver

    yield make
    for rt in made:
        rt.stop(timeout=5)


def test_a_pod_runs_to_its_exit_and_leaves_its_record(make_runtime, namespace, core):
    """launch → Started with the real pod's UID → LIVE → Exited with kwok's exit code → the termination
    message's record is the evidence → the settled pod is deleted (retention 0)."""
    d = make_runtime(namespace, pod_retention_success="0")
    ref = new_ref()
    record = outcome.record_for_state("success", {"state": "success", "end_date": "2026-12-01T00:00:00Z",
                                                  "task_outlets": [], "outlet_events": []},
                                      attempt=outcome.AttemptIdentity(ref.ti_id, 1, 1), api_version="2025-09-23")
    message = outcome.encode(record)
    assert d.launch(ref, annotations={"kwok.leoflow.test/exit-code": "0", "kwok.leoflow.test/run-for": "3s",
                                      "kwok.leoflow.test/message": message}).disposition is Disposition.DISPATCHED
    ev = d.started(ref)
    real = core.read_namespaced_pod(ev.facts["pod_name"], namespace)
    assert ev.facts == {"pod_name": real.metadata.name, "pod_uid": real.metadata.uid}
    assert real.metadata.labels["team"] == "data" and real.spec.node_name == "kwok-node-0"  # the template
    row = attempt(ref, ev)
    wait_for(lambda: d.call("observe", [row])[ref] is Presence.LIVE, 10, what="the pod to be seen live")
    exited = d.poll_until(lambda e: isinstance(e, Exited), 30, "the pod to finish")
    assert exited == Exited(launch_id(ref), 0)
    assert d.call("observe", [row])[ref] is Presence.GONE
    assert d.call("evidence", row).record == record
    assert d.call("collect", lambda ti_id, epoch: (ti_id, epoch) == (ref.ti_id, 1)) == 1
    wait_for(lambda: not [p for p in core.list_namespaced_pod(namespace).items if p.metadata.uid == real.metadata.uid],
             30, what="the settled pod to be deleted")


def test_a_full_quota_is_backpressure_then_the_launch_succeeds_once_it_frees(make_runtime, namespace, core):
    """A ResourceQuota with no room: the create is LaunchFailed retryable (backpressure) and admit() answers
    BACKPRESSURE without a call; once the quota frees, the re-offered attempt (the next epoch) starts."""
    core.create_namespaced_resource_quota(namespace, client.V1ResourceQuota(
        metadata=client.V1ObjectMeta(name="one-pod"), spec=client.V1ResourceQuotaSpec(hard={"pods": "1"})))
    # the quota admission charges a pod only once the controller has given the quota a status; a pod admitted
    # before that is counted at the controller's next full resync (minutes): CI met that race
    wait_for(lambda: (core.read_namespaced_resource_quota("one-pod", namespace).status.hard or {}).get("pods") == "1",
             30, what="the quota controller to give the quota its status")
    core.create_namespaced_pod(namespace, client.V1Pod(
        metadata=client.V1ObjectMeta(name="filler"),
        spec=client.V1PodSpec(node_name="kwok-node-0", containers=[client.V1Container(name="c", image="x")])))
    wait_for(lambda: (core.read_namespaced_resource_quota("one-pod", namespace).status.used or {}).get("pods") == "1",
             30, what="the quota to count the filler pod")
    d = make_runtime(namespace)
    ti_id = str(uuid.uuid4())
    first = new_ref(1, ti_id)
    assert d.launch(first, annotations={"kwok.leoflow.test/exit-code": "0"}).disposition is Disposition.DISPATCHED
    failed = d.poll_until(lambda e: e.launch_id == launch_id(first), 30, "the create's answer")
    assert isinstance(failed, LaunchFailed) and failed.retryable and "exceeded quota" in failed.error, failed
    wait = d.call("admit")
    assert wait is not None and wait.disposition is Disposition.BACKPRESSURE
    core.delete_namespaced_pod("filler", namespace, grace_period_seconds=0)
    wait_for(lambda: (core.read_namespaced_resource_quota("one-pod", namespace).status.used or {}).get("pods") == "0",
             30, what="the quota to free")
    wait_for(lambda: d.call("admit") is None, 10, what="the back-off window to reopen")
    second = new_ref(2, ti_id)
    assert d.launch(second, annotations={"kwok.leoflow.test/exit-code": "0"}).disposition is Disposition.DISPATCHED
    assert d.started(second).facts["pod_name"] == pod_name(PodAttempt(ti_id, 1, 2, "dag", "task", "run"))


def test_a_podsecurity_violation_is_refused_with_the_reason_and_a_compliant_pod_is_admitted(make_runtime,
                                                                                            restricted_namespace):
    """In a ``restricted`` namespace leoflow's pod is admitted; a pod_override the allowlist lets through but
    Pod Security forbids (runAsUser 0) fails at once, not retried, with the API server's reason."""
    d = make_runtime(restricted_namespace, pod_override_allow="metadata.annotations, "
                     "spec.containers.securityContext.runAsUser")
    ok = new_ref()
    d.launch(ok, annotations={"kwok.leoflow.test/exit-code": "0"})
    assert d.started(ok).facts["pod_uid"]
    bad = new_ref()
    root = k8s.V1Pod(spec=k8s.V1PodSpec(containers=[k8s.V1Container(
        name="base", security_context=k8s.V1SecurityContext(run_as_user=0))]))
    assert d.launch(bad, override=root).disposition is Disposition.DISPATCHED
    failed = d.poll_until(lambda e: e.launch_id == launch_id(bad), 30, "the create's answer")
    assert isinstance(failed, LaunchFailed) and not failed.retryable, failed
    assert "violates PodSecurity" in failed.error and "runAsUser=0" in failed.error
    assert d.call("admit") is None  # a refusal closes no back-off window


def test_an_override_outside_the_allowlist_is_refused_at_launch_naming_the_field(make_runtime, namespace):
    d = make_runtime(namespace)
    override = k8s.V1Pod(spec=k8s.V1PodSpec(host_network=True, containers=[]))
    result = d.launch(new_ref(), override=override)
    assert result.disposition is Disposition.REFUSED and "spec.hostNetwork" in result.reason


def test_kill_deletes_that_epochs_pod_only(make_runtime, namespace, core):
    """Two epochs of one ti_id running: killing epoch 1 deletes its pod (UID precondition) and leaves epoch 2's.
    The killed pod ends Failed (exit 137, as a kubelet reports it) and leoflow's finalizer keeps it until its
    attempt is closed; then it goes."""
    d = make_runtime(namespace)
    ti_id = str(uuid.uuid4())
    old, new = new_ref(1, ti_id), new_ref(2, ti_id)
    d.launch(old)  # no exit-code annotation: kwok keeps them Running until deleted
    d.launch(new)
    rows = {old: attempt(old, d.started(old)), new: attempt(new, d.started(new))}
    wait_for(lambda: set(d.call("observe", list(rows.values())).values()) == {Presence.LIVE}, 10,
             what="both pods to be seen live")
    assert d.call("kill", rows[old], grace=0.0) is Presence.LIVE
    wait_for(lambda: d.call("observe", [rows[old]])[old] is Presence.GONE, 30, what="epoch 1's pod to be gone")
    assert d.poll_until(lambda e: isinstance(e, Exited), 10, "epoch 1's exit") == Exited(launch_id(old), 137)
    held = core.read_namespaced_pod(rows[old].pod_name, namespace)  # the finalizer keeps it until it is settled
    assert held.metadata.deletion_timestamp is not None and held.status.phase == "Failed"
    assert d.call("kill", rows[old], grace=0.0) is Presence.GONE  # nothing of it runs any more
    d.call("forget", old)  # the lifecycle closed it
    assert d.call("collect", lambda ti_id, epoch: epoch == 1) == 1
    wait_for(lambda: {p.metadata.name: p.metadata.uid for p in core.list_namespaced_pod(namespace).items}
             == {rows[new].pod_name: rows[new].pod_uid}, 30, what="only epoch 2's pod to be left")
    assert d.call("observe", [rows[new]])[new] is Presence.LIVE


def test_a_409_on_our_own_pod_is_started_with_the_existing_uid(make_runtime, namespace, core):
    """A create whose earlier copy landed (its answer lost) meets its own pod: Started with that pod's UID. A
    pod under the name that names another attempt is refused."""
    d = make_runtime(namespace)
    ref = new_ref()
    pa = PodAttempt(ref.ti_id, 1, 1, "dag", "task", "run")
    earlier = core.create_namespaced_pod(namespace, build_pod(pa, d.rt.kube, template=d.rt._template))
    d.launch(ref)
    ev = d.started(ref)
    assert ev.facts == {"pod_name": earlier.metadata.name, "pod_uid": earlier.metadata.uid}
    squat = new_ref()
    other = build_pod(PodAttempt(squat.ti_id, 1, 1, "dag", "task", "run"), d.rt.kube, template=d.rt._template)
    other.metadata.annotations["leoflow.io/attempt"] = json.dumps(
        {"ti_id": str(uuid.uuid4()), "try_number": 1, "attempt_epoch": 1})
    core.create_namespaced_pod(namespace, other)
    d.launch(squat)
    failed = d.poll_until(lambda e: e.launch_id == launch_id(squat), 30, "the create's answer")
    assert isinstance(failed, LaunchFailed) and not failed.retryable and "not this attempt's" in failed.error


def test_nothing_blocks_while_the_api_server_is_frozen(make_runtime, namespace, k8s_env):
    """SIGSTOP the kube-apiserver: launch(), poll(), observe() and admit() still return in milliseconds;
    the create lands once it runs again. Freezing a control plane this session did not start (``K8SENV_DIR``) is
    done only with ``K8SENV_FREEZE_OK=1`` (it may be shared)."""
    if k8s_env.start_seconds == 0 and os.environ.get("K8SENV_FREEZE_OK") != "1":
        pytest.skip("a reused control plane (K8SENV_DIR) is frozen only with K8SENV_FREEZE_OK=1")
    apiserver = next(p["pid"] for p in k8s_env.raw["processes"] if p["name"] == "kube-apiserver")
    d = make_runtime(namespace)
    live = new_ref()
    d.launch(live)
    row = attempt(live, d.started(live))
    wait_for(lambda: d.call("observe", [row])[live] is Presence.LIVE, 10, what="the pod to be seen live")
    frozen = new_ref()
    os.kill(apiserver, signal.SIGSTOP)
    try:
        assert d.launch(frozen).disposition is Disposition.DISPATCHED
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            assert not [e for e in d.call("poll") if e.launch_id == launch_id(frozen)]
            assert d.call("observe", [row, attempt(frozen, state=AttemptState.CLAIMED)]) == {
                live: Presence.LIVE, frozen: Presence.UNKNOWN}
            d.call("admit")
            time.sleep(0.05)
    finally:
        os.kill(apiserver, signal.SIGCONT)
    assert d.started(frozen, timeout=60).facts["pod_uid"]
    assert max(d.slowest.values()) < FAST, d.slowest


def test_an_image_that_cannot_be_pulled_is_one_clear_error(make_runtime, namespace, core, caplog):
    """The agent container waiting in ErrImagePull (the status a kubelet writes; here patched in, the pod bound
    to a node nobody serves) is logged once as an error naming the reason and the image's message; the attempt
    stays LIVE (the reaper rejects it past a grace: ``test_pod_start.py``) and nothing is lost."""
    import logging

    caplog.set_level(logging.ERROR, logger="leoflow_airflow.runtime.kubernetes.runtime")
    d = make_runtime(namespace, node="no-such-node")
    ref = new_ref()
    d.launch(ref)
    ev = d.started(ref)
    name = ev.facts["pod_name"]
    core.patch_namespaced_pod_status(name, namespace, {"status": {"phase": "Pending", "containerStatuses": [{
        "name": "base", "image": "registry.example/leoflow:test", "imageID": "", "ready": False, "restartCount": 0,
        "state": {"waiting": {"reason": "ErrImagePull",
                              "message": 'failed to pull "registry.example/leoflow:test": not found'}}}]}})
    row = attempt(ref, ev)

    def logged():
        d.events.extend(d.call("poll"))
        return [r for r in caplog.records if "ErrImagePull" in r.getMessage()]

    [record] = wait_for(logged, 30, what="the ErrImagePull error")
    assert name in record.getMessage() and "registry.example/leoflow:test" in record.getMessage()
    for _ in range(5):
        d.events.extend(d.call("poll"))
    assert len(logged()) == 1
    assert d.call("observe", [row])[ref] is Presence.LIVE


@pytest.mark.parametrize("what", ["service_account", "apiserver"])
def test_a_missing_service_account_or_an_unreachable_apiserver_keeps_dispatch_deferred(
        make_runtime, namespace, k8s_env, tmp_path, caplog, what):
    """Bad input at start: one error naming what to fix, and admit() answers DEFERRED with it (the workloads
    stay queued: nothing is lost), never a crash."""
    import logging

    caplog.set_level(logging.ERROR, logger="leoflow_airflow.runtime.kubernetes.runtime")
    if what == "service_account":
        d = make_runtime(namespace, admit=False, service_account="leoflow-tasks")
        fix = f"ServiceAccount {namespace}/leoflow-tasks does not exist"
    else:
        dead = tmp_path / "dead.kubeconfig"
        dead.write_text(k8s_env.kubeconfig.read_text().replace(k8s_env.server, "https://127.0.0.1:1"))
        d = make_runtime(namespace, admit=False, kube_config=str(dead))
        fix = "https://127.0.0.1:1 does not answer"

    def deferred():
        d.call("poll")
        wait = d.call("admit")
        return wait if wait is not None and fix in wait.reason else None

    wait = wait_for(deferred, 60, what="admit() to name the problem")
    assert wait.disposition is Disposition.DEFERRED
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and fix in errors[0], errors
