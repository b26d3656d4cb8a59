"""``KubernetesRuntime``'s scheduler-side bookkeeping, with a stub pod informer and a stub ``CoreV1Api`` whose
calls the test releases: launches never wait for the API server, the number of creates in flight is bounded,
a kill of a launch whose create is in flight deletes its pod (UID precondition) the moment the create answers,
a 503 closes the back-off window, and a missing ServiceAccount keeps dispatch DEFERRED with one clear error.
The runtime against a real API server is ``tests/k8s/test_kube_runtime.py``."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from types import SimpleNamespace

import pytest

from leoflow_airflow import settings as leoflow_settings
from leoflow_airflow.dispatch.disposition import Disposition
from leoflow_airflow.ledger.states import AttemptRef
from leoflow_airflow.lifecycle.runtime import LaunchFailed, LaunchSpec, Presence, Started, launch_id
from leoflow_airflow.runtime.kubernetes.runtime import KubernetesRuntime


class StubInformer:
    """Synced at once, empty: every pod is absent from the cache."""

    synced = True
    last_error = None

    def __init__(self, *args) -> None:
        self.args = args

    def start(self) -> None:
        pass

    def stop(self, timeout: float) -> None:
        pass

    def get(self, name):
        return None

    def tombstone(self, name, uid):
        return None

    def views(self):
        return []

    def ending(self):
        return [v for v in self.views() if v.terminal or v.deleting]

    def has_uid(self, uid):
        return any(v.uid == uid for v in self.views())

    def take_changed(self):
        return set()  # no watch event: poll() looks only at what its own state says


class ApiError(Exception):
    def __init__(self, status: int, body: str = "") -> None:
        super().__init__(f"HTTP {status}")
        self.status, self.body, self.headers, self.reason = status, body, {}, ""


class StubCore:
    """``CoreV1Api`` calls the runtime makes; creates wait for ``release`` and answer ``create_answer``."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.create_answer: Exception | None = None
        self.service_account_missing = False
        self.creates: list[str] = []
        self.deletes: list[tuple[str, str | None, int | None]] = []
        self.deleted = threading.Event()

    def list_namespaced_pod(self, namespace, **kw):
        return SimpleNamespace(items=[])

    def read_namespace(self, name, **kw):
        return SimpleNamespace()

    def read_namespaced_service_account(self, name, namespace, **kw):
        if self.service_account_missing:
            raise ApiError(404)
        return SimpleNamespace()

    def create_namespaced_pod(self, namespace, pod, **kw):
        self.creates.append(pod.metadata.name)
        assert self.release.wait(10)
        if self.create_answer is not None:
            raise self.create_answer
        return SimpleNamespace(metadata=SimpleNamespace(uid=f"uid-{pod.metadata.name}"))

    def read_namespaced_pod(self, name, namespace, **kw):
        raise ApiError(404)

    def delete_namespaced_pod(self, name, namespace, body=None, **kw):
        uid = body.preconditions.uid if body.preconditions else None
        self.deletes.append((name, uid, body.grace_period_seconds))
        self.deleted.set()


@pytest.fixture
def runtime(monkeypatch):
    core = StubCore()
    monkeypatch.setattr("kubernetes.client.CoreV1Api", lambda api: core)
    conf = {"runtime": "kubernetes", "image": "img:1", "exchange_url": "http://x/leoflow", "launch_queue_size": "2"}
    s = leoflow_settings.load(lambda section, key, fallback: conf.get(key, fallback))
    rts = []

    def make() -> KubernetesRuntime:
        rt = KubernetesRuntime(s, api_client_factory=lambda: SimpleNamespace(), informer_factory=StubInformer,
                               mutation_hook=False)
        rts.append(rt)
        return rt

    yield make, core
    core.release.set()
    for rt in rts:
        rt.terminate()


def spec(epoch: int = 1) -> LaunchSpec:
    ref = AttemptRef(str(uuid.uuid4()), 1, epoch)
    ti = SimpleNamespace(dag_id="dag", task_id="task", run_id="run", map_index=-1, executor_config=None)
    return LaunchSpec(launch_id(ref), ref, SimpleNamespace(ti=ti))


def up(rt: KubernetesRuntime) -> None:
    rt.start()
    deadline = time.monotonic() + 10
    while rt.admit() is not None:
        assert time.monotonic() < deadline, rt.admit()
        time.sleep(0.01)


def events_until(rt: KubernetesRuntime, n: int) -> list:
    out, deadline = [], time.monotonic() + 10
    while len(out) < n:
        assert time.monotonic() < deadline, out
        out.extend(rt.poll())
        time.sleep(0.01)
    return out


def test_launch_returns_at_once_and_creates_in_flight_are_bounded(runtime):
    make, core = runtime
    rt = make()
    up(rt)
    first, second = spec(), spec()
    t0 = time.monotonic()
    assert rt.launch(first).disposition is Disposition.DISPATCHED
    assert rt.launch(second).disposition is Disposition.DISPATCHED
    assert time.monotonic() - t0 < 0.5  # the creates wait on the pool, not here
    full = rt.admit()
    assert full is not None and full.disposition is Disposition.DEFERRED and "launch_queue_size" in full.reason
    assert rt.poll() == []
    core.release.set()
    # the stub informer's cache stays empty, so a created pod may also be judged gone (an Exited) before the
    # other create returns: only the Started events are this test's
    started, deadline = [], time.monotonic() + 10
    while len(started) < 2:
        assert time.monotonic() < deadline, started
        started.extend(e for e in rt.poll() if isinstance(e, Started))
        time.sleep(0.01)
    assert {e.launch_id for e in started} == {first.launch_id, second.launch_id}, started
    assert all(e.facts["pod_uid"].startswith("uid-") for e in started)
    assert rt.admit() is None


def test_a_kill_while_the_create_is_in_flight_deletes_the_pod_once_it_exists(runtime):
    make, core = runtime
    rt = make()
    up(rt)
    s = spec()
    rt.launch(s)
    row = SimpleNamespace(ref=s.ref, pod_name=None, pod_uid=None, dag_id="dag", task_id="task", run_id="run",
                          map_index=-1)
    assert rt.observe([row]) == {s.ref: Presence.UNKNOWN}
    assert rt.kill(row, grace=0.0) is Presence.GONE  # nothing of it runs yet, and nothing of it will
    core.release.set()
    [event] = events_until(rt, 1)
    assert isinstance(event, Started)
    assert core.deleted.wait(10)
    assert core.deletes == [(event.facts["pod_name"], event.facts["pod_uid"], 0)]


def test_a_503_is_retried_and_closes_the_window(runtime):
    make, core = runtime
    rt = make()
    up(rt)
    core.create_answer = ApiError(503, '{"kind":"Status","message":"etcdserver: leader changed"}')
    core.release.set()
    s = spec()
    rt.launch(s)
    [event] = events_until(rt, 1)
    assert isinstance(event, LaunchFailed) and event.retryable and "leader changed" in event.error
    wait = rt.admit()
    assert wait is not None and wait.disposition is Disposition.DEFERRED and "leader changed" in wait.reason


def test_a_pod_that_cannot_be_built_is_refused_at_once(runtime):
    make, core = runtime
    rt = make()
    up(rt)
    s = spec()
    s.workload.ti.executor_config = {"pod_template_file": "/x.yaml"}
    result = rt.launch(s)
    assert result.disposition is Disposition.REFUSED and "executor_config.pod_template_file" in result.reason
    assert core.creates == []


def test_a_missing_service_account_keeps_dispatch_deferred_with_one_error(runtime, caplog):
    make, core = runtime
    core.service_account_missing = True
    rt = make()
    caplog.set_level(logging.ERROR, logger="leoflow_airflow.runtime.kubernetes.runtime")
    rt.start()
    deadline = time.monotonic() + 10
    while "does not exist" not in (rt.admit() or SimpleNamespace(reason="")).reason:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    for _ in range(5):
        rt.poll()
    wait = rt.admit()
    assert wait.disposition is Disposition.DEFERRED
    assert "ServiceAccount default/default does not exist" in wait.reason and "[leoflow] service_account" in wait.reason
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "ServiceAccount default/default does not exist" in errors[0].getMessage()


def test_a_callback_runs_as_a_local_child_fed_on_stdin(runtime):
    """A callback workload goes to a child process on stdin (never argv or the environment) and its exit code
    comes back as CallbackDone; here a workload Airflow cannot parse, so the child fails: ok False."""
    make, core = runtime
    rt = make()
    secret = "eyJhbGciOiJIUzUxMiJ9.not-a-workload"

    class Workload:
        def model_dump_json(self) -> str:
            return '{"type": "ExecuteCallback", "token": "%s"}' % secret

    assert rt.launch_callback("cb-1", Workload()).disposition is Disposition.DISPATCHED
    proc = rt._callbacks["cb-1"]
    assert secret not in " ".join(proc.args)
    assert proc.wait(120) != 0
    [done] = events_until(rt, 1)
    assert done.launch_id == "cb-1" and done.ok is False


def test_start_progress_keeps_a_pods_first_seen_time_while_other_pages_are_asked(runtime, monkeypatch):
    """The lifecycle asks ``start_progress`` for one keyset page of attempts per sync() (issue 10 item 1): a pod
    pulling its image is asked again only a sweep later, and must keep the time it was first seen pulling (the
    60 s image-pull grace counts from it), not start over because other pages were asked in between. Its entry
    goes once its attempt is forgotten."""
    from leoflow_airflow.runtime.kubernetes import decide

    make, _ = runtime
    rt = make()
    a, b = (SimpleNamespace(ref=AttemptRef(str(uuid.uuid4()), 1, 1)) for _ in range(2))
    uid = {a.ref: "uid-a", b.ref: "uid-b"}
    monkeypatch.setattr(rt, "_where", lambda attempt: ("pod", uid[attempt.ref], None))
    monkeypatch.setattr(rt, "_presence", lambda name, u, ref, now=None: (Presence.LIVE, SimpleNamespace(uid=u)))
    monkeypatch.setattr(decide, "start_key", lambda view: "pulling")
    firsts: list[tuple[str, object]] = []

    def progress(view, *, first_seen, unschedulable_timeout):
        firsts.append((view.uid, first_seen))
        return first_seen

    monkeypatch.setattr(decide, "start_progress", progress)
    rt.start_progress([a])
    rt.start_progress([b])  # the next page
    rt.start_progress([a])  # a sweep later
    assert [u for u, _ in firsts] == ["uid-a", "uid-b", "uid-a"]
    assert firsts[2][1] == firsts[0][1]
    rt._launches[launch_id(a.ref)] = SimpleNamespace(creating=False, name="pod", uid="uid-a")
    rt.forget(a.ref)
    rt.start_progress([a])
    assert firsts[3][1] > firsts[0][1]  # forgotten: first seen anew


class ViewsInformer(StubInformer):
    """Synced, serving the views a test puts in ``pods``; ``changed`` is what the watch touched since the
    last ``take_changed``."""

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.pods: dict = {}
        self.changed: set[str] = set()

    def get(self, name):
        return self.pods.get(name)

    def take_changed(self):
        out, self.changed = self.changed, set()
        return out


def _pod(name: str, uid: str, ended: bool):
    from leoflow_airflow.runtime.kubernetes.status import pod_view

    state = {"terminated": {"exitCode": 0, "reason": "Completed"}} if ended else {"running": {}}
    return pod_view({"metadata": {"name": name, "uid": uid, "namespace": "ns"},
                     "status": {"phase": "Succeeded" if ended else "Running",
                                "containerStatuses": [{"name": "base", "state": state}]}})


def test_poll_looks_at_pods_that_changed_at_once_and_at_the_others_in_turn(monkeypatch):
    """Issue 10, "Benchmark": a scheduler loop's poll() must not walk every running pod. It looks at the pods
    the watch touched (an ended one is reported at the next poll) and, as a safety net, at the next
    ``reap_page_size`` of the others in turn, so an end no event announced is still reported within
    ``ceil(pods / reap_page_size)`` polls."""
    from leoflow_airflow.lifecycle.runtime import Exited
    from leoflow_airflow.runtime.kubernetes import runtime as runtime_module

    core = StubCore()
    monkeypatch.setattr("kubernetes.client.CoreV1Api", lambda api: core)
    conf = {"runtime": "kubernetes", "image": "img:1", "exchange_url": "http://x/leoflow", "reap_page_size": "1"}
    rt = KubernetesRuntime(leoflow_settings.load(lambda section, key, fallback: conf.get(key, fallback)),
                           api_client_factory=lambda: SimpleNamespace(), informer_factory=ViewsInformer,
                           mutation_hook=False)
    try:
        up(rt)
        refs = [AttemptRef(str(uuid.uuid4()), 1, 1) for _ in range(4)]
        for i, ref in enumerate(refs):
            rt._launches[launch_id(ref)] = runtime_module._Launch(ref, f"pod-{i}", uid=f"u{i}", polled=True)
            rt.informer.pods[f"pod-{i}"] = _pod(f"pod-{i}", f"u{i}", ended=False)
        looked: list[str] = []
        real = rt._presence
        monkeypatch.setattr(rt, "_presence",
                            lambda name, uid, ref, now=None: (looked.append(name), real(name, uid, ref, now))[1])

        assert rt.poll() == [] and len(looked) == 1  # nothing changed: only the one in turn

        looked.clear()
        rt.informer.pods["pod-2"] = _pod("pod-2", "u2", ended=True)
        rt.informer.changed = {"pod-2"}
        events = rt.poll()
        assert [e for e in events if isinstance(e, Exited)] == [Exited(launch_id(refs[2]), 0)]
        assert "pod-2" in looked and len(looked) <= 2

        rt.informer.pods["pod-0"] = _pod("pod-0", "u0", ended=True)  # no event says so
        found, polls = [], 0
        while not found:
            polls += 1
            assert polls <= 4, "an end no event announced was not found within ceil(pods / page) polls"
            found = [e for e in rt.poll() if isinstance(e, Exited)]
        assert found == [Exited(launch_id(refs[0]), 0)]
    finally:
        core.release.set()
        rt.terminate()
