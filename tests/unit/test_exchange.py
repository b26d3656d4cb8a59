"""The token exchange's check order and every refusal (issue 9 item 3; DESIGN §3 "Start").

Kubernetes is faked at its narrow seam (``KubeReader``: a TokenReview and a pod GET); the ledger is the real
``LedgerStore`` on SQLite, and tokens are minted by Airflow's real ``JWTGenerator`` and checked with Airflow's
real ``JWTValidator``. The k8s tier (tests/k8s/test_exchange.py) runs the same route against the real
kube-apiserver.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import random
import threading
import uuid
from datetime import datetime, timezone

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from leoflow_agent.exchange import MAX_REQUEST_BYTES, decode_grant, request_body
from leoflow_airflow import settings
from leoflow_airflow.api.app import create_app
from leoflow_airflow.api.exchange import (
    REFUSALS,
    Exchange,
    ExchangeService,
    Refused,
    airflow_minter,
    check_can_mint,
    from_airflow,
    signing_configured,
)
from leoflow_airflow.errors import ConfigError
from leoflow_airflow.ledger.models import metadata
from leoflow_airflow.ledger.states import AttemptRef, AttemptState, Resolution
from leoflow_airflow.ledger.store import LedgerStore
from leoflow_airflow.runtime.kubernetes.identity import (
    IDENTITY_ANNOTATION,
    identity_annotation,
    parse_identity_annotation,
)
from leoflow_airflow.runtime.kubernetes.review import (
    EXTRA_CREDENTIAL_ID,
    EXTRA_POD_NAME,
    EXTRA_POD_UID,
    KubeRejected,
    KubeUnavailable,
    PodFacts,
    TokenReviewResult,
)

S = AttemptState
AUDIENCE = "leoflow"
NS = "tasks"
SA = "leoflow-task"
USER = f"system:serviceaccount:{NS}:{SA}"
SECRET = "s" * 86
TASK_AUDIENCE = "urn:airflow.apache.org:task"


def projected_token(*, audience: str | list = AUDIENCE, namespace: str = NS, service_account: str = SA,
                    exp_in: float = 7 * 86400, pod: dict | None = None, drop: tuple[str, ...] = (), **more) -> str:
    """A JWT whose claims look like a projected ServiceAccount token of ``namespace``/``service_account`` bound
    to a pod, for ``audience`` (what the exchange's local pre-check reads); signed with a test key nobody
    checks: only the fake TokenReview decides whether it is authentic. It expires ``exp_in`` seconds after it is
    made: a week by default, because module-level tokens (``TOKEN``, the parametrized cases) are made when pytest
    collects, which in a whole-suite run is more than an hour before the unit tests run."""
    import time as _time

    import jwt

    now = int(_time.time())
    claims = {"aud": audience if isinstance(audience, list) else [audience], "exp": now + exp_in, "iat": now,
              "iss": "https://kubernetes.default.svc.cluster.local", "jti": str(uuid.uuid4()),
              "sub": f"system:serviceaccount:{namespace}:{service_account}",
              "kubernetes.io": {"namespace": namespace,
                                "pod": {"name": "p", "uid": str(uuid.uuid4())} if pod is None else pod,
                                "serviceaccount": {"name": service_account, "uid": str(uuid.uuid4())}}, **more}
    for key in drop:
        claims.pop(key, None)
    return jwt.encode(claims, "k" * 32, algorithm="HS256")


TOKEN = projected_token()  # claims like a pod's projected token; only the fake reviews it
OPTIONS = {"runtime": "kubernetes", "namespace": NS, "service_account": SA, "exchange_audience": AUDIENCE}
"""The ``[leoflow]`` values of these tests."""


def kube_settings(**more: str) -> settings.KubernetesSettings:
    """The ``[leoflow]`` Kubernetes group as the api-server's exchange reads it (``load_exchange``)."""
    values = {**OPTIONS, **more}
    return settings.load_exchange(lambda section, key, fallback: values.get(key, fallback))


class FakeKube:
    """KubeReader fake: one TokenReview answer per token, pods by name; records every call in ``calls``."""

    def __init__(self) -> None:
        self.reviews: dict[str, TokenReviewResult | Exception] = {}
        self.pods: dict[str, PodFacts | Exception] = {}
        self.calls: list[tuple] = []

    def review(self, token, audiences):
        self.calls.append(("review", token, tuple(audiences)))
        answer = self.reviews.get(token, TokenReviewResult(authenticated=False, error="invalid bearer token"))
        if isinstance(answer, Exception):
            raise answer
        return answer

    def read_pod(self, namespace, name):
        self.calls.append(("read_pod", namespace, name))
        pod = self.pods.get(name)
        if isinstance(pod, Exception):
            raise pod
        if pod is not None and pod.namespace != namespace:
            return None
        return pod


class RecordingLedger:
    """The real LedgerStore, with its exchange calls recorded (to show which checks ran)."""

    def __init__(self, store: LedgerStore) -> None:
        self.store = store
        self.calls: list[str] = []
        self.fail: Exception | None = None
        self.before_write = None

    def current(self, ti_id):
        self.calls.append("current")
        if self.fail is not None:
            raise self.fail
        return self.store.current(ti_id)

    def record_exchange(self, ref, *, credential_id):
        self.calls.append("record_exchange")
        if self.before_write is not None:
            self.before_write()
        return self.store.record_exchange(ref, credential_id=credential_id)

    def record_exchange_again(self, ref, *, pod_uid, credential_id):
        self.calls.append("record_exchange_again")
        return self.store.record_exchange_again(ref, pod_uid=pod_uid, credential_id=credential_id)


def generator():
    from airflow.api_fastapi.auth.tokens import JWTGenerator

    return JWTGenerator(secret_key=SECRET, valid_for=600, audience=TASK_AUDIENCE, issuer=None, algorithm="HS512")


def validated_claims(token: str) -> dict:
    """Airflow's own validator, configured as the Execution API configures it (``execution_api/app.py``)."""
    import asyncio

    from airflow.api_fastapi.auth.tokens import JWTValidator

    validator = JWTValidator(secret_key=SECRET, audience=[TASK_AUDIENCE], required_claims=frozenset({"aud", "exp", "iat"}),
                             algorithm=["HS512"])
    return asyncio.run(validator.avalidated_claims(token, {}))


def workload_json(ti_id: str, try_number: int = 1) -> str:
    from airflow.executors.workloads import BundleInfo, ExecuteTask
    from airflow.executors.workloads.task import TaskInstanceDTO

    ti = TaskInstanceDTO(id=uuid.UUID(ti_id), task_id="task", dag_id="dag", run_id="run", try_number=try_number,
                         dag_version_id=uuid.uuid4(), map_index=-1, pool_slots=1, priority_weight=1, queue="default")
    w = ExecuteTask(token="", dag_rel_path="dag.py", bundle_info=BundleInfo(name="dags"), log_path="x.log", ti=ti)
    return w.model_dump_json(exclude={"token"})


class World:
    """A ledger, a fake Kubernetes, and an exchange over them; ``attempt()`` makes a dispatched Kubernetes
    attempt with its pod and a token that reviews as that pod's."""

    def __init__(self, tmp_path) -> None:
        self.engine = sa.create_engine(f"sqlite:///{tmp_path / 'ledger.db'}")
        metadata.create_all(self.engine)
        self.store = LedgerStore(self.engine)
        self.ledger = RecordingLedger(self.store)
        self.kube = FakeKube()
        self.exchange = Exchange(config=kube_settings(),
                                 kube=self.kube, ledger=self.ledger, mint=airflow_minter(generator()))
        self.service = ExchangeService(self.exchange)

    def attempt(self, *, token: str = TOKEN, runtime: str = "kubernetes", state: AttemptState = S.DISPATCHED,
                record_pod: bool = True, ti_id: str | None = None):
        ti_id = ti_id or str(uuid.uuid4())
        a = self.store.claim_epoch(ti_id=ti_id, try_number=1, dag_id="dag", task_id="task", run_id="run",
                                   map_index=-1, runtime=runtime, workload_json=workload_json(ti_id),
                                   scheduler_job_id=1)
        name, uid = f"pod-{ti_id[:8]}-{a.ref.attempt_epoch}", str(uuid.uuid4())
        if state is not S.CLAIMED:
            facts = {"pod_name": name, "pod_uid": uid} if record_pod else {}
            assert self.store.transition(a.ref, expected=[S.CLAIMED], to=S.DISPATCHED, **facts)
        if state is S.CLOSED:
            assert self.store.transition(a.ref, expected=[S.DISPATCHED], to=S.CLOSED, resolution=Resolution.MOVED_ON)
        self.kube.pods[name] = PodFacts(name=name, namespace=NS, uid=uid,
                                        annotations={IDENTITY_ANNOTATION: identity_annotation(a.ref)})
        self.kube.reviews[token] = TokenReviewResult(
            authenticated=True, audiences=(AUDIENCE,), username=USER,
            extra={EXTRA_POD_NAME: (name,), EXTRA_POD_UID: (uid,),
                   EXTRA_CREDENTIAL_ID: (f"JTI={uuid.uuid4()}",), "authentication.kubernetes.io/node-name": ("n",)})
        return a.ref, name, uid

    def post(self, body: bytes):
        return self.service.handle(body)


@pytest.fixture
def world(tmp_path):
    w = World(tmp_path)
    yield w
    w.engine.dispose()


def refused_reason(caplog, answer) -> str:
    """The reason the service logged under the answer's error_id (the answer itself carries none)."""
    assert answer.status == 403 and set(answer.body) == {"error_id"}, answer
    lines = [r.getMessage() for r in caplog.records if answer.body["error_id"] in r.getMessage()]
    assert len(lines) == 1, lines
    return lines[0].split("reason=")[1].split()[0]


# --- the good path --------------------------------------------------------------------------------------

def test_good_exchange_returns_the_stored_workload_with_a_token_airflow_accepts(world, caplog):
    """The stored workload comes back with a workload token minted now (sub=ti_id, scope=workload) that
    Airflow's validator accepts; the attempt is marked exchanged with the review's credential id, its state
    untouched; Kubernetes was asked in order (review with our audience, then the pod of the review)."""
    ref, name, _ = world.attempt()
    before = datetime.now(timezone.utc)
    answer = world.post(request_body(TOKEN))
    assert answer.status == 200, answer
    assert answer.headers["Cache-Control"] == "no-store"
    grant = decode_grant(json.dumps(answer.body))
    assert (grant.ti_id, grant.try_number, grant.attempt_epoch) == (ref.ti_id, 1, 1)
    from airflow.executors.workloads import ExecuteTask

    w = ExecuteTask.model_validate_json(grant.workload)
    assert str(w.ti.id) == ref.ti_id and str(w.dag_rel_path) == "dag.py"
    claims = validated_claims(w.token)
    assert claims["sub"] == ref.ti_id and claims["scope"] == "workload" and claims["aud"] == TASK_AUDIENCE
    assert claims["iat"] >= int(before.timestamp())
    assert world.kube.calls == [("review", TOKEN, (AUDIENCE,)), ("read_pod", NS, name)]
    assert world.ledger.calls == ["current", "record_exchange"]
    row = world.store.get(ref)
    assert row.state is S.DISPATCHED and row.exchanged_at is not None
    assert row.exchange_credential_id == world.kube.reviews[TOKEN].extra[EXTRA_CREDENTIAL_ID][0]
    assert TOKEN not in caplog.text and w.token not in caplog.text


def test_each_exchange_mints_a_new_token(world):
    """Two attempts exchanged one after the other get distinct tokens (a fresh jti each): nothing cached."""
    world.attempt(token=TOKEN)
    other = projected_token()
    world.attempt(token=other)
    a, b = world.post(request_body(TOKEN)), world.post(request_body(other))
    assert a.status == b.status == 200
    ta = json.loads(a.body["workload"])["token"]
    tb = json.loads(b.body["workload"])["token"]
    assert validated_claims(ta)["jti"] != validated_claims(tb)["jti"]


# --- refusals, in check order ---------------------------------------------------------------------------

@pytest.mark.parametrize("body", [
    b"", b"null", b"[]", b'"token"', b"{}", b'{"token": 5}', b'{"token": null}', b'{"tok": "a.b.c"}',
    b"\xff\xfe", b'{"token": "a.b.c"', b"[" * 8000 + b"]" * 8000,
    json.dumps({"token": TOKEN, "pad": "x" * MAX_REQUEST_BYTES}).encode(),
])
def test_a_malformed_request_is_refused_before_any_kubernetes_or_ledger_call(world, caplog, body):
    world.attempt()
    answer = world.post(body)
    assert refused_reason(caplog, answer) == "malformed_request"
    assert world.kube.calls == [] and world.ledger.calls == []


@pytest.mark.parametrize("token", ["", "garbage", "a.b", "a.b.c.d", "a b.c.d", "a.b.c\n.d", "x" * 9000 + ".a.b",
                                   "é.b.c"])
def test_a_token_not_shaped_like_a_jwt_is_never_sent_to_kubernetes(world, caplog, token):
    world.attempt()
    answer = world.post(json.dumps({"token": token}).encode())
    assert refused_reason(caplog, answer) == "malformed_token"
    assert world.kube.calls == []


@pytest.mark.parametrize(("token", "reason"), [
    (projected_token(audience="https://kubernetes.default.svc"), "implausible_token"),  # the API's own audience
    (projected_token(audience=[]), "implausible_token"),
    (projected_token(drop=("aud",)), "implausible_token"),
    (projected_token(exp_in=-3600), "implausible_token"),                    # expired an hour ago
    (projected_token(drop=("exp",)), "implausible_token"),
    (projected_token(exp="tomorrow"), "implausible_token"),
    (projected_token(drop=("kubernetes.io",)), "implausible_token"),         # a legacy Secret-based token
    (projected_token(pod={}), "implausible_token"),                          # not bound to a pod
    (projected_token(pod={"name": "p", "uid": ""}), "implausible_token"),
    (projected_token(namespace="default"), "implausible_token"),
    (projected_token(service_account="default"), "implausible_token"),
    ("a.b.c", "malformed_token"),                                              # JWT-shaped, but no JSON inside
    ("eyJhbGciOiJSUzI1NiJ9.W10.c2ln", "malformed_token"),                      # claims are a JSON list
], ids=lambda v: v if isinstance(v, str) and len(v) < 40 else None)
def test_a_token_whose_unverified_claims_are_no_pod_token_of_ours_costs_no_token_review(world, caplog, token,
                                                                                      reason):
    """k8s review §10: a body anyone on the network can send is refused from its unverified claims (audience,
    expiry, the ``kubernetes.io`` pod binding, namespace and ServiceAccount) with the usual 403 and error_id, and
    never reaches TokenReview; the good token still does."""
    world.attempt()
    world.attempt(token=token)  # even a token the fake would authenticate is stopped before the review
    answer = world.post(request_body(token))
    assert refused_reason(caplog, answer) == reason
    assert world.kube.calls == [] and world.ledger.calls == []
    assert world.post(request_body(TOKEN)).status == 200


ISSUER = "https://kubernetes.default.svc.cluster.local"
"""The ``iss`` of :func:`projected_token`."""


def test_a_token_of_an_issuer_not_listed_costs_no_token_review_and_a_listed_one_is_exchanged(world, caplog):
    """Issue 33 item 4: with ``[leoflow] exchange_issuers`` set, a token whose unverified ``iss`` is none of them
    (another cluster's, a missing one) is refused ``implausible_token`` before any TokenReview; a token of either
    listed issuer (an issuer rotation lists both) goes on to the review and is exchanged."""
    world.exchange.config = kube_settings(exchange_issuers=f"https://old.example, {ISSUER}")
    assert world.exchange.config.exchange_issuers == ("https://old.example", ISSUER)
    for token in (projected_token(iss="https://other-cluster.example"), projected_token(drop=("iss",))):
        world.attempt(token=token)
        assert refused_reason(caplog, world.post(request_body(token))) == "implausible_token"
    assert world.kube.calls == [] and world.ledger.calls == []
    world.attempt()
    assert world.post(request_body(TOKEN)).status == 200
    old = projected_token(iss="https://old.example")
    world.attempt(token=old)
    assert world.post(request_body(old)).status == 200


@pytest.mark.parametrize("value", ["https://a.example, https://b example", "x" * 513])
def test_an_issuer_with_whitespace_or_too_long_is_a_config_error_naming_the_option(value):
    from leoflow_airflow.errors import ConfigError

    with pytest.raises(ConfigError, match="exchange_issuers"):
        kube_settings(exchange_issuers=value)


def test_past_the_review_bound_the_exchange_answers_503_at_once(world, caplog):
    """k8s review §10: with every review slot held by requests waiting on a slow TokenReview, the next plausible
    request is answered 503 with Retry-After at once, without a TokenReview, so a flood cannot take the threads
    Airflow's own routes share; once the slow ones end, the same request is served."""
    from leoflow_airflow.api.exchange import BUSY_RETRY_AFTER_SECONDS, ReviewGate

    gate = ReviewGate(2)
    world.exchange.gate = gate
    release, entered = threading.Event(), threading.Semaphore(0)
    slow = [projected_token(), projected_token()]
    for token in slow:
        world.attempt(token=token)
    world.attempt()
    fast_review = world.kube.review

    def review(token, audiences):
        if token in slow:
            entered.release()
            assert release.wait(10)
        return fast_review(token, audiences)

    world.kube.review = review
    threads = [threading.Thread(target=world.post, args=(request_body(t),)) for t in slow]
    for t in threads:
        t.start()
    for _ in slow:
        assert entered.acquire(timeout=10)
    answer = world.post(request_body(TOKEN))
    assert answer.status == 503 and set(answer.body) == {"error_id"}
    assert answer.headers["Retry-After"] == str(BUSY_RETRY_AFTER_SECONDS)
    assert ("review", TOKEN, (AUDIENCE,)) not in world.kube.calls
    assert "reason=busy" in caplog.text
    release.set()
    for t in threads:
        t.join(10)
    assert world.post(request_body(TOKEN)).status == 200


def test_the_exchange_and_the_warm_registration_share_one_review_gate_per_process(monkeypatch):
    """``authenticate_pod`` without a gate uses the process-wide one: full, it answers ``busy`` before any
    Kubernetes call (the warm pods' registration calls it so)."""
    from leoflow_airflow.api import exchange as exchange_module
    from leoflow_airflow.api.exchange import ReviewGate, Unavailable, authenticate_pod

    monkeypatch.setattr(exchange_module, "REVIEW_GATE", ReviewGate(1))
    kube = FakeKube()
    with exchange_module.REVIEW_GATE.hold("test"):
        with pytest.raises(Unavailable) as err:
            authenticate_pod(kube_settings(), kube, TOKEN)
    assert err.value.reason == "busy" and kube.calls == []
    with pytest.raises(Refused):  # the slot is free again: reviewed (and refused by the fake)
        authenticate_pod(kube_settings(), kube, TOKEN)
    assert [c[0] for c in kube.calls] == ["review"]


def test_review_rejected_unauthenticated_and_wrong_audience_stop_before_the_pod_get(world, caplog):
    ref, _, _ = world.attempt()
    world.kube.reviews[TOKEN] = KubeRejected("TokenReview: HTTP 422")
    assert refused_reason(caplog, world.post(request_body(TOKEN))) == "review_rejected"
    world.kube.reviews[TOKEN] = TokenReviewResult(authenticated=False, error="token has expired")
    assert refused_reason(caplog, world.post(request_body(TOKEN))) == "unauthenticated"
    other = projected_token()
    world.attempt(token=other)
    good = world.kube.reviews[other]
    world.kube.reviews[other] = TokenReviewResult(authenticated=True, audiences=("https://kubernetes.default.svc",),
                                                  username=USER, extra=good.extra)
    assert refused_reason(caplog, world.post(request_body(other))) == "audience_mismatch"
    assert [c[0] for c in world.kube.calls] == ["review"] * 3
    assert world.ledger.calls == [] and world.store.get(ref).exchanged_at is None


@pytest.mark.parametrize("username", [
    f"system:serviceaccount:{NS}:default",          # another ServiceAccount of the namespace
    f"system:serviceaccount:other:{SA}",            # the same name in another namespace
    f"system:serviceaccount:{NS}:{SA}x",
    "leoflow-admin",                                  # not a ServiceAccount at all
    "",
])
def test_another_service_accounts_token_is_refused(world, caplog, username):
    world.attempt()
    r = world.kube.reviews[TOKEN]
    world.kube.reviews[TOKEN] = TokenReviewResult(authenticated=True, audiences=r.audiences, username=username,
                                                  extra=r.extra)
    assert refused_reason(caplog, world.post(request_body(TOKEN))) == "wrong_service_account"
    assert [c[0] for c in world.kube.calls] == ["review"]


@pytest.mark.parametrize("drop", [EXTRA_POD_NAME, EXTRA_POD_UID, "both", "two-names", "empty-uid"])
def test_a_token_not_bound_to_exactly_one_pod_is_refused(world, caplog, drop):
    world.attempt()
    r = world.kube.reviews[TOKEN]
    extra = dict(r.extra)
    if drop == "both":
        extra.pop(EXTRA_POD_NAME), extra.pop(EXTRA_POD_UID)
    elif drop == "two-names":
        extra[EXTRA_POD_NAME] = ("a", "b")
    elif drop == "empty-uid":
        extra[EXTRA_POD_UID] = ("",)
    else:
        extra.pop(drop)
    world.kube.reviews[TOKEN] = TokenReviewResult(authenticated=True, audiences=r.audiences, username=USER, extra=extra)
    assert refused_reason(caplog, world.post(request_body(TOKEN))) == "not_pod_bound"
    assert [c[0] for c in world.kube.calls] == ["review"]


def test_pod_gone_replaced_or_terminating_is_refused_before_the_ledger(world, caplog):
    ref, name, uid = world.attempt()
    pod = world.kube.pods[name]
    del world.kube.pods[name]
    assert refused_reason(caplog, world.post(request_body(TOKEN))) == "pod_gone"
    world.kube.pods[name] = PodFacts(name=name, namespace=NS, uid=str(uuid.uuid4()), annotations=pod.annotations)
    assert refused_reason(caplog, world.post(request_body(TOKEN))) == "pod_replaced"
    world.kube.pods[name] = PodFacts(name=name, namespace=NS, uid=uid, annotations=pod.annotations,
                                     deletion_timestamp=datetime.now(timezone.utc))
    assert refused_reason(caplog, world.post(request_body(TOKEN))) == "pod_terminating"
    assert world.ledger.calls == [] and world.store.get(ref).exchanged_at is None


@pytest.mark.parametrize("annotation", [None, "", "{}", "not json", '{"ti_id": "x", "try_number": 1, "attempt_epoch": 1}',
                                        '{"ti_id": "%s", "try_number": 0, "attempt_epoch": 1}' % "463d00a1-e73c-489e-ad14-8db95d62af65",
                                        '{"ti_id": "%s", "try_number": 1, "attempt_epoch": true}' % "d8c9077b-2dca-4ef4-8645-432dedd60b58",
                                        "[1, 2, 3]"])
def test_a_pod_without_a_valid_identity_annotation_is_refused(world, caplog, annotation):
    _, name, uid = world.attempt()
    world.kube.pods[name] = PodFacts(name=name, namespace=NS, uid=uid,
                                     annotations={} if annotation is None else {IDENTITY_ANNOTATION: annotation})
    assert refused_reason(caplog, world.post(request_body(TOKEN))) == "no_identity"
    assert world.ledger.calls == []


def test_an_attempt_the_ledger_does_not_know_is_refused(world, caplog):
    _, name, uid = world.attempt()
    stranger = AttemptRef(str(uuid.uuid4()), 1, 1)
    world.kube.pods[name] = PodFacts(name=name, namespace=NS, uid=uid,
                                     annotations={IDENTITY_ANNOTATION: identity_annotation(stranger)})
    assert refused_reason(caplog, world.post(request_body(TOKEN))) == "unknown_attempt"


def test_a_stale_epoch_is_refused(world, caplog):
    """The pod of epoch 1 exchanges after the ledger moved its ti_id on to epoch 2: refused, and epoch 2's
    row is untouched."""
    ref, name, _ = world.attempt()
    assert world.store.transition(ref, expected=[S.DISPATCHED], to=S.CLOSED, resolution=Resolution.REDISPATCHED)
    e2 = projected_token()
    ref2, _, _ = world.attempt(token=e2, ti_id=ref.ti_id)
    assert ref2.attempt_epoch == 2
    assert refused_reason(caplog, world.post(request_body(TOKEN))) == "stale_epoch"
    assert world.store.get(ref2).exchanged_at is None
    assert world.post(request_body(e2)).status == 200  # epoch 2's own pod is served


def test_a_try_number_other_than_the_ledgers_is_a_stale_epoch(world, caplog):
    ref, name, uid = world.attempt()
    forged = AttemptRef(ref.ti_id, ref.try_number + 1, ref.attempt_epoch)
    world.kube.pods[name] = PodFacts(name=name, namespace=NS, uid=uid,
                                     annotations={IDENTITY_ANNOTATION: identity_annotation(forged)})
    assert refused_reason(caplog, world.post(request_body(TOKEN))) == "stale_epoch"


def test_a_closed_attempt_is_refused(world, caplog):
    world.attempt(state=S.CLOSED)
    assert refused_reason(caplog, world.post(request_body(TOKEN))) == "not_dispatched"


def test_an_attempt_still_claimed_is_undecided_until_the_scheduler_records_it_dispatched(world, caplog):
    """Pod creation is asynchronous: a pod can ask before the scheduler recorded its attempt DISPATCHED. That
    answer is a 503 with Retry-After (the agent asks again), nothing recorded; once DISPATCHED, the same token is
    granted."""
    ref, name, uid = world.attempt(state=S.CLAIMED)
    answer = world.post(request_body(TOKEN))
    assert answer.status == 503 and set(answer.body) == {"error_id"} and answer.headers["Retry-After"] == "1"
    [record] = [r for r in caplog.records if answer.body["error_id"] in r.getMessage()]
    assert "reason=not_yet_dispatched" in record.getMessage()
    assert record.levelname == "INFO"  # an expected race, not a fault
    assert world.store.get(ref).exchanged_at is None
    assert world.store.transition(ref, expected=[S.CLAIMED], to=S.DISPATCHED, pod_name=name, pod_uid=uid)
    granted = world.post(request_body(TOKEN))
    assert granted.status == 200 and decode_grant(json.dumps(granted.body)).ti_id == ref.ti_id


def test_a_lite_attempt_is_refused(world, caplog):
    world.attempt(runtime="lite")
    assert refused_reason(caplog, world.post(request_body(TOKEN))) == "not_kubernetes"


def rotated(world, token: str) -> str:
    """A new projected token of the pod ``token`` reviews as (the kubelet rotated the file): same pod, another
    credential id."""
    new = projected_token()
    r = world.kube.reviews[token]
    world.kube.reviews[new] = TokenReviewResult(authenticated=True, audiences=r.audiences, username=r.username,
                                                extra={**r.extra, EXTRA_CREDENTIAL_ID: (f"JTI={uuid.uuid4()}",)})
    return new


def test_the_same_pod_may_exchange_again_after_a_lost_answer(world, caplog):
    """k8s review §4: the first 200 was lost (the agent's read timed out, a proxy cut it) after the ledger
    recorded the exchange. The same pod (the UID the ledger recorded at create), asking again with a rotated
    token, gets a grant with a freshly minted workload token, not ``already_exchanged``; the row keeps the
    first exchange's time and records the latest credential; the state is untouched."""
    ref, _, _ = world.attempt()
    first = world.post(request_body(TOKEN))
    assert first.status == 200
    exchanged_at = world.store.get(ref).exchanged_at
    again = rotated(world, TOKEN)
    second = world.post(request_body(again))
    assert second.status == 200, caplog.text
    grant = decode_grant(json.dumps(second.body))
    assert (grant.ti_id, grant.try_number, grant.attempt_epoch) == (ref.ti_id, ref.try_number, ref.attempt_epoch)
    tokens = [json.loads(a.body["workload"])["token"] for a in (first, second)]
    claims = [validated_claims(t) for t in tokens]
    assert claims[0]["sub"] == claims[1]["sub"] == ref.ti_id and claims[0]["jti"] != claims[1]["jti"]
    row = world.store.get(ref)
    assert row.state is S.DISPATCHED and row.exchanged_at == exchanged_at
    assert row.exchange_credential_id == world.kube.reviews[again].extra[EXTRA_CREDENTIAL_ID][0]
    assert "re-exchanged" in caplog.text


def test_a_second_exchange_by_another_pod_or_of_an_unrecorded_pod_is_refused(world, caplog):
    """Only the pod the ledger recorded may exchange again: an attempt whose pod was not recorded, or one that
    moved on, is ``already_exchanged`` for everyone, and the first credential is kept."""
    ref, name, uid = world.attempt(record_pod=False)
    first = world.kube.reviews[TOKEN].extra[EXTRA_CREDENTIAL_ID][0]
    assert world.post(request_body(TOKEN)).status == 200
    answer = world.post(request_body(rotated(world, TOKEN)))
    assert refused_reason(caplog, answer) == "already_exchanged"
    assert first in caplog.text  # auditable: the refusal names the credential that exchanged first
    assert world.store.get(ref).exchange_credential_id == first

    other = projected_token()
    ref2, _, _ = world.attempt(token=other)
    assert world.post(request_body(other)).status == 200
    assert world.store.transition(ref2, expected=[S.DISPATCHED], to=S.CLOSED, resolution=Resolution.MOVED_ON)
    assert refused_reason(caplog, world.post(request_body(other))) == "already_exchanged"

    third = projected_token()
    ref3, name3, _ = world.attempt(token=third)
    assert world.post(request_body(third)).status == 200
    # a pod with another UID (one that copied the annotation, or one recreated under the name) is refused
    world.kube.pods["impostor"] = PodFacts(name="impostor", namespace=NS, uid=str(uuid.uuid4()),
                                           annotations=world.kube.pods[name3].annotations)
    impostor = projected_token()
    world.kube.reviews[impostor] = TokenReviewResult(
        authenticated=True, audiences=(AUDIENCE,), username=USER,
        extra={EXTRA_POD_NAME: ("impostor",), EXTRA_POD_UID: (world.kube.pods["impostor"].uid,)})
    assert refused_reason(caplog, world.post(request_body(impostor))) == "already_exchanged"
    assert "the ledger recorded pod" in caplog.text


def test_a_warm_delivered_attempt_is_never_re_granted_by_the_exchange(world, caplog):
    """An attempt a warm pod took on its await (credential ``warm:<uid>``) is not the exchange's to re-grant."""
    ref, _, uid = world.attempt()
    assert world.store.record_exchange(ref, credential_id=f"warm:{uid}")
    assert refused_reason(caplog, world.post(request_body(TOKEN))) == "already_exchanged"


def test_a_pod_the_ledger_did_not_record_for_the_attempt_is_refused(world, caplog):
    """A pod that copies a real attempt's annotation (anyone who may create pods with the ServiceAccount
    could) is refused when the ledger recorded the attempt's own pod, before the real pod exchanges."""
    ref, name, uid = world.attempt()
    world.kube.pods["impostor"] = PodFacts(name="impostor", namespace=NS, uid=str(uuid.uuid4()),
                                           annotations=world.kube.pods[name].annotations)
    r = world.kube.reviews[TOKEN]
    impostor = projected_token()
    world.kube.reviews[impostor] = TokenReviewResult(
        authenticated=True, audiences=r.audiences, username=USER,
        extra={EXTRA_POD_NAME: ("impostor",), EXTRA_POD_UID: (world.kube.pods["impostor"].uid,)})
    assert refused_reason(caplog, world.post(request_body(impostor))) == "pod_not_recorded"
    assert world.store.get(ref).exchanged_at is None
    assert world.post(request_body(TOKEN)).status == 200


def test_a_stored_workload_that_cannot_be_rebuilt_is_refused_and_not_marked(world, caplog):
    ref, _, _ = world.attempt()
    with world.engine.begin() as conn:
        conn.execute(sa.text("UPDATE leoflow_attempt SET workload_json = :w"), {"w": json.dumps({"ti": {"id": 1}})})
    assert refused_reason(caplog, world.post(request_body(TOKEN))) == "bad_workload"
    assert any(r.levelno == logging.ERROR and "cannot be rebuilt" in r.getMessage() for r in caplog.records)
    assert world.store.get(ref).exchanged_at is None


def test_a_lost_race_is_refused(world, caplog):
    """Another worker exchanged the attempt between this one's ledger read and its guarded write, and the
    ledger recorded no pod for it (so the second request cannot be told to be the same pod's)."""
    ref, _, _ = world.attempt(record_pod=False)
    world.ledger.before_write = lambda: world.store.record_exchange(ref, credential_id="JTI=other-worker")
    assert refused_reason(caplog, world.post(request_body(TOKEN))) == "already_exchanged"
    assert world.store.get(ref).exchange_credential_id == "JTI=other-worker"


def test_concurrent_exchanges_of_one_attempt_grant_exactly_one(world):
    """Eight threads exchange the same attempt at once through the real ledger, the ledger recording no pod for
    it: one 200, seven 403."""
    world.attempt(record_pod=False)
    barrier = threading.Barrier(8)
    answers = []

    def go():
        barrier.wait()
        answers.append(world.post(request_body(TOKEN)).status)

    threads = [threading.Thread(target=go) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(answers) == [200] + [403] * 7


# --- undecided: 503, nothing recorded -------------------------------------------------------------------

def test_kubernetes_or_ledger_without_an_answer_is_503_and_records_nothing(world, caplog):
    ref, name, _ = world.attempt()
    world.kube.reviews[TOKEN], good = KubeUnavailable("TokenReview: ReadTimeoutError"), world.kube.reviews[TOKEN]
    a = world.post(request_body(TOKEN))
    assert a.status == 503 and set(a.body) == {"error_id"} and a.headers["Retry-After"] == "5"
    world.kube.reviews[TOKEN] = good
    pod, world.kube.pods[name] = world.kube.pods[name], KubeUnavailable("pod GET: HTTP 503")
    assert world.post(request_body(TOKEN)).status == 503
    world.kube.pods[name] = pod
    world.ledger.fail = sa.exc.OperationalError("SELECT", {}, Exception("database is locked"))
    assert world.post(request_body(TOKEN)).status == 503
    assert "kube_unavailable" in caplog.text and "ledger_unavailable" in caplog.text
    assert world.store.get(ref).exchanged_at is None
    world.ledger.fail = None
    assert world.post(request_body(TOKEN)).status == 200  # the same request succeeds once they answer


def test_an_unexpected_error_is_logged_and_answered_503(world, caplog):
    world.attempt()
    world.exchange.mint = lambda attempt: 1 / 0
    answer = world.post(request_body(TOKEN))
    assert answer.status == 503 and set(answer.body) == {"error_id"}
    assert "ZeroDivisionError" in caplog.text and answer.body["error_id"] in caplog.text


def test_every_refusal_reason_is_reachable():
    """The closed set of reasons (logged, never sent) is exactly what the tests above produce, plus
    ``disabled`` (below) and ``vetoed`` (a plugin's veto: ``test_hooks.py``)."""
    assert REFUSALS == {
        "disabled", "malformed_request", "malformed_token", "review_rejected", "unauthenticated",
        "audience_mismatch", "wrong_service_account", "not_pod_bound", "pod_gone", "pod_replaced",
        "pod_terminating", "no_identity", "unknown_attempt", "stale_epoch", "not_kubernetes", "not_dispatched",
        "already_exchanged", "pod_not_recorded", "bad_workload", "vetoed", "implausible_token"}


# --- the app and its lifespan ---------------------------------------------------------------------------

def test_the_route_serves_the_service_built_in_the_lifespan_and_closes_it(world):
    closed = []
    service = ExchangeService(world.exchange, closers=(lambda: closed.append(True),))
    built = []
    app = create_app(exchange_factory=lambda: built.append(True) or service)
    assert built == []  # nothing is built at import / create time
    world.attempt()
    with TestClient(app) as client:
        assert built == [True]
        r = client.post("/v1/exchange", content=request_body(TOKEN))
        assert r.status_code == 200 and r.headers["cache-control"] == "no-store"
        assert decode_grant(r.content).attempt_epoch == 1
        r = client.post("/v1/exchange", content=request_body(projected_token()))
        assert r.status_code == 403 and r.json().keys() == {"error_id"}
        assert client.get("/v1/exchange").status_code == 405
        assert client.post("/v1/exchange?token=" + TOKEN).status_code == 403  # never read from the query
        big = client.post("/v1/exchange", content=b"x" * (MAX_REQUEST_BYTES * 4))
        assert big.status_code == 403
    assert closed == [True]


def test_fuzzed_bodies_never_get_a_5xx(world):
    """1,000 random bodies (bytes, JSON of every shape, JWT-shaped strings, mutations of a good token) get a
    403 with only an ``error_id``, or the one 200 the unmutated good token earns."""
    world.attempt()
    rng = random.Random(9)
    app = create_app(exchange_factory=lambda: world.service)
    alphabet = "abcAB019-_.=+/ \n\"{}[]:,\\é\x00"

    def body() -> bytes:
        kind = rng.randrange(6)
        if kind == 0:
            return rng.randbytes(rng.randrange(0, 300))
        if kind == 1:
            return "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 200))).encode()
        if kind == 2:
            token = list(TOKEN)
            for _ in range(rng.randrange(1, 4)):
                token[rng.randrange(len(token))] = rng.choice(alphabet)
            return json.dumps({"token": "".join(token)}).encode()
        if kind == 3:
            value = rng.choice([None, 1, 1.5, True, [], {}, "x" * rng.randrange(0, 50), [TOKEN], {"token": TOKEN}])
            return json.dumps({"token": value}).encode()
        if kind == 4:
            parts = [("".join(rng.choice("abAB09-_") for _ in range(rng.randrange(1, 30)))) for _ in range(3)]
            return json.dumps({"token": ".".join(parts)}).encode()
        return json.dumps({rng.choice(["token", "Token", "tok", ""]): TOKEN, "x": rng.random()}).encode()

    statuses = []
    with TestClient(app) as client:
        for _ in range(1000):
            r = client.post("/v1/exchange", content=body(), headers={"content-type": rng.choice(
                ["application/json", "text/plain", "application/x-www-form-urlencoded"])})
            statuses.append(r.status_code)
            assert r.status_code in (200, 403), r.status_code
            if r.status_code == 403:
                assert r.json().keys() == {"error_id"}
    assert statuses.count(200) >= 1  # the good token (and only it: the fake reviews nothing else) is granted


def test_an_api_server_with_runtime_lite_refuses_every_exchange(monkeypatch):
    service = from_airflow(get=lambda s, k, f: {"runtime": "lite"}.get(k, f))
    assert service.exchange is None
    assert service.handle(request_body(TOKEN)).status == 403


def test_runtime_kubernetes_without_a_signing_key_answers_503_and_the_app_still_starts(monkeypatch, caplog):
    monkeypatch.setenv("AIRFLOW__API_AUTH__JWT_SECRET", "")
    monkeypatch.setenv("AIRFLOW__API_AUTH__JWT_PRIVATE_KEY_PATH", "")
    service = from_airflow(get=lambda s, k, f: {"runtime": "kubernetes"}.get(k, f))
    assert service.exchange is None and service.off[0] == "cannot_mint"
    assert "jwt_secret" in caplog.text
    assert service.handle(request_body(TOKEN)).status == 503


def test_runtime_kubernetes_with_a_bad_setting_answers_503(monkeypatch):
    service = from_airflow(get=lambda s, k, f: {"runtime": "kubernetes", "namespace": "Not_A_Namespace"}.get(k, f))
    assert service.exchange is None and service.off[0] == "not_configured"
    assert "leoflow] namespace" in service.off[1]


def test_from_airflow_builds_the_generator_like_the_executor(monkeypatch, world):
    """With a shared secret configured the exchange mints with the same generator arguments as
    ``BaseExecutor.jwt_generator``: a token it mints validates with Airflow's validator for that secret."""
    monkeypatch.setenv("AIRFLOW__API_AUTH__JWT_SECRET", SECRET)
    monkeypatch.setenv("AIRFLOW__EXECUTION_API__JWT_AUDIENCE", TASK_AUDIENCE)
    service = from_airflow(ledger=world.ledger, kube=world.kube,
                           get=lambda s, k, f: OPTIONS.get(k, f))
    world.attempt()
    answer = service.handle(request_body(TOKEN))
    assert answer.status == 200, answer
    claims = validated_claims(json.loads(answer.body["workload"])["token"])
    from airflow.configuration import conf

    assert claims["exp"] - claims["iat"] == int(conf.getfloat("scheduler", "task_queued_timeout"))


# --- identity annotation --------------------------------------------------------------------------------

def test_identity_annotation_round_trips_and_rejects_junk():
    ref = AttemptRef(str(uuid.uuid4()), 3, 2)
    assert parse_identity_annotation(identity_annotation(ref)) == ref
    assert parse_identity_annotation(identity_annotation(ref).replace("}", ',"dag_id":"d"}')) == ref
    for junk in (None, 5, "", "x" * 2000, '{"ti_id": "%s", "try_number": "1", "attempt_epoch": 1}' % ref.ti_id,
                 '{"ti_id": "%s", "try_number": 1}' % ref.ti_id):
        assert parse_identity_annotation(junk) is None


# --- round trip: the pod builder's pod is the pod the exchange accepts -------------------------------------

def pod_facts_and_review(pod, uid: str) -> tuple[PodFacts, TokenReviewResult]:
    """What Kubernetes would tell the exchange about a pod the builder made once it is created with ``uid``:
    the pod GET (its own name, namespace and annotations) and the TokenReview of its projected token (the
    audience the builder put on the token volume, the user of the pod's own ServiceAccount, bound to it)."""
    [projection] = [src.service_account_token for v in pod.spec.volumes if v.projected
                    for src in v.projected.sources if src.service_account_token]
    meta = pod.metadata
    facts = PodFacts(name=meta.name, namespace=meta.namespace, uid=uid, annotations=dict(meta.annotations),
                     labels=dict(meta.labels))
    review = TokenReviewResult(
        authenticated=True, audiences=(projection.audience,),
        username=f"system:serviceaccount:{meta.namespace}:{pod.spec.service_account_name}",
        extra={EXTRA_POD_NAME: (meta.name,), EXTRA_POD_UID: (uid,), EXTRA_CREDENTIAL_ID: ("JTI=round-trip",)})
    return facts, review


@pytest.mark.parametrize(("spelling", "ids"), [
    (str, ("dag", "task", "run")),
    (lambda u: u.hex.upper(), ("日本" * 125, "タスク" * 83, "ü" * 250)),  # Airflow's longest ids, JSON-escaped 6x
], ids=["canonical", "hex-upper-longest-unicode-ids"])
def test_a_pod_the_builder_made_is_what_the_exchange_accepts_for_the_same_attempt(world, spelling, ids):
    """The two halves of the Kubernetes runtime agree (issue 9 items 1 and 3): from ONE ``[leoflow]`` group,
    ``build_pod`` stamps the identity annotation, the token audience and the ServiceAccount, and the exchange,
    reading that pod and a review of its token as Kubernetes would answer them, grants exactly this attempt.
    The annotation is what the exchange's parser reads as the ledger's attempt, whatever the ti_id's spelling
    in the builder's input and however long the DAG, task and run ids (an annotation that carried them could
    outgrow ``MAX_IDENTITY_LEN``); a pod built for another try of the ti_id is ``stale_epoch``."""
    from leoflow_airflow.runtime.kubernetes.pod import PodAttempt, build_pod, pod_name

    values = {**OPTIONS, "image": "registry.example/leoflow:1", "exchange_url": "https://airflow.example/leoflow"}
    kube = settings.load_kubernetes(lambda section, key, fallback: values.get(key, fallback))
    assert kube == settings.load_exchange(lambda section, key, fallback: values.get(key, fallback))

    ti = uuid.uuid4()
    dag_id, task_id, run_id = ids
    a = world.store.claim_epoch(ti_id=str(ti), try_number=1, dag_id=dag_id, task_id=task_id, run_id=run_id,
                                map_index=-1, runtime="kubernetes", workload_json=workload_json(str(ti)),
                                scheduler_job_id=1)
    attempt = PodAttempt(ti_id=spelling(ti), try_number=1, attempt_epoch=a.ref.attempt_epoch, dag_id=dag_id,
                         task_id=task_id, run_id=run_id)
    uid = str(uuid.uuid4())
    assert world.store.transition(a.ref, expected=[S.CLAIMED], to=S.DISPATCHED, pod_name=pod_name(attempt),
                                  pod_uid=uid)
    pod = build_pod(attempt, kube)
    assert parse_identity_annotation(pod.metadata.annotations[IDENTITY_ANNOTATION]) == a.ref == attempt.ref

    facts, review = pod_facts_and_review(pod, uid)
    world.kube.pods[facts.name], world.kube.reviews[TOKEN] = facts, review
    exchange = Exchange(config=kube, kube=world.kube, ledger=world.ledger, mint=airflow_minter(generator()))
    grant = exchange.exchange(TOKEN)
    assert (grant.ti_id, grant.try_number, grant.attempt_epoch) == (a.ref.ti_id, a.ref.try_number, a.ref.attempt_epoch)
    assert world.kube.calls == [("review", TOKEN, (kube.exchange_audience,)), ("read_pod", NS, pod_name(attempt))]

    # the same pod name built for another try of the ti_id: its annotation names no current attempt
    other = build_pod(dataclasses.replace(attempt, try_number=2), kube)
    world.kube.pods[facts.name] = pod_facts_and_review(other, uid)[0]
    with pytest.raises(Refused) as err:
        exchange.exchange(TOKEN)
    assert err.value.reason == "stale_epoch"


# --- the scheduler's start() check ----------------------------------------------------------------------

@pytest.mark.parametrize("env", [
    {"AIRFLOW__API_AUTH__JWT_SECRET": "x" * 64},
    {"AIRFLOW__API_AUTH__JWT_SECRET_CMD": "cat /secret"},
    {"AIRFLOW__API_AUTH__JWT_SECRET_SECRET": "jwt"},
    {"AIRFLOW__API_AUTH__JWT_PRIVATE_KEY_PATH": "/keys/jwt.pem"},
])
def test_a_signing_key_set_in_the_environment_counts(env):
    assert signing_configured(env, None)


@pytest.mark.parametrize("line", ["jwt_secret = abc", "jwt_secret_cmd = cat /x", "jwt_private_key_path = /k.pem"])
def test_a_signing_key_set_in_the_config_file_counts(tmp_path, line):
    cfg = tmp_path / "airflow.cfg"
    cfg.write_text(f"[core]\nexecutor = X\n[api_auth]\n{line}\n")
    assert signing_configured({}, str(cfg))


def test_no_signing_key_refuses_start_and_names_both_keys(tmp_path, monkeypatch):
    """An empty key, another section's key, no file: not configured, even though ``conf`` holds the secret
    ``BaseExecutor.__init__`` made up for this process."""
    cfg = tmp_path / "airflow.cfg"
    cfg.write_text("[api_auth]\njwt_secret =\n[api]\njwt_secret = elsewhere\n")
    from airflow.configuration import conf

    monkeypatch.delenv("AIRFLOW__API_AUTH__JWT_SECRET", raising=False)
    monkeypatch.setattr(conf, "get", lambda *a, **k: "invented-per-process" if a[:2] == ("api_auth", "jwt_secret")
                        else type(conf).get(conf, *a, **k))
    for environ, path in (({}, str(cfg)), ({"AIRFLOW__API_AUTH__JWT_SECRET": " "}, None),
                          ({}, str(tmp_path / "missing.cfg"))):
        with pytest.raises(ConfigError) as exc:
            check_can_mint(environ=environ, config_file=path or str(tmp_path / "missing.cfg"))
        assert "jwt_secret" in str(exc.value) and "jwt_private_key_path" in str(exc.value)


def test_an_unreadable_key_file_refuses_start(tmp_path, monkeypatch):
    monkeypatch.setenv("AIRFLOW__API_AUTH__JWT_PRIVATE_KEY_PATH", str(tmp_path / "absent.pem"))
    with pytest.raises(ConfigError) as exc:
        check_can_mint(environ={"AIRFLOW__API_AUTH__JWT_PRIVATE_KEY_PATH": str(tmp_path / "absent.pem")},
                       config_file=None)
    assert "cannot mint" in str(exc.value)


def test_a_configured_secret_passes(monkeypatch):
    monkeypatch.setenv("AIRFLOW__API_AUTH__JWT_SECRET", SECRET)
    check_can_mint(environ={"AIRFLOW__API_AUTH__JWT_SECRET": SECRET}, config_file=None)


# --- the real Kubernetes client: every call bounded -----------------------------------------------------

def _kubeconfig(path, server: str):
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": server, "insecure-skip-tls-verify": True}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))
    return str(path)


def test_a_silent_apiserver_makes_each_call_end_within_the_timeout(tmp_path):
    """An apiserver that accepts connections and never answers (a listening socket nobody serves): each
    call gives up after ``exchange_timeout_seconds`` (1 s here) with ``KubeUnavailable``, retried by nobody, and the
    exchange answers 503."""
    import socket
    import time

    from leoflow_airflow.runtime.kubernetes.review import KubeClient

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)
    try:
        kube = KubeClient.from_config(in_cluster=False, timeout=1.0, kube_config=_kubeconfig(
            tmp_path / "kc", f"https://127.0.0.1:{silent.getsockname()[1]}"))
        for call in (lambda: kube.review(TOKEN, [AUDIENCE]), lambda: kube.read_pod(NS, "p")):
            t0 = time.monotonic()
            with pytest.raises(KubeUnavailable):
                call()
            assert 0.9 < time.monotonic() - t0 < 3.0
        exchange = Exchange(config=kube_settings(), kube=kube, ledger=None, mint=None)
        t0 = time.monotonic()
        assert ExchangeService(exchange).handle(request_body(TOKEN)).status == 503
        assert time.monotonic() - t0 < 3.0
        kube.close()
    finally:
        silent.close()


def test_an_unreachable_apiserver_is_unavailable_at_once(tmp_path):
    import socket

    from leoflow_airflow.runtime.kubernetes.review import KubeClient

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now: connection refused
    kube = KubeClient.from_config(in_cluster=False, timeout=5.0,
                                  kube_config=_kubeconfig(tmp_path / "kc", f"https://127.0.0.1:{port}"))
    with pytest.raises(KubeUnavailable):
        kube.review(TOKEN, [AUDIENCE])
    with pytest.raises(KubeUnavailable):
        kube.read_pod(NS, "p")


# --- the agent's side of a lost answer (k8s review §4) -----------------------------------------------------

def test_an_agent_whose_granted_answer_was_lost_is_granted_on_its_retry(world, tmp_path):
    """The server granted and recorded the exchange, but the agent's read timed out: the agent tries again
    (a timeout is no refusal) and the server grants the same pod again, so the pod starts its attempt instead of
    recording ``exchange_refused`` (which spends one of the attempt's re-dispatches)."""
    import httpx

    from leoflow_agent import podmain

    ref, _, _ = world.attempt()
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    statuses = []

    def post(url, body, timeout):
        assert timeout <= podmain.REQUEST_TIMEOUT_SECONDS
        answer = world.post(body)
        statuses.append(answer.status)
        if len(statuses) == 1:
            raise httpx.ReadTimeout("timed out")  # the 200 is lost on the way back
        return answer.status, {k.lower(): v for k, v in answer.headers.items()}, json.dumps(answer.body).encode()

    config = podmain.PodConfig(exchange_url="http://api.example/leoflow", token_file=str(token_file),
                               message_budget=4096, ceiling_seconds=0)
    result = podmain.exchange_with_retries(config, post=post, sleep=lambda seconds: None, rng=lambda: 0.0)
    assert (result.reason, result.exit_code, result.tries) == (None, podmain.EXIT_OK, 2), result
    assert (result.grant.ti_id, result.grant.attempt_epoch) == (ref.ti_id, ref.attempt_epoch)
    assert statuses == [200, 200]


def test_the_agent_waits_longer_than_the_servers_worst_case_and_settings_keep_it_so():
    """k8s review §4: the server's exchange may take two Kubernetes calls of ``exchange_timeout_seconds`` each
    plus its own work; the agent's request timeout covers that at the default, and a larger
    ``exchange_timeout_seconds`` that would not fit is refused at load, naming the option."""
    from leoflow_agent.podmain import EXCHANGE_SERVER_SLACK_SECONDS, REQUEST_TIMEOUT_SECONDS

    default = kube_settings().exchange_timeout_seconds
    assert 2 * default + EXCHANGE_SERVER_SLACK_SECONDS <= REQUEST_TIMEOUT_SECONDS
    most = (REQUEST_TIMEOUT_SECONDS - EXCHANGE_SERVER_SLACK_SECONDS) / 2
    assert kube_settings(exchange_timeout_seconds=str(most)).exchange_timeout_seconds == most
    with pytest.raises(ConfigError, match="exchange_timeout_seconds"):
        kube_settings(exchange_timeout_seconds=str(most + 0.5))


def test_record_exchange_again_is_guarded_on_the_recorded_pod_and_the_state(world):
    """``LedgerStore.record_exchange_again`` changes the row only while it is dispatched, exchanged, recorded for
    that pod UID and not taken by a warm pod; the first exchange's time is kept."""
    ref, _, uid = world.attempt()
    assert not world.store.record_exchange_again(ref, pod_uid=uid, credential_id="JTI=2")  # never exchanged
    assert world.store.record_exchange(ref, credential_id="JTI=1")
    first = world.store.get(ref).exchanged_at
    assert not world.store.record_exchange_again(ref, pod_uid="another-uid", credential_id="JTI=2")
    assert world.store.record_exchange_again(ref, pod_uid=uid, credential_id="JTI=2")
    row = world.store.get(ref)
    assert (row.exchanged_at, row.exchange_credential_id) == (first, "JTI=2")
    warm_ref, _, warm_uid = world.attempt(token=projected_token())
    assert world.store.record_exchange(warm_ref, credential_id=f"warm:{warm_uid}")
    assert not world.store.record_exchange_again(warm_ref, pod_uid=warm_uid, credential_id="JTI=3")
    assert world.store.transition(ref, expected=[S.DISPATCHED], to=S.CLOSED, resolution=Resolution.MOVED_ON)
    assert not world.store.record_exchange_again(ref, pod_uid=uid, credential_id="JTI=4")
    with pytest.raises(ValueError):
        world.store.record_exchange_again(ref, pod_uid="", credential_id=None)
