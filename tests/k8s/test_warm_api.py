"""The warm pods' endpoints against the real kube-apiserver (issue 11): register, await, outcome.

Real parts, as ``test_exchange.py``: the kube-apiserver of ``scripts/k8senv`` (TokenReview, pods, RBAC; the
api-server identity may only ``create tokenreviews`` and ``get pods``), pod-bound tokens from the real
TokenRequest API, the ledger on SQLite (``LedgerStore`` + ``WarmLedger``), Airflow's ``JWTGenerator`` built from
Airflow's config, and leoflow's FastAPI app called in-process (``TestClient``), its lifespan included. One
namespace, one app and one ledger for the module (each test makes its own pods and attempts); the long poll is
held 1 s instead of 20 s so the 204 answers come quickly.
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from kubernetes import client

from leoflow_agent import outcome
from leoflow_agent.exchange import request_body
from leoflow_airflow.api import warm as warm_api
from leoflow_airflow.api.app import create_app
from leoflow_airflow.api.exchange import from_airflow
from leoflow_airflow.ledger.models import metadata
from leoflow_airflow.ledger.states import AttemptRef, AttemptState
from leoflow_airflow.ledger.store import LedgerStore
from leoflow_airflow.ledger.warm import WarmLedger

from .conftest import _fresh_namespace, wait_for
from .exchange_wiring import (
    AUDIENCE,
    OTHER_SA,
    TASK_SA,
    drop_finalizers,
    kube_attempt,
    make_pod,
    make_warm_pod,
    pod_token,
    wire_namespace,
)

pytestmark = pytest.mark.k8s

SECRET = "warm-test-secret-" + "k" * 64
TASK_AUDIENCE = "urn:airflow.apache.org:task"
HOLD = "leoflow.test/hold"
AWAIT_SECONDS = 1.0


@dataclass
class WarmEnv:
    """The module's namespace, ledger and app."""

    core: client.CoreV1Api
    namespace: str
    node: str
    store: LedgerStore
    workers: WarmLedger
    http: TestClient

    def warm_pod(self, **kw) -> client.V1Pod:
        """A warm pod on a kwok node (``make_warm_pod``)."""
        return make_warm_pod(self.core, self.namespace, node=self.node, **kw)

    def token(self, pod: client.V1Pod, **kw) -> str:
        return pod_token(self.core, self.namespace, pod, **kw)

    def register(self, pod: client.V1Pod, **kw):
        return self.http.post("/v1/warm/register", content=request_body(self.token(pod, **kw)),
                              headers={"content-type": "application/json"})

    def registered(self, pod: client.V1Pod) -> str:
        """Register ``pod``; its credential."""
        r = self.register(pod)
        assert r.status_code == 200, r.text
        return r.json()["credential"]

    def await_(self, credential: str, body: bytes = b"{}"):
        return self.http.post("/v1/warm/await", content=body, headers={"authorization": f"Bearer {credential}"})

    def post_outcome(self, credential: str, body: bytes | str):
        return self.http.post("/v1/outcome", content=body, headers={"authorization": f"Bearer {credential}"})

    def attempt(self, *, ti_id: str | None = None, state: AttemptState = AttemptState.DISPATCHED) -> AttemptRef:
        """A Kubernetes attempt in the ledger (CLAIMED, then ``state``)."""
        return kube_attempt(self.store, ti_id=ti_id, state=state)

    def assign(self, pod: client.V1Pod, ref: AttemptRef) -> None:
        """What the scheduler's launch does: assign ``ref`` to the idle worker of ``pod``."""
        row = self.workers.get(pod.metadata.uid)
        assert row is not None and row.state == "idle", row
        assert self.workers.assign(pod.metadata.uid, ref, row_version=row.row_version)


@pytest.fixture(scope="module")
def wenv(api, core, k8s_env, tmp_path_factory, request) -> Iterator[WarmEnv]:
    """One namespace wired for the exchange, a ledger, and the app whose lifespan builds the exchange and the
    warm endpoints from Airflow's config."""
    namespaces = _fresh_namespace(core, request)
    namespace = next(namespaces)
    tmp = tmp_path_factory.mktemp("warm-api")
    kubeconfig, unwire = wire_namespace(api, core, namespace, k8s_env, tmp / "api-server.kubeconfig")
    engine = sa.create_engine(f"sqlite:///{tmp / 'ledger.db'}")
    metadata.create_all(engine)
    store = LedgerStore(engine)
    options = {"runtime": "kubernetes", "namespace": namespace, "service_account": TASK_SA,
               "exchange_audience": AUDIENCE, "in_cluster": "False", "kube_config": str(kubeconfig),
               "exchange_timeout_seconds": "10"}
    app = create_app(exchange_factory=lambda: from_airflow(ledger=store, get=lambda s, k, f: options.get(k, f)),
                     warm_factory=lambda ex: warm_api.from_exchange(ex, await_seconds=AWAIT_SECONDS), ui=False)
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("AIRFLOW__API_AUTH__JWT_SECRET", SECRET)
            mp.setenv("AIRFLOW__EXECUTION_API__JWT_AUDIENCE", TASK_AUDIENCE)
            with TestClient(app) as http:
                assert app.state.leoflow_warm.pods is not None, app.state.leoflow_warm.off
                yield WarmEnv(core=core, namespace=namespace, node=k8s_env.nodes[0], store=store,
                              workers=WarmLedger(engine), http=http)
    finally:
        engine.dispose()
        drop_finalizers(core, namespace)  # let held pods go with their namespace
        unwire()
        next(namespaces, None)


def error(response, status: int) -> str:
    """Assert an error answer of ``status`` carrying exactly a reason and an error id; return the reason."""
    assert response.status_code == status, (response.status_code, response.text)
    body = response.json()
    assert body.keys() == {"error", "error_id"}, body
    return body["error"]


# --- register ---------------------------------------------------------------------------------------------

def test_a_warm_pod_registers_and_gets_a_credential_stored_only_as_its_hash(wenv, statsd):
    version = str(uuid.uuid4())
    pod = wenv.warm_pod(version=version)
    r = wenv.register(pod)
    assert r.status_code == 200, r.text
    assert r.headers["cache-control"] == "no-store"
    body = r.json()
    assert body.keys() == {"credential", "pod_uid", "dag_version_id", "await_seconds"}
    assert (body["pod_uid"], body["dag_version_id"], body["await_seconds"]) == (pod.metadata.uid, version, 1)
    credential = body["credential"]
    assert len(credential) == 43
    row = wenv.workers.by_credential(hashlib.sha256(credential.encode()).hexdigest())
    assert (row.pod_uid, row.pod_name, row.namespace, row.dag_version_id, row.state) == (
        pod.metadata.uid, pod.metadata.name, wenv.namespace, version, "idle")
    with wenv.store.engine.connect() as conn:
        stored = conn.execute(sa.text("SELECT credential_sha256 FROM leoflow_warm_worker WHERE pod_uid = :u"),
                              {"u": pod.metadata.uid}).scalar_one()
    assert stored == hashlib.sha256(credential.encode()).hexdigest() and credential not in stored
    assert "leoflow.warm.register.ok" in statsd.wait_names({"leoflow.warm.register.ok"})


def test_a_re_register_replaces_the_credential_unless_the_pod_holds_an_attempt(wenv):
    pod = wenv.warm_pod()
    old = wenv.registered(pod)
    new = wenv.registered(pod)
    assert new != old
    assert error(wenv.await_(old), 401) == "unknown_credential"
    wenv.assign(pod, wenv.attempt())
    assert error(wenv.register(pod), 403) == "holds_attempt"
    assert wenv.await_(new).status_code == 200  # the held attempt is still this credential's


def test_a_task_pod_is_not_a_warm_pod(wenv, statsd):
    ref = wenv.attempt()
    task_pod = make_pod(wenv.core, wenv.namespace, ref, node=wenv.node)
    assert error(wenv.register(task_pod), 403) == "not_warm_pod"
    no_version = wenv.warm_pod(labels={"leoflow.io/warm": "true"})
    assert error(wenv.register(no_version), 403) == "not_warm_pod"
    # every warm label, but no anchor owns it (k8s review §1: what a forged pod would look like)
    unanchored = wenv.warm_pod(anchored=False)
    assert error(wenv.register(unanchored), 403) == "not_warm_pod"
    assert all(wenv.workers.get(p.metadata.uid) is None for p in (task_pod, no_version, unanchored))
    names = statsd.wait_names({"leoflow.warm.register.denied.not_warm_pod"})
    assert "leoflow.warm.register.denied.not_warm_pod" in names and "leoflow.warm.register.ok" not in names, names


def test_a_deleting_pod_is_refused_though_kubernetes_still_accepts_its_token(wenv):
    pod = wenv.warm_pod(finalizers=[HOLD])
    token = wenv.token(pod)
    wenv.core.delete_namespaced_pod(pod.metadata.name, wenv.namespace, grace_period_seconds=0)
    wait_for(lambda: wenv.core.read_namespaced_pod(pod.metadata.name, wenv.namespace).metadata.deletion_timestamp,
             30, what="deletionTimestamp")
    r = wenv.http.post("/v1/warm/register", content=request_body(token))
    assert error(r, 403) == "pod_deleting"
    assert wenv.workers.get(pod.metadata.uid) is None


def test_wrong_audience_and_other_pods_tokens_are_refused(wenv):
    pod = wenv.warm_pod()
    # refused from the token's own (unverified) claims, before any TokenReview (k8s review §10)
    assert error(wenv.register(pod, audiences=["someone-else"]), 403) == "implausible_token"
    other = wenv.warm_pod(sa_name=OTHER_SA)
    assert error(wenv.register(other, sa_name=OTHER_SA), 403) == "implausible_token"
    # a token of a pod since replaced by another pod of the same name
    first = wenv.warm_pod()
    old_token = wenv.token(first)
    wenv.core.delete_namespaced_pod(first.metadata.name, wenv.namespace, grace_period_seconds=0)
    wait_for(lambda: not wenv.core.list_namespaced_pod(
        wenv.namespace, field_selector=f"metadata.name={first.metadata.name}").items, 30, what="pod gone")
    wenv.warm_pod(name=first.metadata.name)
    r = wenv.http.post("/v1/warm/register", content=request_body(old_token))
    assert error(r, 403) in {"unauthenticated", "pod_replaced"}
    assert error(wenv.http.post("/v1/warm/register", content=b"{}"), 403) == "malformed_request"
    assert [w.pod_uid for w in wenv.workers.workers(wenv.namespace) if w.pod_uid in
            (pod.metadata.uid, other.metadata.uid, first.metadata.uid)] == []


# --- await ------------------------------------------------------------------------------------------------

def test_await_answers_204_after_the_wait_when_nothing_is_assigned(wenv):
    pod = wenv.warm_pod()
    credential = wenv.registered(pod)
    assert wenv.workers.get(pod.metadata.uid).last_seen_at is None  # registered, not ready until it awaits
    t0 = time.monotonic()
    r = wenv.await_(credential)
    elapsed = time.monotonic() - t0
    assert r.status_code == 204 and r.content == b""
    assert AWAIT_SECONDS <= elapsed < AWAIT_SECONDS + 3, elapsed
    assert wenv.workers.get(pod.metadata.uid).last_seen_at is not None
    assert error(wenv.await_("x" * 43), 401) == "unknown_credential"
    assert error(wenv.http.post("/v1/warm/await", content=b"{}"), 401) == "unknown_credential"
    assert error(wenv.http.post("/v1/warm/await", content=b"[", headers={"authorization": f"Bearer {credential}"}),
                 400) == "malformed_request"


def test_await_delivers_an_assignment_made_during_the_wait_with_a_fresh_workload_token(wenv):
    """The scheduler assigns while the worker waits: the workload is delivered within a poll interval, with a
    workload token Airflow's own Execution API validator accepts for this ti_id; the worker is busy, the attempt
    marked exchanged by ``warm:<pod uid>``."""
    pod = wenv.warm_pod()
    credential = wenv.registered(pod)
    ref = wenv.attempt()
    timer = threading.Timer(0.4, wenv.assign, (pod, ref))
    timer.start()
    t0 = time.monotonic()
    r = wenv.await_(credential)
    timer.join()
    assert r.status_code == 200, r.text
    assert time.monotonic() - t0 < AWAIT_SECONDS + 0.5
    body = r.json()
    assert (body["ti_id"], body["try_number"], body["attempt_epoch"]) == (ref.ti_id, 1, 1)

    from airflow.api_fastapi.execution_api.app import _jwt_validator
    from airflow.api_fastapi.execution_api.datamodels.token import TIClaims
    from airflow.executors.workloads import ExecuteTask

    workload = ExecuteTask.model_validate(body["workload"])
    assert str(workload.ti.id) == ref.ti_id
    claims = asyncio.run(_jwt_validator().avalidated_claims(workload.token, {}))
    assert TIClaims(**claims).sub == ref.ti_id
    row = wenv.workers.get(pod.metadata.uid)
    assert (row.state, row.ref, row.attempts_taken) == ("busy", ref, 1)
    attempt = wenv.store.get(ref)
    assert attempt.exchanged_at is not None and attempt.exchange_credential_id == f"warm:{pod.metadata.uid}"
    # the next await keeps the attempt while its outcome is unknown (k8s review §3), and lets go of it once the
    # record landed
    assert wenv.await_(credential).status_code == 204
    assert wenv.workers.get(pod.metadata.uid).state == "busy"
    assert wenv.post_outcome(credential, record_of(ref)).status_code == 200
    assert wenv.await_(credential).status_code == 204
    assert wenv.workers.get(pod.metadata.uid).state == "idle"


def test_a_lost_await_answer_is_delivered_again_with_a_fresh_token(wenv):
    """k8s review §4: the 200 that delivered an attempt was lost; the worker's next await says it took nothing
    (or another attempt), so the same attempt is handed again with a newly minted token; a worker that says it
    ran the attempt is not handed it again and keeps it (outcome unknown)."""
    import json as _json

    from airflow.executors.workloads import ExecuteTask

    pod = wenv.warm_pod()
    credential = wenv.registered(pod)
    ref = wenv.attempt()
    wenv.assign(pod, ref)
    first = wenv.await_(credential, b'{"taken": null}')
    assert first.status_code == 200
    again = wenv.await_(credential, b'{"taken": null}')  # the first answer never reached the worker
    assert again.status_code == 200 and again.json()["ti_id"] == ref.ti_id, again.text
    tokens = {ExecuteTask.model_validate(r.json()["workload"]).token for r in (first, again)}
    assert len(tokens) == 2
    taken = _json.dumps({"taken": {"ti_id": ref.ti_id, "try_number": ref.try_number,
                                   "attempt_epoch": ref.attempt_epoch}}).encode()
    assert wenv.await_(credential, taken).status_code == 204
    row = wenv.workers.get(pod.metadata.uid)
    assert (row.state, row.ref, row.attempts_taken) == ("busy", ref, 1)


def test_a_stale_epochs_assignment_is_never_delivered_but_unassigned(wenv):
    pod = wenv.warm_pod()
    credential = wenv.registered(pod)
    stale = wenv.attempt()
    wenv.attempt(ti_id=stale.ti_id)  # epoch 2 is the ledger's current attempt now
    wenv.assign(pod, stale)
    assert wenv.await_(credential).status_code == 204
    row = wenv.workers.get(pod.metadata.uid)
    assert (row.state, row.ref) == ("idle", None)
    assert wenv.store.get(stale).exchanged_at is None


def test_a_claimed_attempt_waits_for_dispatch_and_a_closed_one_is_unassigned(wenv):
    pod = wenv.warm_pod()
    credential = wenv.registered(pod)
    ref = wenv.attempt(state=AttemptState.CLAIMED)
    wenv.assign(pod, ref)
    assert wenv.await_(credential).status_code == 204  # not dispatched yet: kept assigned
    assert wenv.workers.get(pod.metadata.uid).state == "assigned"
    assert wenv.store.transition(ref, expected=[AttemptState.CLAIMED], to=AttemptState.DISPATCHED)
    assert wenv.await_(credential).status_code == 200
    closed = wenv.attempt()
    from leoflow_airflow.ledger.states import Resolution

    assert wenv.store.transition(closed, expected=[AttemptState.DISPATCHED], to=AttemptState.CLOSED,
                                 resolution=Resolution.MOVED_ON)
    assert wenv.post_outcome(credential, record_of(ref)).status_code == 200
    assert wenv.await_(credential).status_code == 204  # releases the first attempt (its record landed)
    wenv.assign(pod, closed)
    assert wenv.await_(credential).status_code == 204
    assert wenv.workers.get(pod.metadata.uid).state == "idle"


def test_one_attempt_is_never_delivered_twice(wenv):
    """A worker took the attempt; the same attempt assigned to a second worker (or exchanged by a cold pod
    before) is never handed out again: the second worker goes back to idle."""
    first, second = wenv.warm_pod(), wenv.warm_pod()
    c1, c2 = wenv.registered(first), wenv.registered(second)
    ref = wenv.attempt()
    wenv.assign(first, ref)
    assert wenv.await_(c1).status_code == 200
    wenv.assign(second, ref)
    assert wenv.await_(c2).status_code == 204
    assert wenv.workers.get(second.metadata.uid).state == "idle"
    assert wenv.store.get(ref).exchange_credential_id == f"warm:{first.metadata.uid}"


# --- outcome ----------------------------------------------------------------------------------------------

def record_of(ref: AttemptRef, state: str = "success") -> str:
    rec = outcome.record_for_state(state, {"state": state, "end_date": "2026-12-03T12:00:00Z"},
                                   attempt=outcome.AttemptIdentity(ref.ti_id, ref.try_number, ref.attempt_epoch),
                                   api_version="2026-06-30")
    return outcome.encode(rec)


def test_an_attempt_that_ends_during_its_kill_still_delivers_its_record(wenv):
    """A kill of a warm attempt first marks the row ``killing`` (guarded on the attempt it holds, so the delete
    never reaches a newer one); an attempt that ends within the kill's grace still stores its record."""
    pod = wenv.warm_pod()
    credential = wenv.registered(pod)
    ref = wenv.attempt()
    wenv.assign(pod, ref)
    assert wenv.await_(credential).status_code == 200
    assert wenv.workers.mark_killing(pod.metadata.uid, ref)
    r = wenv.post_outcome(credential, record_of(ref))
    assert r.status_code == 200 and r.json() == {"stored": True}, r.text


def test_outcome_stores_the_first_record_of_the_held_attempt_only(wenv, statsd):
    pod = wenv.warm_pod()
    credential = wenv.registered(pod)
    ref = wenv.attempt()
    other = wenv.attempt()
    assert error(wenv.post_outcome(credential, record_of(ref)), 409) == "not_held"  # idle: holds nothing
    wenv.assign(pod, ref)
    assert wenv.await_(credential).status_code == 200
    r = wenv.post_outcome(credential, record_of(ref))
    assert r.status_code == 200 and r.json() == {"stored": True}, r.text
    r = wenv.post_outcome(credential, record_of(ref, "failed"))
    assert r.status_code == 200 and r.json() == {"stored": False}, r.text
    assert wenv.workers.outcomes([ref]) == {ref: record_of(ref)}  # the first one kept
    assert error(wenv.post_outcome(credential, record_of(other)), 409) == "not_held"
    assert error(wenv.post_outcome(credential, b'{"v":1,"outcome":"nope"}'), 400) == "bad_record"
    assert error(wenv.post_outcome(credential, b'{"v":1,"outcome":"success"}'), 400) == "bad_record"  # no attempt
    assert error(wenv.post_outcome("y" * 43, record_of(ref)), 401) == "unknown_credential"
    assert wenv.workers.outcomes([other]) == {}
    want = {"leoflow.warm.await.delivered", "leoflow.warm.outcome.ok", "leoflow.warm.outcome.denied.not_held",
            "leoflow.warm.outcome.denied.bad_record", "leoflow.warm.outcome.denied.unknown_credential"}
    assert want <= statsd.wait_names(want), statsd.names("airflow.")
