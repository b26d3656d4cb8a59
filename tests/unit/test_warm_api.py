"""The warm endpoints' pure parts and the await loop's control (issue 11): the judgement of an assignment,
the request parsers, and the long poll ending at an assignment, at its deadline, or when the client goes
away. The worker rows are a real ``WarmLedger`` on SQLite; Kubernetes and the minter are not called here (the
k8s tier, ``tests/k8s/test_warm_api.py``, runs the endpoints against the real kube-apiserver)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import uuid
from dataclasses import dataclass, replace
from datetime import datetime, timezone

import pytest
import sqlalchemy as sa

from leoflow_agent import outcome
from leoflow_airflow.api import warm
from leoflow_airflow.api.warm import TAKE, UNASSIGN, WAIT, WarmPods, WarmRefused, WarmService, judge_assignment
from leoflow_airflow.ledger.models import metadata
from leoflow_airflow.ledger.states import AttemptRef, AttemptState
from leoflow_airflow.ledger.store import LedgerStore
from leoflow_airflow.ledger.warm import WarmLedger

REF = AttemptRef("0199cccc-0000-7000-8000-000000000001", 1, 2)


@dataclass(frozen=True)
class A:
    """The fields of an ``Attempt`` the judgement reads."""

    ref: AttemptRef = REF
    runtime: str = "kubernetes"
    state: AttemptState = AttemptState.DISPATCHED
    exchanged_at: datetime | None = None
    exchange_credential_id: str | None = None
    pod_uid: str | None = None


@pytest.mark.parametrize("attempt, verdict", [
    (A(), TAKE),
    (A(pod_uid="uid-1"), TAKE),
    (None, UNASSIGN),
    (A(ref=AttemptRef(REF.ti_id, 1, 3)), UNASSIGN),  # a later epoch is current: stale
    (A(ref=AttemptRef(REF.ti_id, 2, 2)), UNASSIGN),
    (A(runtime="lite"), UNASSIGN),
    (A(exchanged_at=datetime(2026, 12, 3, tzinfo=timezone.utc)), UNASSIGN),
    (A(state=AttemptState.CLAIMED), WAIT),
    (A(state=AttemptState.CLOSED), UNASSIGN),
    (A(state=AttemptState.REPORTED), UNASSIGN),
    (A(pod_uid="uid-other"), UNASSIGN),
])
def test_judge_assignment(attempt, verdict):
    assert judge_assignment(attempt, REF, "uid-1")[0] == verdict


def test_bearer_credential_shapes():
    good = "A" * 42 + "_"
    assert warm.bearer_credential(f"Bearer {good}") == good
    assert warm.bearer_credential(f"bearer  {good} ") == good
    for bad in (None, "", good, f"Basic {good}", "Bearer " + "A" * 42, "Bearer " + "A" * 44, "Bearer " + "=" * 43):
        with pytest.raises(WarmRefused) as info:
            warm.bearer_credential(bad)
        assert info.value.reason == "unknown_credential"


def test_parse_await_and_outcome_bodies():
    warm.parse_await(b"{}")
    warm.parse_await(b'{"anything": 1}')
    for bad in (b"", b"[]", b"nope", b"{" * 2000):
        with pytest.raises(WarmRefused, match="malformed_request"):
            warm.parse_await(bad)
    rec = outcome.record_for_state("success", {"state": "success", "end_date": "2026-12-03T12:00:00Z"},
                                   attempt=REF, api_version="2026-06-30")
    text = outcome.encode(rec)
    assert warm.parse_outcome(f" {text}\n".encode()) == (REF, text)
    no_attempt = outcome.encode(replace(rec, ti_id=None))
    for bad in (b"", b"\xff\xfe", b"{}", no_attempt.encode(), b"x" * (warm.MAX_OUTCOME_BYTES + 1)):
        with pytest.raises(WarmRefused, match="bad_record"):
            warm.parse_outcome(bad)


# --- the await loop ---------------------------------------------------------------------------------------

class Attempts:
    """The attempt ledger seam over a real ``LedgerStore``, counting ``record_exchange`` and able to refuse it."""

    def __init__(self, store: LedgerStore) -> None:
        self.store = store
        self.refuse_exchange = False

    def current(self, ti_id: str):
        return self.store.current(ti_id)

    def record_exchange(self, ref, *, credential_id):
        if self.refuse_exchange:
            return False
        return self.store.record_exchange(ref, credential_id=credential_id)


@pytest.fixture
def env(tmp_path):
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'ledger.db'}")
    metadata.create_all(engine)
    store = LedgerStore(engine)
    workers = WarmLedger(engine)
    attempts = Attempts(store)
    pods = WarmPods(config=None, kube=None, workers=workers, attempts=attempts,  # type: ignore[arg-type]
                    mint=lambda a: json.dumps({"ti": a.ref.ti_id, "token": "minted"}))
    credential = "C" * 43
    assert workers.register(pod_uid="uid-1", pod_name="w", namespace="ns", dag_version_id=str(uuid.uuid4()),
                            credential_sha256=hashlib.sha256(credential.encode()).hexdigest())
    yield store, workers, attempts, pods, f"Bearer {credential}"
    engine.dispose()


def dispatched(store: LedgerStore) -> AttemptRef:
    ti = str(uuid.uuid4())
    a = store.claim_epoch(ti_id=ti, try_number=1, dag_id="d", task_id="t", run_id="r", map_index=-1,
                          runtime="kubernetes", workload_json="{}", scheduler_job_id=1)
    assert store.transition(a.ref, expected=[AttemptState.CLAIMED], to=AttemptState.DISPATCHED)
    return a.ref


class Loop:
    """A fake clock and sleep for the await loop: each sleep advances the clock, and may run a step."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps = 0
        self.on_sleep = None

    def monotonic(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps += 1
        self.now += seconds
        if self.on_sleep is not None:
            self.on_sleep(self.sleeps)


async def inline(fn, *args):
    return fn(*args)


def run_await(service: WarmService, auth: str, loop: Loop, disconnected=lambda: False):
    async def gone() -> bool:
        return disconnected()

    return asyncio.run(service.await_(auth, b"{}", gone, to_thread=inline, sleep=loop.sleep,
                                      monotonic=loop.monotonic))


def test_await_polls_every_interval_until_the_deadline_then_204(env):
    *_, pods, auth = env
    loop = Loop()
    answer = run_await(WarmService(pods, await_seconds=20, poll_interval=0.25), auth, loop)
    assert answer.status == 204
    assert loop.sleeps == 80 and loop.now == 20.0


def test_await_ends_at_the_first_poll_after_the_client_went_away(env):
    *_, pods, auth = env
    loop = Loop()
    answer = run_await(WarmService(pods, await_seconds=20, poll_interval=0.25), auth, loop,
                       disconnected=lambda: loop.sleeps >= 3)
    assert answer.status == 204 and loop.sleeps == 3


def test_await_delivers_an_assignment_made_while_it_waits(env):
    store, workers, _, pods, auth = env
    ref = dispatched(store)
    loop = Loop()
    loop.on_sleep = lambda n: n == 5 and workers.assign("uid-1", ref, row_version=workers.get("uid-1").row_version)
    answer = run_await(WarmService(pods, await_seconds=20, poll_interval=0.25), auth, loop)
    assert answer.status == 200 and loop.sleeps == 5
    assert answer.body == {"ti_id": ref.ti_id, "try_number": 1, "attempt_epoch": 1,
                           "workload": {"ti": ref.ti_id, "token": "minted"}}


def test_a_taken_assignment_whose_exchange_write_changes_nothing_answers_204_and_stays_busy(env):
    store, workers, attempts, pods, auth = env
    ref = dispatched(store)
    workers.assign("uid-1", ref, row_version=0)
    attempts.refuse_exchange = True  # a concurrent exchange of the attempt won the guarded write
    loop = Loop()
    answer = run_await(WarmService(pods, await_seconds=20, poll_interval=0.25), auth, loop)
    assert answer.status == 204 and loop.sleeps == 0
    assert (workers.get("uid-1").state, workers.get("uid-1").ref) == ("busy", ref)
    # its next await lets go of it
    attempts.refuse_exchange = False
    assert run_await(WarmService(pods, await_seconds=1, poll_interval=0.25), auth, Loop()).status == 204
    assert workers.get("uid-1").state == "idle"


def test_a_worker_forgotten_during_the_wait_gets_401(env):
    _, workers, _, pods, auth = env
    loop = Loop()
    loop.on_sleep = lambda n: n == 2 and workers.forget("uid-1")
    answer = run_await(WarmService(pods, await_seconds=20, poll_interval=0.25), auth, loop)
    assert answer.status == 401 and answer.body["error"] == "unknown_credential"


def test_a_ledger_that_cannot_be_read_answers_503_with_retry_after(env):
    store, workers, _, pods, auth = env
    workers.engine.dispose()
    with workers.engine.begin() as conn:
        conn.execute(sa.text("DROP TABLE leoflow_warm_worker"))
    answer = run_await(WarmService(pods, await_seconds=1, poll_interval=0.25), auth, Loop())
    assert answer.status == 503 and answer.body["error"] == "ledger_unavailable"
    assert answer.headers["Retry-After"]


def test_an_off_service_answers_the_exchanges_reason(env):
    *_, auth = env
    off = WarmService(None, off=("disabled", "[leoflow] runtime is not kubernetes"))
    assert run_await(off, auth, Loop()).status == 403
    answer = WarmService(None, off=("not_configured", "x")).register(b'{"token": "a.b.c"}')
    assert answer.status == 503 and answer.body["error"] == "not_configured"


# --- who may register (k8s review §1) ---------------------------------------------------------------------

def _facts(pod, **changes):
    """The ``PodFacts`` the pod GET would give for the built ``pod`` (a ``V1Pod``), with ``changes``."""
    from leoflow_airflow.runtime.kubernetes.review import OwnerRef, PodFacts

    meta = pod.metadata
    facts = PodFacts(name=meta.name, namespace=meta.namespace, uid=str(uuid.uuid4()),
                     annotations=dict(meta.annotations or {}), labels=dict(meta.labels or {}),
                     owner_references=tuple(OwnerRef(o.api_version, o.kind, o.name, o.uid or "", bool(o.controller))
                                            for o in meta.owner_references or ()))
    return replace(facts, **changes)


def test_a_task_pod_cannot_become_a_warm_worker(tmp_path, monkeypatch):
    """A DAG author's cold task pod that claims another DAG version's warm pool (``leoflow.io/warm`` and
    ``leoflow.io/dag-version`` labels) is refused when it is built, whichever layer sets them; and the warm
    registration takes only a pod leoflow made as a warm pod (its name, no attempt identity, its anchor as
    controller owner), so even a pod that carries every warm label gets no worker row."""
    from kubernetes.client import models as k8s

    from leoflow_airflow import settings as leoflow_settings
    from leoflow_airflow.api.exchange import BoundPod
    from leoflow_airflow.errors import PodRefused
    from leoflow_airflow.runtime.kubernetes import warmpods
    from leoflow_airflow.runtime.kubernetes.pod import PodAttempt, build_pod

    values = {"image": "registry.example/leoflow:1", "exchange_url": "https://airflow.example/leoflow"}
    kube = leoflow_settings.load_kubernetes(lambda section, key, fallback: values.get(key, fallback))
    victim = str(uuid.uuid4())  # tenant B's DAG version
    claim = {"leoflow.io/warm": "true", "leoflow.io/dag-version": victim, "leoflow.io/scheduler-job": "7"}
    attempt = PodAttempt(str(uuid.uuid4()), 1, 1, "tenant_a_dag", "t", "r")

    # the pod builder: a DAG author's override that sets a leoflow label is refused, naming it
    override = {"pod_override": k8s.V1Pod(metadata=k8s.V1ObjectMeta(labels=claim),
                                          spec=k8s.V1PodSpec(containers=[]))}
    with pytest.raises(PodRefused) as err:
        build_pod(attempt, kube, executor_config=override)
    assert err.value.field == "metadata.labels.leoflow.io/warm"
    # ... and the operator's template and hooks cannot carry them either: leoflow's values replace theirs
    template = k8s.V1Pod(metadata=k8s.V1ObjectMeta(labels={**claim, "team": "a"}),
                         spec=k8s.V1PodSpec(containers=[k8s.V1Container(name="base")]))

    def hook(p):
        p.metadata.labels.update({**claim, "app.kubernetes.io/component": "warm-pod"})

    for cold in (build_pod(attempt, kube, template=template),
                 build_pod(attempt, kube, mutation_hook=hook, template=template),
                 build_pod(attempt, kube, plugin_hook=lambda p, a: hook(p), template=template)):
        assert cold.metadata.labels["team"] == "a" and not set(claim) & set(cold.metadata.labels)
        assert cold.metadata.labels["app.kubernetes.io/component"] == "task-attempt"

    # the registration: only a warm pod leoflow built, of the version its labels name
    from leoflow_airflow.runtime.kubernetes.review import OwnerRef

    engine = sa.create_engine(f"sqlite:///{tmp_path / 'ledger.db'}")
    metadata.create_all(engine)
    workers = WarmLedger(engine)
    pods = WarmPods(config=kube, kube=None, workers=workers, attempts=None, mint=None)  # type: ignore[arg-type]
    facts = {}
    monkeypatch.setattr(warm, "authenticate_pod", lambda cfg, k, token, **kw: BoundPod(
        pod=facts["pod"], credential_id="JTI=1", where=f"pod {facts['pod'].name}"))

    def register(pod) -> str:
        facts["pod"] = pod
        try:
            pods.register("token", await_seconds=20)
        except WarmRefused as exc:
            assert workers.get(pod.uid) is None
            return exc.reason
        return "registered"

    real = warmpods.build_warm_pod(
        warmpods.PoolVersion(victim, "tenant_b_dag", "bundle", "", "dags/b.py"), kube, leoflow_settings.WarmSettings(),
        job_id="7", name=warmpods.warm_pod_name("7", victim), anchor_uid="anchor-uid")
    anchor = OwnerRef("v1", "ConfigMap", warmpods.anchor_name("7", victim), "anchor-uid", True)
    forged = _facts(cold, labels={**cold.metadata.labels, **claim})  # a task pod carrying every warm label
    assert register(forged) == "not_warm_pod"
    assert register(replace(forged, owner_references=(anchor,))) == "not_warm_pod"  # a task pod's name
    good = _facts(real)
    assert register(replace(good, annotations={"leoflow.io/attempt": "x"})) == "not_warm_pod"
    assert register(replace(good, owner_references=())) == "not_warm_pod"
    assert register(replace(good, owner_references=(replace(anchor, controller=False),))) == "not_warm_pod"
    other = OwnerRef("v1", "ConfigMap", warmpods.anchor_name("7", str(uuid.uuid4())), "u", True)
    assert register(replace(good, owner_references=(other,))) == "not_warm_pod"  # another version's anchor
    assert register(replace(good, owner_references=(replace(anchor, kind="Secret"),))) == "not_warm_pod"
    assert register(replace(good, labels={**good.labels, "leoflow.io/scheduler-job": "8"})) == "not_warm_pod"
    assert register(replace(good, name=warmpods.warm_pod_name("7", str(uuid.uuid4())))) == "not_warm_pod"
    assert register(good) == "registered"
    assert workers.get(good.uid).dag_version_id == victim
    engine.dispose()
