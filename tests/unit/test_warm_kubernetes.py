"""Kubernetes warm pods, scheduler side (issue 11; ``runtime/kubernetes/warmpods.py`` and ``warmdecide.py``): the
``[leoflow] warm_*`` options, the warm pod as built, and every pure decision (placement, the presence matrix, the
evidence order, the deadline arithmetic, anchor liveness, the pool's view of a pod and its row); then the pool
tick and the runtime's placement against an in-memory ledger with the contract's methods and a stub API. The pool
against a real kube-apiserver and garbage collector is ``tests/k8s/test_warm_pods.py``."""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

import pytest
from kubernetes.client import models as k8s

from leoflow_agent import outcome
from leoflow_airflow import settings as leoflow_settings
from leoflow_airflow.dispatch.disposition import Disposition
from leoflow_airflow.errors import ConfigError
from leoflow_airflow.ledger.states import AttemptRef
from leoflow_airflow.lifecycle.runtime import EndKind, LaunchSpec, Presence, Started, StartState, launch_id
from leoflow_airflow.runtime.kubernetes import warmdecide as wd
from leoflow_airflow.runtime.kubernetes import warmpods
from leoflow_airflow.runtime.kubernetes.runtime import KubernetesRuntime, label_selector
from leoflow_airflow.runtime.kubernetes.status import pod_view
from leoflow_airflow.warm.pool import WorkerState
from tests.fakes.warm_ledger import MemoryLedger, Row

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=timezone.utc)
V1 = "0192f0c4-1111-7222-8333-444455556666"
V2 = "0192f0c4-2222-7222-8333-444455556666"
BASE = {"runtime": "kubernetes", "image": "img:1", "exchange_url": "http://x/leoflow", "instance": "blue"}


def selects(selector: str, labels: dict | None) -> bool:
    """Whether a Kubernetes equality-based ``selector`` (``k=v`` and ``!k`` terms, comma-joined) selects an object
    with ``labels``, as the API server decides it."""
    labels = labels or {}
    for term in filter(None, selector.split(",")):
        if term.startswith("!"):
            if term[1:] in labels:
                return False
        else:
            key, _, value = term.partition("=")
            if labels.get(key) != value:
                return False
    return True


def load(**conf: str) -> leoflow_settings.LeoflowSettings:
    values = {**BASE, **conf}
    return leoflow_settings.load(lambda section, key, fallback: values.get(key, fallback))


def ref(epoch: int = 1) -> AttemptRef:
    return AttemptRef(str(uuid.uuid4()), 1, epoch)


def view(name: str, uid: str, *, phase: str = "Running", deleting: bool = False, labels: dict | None = None,
         started: datetime | None = NOW - timedelta(minutes=10), terminated: dict | None = None,
         created: datetime = NOW - timedelta(minutes=11)):
    meta = {"name": name, "uid": uid, "namespace": "default", "labels": labels or {},
            "creationTimestamp": created.strftime("%Y-%m-%dT%H:%M:%SZ")}
    if deleting:
        meta["deletionTimestamp"] = NOW.strftime("%Y-%m-%dT%H:%M:%SZ")
    state = {"terminated": terminated} if terminated is not None else {"running": {}}
    status = {"phase": phase, "containerStatuses": [{"name": "base", "state": state}]}
    if started is not None:
        status["startTime"] = started.strftime("%Y-%m-%dT%H:%M:%SZ")
    return pod_view({"metadata": meta, "status": status})


# --- options -----------------------------------------------------------------------------------------------


def test_warm_pods_are_off_by_default_and_every_option_is_checked():
    s = load()
    assert s.warm.warm_min_idle == 0 and not s.warm.enabled
    assert load(warm_min_idle="2").warm.enabled
    assert load(warm_pools='{"etl_*": {"min_idle": 1}}').warm.enabled
    assert not load(warm_pools='{"etl_*": {"max_pool_size": 9}}').warm.enabled
    # a per-DAG prewarm reads the current versions of unpaused DAGs even with warm_prewarm off
    assert not load(warm_min_idle="2").warm.prewarm_any
    assert load(warm_pools='{"etl_*": {"min_idle": 1, "prewarm": true}}').warm.prewarm_any
    assert load(warm_prewarm="True").warm.prewarm_any
    for key, value, said in (("warm_pools", '{"etl_*": {"min_idle": -1}}', "min_idle"),
                             ("warm_pools", "[1]", "JSON object"),
                             ("warm_isolation", "none", "read-only-root"),
                             ("warm_max_attempts", "0", "greater than 0"),
                             ("warm_min_idle", "-1", "0 or more"),
                             ("warm_max_lifetime_seconds", "0", "greater than 0")):
        with pytest.raises(ConfigError) as err:
            load(**{key: value})
        assert f"[leoflow] {key}" in str(err.value) and said in str(err.value)


# --- the warm pod ------------------------------------------------------------------------------------------


def test_a_warm_pod_is_a_hardened_task_pod_with_the_warm_pins():
    s = load(warm_max_lifetime_seconds="1800", warm_max_attempts="7")
    pv = warmpods.PoolVersion(V1, "etl", "dags", "v42", "etl/daily.py")
    name = warmpods.warm_pod_name("17", V1)
    pod = warmpods.build_warm_pod(pv, s.kubernetes, s.warm, job_id="17", name=name, anchor_uid="anchor-uid")
    labels = pod.metadata.labels
    assert warmpods.is_warm_name(name) and pod.metadata.name == name
    assert labels["leoflow.io/warm"] == "true" and labels["leoflow.io/dag-version"] == V1
    assert labels["leoflow.io/scheduler-job"] == "17" and labels["leoflow.io/tenant"]
    assert not any(k in labels for k in ("leoflow.io/ti-id", "leoflow.io/attempt-epoch", "leoflow.io/dag-id"))
    assert labels["app.kubernetes.io/component"] == "warm-pod"  # the task pods' informer never sees it
    assert "app.kubernetes.io/component=task-attempt" in label_selector("blue")
    assert not pod.metadata.annotations and not pod.metadata.finalizers
    (owner,) = pod.metadata.owner_references
    assert (owner.kind, owner.name, owner.uid, owner.controller, owner.block_owner_deletion) == (
        "ConfigMap", f"leoflow-warm-17-{V1}", "anchor-uid", True, False)
    assert pod.spec.active_deadline_seconds == 1800 + 604800
    agent = pod.spec.containers[0]
    assert agent.args == ["python", "-m", "leoflow_agent", "warm-pod"]
    env = {e.name: e.value for e in agent.env}
    assert env["LEOFLOW_WARM_BUNDLE"] == "dags" and env["LEOFLOW_WARM_BUNDLE_VERSION"] == "v42"
    assert env["LEOFLOW_WARM_DAG_FILE"] == "etl/daily.py" and env["LEOFLOW_WARM_MAX_ATTEMPTS"] == "7"
    assert env["LEOFLOW_WARM_ISOLATION"] == "read-only-root" and env["LEOFLOW_EXCHANGE_URL"] == "http://x/leoflow"
    scratch = next(v for v in pod.spec.volumes if v.name == "leoflow-scratch")
    assert scratch.empty_dir is not None
    assert {m.mount_path for m in agent.volume_mounts} == {"/var/run/secrets/leoflow", env["LEOFLOW_WARM_SCRATCH"],
                                                          "/tmp", "/dev/shm"}
    # read-only-root: the agent empties /tmp and /dev/shm between attempts, so they are the pod's own volumes
    volumes = {v.name: v for v in pod.spec.volumes}
    assert volumes["leoflow-tmp"].empty_dir is not None and volumes["leoflow-shm"].empty_dir.medium == "Memory"
    assert agent.security_context.read_only_root_filesystem is True
    assert env["LEOFLOW_WARM_SWEEP_ROOTS"] == "/tmp:/dev/shm"  # the agent empties only what the pod owns
    assert pod.spec.security_context.run_as_non_root and agent.security_context.capabilities.drop == ["ALL"]
    assert pod.spec.automount_service_account_token is False


def test_a_warm_pod_has_no_deadline_when_the_credential_ceiling_is_off():
    s = load(credential_ceiling_seconds="0")
    pv = warmpods.PoolVersion(V1, "etl", "dags", "", "etl.py")
    pod = warmpods.build_warm_pod(pv, s.kubernetes, s.warm, job_id="1", name="lfw-1-0192f0c41111-0000abcd",
                                  anchor_uid="u")
    assert pod.spec.active_deadline_seconds is None


# --- placement -----------------------------------------------------------------------------------------------


def test_placement_sends_a_task_whose_executor_config_asks_for_anything_to_a_cold_pod():
    assert wd.cold_reason(None) is None and wd.cold_reason({}) is None
    assert wd.cold_reason({"pod_override": k8s.V1Pod()}) is None
    assert wd.cold_reason({"other_executor": {"x": 1}}) is None  # another executor's key: ignored
    big = k8s.V1Pod(spec=k8s.V1PodSpec(containers=[k8s.V1Container(
        name="base", resources=k8s.V1ResourceRequirements(limits={"memory": "8Gi"}))]))
    assert "spec.containers.resources" in wd.cold_reason({"pod_override": big})
    assert "nodeSelector" in wd.cold_reason({"pod_override": k8s.V1Pod(spec=k8s.V1PodSpec(
        containers=[], node_selector={"gpu": "yes"}))})
    assert wd.cold_reason({"pod_template_file": "/x.yaml"}) is not None
    assert wd.cold_reason({"pod_override": "not a pod"}) is not None


def test_only_an_idle_worker_of_the_version_whose_pod_runs_is_a_candidate_most_recently_seen_first():
    rows = [Row("u1", "p1", last_seen_at=NOW - timedelta(seconds=30)),
            Row("u2", "p2", last_seen_at=NOW - timedelta(seconds=1)),
            Row("u3", "p3", state="busy"), Row("u4", "p4", dag_version_id=V2), Row("u5", "p5"),
            Row("u6", "p6"), Row("u7", "p7"), Row("u8", "p8"), Row("u9", "p9")]
    views = {"p1": view("p1", "u1"), "p2": view("p2", "u2"), "p3": view("p3", "u3"), "p4": view("p4", "u4"),
             "p5": view("p5", "u5", phase="Pending"), "p6": view("p6", "u6", deleting=True),
             "p7": view("p7", "other-uid"),  # p8: not in the cache
             "p9": view("p9", "u9")}  # registered, Running, never awaited: still parsing its DAG file
    assert [r.pod_name for r in wd.candidates(rows, views, V1)] == ["p2", "p1"]


# --- deadlines -----------------------------------------------------------------------------------------------


def test_the_deadline_is_lifetime_plus_ceiling_at_create_and_only_ever_lowered_at_assignment():
    assert wd.create_deadline(3600, 604800) == 608400
    assert wd.create_deadline(10.2, 600) == 611
    assert wd.create_deadline(3600, 0) is None
    assert wd.lowered_deadline(608400, 120.5, 604800) == 604921  # age + ceiling, rounded up
    assert wd.lowered_deadline(604000, 120, 604800) is None  # lower already: never raised
    assert wd.lowered_deadline(604920, 120, 604800) is None  # equal: nothing to do
    assert wd.lowered_deadline(None, 30, 600) == 630
    assert wd.lowered_deadline(608400, 120, 0) is None
    patch = wd.deadline_patch("u1", 608400, 604921)
    assert patch[0] == {"op": "test", "path": "/metadata/uid", "value": "u1"}
    assert {"op": "test", "path": "/spec/activeDeadlineSeconds", "value": 608400} in patch
    assert patch[-1] == {"op": "replace", "path": "/spec/activeDeadlineSeconds", "value": 604921}


# --- the attempt side ---------------------------------------------------------------------------------------


def test_the_presence_matrix_of_a_warm_attempt():
    r = ref()
    live, ended = view("p", "u"), view("p", "u", phase="Succeeded", terminated={"exitCode": 0})
    holding = Row("u", "p", state="busy", ref=r)
    P = wd.warm_presence
    assert P(holding, live, r, row_fresh=True, pod_confirmed_gone=False) is Presence.LIVE
    assert P(replace(holding, state="assigned"), live, r, row_fresh=True, pod_confirmed_gone=False) is Presence.LIVE
    assert P(holding, live, r, row_fresh=False, pod_confirmed_gone=False) is Presence.UNKNOWN
    assert P(holding, ended, r, row_fresh=True, pod_confirmed_gone=False) is Presence.GONE  # the worker-lost reaper
    assert P(holding, None, r, row_fresh=True, pod_confirmed_gone=False) is Presence.UNKNOWN  # cache only defers
    assert P(holding, None, r, row_fresh=True, pod_confirmed_gone=True) is Presence.GONE
    assert P(replace(holding, state="idle", ref=None), live, r, row_fresh=True, pod_confirmed_gone=False) \
        is Presence.GONE  # released: the worker awaits again
    assert P(replace(holding, ref=ref()), live, r, row_fresh=True, pod_confirmed_gone=False) is Presence.GONE
    assert P(None, live, r, row_fresh=True, pod_confirmed_gone=False) is Presence.GONE


def _record(r: AttemptRef, state: str = "success", *, identity: bool = True) -> str:
    ident = outcome.AttemptIdentity(r.ti_id, r.try_number, r.attempt_epoch)
    rec = outcome.record_for_state(state, {"state": state}, attempt=ident, api_version=None)
    if not identity:
        rec = replace(rec, ti_id=None, try_number=None, attempt_epoch=None)
    return outcome.encode(rec)


def test_the_evidence_of_a_warm_attempt_in_band_record_first_then_only_its_own_termination_message():
    r, other = ref(), ref()
    oom = {"exitCode": 137, "reason": "OOMKilled", "message": _record(other)}
    dead = view("p", "u", phase="Failed", terminated=oom)
    ev = wd.warm_evidence(_record(r, "failed"), dead, r)
    assert ev.record is not None and ev.record.state == "failed"  # the ledger's record wins
    ev = wd.warm_evidence(None, dead, r)  # another attempt's message: never evidence; the end names OOMKilled
    assert ev.record is None and ev.cause is not None and ev.cause.kind is EndKind.OOM_KILLED
    assert "OOMKilled" in ev.cause.reason
    mine = view("p", "u", phase="Succeeded", terminated={"exitCode": 0, "reason": "Completed", "message": _record(r)})
    assert wd.warm_evidence(None, mine, r).record is not None
    anon = view("p", "u", phase="Succeeded", terminated={"exitCode": 0, "message": _record(r, identity=False)})
    assert wd.warm_evidence(None, anon, r).record is None  # no identity: could be anyone's
    assert wd.warm_evidence("not json", None, r).record is None
    running = wd.warm_evidence(None, view("p", "u"), r)
    assert running.record is None and running.cause is None  # a live pod's status ends nothing


def test_start_progress_of_a_warm_attempt_and_an_assignment_never_taken_is_taken_back():
    r = ref()
    assigned = Row("u", "p", state="assigned", ref=r, assigned_at=NOW - timedelta(seconds=10))
    progress, back = wd.warm_start_progress(assigned, r, NOW)
    assert progress.state is StartState.STARTING and not back
    busy = replace(assigned, state="busy", taken_at=NOW - timedelta(seconds=5))
    progress, back = wd.warm_start_progress(busy, r, NOW)
    assert (progress.state, progress.since, back) == (StartState.STARTED, NOW - timedelta(seconds=5), False)
    late = replace(assigned, assigned_at=NOW - timedelta(seconds=61))
    assert wd.warm_start_progress(late, r, NOW) == (None, True)
    assert wd.warm_start_progress(replace(busy, ref=ref()), r, NOW) == (None, False)


def test_anchors_of_scheduler_jobs_that_are_not_alive_are_the_ones_deleted():
    anchors = [("a-7", "7"), ("a-8", "8"), ("a-9", "9"), ("a-x", ""), ("a-own", "12")]
    assert wd.dead_anchors(anchors, alive={"8"}, own_job="12") == ["a-7", "a-9"]


def test_a_pod_and_its_row_as_the_pool_sees_them():
    kw = dict(version=V1, tenant="t", now=NOW, max_attempts=3, max_lifetime=3600)
    W = wd.pool_worker
    assert W(view("p", "u", phase="Failed"), None, **kw).state is WorkerState.TERMINAL
    assert W(view("p", "u", deleting=True), Row("u", "p"), **kw).state is WorkerState.DRAINING
    starting = W(view("p", "u", phase="Pending"), None, **kw)
    assert starting.state is WorkerState.STARTING and starting.since == NOW - timedelta(minutes=11)
    assert W(view("p", "u"), Row("old-uid", "p"), **kw).state is WorkerState.STARTING
    assert W(view("p", "u"), Row("u", "p", state="busy", ref=ref()), **kw).state is WorkerState.BUSY
    seen = dict(last_seen_at=NOW)
    assert W(view("p", "u"), Row("u", "p", attempts_taken=3, **seen), **kw).state is WorkerState.DRAINING
    assert W(view("p", "u", started=NOW - timedelta(hours=2)), Row("u", "p", **seen), **kw).state \
        is WorkerState.DRAINING
    assert W(view("p", "u"), Row("u", "p", **seen), **kw).state is WorkerState.IDLE
    # registered but never awaited: still parsing its DAG file, not ready (the start timeout bounds it)
    assert W(view("p", "u"), Row("u", "p"), **kw).state is WorkerState.STARTING


# --- the pool tick (stub API, in-memory ledger) ------------------------------------------------------------


class ApiError(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(f"HTTP {status}")
        self.status, self.reason, self.headers, self.body = status, "", {}, ""


class FakeCore:
    """Pods and ConfigMaps the pool creates and deletes, kept in dicts (no garbage collector here)."""

    def __init__(self) -> None:
        self.pods: dict[str, k8s.V1Pod] = {}
        self.configmaps: dict[str, k8s.V1ConfigMap] = {}
        self.deleted: list[str] = []
        self.patches: list = []
        self.uids = 0

    def create_namespaced_config_map(self, ns, body, **kw):
        if body.metadata.name in self.configmaps:
            raise ApiError(409)
        self.uids += 1
        body.metadata.uid = f"cm-{self.uids}"  # never reused, as the API server's UIDs
        self.configmaps[body.metadata.name] = body
        return body

    def read_namespaced_config_map(self, name, ns, **kw):
        if name not in self.configmaps:
            raise ApiError(404)
        return self.configmaps[name]

    def list_namespaced_config_map(self, ns, label_selector="", **kw):
        return SimpleNamespace(items=[cm for cm in self.configmaps.values()
                                      if selects(label_selector, cm.metadata.labels)])

    def delete_namespaced_config_map(self, name, ns, **kw):
        if self.configmaps.pop(name, None) is None:
            raise ApiError(404)

    def create_namespaced_pod(self, ns, pod, **kw):
        pod.metadata.uid = f"uid-{pod.metadata.name}"
        self.pods[pod.metadata.name] = pod
        return pod

    def delete_namespaced_pod(self, name, ns, body=None, **kw):
        self.deleted.append(name)
        self.pods.pop(name, None)

    # the runtime's start-up check
    def list_namespaced_pod(self, ns, **kw):
        return SimpleNamespace(items=[])

    def read_namespace(self, name, **kw):
        return SimpleNamespace()

    def read_namespaced_service_account(self, name, ns, **kw):
        return SimpleNamespace()

    def read_namespaced_pod(self, name, ns, **kw):
        pod = self.pods.get(name)
        if pod is None:
            raise ApiError(404)
        started = (datetime.now(timezone.utc) - timedelta(seconds=120)).strftime("%Y-%m-%dT%H:%M:%SZ")
        return SimpleNamespace(data=json.dumps({
            "metadata": {"name": name, "uid": pod.metadata.uid},
            "spec": {"activeDeadlineSeconds": pod.spec.active_deadline_seconds},
            "status": {"phase": "Running", "startTime": started}}))

    def patch_namespaced_pod(self, name, ns, body, **kw):
        self.patches.append((name, body))


class FakeInformer:
    """A cache the test fills: ``show()`` copies the fake API's pods in (a lagging cache until then)."""

    def __init__(self, *args) -> None:
        self.synced = True
        self.last_error = None
        self.pods: dict[str, object] = {}
        self.buried: dict[str, object] = {}

    def show(self, core: FakeCore, phase: str = "Running") -> None:
        self.pods = {n: view(n, p.metadata.uid, phase=phase, labels=p.metadata.labels, created=NOW)
                     for n, p in core.pods.items()}

    def start(self):
        pass

    def stop(self, timeout):
        pass

    def get(self, name):
        return self.pods.get(name)

    def tombstone(self, name, uid):
        view = self.buried.get(name)
        return view if view is not None and view.uid == uid else None

    def views(self):
        return list(self.pods.values())

    def ending(self):
        return []

    def has_uid(self, uid):
        return False

    def take_changed(self):
        return set()


def versions():
    return [warmpods.PoolVersion(V1, "etl", "dags", "", "etl.py", active_run=True)]


def make_pool(core, ledger, informer, heartbeats=None, monotonic=None, health_threshold=None, **conf):
    s = load(**conf)
    return warmpods.WarmPool(core, s.kubernetes, s.warm, job_id="5", ledger=ledger, informer=informer,
                             versions=versions, heartbeats=heartbeats or (lambda jobs: {}), monotonic=monotonic,
                             health_threshold=health_threshold)


def test_the_pool_creates_min_idle_pods_under_one_anchor_and_a_lagging_cache_never_overshoots():
    core, ledger, informer = FakeCore(), MemoryLedger(), FakeInformer()
    pool = make_pool(core, ledger, informer, warm_min_idle="2", warm_max_pool_size="3")
    report = pool.tick(NOW)
    assert len(report.created) == 2 and report.anchors_created == [f"leoflow-warm-5-{V1}"]
    for _ in range(3):  # the cache has not shown them yet: the expectations count them
        assert pool.tick(NOW).created == []
    assert len(core.pods) == 2
    informer.show(core, phase="Pending")
    assert pool.tick(NOW).created == []
    anchor_uid = core.configmaps[f"leoflow-warm-5-{V1}"].metadata.uid
    assert {p.metadata.owner_references[0].uid for p in core.pods.values()} == {anchor_uid}


def test_the_tenant_cap_counts_every_version_of_a_tenant_once_its_pods_show_in_the_cache():
    core, ledger, informer = FakeCore(), MemoryLedger(), FakeInformer()
    pool = make_pool(core, ledger, informer, warm_min_idle="2", warm_max_pool_size="2", warm_tenant_cap="3")
    pool._versions = lambda: [warmpods.PoolVersion(V1, "etl", "dags", "", "etl.py", active_run=True),
                              warmpods.PoolVersion(V2, "etl2", "dags", "", "etl2.py", active_run=True)]
    assert len(pool.tick(NOW).created) == 3
    informer.show(core, phase="Pending")  # the pods' tenant label is label-safe: read back as the tenant
    for _ in range(3):
        assert pool.tick(NOW).created == []
    assert len(core.pods) == 3


def test_the_pool_tells_the_plugins_when_a_versions_ready_warm_pods_change(monkeypatch):
    calls = []
    monkeypatch.setattr("leoflow_airflow.hooks.warm_pool_resized",
                        lambda key, *, before, after: calls.append((key, before, after)))
    core, ledger, informer = FakeCore(), MemoryLedger(), FakeInformer()
    pool = make_pool(core, ledger, informer, warm_min_idle="1", warm_max_pool_size="1")
    pool.tick(NOW)
    informer.show(core)
    pool.tick(NOW)
    assert calls == []  # created and Running, not registered: not ready yet
    (name,) = core.pods
    ledger.rows["uid-" + name] = Row("uid-" + name, name, registered_at=NOW, last_seen_at=NOW)
    pool.tick(NOW)
    pool.tick(NOW)
    assert calls == [(f"kubernetes:{V1}", 0, 1)]


def test_the_pool_gauges_its_pods_by_state_only_once_its_cache_has_synced(monkeypatch):
    """``leoflow.warm.kubernetes.pods.<state>`` totals (zeros included) on each synced tick; an unsynced cache
    sends nothing (it shows no pods: zeros would be a lie); a terminal pod is no worker and is not counted."""
    sent = []
    monkeypatch.setattr("leoflow_airflow.metrics.gauge", lambda name, value: sent.append((name, value)))
    core, ledger, informer = FakeCore(), MemoryLedger(), FakeInformer()
    pool = make_pool(core, ledger, informer, warm_min_idle="2", warm_max_pool_size="3")
    informer.synced = False
    pool.tick(NOW)
    assert sent == []
    informer.synced = True
    pool.tick(NOW)
    informer.show(core, phase="Pending")
    sent.clear()
    pool.tick(NOW)
    prefix = "leoflow.warm.kubernetes.pods."
    assert dict(sent) == {prefix + "idle": 0, prefix + "starting": 2, prefix + "busy": 0, prefix + "draining": 0}
    first, second = sorted(core.pods)
    ledger.rows["uid-" + first] = Row("uid-" + first, first, registered_at=NOW, last_seen_at=NOW)
    informer.pods[second] = view(second, "uid-" + second, phase="Failed", created=NOW,
                                 labels=core.pods[second].metadata.labels)
    sent.clear()
    pool.tick(NOW)
    assert dict(sent)[prefix + "idle"] == 1 and dict(sent)[prefix + "starting"] == 0, sent
    assert warmpods.pod_state_counts([]) == {"idle": 0, "starting": 0, "busy": 0, "draining": 0}


def test_the_pool_never_deletes_a_worker_that_holds_an_attempt():
    core, ledger, informer = FakeCore(), MemoryLedger(), FakeInformer()
    pool = make_pool(core, ledger, informer, warm_min_idle="1", warm_max_pool_size="1")
    pool.tick(NOW)
    informer.show(core)
    (name,) = core.pods
    ledger.rows["uid-" + name] = Row("uid-" + name, name, last_seen_at=NOW)
    pool._versions = lambda: []  # the version drains: its idle worker goes, unless it was assigned meanwhile
    ledger.assign("uid-" + name, ref(), row_version=0)
    decided = pool.tick(NOW)
    assert decided.deleted == [] and name in core.pods


def test_at_start_the_anchors_of_dead_scheduler_jobs_are_deleted():
    core, ledger, informer = FakeCore(), MemoryLedger(), FakeInformer()
    for job in ("3", "4"):
        core.create_namespaced_config_map("default", warmpods.build_anchor(job, V1, "default", instance="blue"))
    pool = make_pool(core, ledger, informer, warm_min_idle="1",
                     heartbeats=lambda jobs: {"3": NOW - timedelta(days=1)})
    assert pool.sweep_dead_anchors(lambda jobs: {"4"} & jobs) == [f"leoflow-warm-3-{V1}"]
    assert set(core.configmaps) == {f"leoflow-warm-4-{V1}"}


def test_sweep_dead_anchors_ignores_anchors_of_another_installation():
    """k8s review §5: installation green shares the namespace; its scheduler job 3 is never alive in this (blue)
    installation's ``job`` table. Blue's start sweep must not delete green's anchor (the garbage collector would
    then kill green's warm pods, running attempts included), only blue's own dead job's."""
    core, ledger, informer = FakeCore(), MemoryLedger(), FakeInformer()
    core.create_namespaced_config_map("default", warmpods.build_anchor("3", V1, "default", instance="green"))
    core.create_namespaced_config_map("default", warmpods.build_anchor("4", V2, "default", instance="blue"))
    pool = make_pool(core, ledger, informer, warm_min_idle="1", heartbeats=lambda jobs: {})
    assert pool.sweep_dead_anchors(lambda jobs: set()) == [f"leoflow-warm-4-{V2}"]
    assert set(core.configmaps) == {f"leoflow-warm-3-{V1}"}
    assert core.configmaps[f"leoflow-warm-3-{V1}"].metadata.labels["leoflow.io/instance"] == "green"


def test_warm_pods_and_anchors_carry_the_installation_label():
    """k8s review §5: every warm pod and anchor ConfigMap the pool makes is labelled ``leoflow.io/instance`` with
    ``[leoflow] instance``, whatever the pod template says, so only this installation's selectors find them."""
    core, ledger, informer = FakeCore(), MemoryLedger(), FakeInformer()
    pool = make_pool(core, ledger, informer, warm_min_idle="2")
    pool.tick(NOW)
    assert core.pods and core.configmaps
    for obj in (*core.pods.values(), *core.configmaps.values()):
        assert obj.metadata.labels["leoflow.io/instance"] == "blue", obj.metadata.name
    s = load()
    template = k8s.V1Pod(metadata=k8s.V1ObjectMeta(labels={"leoflow.io/instance": "green"}),
                         spec=k8s.V1PodSpec(containers=[k8s.V1Container(name="base")]))
    pod = warmpods.build_warm_pod(warmpods.PoolVersion(V1, "etl", "dags", "", "etl.py"), s.kubernetes, s.warm,
                                  job_id="5", name=warmpods.warm_pod_name("5", V1), anchor_uid="u", template=template)
    assert pod.metadata.labels["leoflow.io/instance"] == "blue"


def test_the_pod_and_warm_informers_select_only_this_installations_pods(monkeypatch):
    """k8s review §5: the runtime's two informers watch with selectors that take this installation's task pods
    (resp. warm pods) and neither another installation's (``[leoflow] instance`` green) nor the other kind."""
    from leoflow_airflow.runtime.kubernetes.pod import PodAttempt, build_pod

    core, selectors = FakeCore(), []

    def informer_factory(api, namespace, selector):
        selectors.append(selector)
        return FakeInformer()

    monkeypatch.setattr("kubernetes.client.CoreV1Api", lambda api: core)
    blue, green = load(warm_min_idle="1"), load(warm_min_idle="1", instance="green")
    rt = KubernetesRuntime(blue, api_client_factory=lambda: SimpleNamespace(), informer_factory=informer_factory,
                           mutation_hook=False, warm_ledger_factory=MemoryLedger, warm_versions=versions,
                           jobs_alive=lambda jobs: set())
    rt.job_id = 5
    rt.start()
    rt.terminate()
    task_selector, warm_selector = selectors
    attempt = PodAttempt(str(uuid.uuid4()), 1, 1, "etl", "t", "run")
    pv = warmpods.PoolVersion(V1, "etl", "dags", "", "etl.py")
    task = {s.kubernetes.instance: build_pod(attempt, s.kubernetes).metadata.labels for s in (blue, green)}
    warm = {s.kubernetes.instance: warmpods.build_warm_pod(pv, s.kubernetes, s.warm, job_id="5", anchor_uid="u",
                                                           name=warmpods.warm_pod_name("5", V1)).metadata.labels
            for s in (blue, green)}
    assert selects(task_selector, task["blue"]) and not selects(task_selector, task["green"])
    assert selects(warm_selector, warm["blue"]) and not selects(warm_selector, warm["green"])
    assert not selects(task_selector, warm["blue"]) and not selects(warm_selector, task["blue"])


def test_a_deleted_anchor_is_recreated_before_the_next_creates_so_they_are_not_garbage_collected():
    """k8s review §11: an operator deletes the anchor (the README's way to remove a pool) and the garbage collector
    takes its pods. The next creates must name a live anchor: a pod owned by the deleted UID is accepted by the
    API server and collected at once, every tick, for ever."""
    core, ledger, informer = FakeCore(), MemoryLedger(), FakeInformer()
    pool = make_pool(core, ledger, informer, warm_min_idle="1", warm_max_pool_size="1")
    assert len(pool.tick(NOW).created) == 1
    name = f"leoflow-warm-5-{V1}"
    first = core.configmaps[name].metadata.uid
    core.delete_namespaced_config_map(name, "default")
    core.pods.clear()  # the garbage collector
    informer.show(core)
    pool.expectations = warmpods.Expectations(warmpods.EXPECTATION_TTL_SECONDS)  # the create was observed gone
    report = pool.tick(NOW)
    assert len(report.created) == 1 and report.anchors_created == [name]
    (pod,) = core.pods.values()
    owner = pod.metadata.owner_references[0].uid
    assert owner != first and owner == core.configmaps[name].metadata.uid


def test_a_scheduler_job_that_heartbeat_recently_keeps_its_anchors_until_it_stays_dead():
    """k8s review §11: ``Job.is_alive`` says not alive after 30 s without a heartbeat (a DB stall is enough); the
    anchors of a job that heartbeat within the grace (two thresholds: 60 s here) stay, and a later sweep on the
    pool tick (every threshold) deletes them once the job stays dead past it. A job with no row (or long dead)
    loses them at once."""
    core, ledger, informer = FakeCore(), MemoryLedger(), FakeInformer()
    for job in ("3", "6", "7"):
        core.create_namespaced_config_map("default", warmpods.build_anchor(job, V1, "default", instance="blue"))
    now = datetime.now(timezone.utc)
    beats = {"3": now - timedelta(seconds=45), "6": now - timedelta(hours=2)}  # job 7: no Airflow job row
    clock = [1000.0]
    pool = make_pool(core, ledger, informer, heartbeats=lambda jobs: {j: beats[j] for j in jobs if j in beats},
                     monotonic=lambda: clock[0], health_threshold=30.0)
    assert (pool.dead_job_grace, pool.dead_sweep_every) == (60.0, 30.0)
    assert pool.sweep_dead_anchors(lambda jobs: set()) == [f"leoflow-warm-6-{V1}", f"leoflow-warm-7-{V1}"]
    assert set(core.configmaps) == {f"leoflow-warm-3-{V1}"}
    beats["3"] = now - timedelta(hours=1)  # it never came back
    pool.tick(NOW)
    assert f"leoflow-warm-3-{V1}" in core.configmaps  # not yet time for the next sweep
    clock[0] += pool.dead_sweep_every
    pool.tick(NOW)
    assert f"leoflow-warm-3-{V1}" not in core.configmaps
    assert warmpods.past_grace({"a", "b"}, {"a": NOW - timedelta(seconds=59)}, NOW) == {"b"}


def _a_draining_pool_with_one_idle_worker():
    """A pool with one registered idle worker whose DAG version just drained (its worker is to go):
    ``(core, ledger, pool, pod name, pod uid)``."""
    core, ledger, informer = FakeCore(), MemoryLedger(), FakeInformer()
    pool = make_pool(core, ledger, informer, warm_min_idle="1", warm_max_pool_size="1")
    pool.tick(NOW)
    informer.show(core)
    (name,) = core.pods
    uid = "uid-" + name
    ledger.rows[uid] = Row(uid, name, last_seen_at=NOW)
    pool._versions = lambda: []
    return core, ledger, pool, name, uid


def test_the_pool_keeps_a_worker_the_scheduler_assigns_between_the_pools_read_and_its_delete():
    """k8s review §16g: the pool re-reads the row (idle) and the scheduler, on its own thread, assigns the worker
    right then: the pool's delete must not land (the attempt would be re-dispatched). With the guarded retire,
    exactly one of them wins."""
    core, ledger, pool, name, uid = _a_draining_pool_with_one_idle_worker()
    real_get, won = ledger.get, []

    def get_then_scheduler_assigns(pod_uid):
        row = real_get(pod_uid)
        won.append(ledger.assign(pod_uid, ref(), row_version=row.row_version))  # the scheduler thread, now
        return row

    ledger.get = get_then_scheduler_assigns
    report = pool.tick(NOW)
    assert won == [True] and report.deleted == [] and name in core.pods and name not in core.deleted
    assert ledger.rows[uid].state == "assigned"


def test_the_pools_delete_of_an_idle_worker_retires_its_row_first_so_a_later_assign_loses():
    core, ledger, pool, name, uid = _a_draining_pool_with_one_idle_worker()
    assert pool.tick(NOW).deleted == [name] and name in core.deleted
    assert not ledger.assign(uid, ref(), row_version=0)  # the scheduler read it idle before: it loses cleanly


# --- the runtime's placement --------------------------------------------------------------------------------


@pytest.fixture
def warm_runtime(monkeypatch):
    core, ledger = FakeCore(), MemoryLedger()
    informers: list[FakeInformer] = []

    def informer_factory(*args):
        informers.append(FakeInformer())
        return informers[-1]

    monkeypatch.setattr("kubernetes.client.CoreV1Api", lambda api: core)
    s = load(warm_min_idle="1", warm_max_pool_size="2")
    rt = KubernetesRuntime(s, api_client_factory=lambda: SimpleNamespace(), informer_factory=informer_factory,
                           mutation_hook=False, warm_ledger_factory=lambda: ledger,
                           warm_versions=versions, jobs_alive=lambda jobs: set())
    rt.job_id = 5
    rt.start()
    deadline = time.monotonic() + 10
    while rt.admit() is not None:
        assert time.monotonic() < deadline, rt.admit()
        time.sleep(0.01)
    yield rt, core, ledger, informers[1]
    rt.terminate()


def warm_spec(executor_config=None):
    r = ref()
    ti = SimpleNamespace(dag_id="etl", task_id="t", run_id="run", map_index=-1, executor_config=executor_config,
                         dag_version_id=uuid.UUID(V1))
    return LaunchSpec(launch_id(r), r, SimpleNamespace(ti=ti))


def _ready_worker(rt, core, ledger, informer):
    """Tick until the pool created its pod, show it Running in the cache and register it in the ledger."""
    deadline = time.monotonic() + 10
    while not core.pods:
        assert time.monotonic() < deadline
        rt.poll()
        time.sleep(0.01)
    informer.show(core)
    (name,) = core.pods
    ledger.rows["uid-" + name] = Row("uid-" + name, name, last_seen_at=NOW)
    idle(rt)
    rt.warm.set_rows(ledger.workers("default"), time.monotonic())
    return name


def test_an_attempt_goes_to_an_idle_warm_pod_and_its_presence_follows_the_ledger_row(warm_runtime):
    rt, core, ledger, informer = warm_runtime
    name = _ready_worker(rt, core, ledger, informer)
    spec = warm_spec()
    assert rt.launch(spec).disposition is Disposition.DISPATCHED
    events = []
    deadline = time.monotonic() + 5
    while not any(isinstance(e, Started) for e in events):
        assert time.monotonic() < deadline
        events += rt.poll()
        time.sleep(0.01)
    started = next(e for e in events if isinstance(e, Started))
    assert started.facts == {"pod_name": name, "pod_uid": "uid-" + name}
    assert ledger.rows["uid-" + name].state == "assigned" and ledger.rows["uid-" + name].ref == spec.ref
    attempt = SimpleNamespace(ref=spec.ref, pod_name=name, pod_uid="uid-" + name)
    idle(rt)
    rt.warm.set_rows(ledger.workers("default"), rt._warm_launches[spec.launch_id].assigned_at - 1)
    assert rt.observe([attempt])[spec.ref] is Presence.UNKNOWN  # rows read before the assignment: cannot tell
    rt.warm.set_rows(ledger.workers("default"), time.monotonic())
    assert rt.observe([attempt])[spec.ref] is Presence.LIVE
    assert rt.start_progress([attempt])[spec.ref].state is StartState.STARTING
    ledger.rows["uid-" + name] = replace(ledger.rows["uid-" + name], state="idle", ref=None)  # released
    rt.warm.set_rows(ledger.workers("default"), time.monotonic())
    assert rt.observe([attempt])[spec.ref] is Presence.GONE
    deadline = time.monotonic() + 5
    while not core.patches:  # the deadline PATCH runs on the request pool
        assert time.monotonic() < deadline
        time.sleep(0.01)
    (patched, ops), = core.patches  # the deadline, lowered to the pod's age + the credential ceiling
    assert patched == name and ops[-1]["path"] == "/spec/activeDeadlineSeconds"
    assert 604800 + 120 <= ops[-1]["value"] <= 604800 + 130 < 604800 + 3600


def idle(rt):
    """Wait until no pool tick is in flight (the test then sets the rows the runtime reads)."""
    deadline = time.monotonic() + 5
    while rt._warm_busy:
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_a_task_that_asks_for_resources_gets_a_cold_pod_even_with_an_idle_warm_one(warm_runtime):
    rt, core, ledger, informer = warm_runtime
    name = _ready_worker(rt, core, ledger, informer)
    big = k8s.V1Pod(spec=k8s.V1PodSpec(containers=[k8s.V1Container(
        name="base", resources=k8s.V1ResourceRequirements(limits={"memory": "8Gi"}))]))
    spec = warm_spec({"pod_override": big})
    assert rt.launch(spec).disposition is Disposition.DISPATCHED
    assert ledger.rows["uid-" + name].state == "idle" and launch_id(spec.ref) not in rt._warm_launches
    deadline = time.monotonic() + 5
    while not any(not warmpods.is_warm_name(n) for n in core.pods):  # its own pod, with the override
        assert time.monotonic() < deadline
        time.sleep(0.01)
    cold = next(p for n, p in core.pods.items() if not warmpods.is_warm_name(n))
    assert cold.spec.containers[0].resources.limits == {"memory": "8Gi"}


def test_a_lost_assignment_race_tries_the_next_worker_then_goes_cold(warm_runtime):
    rt, core, ledger, informer = warm_runtime
    name = _ready_worker(rt, core, ledger, informer)
    row = ledger.rows["uid-" + name]
    ledger.rows["uid-" + name] = replace(row, state="busy", row_version=9)  # another scheduler's attempt took it
    spec = warm_spec()
    assert rt.launch(spec).disposition is Disposition.DISPATCHED
    assert ledger.rows["uid-" + name].state == "busy"  # not this worker: a cold pod's create went out
    assert launch_id(spec.ref) not in rt._warm_launches and launch_id(spec.ref) in rt._launches


def test_a_worker_idle_again_since_the_last_tick_is_found_by_one_fresh_read(warm_runtime):
    """The last tick saw the worker busy (it ran the chain's previous task); it has finished and is idle in the
    ledger: the launch reads the rows once more and places the attempt warm instead of on a cold pod."""
    rt, core, ledger, informer = warm_runtime
    name = _ready_worker(rt, core, ledger, informer)
    row = ledger.rows["uid-" + name]
    rt.warm.set_rows([replace(row, state="busy")], time.monotonic())  # the tick's view, now stale
    spec = warm_spec()
    assert rt.launch(spec).disposition is Disposition.DISPATCHED
    assert ledger.rows["uid-" + name].state == "assigned" and launch_id(spec.ref) in rt._warm_launches


def test_an_assignment_never_taken_is_taken_back_and_reads_gone(warm_runtime):
    rt, core, ledger, informer = warm_runtime
    name = _ready_worker(rt, core, ledger, informer)
    spec = warm_spec()
    rt.launch(spec)
    row = ledger.rows["uid-" + name]
    ledger.rows["uid-" + name] = replace(row, assigned_at=datetime.now(timezone.utc) - timedelta(seconds=61))
    rt.warm.set_rows(ledger.workers("default"), time.monotonic())
    attempt = SimpleNamespace(ref=spec.ref, pod_name=name, pod_uid="uid-" + name)
    assert spec.ref not in rt.start_progress([attempt])
    assert ledger.rows["uid-" + name].state == "idle"
    assert rt.observe([attempt])[spec.ref] is Presence.GONE


def test_a_killed_warm_attempt_deletes_its_worker_pod(warm_runtime):
    rt, core, ledger, informer = warm_runtime
    name = _ready_worker(rt, core, ledger, informer)
    spec = warm_spec()
    rt.launch(spec)
    ledger.rows["uid-" + name] = replace(ledger.rows["uid-" + name], state="busy", taken_at=NOW)
    rt.warm.set_rows(ledger.workers("default"), time.monotonic())
    attempt = SimpleNamespace(ref=spec.ref, pod_name=name, pod_uid="uid-" + name)
    assert rt.kill(attempt, grace=5) is Presence.LIVE
    deadline = time.monotonic() + 5
    while name not in core.deleted:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    informer.buried[name] = informer.pods.pop(name)  # the watch's DELETED: its last view (Running) is a tombstone
    deadline = time.monotonic() + 5
    while rt.observe([attempt])[spec.ref] is not Presence.GONE:  # once a live read found it gone (404)
        assert time.monotonic() < deadline, rt.observe([attempt])
        time.sleep(0.01)


def _a_busy_warm_attempt(rt, core, ledger, informer):
    """A ready warm worker that took an attempt (launched, its row busy with it): ``(pod name, pod uid, spec)``."""
    name = _ready_worker(rt, core, ledger, informer)
    spec = warm_spec()
    rt.launch(spec)
    uid = "uid-" + name
    ledger.rows[uid] = replace(ledger.rows[uid], state="busy", taken_at=NOW)
    return name, uid, spec


def test_a_deleted_warm_pod_that_never_ends_opens_the_valve(warm_runtime):
    """k8s review §6: a warm pod's node partitions while it runs an attempt; the pod is deleted (a kill, the
    taint manager) but no kubelet reports its end. As for a cold pod, once ``[leoflow] pod_termination_valve``
    seconds passed beyond its deletion grace period the attempt counts as ended by an infra loss (re-run on the
    infra budget), instead of staying LIVE until Airflow's heartbeat purge fails it through the user's retries."""
    rt, core, ledger, informer = warm_runtime
    name, uid, spec = _a_busy_warm_attempt(rt, core, ledger, informer)
    rt.warm.set_rows(ledger.workers("default"), time.monotonic())
    informer.pods[name] = replace(view(name, uid, deleting=True), deletion_grace=30)  # Running: no end reported
    clock = [time.monotonic()]
    rt._monotonic = lambda: clock[0]
    attempt = SimpleNamespace(ref=spec.ref, pod_name=name, pod_uid=uid)
    assert rt.observe([attempt])[spec.ref] is Presence.LIVE  # within its grace period
    clock[0] += 30 + rt.kube.pod_termination_valve - 1
    assert rt.observe([attempt])[spec.ref] is Presence.LIVE
    clock[0] += 2
    assert rt.observe([attempt])[spec.ref] is Presence.GONE
    evidence = rt.evidence(attempt)
    assert evidence.record is None and evidence.cause is not None and evidence.cause.kind is EndKind.INFRA_LOSS
    assert "pod_termination_valve" in evidence.cause.reason


def test_a_warm_kill_never_deletes_a_pod_whose_row_holds_another_attempt(warm_runtime):
    """k8s review §7: attempt N's report was lost and the reaper kills it, but its warm pod finished N and took
    a newer attempt M since the last pool tick (whose rows still say busy with N). The kill must not delete the
    pod that runs M (M would be SIGTERMed and re-run); N is gone, and no delete is sent."""
    rt, core, ledger, informer = warm_runtime
    name, uid, spec = _a_busy_warm_attempt(rt, core, ledger, informer)
    rt.warm.set_rows(ledger.workers("default"), time.monotonic())  # the tick's snapshot: busy with N
    newer = ref()
    ledger.rows[uid] = replace(ledger.rows[uid], ref=newer, row_version=9)  # now: busy with M
    attempt = SimpleNamespace(ref=spec.ref, pod_name=name, pod_uid=uid)
    assert rt.kill(attempt, grace=60) is Presence.GONE
    time.sleep(0.3)  # a delete would go out on the request pool
    assert name not in core.deleted
    assert (ledger.rows[uid].state, ledger.rows[uid].ref) == ("busy", newer)
    assert rt.observe([attempt])[spec.ref] is Presence.GONE


def test_a_warm_attempt_stays_live_while_its_task_heartbeats_whatever_its_pod_says(warm_runtime):
    """k8s review §14, warm pods: a busy warm pod's node is partitioned; the pod is deleted and goes past its
    grace period plus ``[leoflow] pod_termination_valve``, then PodGC marks it ``Failed`` (no kubelet wrote an
    end). While the attempt's TI heartbeat is 3 s old it stays LIVE (its body runs); silent past ``[leoflow]
    agent_lost_threshold`` it is GONE."""
    rt, core, ledger, informer = warm_runtime
    name, uid, spec = _a_busy_warm_attempt(rt, core, ledger, informer)
    rt.warm.set_rows(ledger.workers("default"), time.monotonic())
    informer.pods[name] = replace(view(name, uid, deleting=True), deletion_grace=30)
    clock = [time.monotonic()]
    rt._monotonic = lambda: clock[0]
    attempt = SimpleNamespace(ref=spec.ref, pod_name=name, pod_uid=uid)
    fresh, silent = {spec.ref: 3.0}, {spec.ref: rt.settings.agent_lost_threshold + 1}
    assert rt.observe([attempt], fresh)[spec.ref] is Presence.LIVE
    clock[0] += 30 + rt.kube.pod_termination_valve + 1
    assert rt.observe([attempt], fresh)[spec.ref] is Presence.LIVE  # past grace + valve, still heartbeating
    informer.pods[name] = replace(view(name, uid, deleting=True, phase="Failed"), deletion_grace=30)  # PodGC
    assert rt.observe([attempt], fresh)[spec.ref] is Presence.LIVE
    assert rt.observe([attempt], silent)[spec.ref] is Presence.GONE
