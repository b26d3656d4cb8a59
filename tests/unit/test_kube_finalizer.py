"""leoflow's finalizer on task pods (issue 10 item 4), the pure parts and the runtime's bookkeeping with a stub
``CoreV1Api``: the pod builder pins it whatever the layers do, :func:`decide.release_due` says when it may come
off, :func:`decide.release_patch` removes exactly it from exactly that pod, :func:`finalizer.release_finalizer`
is idempotent and re-reads after a failed ``test``, and ``KubernetesRuntime.collect`` releases at once after a
settle and sweeps what is left, never a running pod's nor an open attempt's. Against the real API server:
``tests/k8s/test_kube_finalizer.py``."""

from __future__ import annotations

import json
import threading
import time
import uuid
from types import SimpleNamespace

import pytest
from kubernetes.client import models as k8s

from leoflow_airflow import settings as leoflow_settings
from leoflow_airflow.ledger.states import AttemptRef
from leoflow_airflow.lifecycle.runtime import Presence
from leoflow_airflow.runtime.kubernetes import decide
from leoflow_airflow.runtime.kubernetes.finalizer import ReleaseOutcome, release_finalizer, release_pods
from leoflow_airflow.runtime.kubernetes.identity import IDENTITY_ANNOTATION, identity_annotation
from leoflow_airflow.runtime.kubernetes.pod import OUTCOME_FINALIZER, PodAttempt, build_pod
from leoflow_airflow.runtime.kubernetes.runtime import KubernetesRuntime
from leoflow_airflow.runtime.kubernetes.status import pod_view

FIN = OUTCOME_FINALIZER
KUBE = leoflow_settings.load_kubernetes(lambda section, key, fallback: {
    "image": "img:1", "exchange_url": "http://x/leoflow"}.get(key, fallback))
ATTEMPT = PodAttempt(str(uuid.uuid4()), 1, 1, "dag", "task", "run")


# --- the pod builder pins it ---------------------------------------------------------------------------------

def test_every_pod_carries_the_finalizer_and_keeps_the_others():
    assert FIN == "leoflow.io/outcome-record"
    assert build_pod(ATTEMPT, KUBE).metadata.finalizers == [FIN]
    template = k8s.V1Pod(metadata=k8s.V1ObjectMeta(finalizers=["team.example/keep", FIN]))
    assert build_pod(ATTEMPT, KUBE, template=template).metadata.finalizers == ["team.example/keep", FIN]


@pytest.mark.parametrize("hook", [
    lambda pod: setattr(pod.metadata, "finalizers", None),
    lambda pod: setattr(pod.metadata, "finalizers", ["hook.example/x"]),
    lambda pod: pod.metadata.finalizers.remove(FIN),
    lambda pod: setattr(pod, "metadata", k8s.V1ObjectMeta(name="renamed")),
], ids=["cleared", "replaced", "removed", "new-metadata"])
def test_a_mutation_hook_cannot_take_it_off(hook):
    finalizers = build_pod(ATTEMPT, KUBE, mutation_hook=hook).metadata.finalizers
    assert finalizers.count(FIN) == 1 and finalizers[-1] == FIN
    assert set(finalizers) <= {FIN, "hook.example/x"}


def test_an_override_cannot_take_it_off_nor_double_it():
    allow = leoflow_settings.load_kubernetes(lambda section, key, fallback: {
        "image": "img:1", "exchange_url": "http://x/leoflow", "pod_override_allow": "metadata"}.get(key, fallback))
    override = k8s.V1Pod(metadata=k8s.V1ObjectMeta(finalizers=[FIN, "o.example/y"]))
    pod = build_pod(ATTEMPT, allow, executor_config={"pod_override": override})
    assert pod.metadata.finalizers == ["o.example/y", FIN]


# --- the pure decisions ----------------------------------------------------------------------------------------

def test_pod_view_reads_the_finalizers():
    def view(finalizers):
        return pod_view({"metadata": {"name": "p", "uid": "u", "finalizers": finalizers}})

    assert view(["a", FIN]).finalizers == ("a", FIN)
    assert view(None).finalizers == () and view("not-a-list").finalizers == () and view([1, FIN]).finalizers == (FIN,)
    assert decide.finalizer_index(("a", FIN)) == 1 and decide.finalizer_index(("a",)) is None


@pytest.mark.parametrize(("finalizers", "terminal", "deleting", "closed", "due"), [
    ((FIN,), True, False, True, True),        # settled, terminal: its record was read
    ((FIN,), False, True, True, True),        # settled, deleted by someone: let it go
    (("x", FIN), True, True, True, True),
    ((FIN,), True, False, False, False),      # not settled: the record may be unread
    ((FIN,), True, True, False, False),       # force-deleted before it was read: keep it
    ((FIN,), False, False, True, False),      # running: its status may still change
    (("x",), True, True, True, False),        # not ours to release
    ((), True, False, True, False),
])
def test_release_due(finalizers, terminal, deleting, closed, due):
    assert decide.release_due(finalizers=finalizers, terminal=terminal, deleting=deleting, closed=closed) is due


def test_the_release_patch_tests_the_uid_and_the_index_before_it_removes():
    assert decide.release_patch("uid-1", 2) == [
        {"op": "test", "path": "/metadata/uid", "value": "uid-1"},
        {"op": "test", "path": "/metadata/finalizers/2", "value": FIN},
        {"op": "remove", "path": "/metadata/finalizers/2"}]


REF = AttemptRef(str(uuid.uuid4()), 1, 1)


def _view(*, phase="Running", deleting=False, node="n1"):
    obj = {"metadata": {"name": "p", "uid": "u1", "finalizers": [FIN]}, "spec": {}, "status": {"phase": phase}}
    if node:
        obj["spec"]["nodeName"] = node
    if deleting:
        obj["metadata"]["deletionTimestamp"] = "2026-12-01T00:00:00Z"
    return pod_view(obj)


@pytest.mark.parametrize(("view", "presence"), [
    (_view(phase="Succeeded", deleting=True), Presence.GONE),  # force-deleted after it ended: the finalizer keeps it
    (_view(phase="Failed", deleting=True), Presence.GONE),
    (_view(deleting=True), Presence.LIVE),  # a kubelet is still stopping it
    (_view(phase="Pending", deleting=True, node=None), Presence.GONE),  # unbound and deleting: it can never start
    (_view(phase="Pending", node=None), Presence.LIVE),
])
def test_presence_of_a_deleting_pod(view, presence):
    assert decide.presence(view, None, uid="u1", ref=REF, now=0.0, read_reuse=10.0)[0] is presence
    read = SimpleNamespace(at=0.0, view=view)
    assert decide.presence(None, read, uid="u1", ref=REF, now=1.0, read_reuse=10.0)[0] is presence


# --- release_finalizer against a stub CoreV1Api -------------------------------------------------------------

class ApiError(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(f"HTTP {status}")
        self.status, self.reason, self.body, self.headers = status, "x", "", {}


class StubCore:
    """Holds pods as JSON dicts; applies a release patch the way the API server does (``test`` → 422)."""

    def __init__(self) -> None:
        self.pods: dict[str, dict] = {}
        self.patches: list[tuple[str, list]] = []
        self.fail_patch: list[int] = []  # statuses the next patches answer
        self.before_patch = None  # called before a patch is applied (to move the finalizer under it)
        self.patched = threading.Event()

    def add(self, name: str, *, uid: str | None = None, finalizers=(FIN,), phase="Succeeded", deleting=False,
            ref: AttemptRef | None = None) -> dict:
        meta = {"name": name, "uid": uid or f"uid-{name}", "finalizers": list(finalizers),
                "labels": {"app.kubernetes.io/managed-by": "leoflow"}}
        if ref is not None:
            meta["annotations"] = {IDENTITY_ANNOTATION: identity_annotation(ref)}
        if deleting:
            meta["deletionTimestamp"] = "2026-12-01T00:00:00Z"
        self.pods[name] = {"metadata": meta, "spec": {"nodeName": "n1"}, "status": {"phase": phase}}
        return self.pods[name]

    def read_namespaced_pod(self, name, namespace, **kw):
        if name not in self.pods:
            raise ApiError(404)
        return SimpleNamespace(data=json.dumps(self.pods[name]).encode())

    def list_namespaced_pod(self, namespace, **kw):
        return SimpleNamespace(data=json.dumps({"items": list(self.pods.values()), "metadata": {}}).encode())

    def patch_namespaced_pod(self, name, namespace, body, **kw):
        assert kw["_content_type"] == "application/json-patch+json"
        self.patches.append((name, body))
        try:
            if self.fail_patch:
                raise ApiError(self.fail_patch.pop(0))
            if self.before_patch is not None:
                self.before_patch()
            pod = self.pods.get(name)
            if pod is None:
                raise ApiError(404)
            meta = pod["metadata"]
            for op in body:
                if op["op"] == "test":
                    key = op["path"].split("/")[2:]
                    got = meta["uid"] if key == ["uid"] else (meta["finalizers"][int(key[1])]
                                                             if int(key[1]) < len(meta["finalizers"]) else None)
                    if got != op["value"]:
                        raise ApiError(422)
            [remove] = [op for op in body if op["op"] == "remove"]
            del meta["finalizers"][int(remove["path"].rsplit("/", 1)[1])]
            return SimpleNamespace()
        finally:
            self.patched.set()


def test_a_release_removes_only_leoflows_finalizer_and_is_idempotent():
    core = StubCore()
    core.add("p", finalizers=["a", FIN, "b"])
    r = release_finalizer(core, "ns", "p", "uid-p", index=1)
    assert (r.outcome, r.done) == (ReleaseOutcome.RELEASED, True)
    assert core.pods["p"]["metadata"]["finalizers"] == ["a", "b"]
    assert release_finalizer(core, "ns", "p", "uid-p", index=1).outcome is ReleaseOutcome.NOT_HELD  # 422: re-read
    assert release_finalizer(core, "ns", "p", "uid-p").outcome is ReleaseOutcome.NOT_HELD
    assert release_finalizer(core, "ns", "absent", "uid-x").outcome is ReleaseOutcome.GONE
    core.add("q", uid="new-uid")
    assert release_finalizer(core, "ns", "q", "old-uid", index=0).outcome is ReleaseOutcome.GONE  # re-created pod
    assert core.pods["q"]["metadata"]["finalizers"] == [FIN]


def test_a_failed_test_rereads_the_pod_and_patches_again_at_the_new_index():
    core = StubCore()
    core.add("p", finalizers=["a", FIN])
    r = release_finalizer(core, "ns", "p", "uid-p", index=0)  # a stale index: the list changed since
    assert r.outcome is ReleaseOutcome.RELEASED and core.pods["p"]["metadata"]["finalizers"] == ["a"]
    assert [ops[-1]["path"] for _, ops in core.patches] == ["/metadata/finalizers/0", "/metadata/finalizers/1"]


def test_a_list_that_keeps_changing_is_a_conflict_and_an_error_is_a_failure():
    core = StubCore()
    core.add("p", finalizers=[FIN])
    core.fail_patch = [422, 422]
    r = release_finalizer(core, "ns", "p", "uid-p", index=0)
    assert (r.outcome, r.done) == (ReleaseOutcome.CONFLICT, False)
    core.fail_patch = [500]
    r = release_finalizer(core, "ns", "p", "uid-p", index=0)
    assert (r.outcome, r.done) == (ReleaseOutcome.FAILED, False) and "500" in r.detail
    assert core.pods["p"]["metadata"]["finalizers"] == [FIN]


def test_release_pods_strips_every_held_pod_or_only_lists_them():
    core = StubCore()
    core.add("a", phase="Running")
    core.add("b", finalizers=[])
    core.add("c", deleting=True)
    dry = release_pods(core, "ns", "sel", dry_run=True)
    assert [(r.name, r.outcome) for r in dry] == [("a", ReleaseOutcome.WOULD_RELEASE),
                                                  ("c", ReleaseOutcome.WOULD_RELEASE)]
    assert not core.patches
    assert [(r.name, r.outcome) for r in release_pods(core, "ns", "sel")] == [
        ("a", ReleaseOutcome.RELEASED), ("c", ReleaseOutcome.RELEASED)]
    assert all(not p["metadata"]["finalizers"] for p in core.pods.values())
    assert release_pods(core, "ns", "sel") == []


# --- the runtime: prompt release after a settle, the sweep ----------------------------------------------------

class CacheInformer:
    """Synced; serves the stub core's pods as the cache (what a watch would have delivered)."""

    synced = True
    last_error = None
    core: StubCore

    def __init__(self, *args) -> None:
        pass

    def start(self) -> None:
        pass

    def stop(self, timeout: float) -> None:
        pass

    def get(self, name):
        obj = self.core.pods.get(name)
        return pod_view(obj) if obj is not None else None

    def tombstone(self, name, uid):
        return None

    def views(self):
        return [pod_view(obj) for obj in self.core.pods.values()]

    def ending(self):
        return [v for v in self.views() if v.terminal or v.deleting]

    def has_uid(self, uid):
        return any(v.uid == uid for v in self.views())


@pytest.fixture
def runtime(monkeypatch):
    core = StubCore()
    monkeypatch.setattr("kubernetes.client.CoreV1Api", lambda api: core)
    CacheInformer.core = core
    conf = {"runtime": "kubernetes", "image": "img:1", "exchange_url": "http://x/leoflow",
            "pod_retention_success": "3600", "pod_retention_failure": "3600"}
    s = leoflow_settings.load(lambda section, key, fallback: conf.get(key, fallback))
    clock = [1000.0]
    rt = KubernetesRuntime(s, api_client_factory=lambda: SimpleNamespace(), informer_factory=CacheInformer,
                           mutation_hook=False, monotonic=lambda: clock[0])
    rt._check = lambda: SimpleNamespace(problem="", notes=())  # no start-up check against the stub
    rt.start()
    yield rt, core, clock
    rt.terminate()


def settle(rt: KubernetesRuntime) -> None:
    """Wait for the pool's answers and take them (what the next scheduler-side call does)."""
    deadline = time.monotonic() + 10
    while any(not f.done() for f in list(rt._futures)):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    rt._absorb()


def adopt(rt: KubernetesRuntime, core: StubCore, ref: AttemptRef, name: str) -> None:
    uid = core.pods[name]["metadata"]["uid"]
    rt.adopt(SimpleNamespace(ref=ref, pod_name=name, pod_uid=uid, dag_id="dag", task_id="task", run_id="run",
                             map_index=-1))


def test_a_settled_attempts_pod_is_released_at_the_next_collect_not_before(runtime):
    rt, core, clock = runtime
    ref = AttemptRef(str(uuid.uuid4()), 1, 1)
    core.add("p", ref=ref, deleting=True)  # force-deleted after it ended: the finalizer holds it
    adopt(rt, core, ref, "p")
    closed: set[AttemptRef] = set()

    def is_closed(ti_id, epoch):
        return AttemptRef(ti_id, 1, epoch) in closed

    assert rt.collect(is_closed) == 0  # the first sweep: open, kept
    settle(rt)
    assert core.pods["p"]["metadata"]["finalizers"] == [FIN] and not core.patches
    closed.add(ref)
    rt.forget(ref)  # the lifecycle closed it
    clock[0] += 1  # long before the next sweep
    assert rt.collect(is_closed) == 1
    settle(rt)
    assert core.pods["p"]["metadata"]["finalizers"] == []
    assert rt.collect(is_closed) == 0  # nothing twice
    settle(rt)
    assert len(core.patches) == 1


def test_the_sweep_releases_what_a_predecessor_settled_and_never_a_running_or_open_one(runtime):
    rt, core, clock = runtime
    refs = {name: AttemptRef(str(uuid.uuid4()), 1, 1) for name in ("done", "deleted", "running", "open", "kill")}
    core.add("done", ref=refs["done"], phase="Succeeded")
    core.add("deleted", ref=refs["deleted"], phase="Failed", deleting=True)
    core.add("running", ref=refs["running"], phase="Running")
    core.add("open", ref=refs["open"], phase="Succeeded", deleting=True)
    core.add("kill", ref=refs["kill"], phase="Running", deleting=True)  # closed, being killed
    core.add("nameless", phase="Failed")  # no identity: nothing can ever read it
    open_ = {refs["open"]}
    assert rt.collect(lambda ti_id, epoch: all(r.ti_id != ti_id for r in open_)) == 4
    settle(rt)
    held = {name for name, pod in core.pods.items() if pod["metadata"]["finalizers"]}
    assert held == {"running", "open"}


def test_a_failed_release_is_tried_again_at_the_next_sweep(runtime, caplog):
    rt, core, clock = runtime
    ref = AttemptRef(str(uuid.uuid4()), 1, 1)
    core.add("p", ref=ref, phase="Succeeded")
    core.fail_patch = [503]
    assert rt.collect(lambda *a: True) == 1
    settle(rt)
    assert core.pods["p"]["metadata"]["finalizers"] == [FIN]
    assert "could not release leoflow's finalizer of pod p" in caplog.text
    clock[0] += 31
    assert rt.collect(lambda *a: True) == 1
    settle(rt)
    assert core.pods["p"]["metadata"]["finalizers"] == []


def test_release_pods_is_an_airflow_leoflow_command_with_its_options():
    from leoflow_airflow import cli

    [group] = cli.get_cli_commands()
    [command] = [c for c in group.subcommands if c.name == "release-pods"]
    assert command.func is cli.release_pods
    assert [a.flags for a in command.args] == [("--namespace",), ("--dry-run",), ("--unlabelled",)]


def test_release_pods_lists_only_this_installations_pods_or_only_unlabelled_ones():
    """k8s review §5: ``release-pods`` strips the finalizer of this installation's task pods
    (``leoflow.io/instance=<[leoflow] instance>``), never of another installation's sharing the namespace;
    ``--unlabelled`` takes only pods without the label (a leoflow older than it), which no scheduler now watches."""
    from leoflow_airflow import cli

    assert cli.release_selector("blue", False).split(",") == [
        "app.kubernetes.io/component=task-attempt", "app.kubernetes.io/managed-by=leoflow",
        "app.kubernetes.io/name=leoflow", "app.kubernetes.io/part-of=airflow", "leoflow.io/instance=blue"]
    unlabelled = cli.release_selector("blue", True).split(",")
    assert unlabelled[-1] == "!leoflow.io/instance" and not any(t.startswith("leoflow.io/instance=")
                                                                for t in unlabelled)


def test_collect_settles_a_pod_of_ours_whose_ledger_row_retention_removed(runtime, tmp_path):
    """k8s review §5 and its follow-up: the informer lists only this installation's pods
    (``leoflow.io/instance``, :func:`test_release_pods_lists_only_this_installations_pods_or_only_unlabelled_ones`
    and the informer selector tests), so a pod it holds whose attempt the ledger no longer holds (retention or
    ``airflow db clean`` removed the closed row before the pod's own retention ran out) is ours and settled: its
    finalizer is released and the ended pod deleted, never kept for ever. An open row still keeps it."""
    import dataclasses

    import sqlalchemy as sa

    from leoflow_airflow.ledger.models import metadata
    from leoflow_airflow.ledger.store import LedgerStore
    from leoflow_airflow.lifecycle.core import Lifecycle

    rt, core, clock = runtime
    rt.kube = dataclasses.replace(rt.kube, pod_retention_success=0, pod_retention_failure=0)
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'ledger.db'}")
    metadata.create_all(engine)
    store = LedgerStore(engine)
    ledger = SimpleNamespace(ledger=store)
    open_ti = str(uuid.uuid4())
    held = store.claim_epoch(ti_id=open_ti, try_number=1, dag_id="d", task_id="t", run_id="r", map_index=-1,
                             runtime="kubernetes", workload_json="{}", scheduler_job_id=1)

    def is_closed(ti_id, epoch):  # what the lifecycle answers the runtime's collect
        return Lifecycle._is_closed(ledger, ti_id, epoch)

    deletes: list[str] = []
    core.delete_namespaced_pod = lambda name, namespace, **kw: deletes.append(name)
    core.add("aged-out", ref=AttemptRef(str(uuid.uuid4()), 1, 1), phase="Succeeded")
    core.add("open", ref=held.ref, phase="Failed", deleting=True)
    for _ in range(2):
        clock[0] += 31  # every sweep
        rt.collect(is_closed)
        settle(rt)
    assert core.pods["aged-out"]["metadata"]["finalizers"] == [] and set(deletes) == {"aged-out"}
    assert core.pods["open"]["metadata"]["finalizers"] == [FIN]
    engine.dispose()


def test_an_ended_pods_log_is_kept_before_its_finalizer_is_released(runtime, monkeypatch):
    """Issue 33 item 11: the release job keeps the pod's log first (``logsalvage``), with the attempt's
    ``log_path`` from its ledger row, then releases; a keep that raises still releases."""
    rt, core, clock = runtime
    rt._remote_logging = True  # [logging] remote_logging on, as start() read it
    ref, other = AttemptRef(str(uuid.uuid4()), 1, 1), AttemptRef(str(uuid.uuid4()), 1, 1)
    core.add("p", ref=ref, phase="Failed")
    core.add("q", ref=other, phase="Failed")
    kept: list[tuple[str, str, list[str]]] = []

    def fake_salvage(core_, namespace, name, uid, ref_, target, **kw):
        kept.append((name, target.log_path, list(core.pods[name]["metadata"]["finalizers"])))
        if name == "q":
            raise OSError("disk full")
        return SimpleNamespace(place=None, why="test")

    monkeypatch.setattr("leoflow_airflow.runtime.kubernetes.runtime.salvage_pod_log", fake_salvage)
    workloads = {r.ti_id: json.dumps({"log_path": f"{n}.log", "ti": {"task_id": n}}) for n, r in (("p", ref),
                                                                                                     ("q", other))}
    assert rt.collect(lambda ti_id, epoch: True, lambda ti_id, epoch: workloads[ti_id]) == 2
    settle(rt)
    assert sorted(k[:2] for k in kept) == [("p", "p.log"), ("q", "q.log")]
    assert [held for _, _, held in kept] == [[FIN], [FIN]], "kept while the finalizer still held the pod"
    assert core.pods["p"]["metadata"]["finalizers"] == [] and core.pods["q"]["metadata"]["finalizers"] == []


@pytest.mark.parametrize("salvage, remote_logging", [(False, True), (True, False)])
def test_no_log_is_kept_when_pod_log_salvage_or_remote_logging_is_off(runtime, monkeypatch, salvage, remote_logging):
    import dataclasses

    rt, core, clock = runtime
    rt.kube = dataclasses.replace(rt.kube, pod_log_salvage=salvage)
    rt._remote_logging = remote_logging
    ref = AttemptRef(str(uuid.uuid4()), 1, 1)
    core.add("p", ref=ref, phase="Failed")
    monkeypatch.setattr("leoflow_airflow.runtime.kubernetes.runtime.salvage_pod_log",
                        lambda *a, **k: pytest.fail("a log kept with pod_log_salvage or remote logging off"))
    assert rt.collect(lambda ti_id, epoch: True, lambda ti_id, epoch: '{"log_path": "x.log", "ti": {}}') == 1
    settle(rt)
    assert core.pods["p"]["metadata"]["finalizers"] == []
