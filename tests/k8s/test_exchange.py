"""The token exchange against the real kube-apiserver (issue 9 item 3, acceptance "Exchange refuses ...").

Real parts: the kube-apiserver of ``scripts/k8senv`` (TokenReview, pods, RBAC), projected-style tokens minted
through the real TokenRequest API and bound to real pods, the ledger (``LedgerStore`` on SQLite), Airflow's
``JWTGenerator`` built from Airflow's config exactly as the plugin's lifespan builds it, and leoflow's FastAPI
app called in-process (``TestClient``), its lifespan included. The api-server's Kubernetes identity is a
ServiceAccount granted only ``create tokenreviews`` and ``get pods`` in the task namespace (DESIGN's
least-privilege RBAC), through a kubeconfig of its own, as ``[leoflow] in_cluster = False`` and ``kube_config``
would name. ``test_exchange_apiserver.py`` runs the route in a real Airflow api-server.
"""

from __future__ import annotations

import asyncio
import json
import random
from dataclasses import dataclass
from pathlib import Path

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from kubernetes import client

from leoflow_agent.exchange import decode_grant, request_body
from leoflow_airflow.api.app import create_app
from leoflow_airflow.api.exchange import from_airflow
from leoflow_airflow.ledger.models import metadata
from leoflow_airflow.ledger.states import AttemptRef, AttemptState, Resolution
from leoflow_airflow.ledger.store import LedgerStore

from .conftest import wait_for
from .exchange_wiring import (
    API_SA,
    AUDIENCE,
    OTHER_SA,
    TASK_SA,
    drop_finalizers,
    jwt_claims,
    kube_attempt,
    make_pod,
    pod_token,
    sar_allowed,
    wire_namespace,
)

pytestmark = pytest.mark.k8s

SECRET = "exchange-test-secret-" + "k" * 64
TASK_AUDIENCE = "urn:airflow.apache.org:task"
HOLD = "leoflow.test/hold"


@dataclass
class ExchangeEnv:
    """One namespace wired for the exchange: ServiceAccounts, RBAC, a ledger and leoflow's app."""

    core: client.CoreV1Api
    auth: client.AuthenticationV1Api
    namespace: str
    store: LedgerStore
    http: TestClient
    kubeconfig: Path
    node: str
    options: dict[str, str]
    """The ``[leoflow]`` values the app's exchange was built from."""

    def attempt(self, *, ti_id: str | None = None, state: AttemptState = AttemptState.DISPATCHED) -> AttemptRef:
        """A Kubernetes attempt in the ledger (CLAIMED, then ``state``); its pod is made by :meth:`pod`."""
        return kube_attempt(self.store, ti_id=ti_id, state=state)

    def pod(self, ref: AttemptRef, **kw) -> client.V1Pod:
        """A task pod of ``ref`` on a kwok node (``make_pod``)."""
        return make_pod(self.core, self.namespace, ref, node=self.node, **kw)

    def built_pod(self, ref: AttemptRef, plugin_hook=None) -> client.V1Pod:
        """The pod leoflow's own builder makes for ``ref`` from :attr:`options` (plus the builder's own: an image,
        the exchange URL, and a pod template placing the pod on a kwok node, as a user's would), with
        ``plugin_hook`` as ``build_pod``'s, created for real; the created pod."""
        from leoflow_airflow import settings
        from leoflow_airflow.runtime.kubernetes.pod import PodAttempt, build_pod

        values = {**self.options, "image": "leoflow.test/none:0", "exchange_url": "https://airflow.example/leoflow"}
        kube = settings.load_kubernetes(lambda section, key, fallback: values.get(key, fallback))
        attempt = PodAttempt(ti_id=ref.ti_id, try_number=ref.try_number, attempt_epoch=ref.attempt_epoch,
                             dag_id="dag", task_id="task", run_id="run")
        template = client.V1Pod(spec=client.V1PodSpec(node_name=self.node, containers=[]))
        built = build_pod(attempt, kube, template=template, plugin_hook=plugin_hook)
        return self.core.create_namespaced_pod(self.namespace, built)

    def token(self, pod: client.V1Pod, **kw) -> str:
        """A token bound to ``pod`` (``pod_token``)."""
        return pod_token(self.core, self.namespace, pod, **kw)

    def review(self, token: str) -> client.V1TokenReviewStatus:
        """Kubernetes' own verdict on ``token`` for our audience (as admin)."""
        return self.auth.create_token_review(client.V1TokenReview(
            spec=client.V1TokenReviewSpec(token=token, audiences=[AUDIENCE]))).status

    def exchange(self, body: bytes):
        return self.http.post("/v1/exchange", content=body, headers={"content-type": "application/json"})

    def delete_pod(self, name: str) -> None:
        self.core.delete_namespaced_pod(name, self.namespace, grace_period_seconds=0)
        wait_for(lambda: not self.core.list_namespaced_pod(self.namespace,
                                                           field_selector=f"metadata.name={name}").items,
                 30, what=f"pod {name} gone")


@pytest.fixture
def xenv(api, core, namespace, k8s_env, tmp_path, monkeypatch):
    """The namespace wired for the exchange; the app's lifespan builds the exchange from Airflow's config."""
    kubeconfig, unwire = wire_namespace(api, core, namespace, k8s_env, tmp_path / "api-server.kubeconfig")
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'ledger.db'}")
    metadata.create_all(engine)
    store = LedgerStore(engine)
    monkeypatch.setenv("AIRFLOW__API_AUTH__JWT_SECRET", SECRET)
    monkeypatch.setenv("AIRFLOW__EXECUTION_API__JWT_AUDIENCE", TASK_AUDIENCE)
    options = {"runtime": "kubernetes", "namespace": namespace, "service_account": TASK_SA,
               "exchange_audience": AUDIENCE, "in_cluster": "False", "kube_config": str(kubeconfig),
               "exchange_timeout_seconds": "10",
               # the k8senv api-server's issuer (scripts/k8senv): real pod tokens pass the local iss check
               "exchange_issuers": "https://kubernetes.default.svc.cluster.local"}
    app = create_app(exchange_factory=lambda: from_airflow(ledger=store, get=lambda s, k, f: options.get(k, f)))
    try:
        with TestClient(app) as http:
            assert app.state.leoflow_exchange.exchange is not None, app.state.leoflow_exchange.off
            yield ExchangeEnv(core=core, auth=client.AuthenticationV1Api(api), namespace=namespace, store=store,
                              http=http, kubeconfig=kubeconfig, node=k8s_env.nodes[0], options=options)
    finally:
        engine.dispose()
        drop_finalizers(core, namespace)  # let held pods go with their namespace
        unwire()


def refused(caplog, response) -> str:
    """Assert a 403 carrying only an ``error_id``; return the reason logged under that id."""
    assert response.status_code == 403, (response.status_code, response.text)
    body = response.json()
    assert body.keys() == {"error_id"}, body
    lines = [r.getMessage() for r in caplog.records if body["error_id"] in r.getMessage()]
    assert len(lines) == 1, lines
    return lines[0].split("reason=")[1].split()[0]


# --- the good path --------------------------------------------------------------------------------------

def test_good_exchange_returns_a_workload_token_airflows_execution_api_accepts(xenv, caplog):
    """A pod's token exchanged: the stored workload with a workload token that Airflow's own Execution API
    validator (``execution_api.app._jwt_validator``, from the same config) and claims model accept, for
    ``/run`` (scope ``workload``) of exactly this ``ti_id``; the ledger records the review's credential id,
    which is the ServiceAccount token's own jti."""
    ref = xenv.attempt()
    pod = xenv.pod(ref)
    token = xenv.token(pod)
    r = xenv.exchange(request_body(token))
    assert r.status_code == 200, r.text
    assert r.headers["cache-control"] == "no-store"
    grant = decode_grant(r.content)
    assert (grant.ti_id, grant.try_number, grant.attempt_epoch) == (ref.ti_id, 1, 1)

    from airflow.api_fastapi.execution_api.app import _jwt_validator
    from airflow.api_fastapi.execution_api.datamodels.token import TIClaims
    from airflow.executors.workloads import ExecuteTask

    workload = ExecuteTask.model_validate_json(grant.workload)
    assert str(workload.ti.id) == ref.ti_id
    claims = asyncio.run(_jwt_validator().avalidated_claims(workload.token, {}))
    model = TIClaims(**claims)
    assert model.scope == "workload" and claims["sub"] == ref.ti_id and claims["aud"] == TASK_AUDIENCE
    row = xenv.store.get(ref)
    assert row.state is AttemptState.DISPATCHED and row.exchanged_at is not None
    assert row.exchange_credential_id == f"JTI={jwt_claims(token)['jti']}"
    assert token not in caplog.text and workload.token not in caplog.text


def test_a_pod_the_builder_made_is_exchanged_for_its_attempt(xenv):
    """The two halves of the Kubernetes runtime on the real kube-apiserver: ``build_pod`` from the same
    ``[leoflow]`` values the app's exchange was built from (plus the builder's own: an image, the exchange URL,
    and a pod template placing the pod on a kwok node, as a user's would), created for real; the token the
    kubelet would project into it (TokenRequest for the pod's own ServiceAccount with the audience of the pod's
    own token volume, bound to the created pod) is exchanged for exactly this attempt."""
    ref = xenv.attempt()
    created = xenv.built_pod(ref)
    [projection] = [src.service_account_token for v in created.spec.volumes if v.projected
                    for src in v.projected.sources if src.service_account_token]
    assert (created.spec.service_account_name, projection.audience) == (TASK_SA, AUDIENCE)
    token = xenv.token(created, audiences=[projection.audience], sa_name=created.spec.service_account_name)
    r = xenv.exchange(request_body(token))
    assert r.status_code == 200, r.text
    grant = decode_grant(r.content)
    assert (grant.ti_id, grant.try_number, grant.attempt_epoch) == (ref.ti_id, ref.try_number, ref.attempt_epoch)
    assert xenv.store.get(ref).exchange_credential_id == f"JTI={jwt_claims(token)['jti']}"


# --- refusals (acceptance: each a 403 with an error_id) --------------------------------------------------

def test_a_token_with_the_wrong_audience_is_refused(xenv, caplog, monkeypatch):
    """A real pod token for another audience is refused from its unverified claims, before any TokenReview
    (k8s review §10); TokenReview would not authenticate it for ours either."""
    from leoflow_airflow.runtime.kubernetes.review import KubeClient

    reviews = []
    real_review = KubeClient.review
    monkeypatch.setattr(KubeClient, "review", lambda self, *a: reviews.append(a) or real_review(self, *a))
    ref = xenv.attempt()
    pod = xenv.pod(ref)
    wrong = xenv.token(pod, audiences=["someone-else"])
    assert refused(caplog, xenv.exchange(request_body(wrong))) == "implausible_token"
    api_audience = xenv.token(pod, audiences=["https://kubernetes.default.svc.cluster.local"])
    assert refused(caplog, xenv.exchange(request_body(api_audience))) == "implausible_token"
    assert reviews == [] and not xenv.review(wrong).authenticated
    assert xenv.store.get(ref).exchanged_at is None
    assert xenv.exchange(request_body(xenv.token(pod))).status_code == 200  # the right one still works


def test_another_service_accounts_token_is_refused(xenv, caplog):
    """A pod running as another ServiceAccount of the namespace, carrying a current attempt's annotation: its
    token's own claims name the other ServiceAccount, so it is refused before any TokenReview."""
    ref = xenv.attempt()
    pod = xenv.pod(ref, sa_name=OTHER_SA)
    token = xenv.token(pod, sa_name=OTHER_SA)
    assert xenv.review(token).authenticated  # Kubernetes accepts it: leoflow's ServiceAccount checks refuse it
    assert refused(caplog, xenv.exchange(request_body(token))) == "implausible_token"
    assert xenv.store.get(ref).exchanged_at is None


def test_a_cluster_admins_token_is_refused(xenv, caplog, k8s_env):
    """Not a pod's token at all (the static admin token of k8senv, not even a JWT): refused before any
    Kubernetes call; Kubernetes would not authenticate it for leoflow's audience either."""
    admin_token = json.loads(Path(k8s_env.kubeconfig).read_text())["users"][0]["user"]["token"]
    response = xenv.exchange(json.dumps({"token": admin_token}).encode())
    assert refused(caplog, response) == "malformed_token"
    assert not xenv.review(admin_token).authenticated


def test_a_deleted_pods_token_is_refused(xenv, caplog):
    ref = xenv.attempt()
    pod = xenv.pod(ref)
    token = xenv.token(pod)
    xenv.delete_pod(pod.metadata.name)
    assert refused(caplog, xenv.exchange(request_body(token))) in {"unauthenticated", "pod_gone"}
    assert xenv.store.get(ref).exchanged_at is None


def test_a_terminating_pods_token_is_refused_though_kubernetes_still_accepts_it(xenv, caplog):
    """A finalizer keeps the deleted pod terminating: TokenReview still authenticates its token (for the
    grace period + 60 s), so leoflow's own deletionTimestamp check is what refuses it."""
    ref = xenv.attempt()
    pod = xenv.pod(ref, finalizers=[HOLD])
    token = xenv.token(pod)
    xenv.core.delete_namespaced_pod(pod.metadata.name, xenv.namespace, grace_period_seconds=0)
    wait_for(lambda: xenv.core.read_namespaced_pod(pod.metadata.name, xenv.namespace).metadata.deletion_timestamp,
             30, what="deletionTimestamp")
    status = xenv.review(token)
    assert status.authenticated, status.error
    assert refused(caplog, xenv.exchange(request_body(token))) == "pod_terminating"
    assert xenv.store.get(ref).exchanged_at is None


def test_a_pod_recreated_under_the_same_name_is_refused(xenv, caplog):
    """The old pod's token after a new pod took its name (another UID); and the new pod itself, which the
    ledger did not record for the attempt, once the ledger names the first pod."""
    ref = xenv.attempt()
    first = xenv.pod(ref)
    old_token = xenv.token(first)
    assert xenv.store.record_facts(ref, expected=[AttemptState.DISPATCHED], pod_name=first.metadata.name,
                                   pod_uid=first.metadata.uid)
    xenv.delete_pod(first.metadata.name)
    second = xenv.pod(ref, name=first.metadata.name)
    assert second.metadata.uid != first.metadata.uid
    assert refused(caplog, xenv.exchange(request_body(old_token))) in {"unauthenticated", "pod_replaced"}
    assert refused(caplog, xenv.exchange(request_body(xenv.token(second)))) == "pod_not_recorded"
    assert xenv.store.get(ref).exchanged_at is None


def test_a_stale_epochs_pod_is_refused(xenv, caplog):
    """Epoch 1's pod exchanges after the ledger moved the ti_id on to epoch 2; epoch 2's pod is served."""
    ref1 = xenv.attempt()
    pod1 = xenv.pod(ref1)
    assert xenv.store.transition(ref1, expected=[AttemptState.DISPATCHED], to=AttemptState.CLOSED,
                                 resolution=Resolution.REDISPATCHED)
    ref2 = xenv.attempt(ti_id=ref1.ti_id)
    assert ref2.attempt_epoch == 2
    pod2 = xenv.pod(ref2)
    assert refused(caplog, xenv.exchange(request_body(xenv.token(pod1)))) == "stale_epoch"
    assert xenv.store.get(ref2).exchanged_at is None
    r = xenv.exchange(request_body(xenv.token(pod2)))
    assert r.status_code == 200 and decode_grant(r.content).attempt_epoch == 2


def test_the_recorded_pod_may_exchange_again_after_a_lost_answer(xenv, caplog):
    """k8s review §4: the ledger recorded the attempt's pod (name and UID, as the scheduler does at create); the
    first 200 was lost. The same pod, with the same token and with a rotated one, is granted again (a fresh
    workload token each time); a pod recreated under the name (another UID) is refused."""
    from airflow.executors.workloads import ExecuteTask

    ref = xenv.attempt()
    pod = xenv.pod(ref)
    assert xenv.store.record_facts(ref, expected=[AttemptState.DISPATCHED], pod_name=pod.metadata.name,
                                   pod_uid=pod.metadata.uid)
    token = xenv.token(pod)
    answers = [xenv.exchange(request_body(t)) for t in (token, token, xenv.token(pod))]
    assert [r.status_code for r in answers] == [200, 200, 200], [r.text for r in answers]
    minted = {ExecuteTask.model_validate_json(decode_grant(r.content).workload).token for r in answers}
    assert len(minted) == 3
    row = xenv.store.get(ref)
    assert row.state is AttemptState.DISPATCHED and row.exchanged_at is not None
    xenv.delete_pod(pod.metadata.name)
    second = xenv.pod(ref, name=pod.metadata.name)
    assert refused(caplog, xenv.exchange(request_body(xenv.token(second)))) == "already_exchanged"


def test_a_second_exchange_of_one_attempt_is_refused(xenv, caplog):
    """With no pod recorded for the attempt, the same token again, and a fresh token of the same pod (the
    kubelet's rotation): both refused; the ledger keeps the first credential id."""
    ref = xenv.attempt()
    pod = xenv.pod(ref)
    token = xenv.token(pod)
    assert xenv.exchange(request_body(token)).status_code == 200
    assert refused(caplog, xenv.exchange(request_body(token))) == "already_exchanged"
    assert refused(caplog, xenv.exchange(request_body(xenv.token(pod)))) == "already_exchanged"
    assert xenv.store.get(ref).exchange_credential_id == f"JTI={jwt_claims(token)['jti']}"


def test_an_attempt_not_dispatched_yet_is_undecided_then_granted(xenv, caplog):
    """The pod asked before the scheduler recorded its attempt DISPATCHED (pod creation is asynchronous): 503
    with Retry-After and nothing recorded, so the agent asks again; once recorded, the same token is granted."""
    ref = xenv.attempt(state=AttemptState.CLAIMED)
    pod = xenv.pod(ref)
    token = xenv.token(pod)
    r = xenv.exchange(request_body(token))
    assert r.status_code == 503 and r.headers["retry-after"] == "1", r.text
    assert [m for m in caplog.messages if r.json()["error_id"] in m and "reason=not_yet_dispatched" in m]
    assert xenv.store.get(ref).exchanged_at is None
    assert xenv.store.transition(ref, expected=[AttemptState.CLAIMED], to=AttemptState.DISPATCHED,
                                 pod_name=pod.metadata.name, pod_uid=pod.metadata.uid)
    r = xenv.exchange(request_body(token))
    assert r.status_code == 200, r.text
    assert decode_grant(r.content).ti_id == ref.ti_id


def test_a_closed_attempt_is_refused(xenv, caplog):
    ref = xenv.attempt(state=AttemptState.CLAIMED)
    pod = xenv.pod(ref)
    assert xenv.store.transition(ref, expected=[AttemptState.CLAIMED], to=AttemptState.CLOSED,
                                 resolution=Resolution.ABANDONED)
    assert refused(caplog, xenv.exchange(request_body(xenv.token(pod)))) == "not_dispatched"


@pytest.mark.parametrize("body, reason", [
    (b"", "malformed_request"),
    (b"garbage", "malformed_request"),
    (b'{"token": "garbage"}', "malformed_token"),
    (b'{"token": "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ4In0.c2lnbmF0dXJl"}', "implausible_token"),
])
def test_garbage_and_an_empty_body_are_refused(xenv, caplog, body, reason):
    assert refused(caplog, xenv.exchange(body)) == reason


def test_a_thousand_fuzzed_bodies_get_no_5xx(xenv, caplog):
    """1,000 bodies: random bytes and JSON, JWT-shaped strings and mutations of a real pod token (these reach
    the real TokenReview). None gets a 5xx; each non-200 is a 403 with only an ``error_id``; at most the one
    unmutated real token is granted."""
    ref = xenv.attempt()
    token = xenv.token(xenv.pod(ref))
    rng = random.Random(3)
    alphabet = "abcXYZ019-_.=+/ \"{}[]:,\\é\x00"

    def mutate() -> str:
        chars = list(token)
        for _ in range(rng.randrange(1, 4)):
            i = rng.randrange(len(chars))
            chars[i] = rng.choice("ABCabc0123-_")
        return "".join(chars)

    def body() -> bytes:
        kind = rng.randrange(6)
        if kind == 0:
            return rng.randbytes(rng.randrange(0, 400))
        if kind == 1:
            return "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 200))).encode()
        if kind in (2, 3):
            return json.dumps({"token": mutate()}).encode()
        if kind == 4:
            value = rng.choice([None, 0, [], {}, "x" * rng.randrange(60), [token], token[:rng.randrange(len(token))]])
            return json.dumps({"token": value}).encode()
        return json.dumps({rng.choice(["token", "tokens", "", "TOKEN"]): token}).encode()

    counts: dict[int, int] = {}
    for _ in range(1000):
        r = xenv.exchange(body())
        counts[r.status_code] = counts.get(r.status_code, 0) + 1
        assert r.status_code in (200, 403), (r.status_code, r.text)
        if r.status_code == 403:
            assert r.json().keys() == {"error_id"}
    assert counts.get(200, 0) <= 1, counts
    reasons = {line.split("reason=")[1].split()[0] for line in caplog.messages if "reason=" in line}
    assert "unauthenticated" in reasons and "malformed_request" in reasons, reasons


# --- undecided: Kubernetes without an answer the exchange can use --------------------------------------

def test_an_api_server_identity_without_get_pods_answers_503_not_403(xenv, api, caplog):
    """RBAC taken away from the api-server's ServiceAccount: the pod GET is forbidden to *us*, which says
    nothing about the pod, so the answer is 503 (try again), and nothing is recorded."""
    ref = xenv.attempt()
    token = xenv.token(xenv.pod(ref))
    client.RbacAuthorizationV1Api(api).delete_namespaced_role_binding("leoflow-exchange", xenv.namespace)
    user = f"system:serviceaccount:{xenv.namespace}:{API_SA}"
    wait_for(lambda: not sar_allowed(api, user, xenv.namespace, verb="get", resource="pods"), 30,
             what="the grant to go")
    r = xenv.exchange(request_body(token))
    assert r.status_code == 503 and r.json().keys() == {"error_id"} and r.headers["retry-after"] == "5"
    assert "kube_unavailable" in caplog.text and "403" in caplog.text
    assert xenv.store.get(ref).exchanged_at is None
