"""``airflow leoflow doctor``'s pure parts: each check's facts → its finding (name, status, the fix), the table,
the JSON, the exit code; and the mint-key probe's token contract with Airflow's real ``JWTGenerator`` and
``JWTValidator`` (no server). The doctor against a real api-server and kube-apiserver is tests/k8s/test_doctor.py.
"""

from __future__ import annotations

import json

import pytest

from leoflow_airflow.doctor import findings as F
from leoflow_airflow.doctor import probe_token
from leoflow_airflow.doctor.findings import Finding, Status
from leoflow_airflow.ladder import LadderReport, Rung
from leoflow_airflow.runtime.kubernetes.access import EXCHANGE_RULES, SCHEDULER_RULES, AccessResult, user_groups

KUBE_VIEW = {"runtime": "kubernetes", "namespace": "tasks", "service_account": "leoflow-task",
             "exchange_audience": "urn:leoflow:exchange"}
LOCAL = F.LocalMint(shared=True, error="", audience="urn:airflow.apache.org:task", leoflow=KUBE_VIEW)
URL = "http://api:8080/leoflow"


def _reply(reason: str, **kw) -> F.VerifyReply:
    return F.VerifyReply(URL, reason=reason, http_status=200, **kw)


def test_a_verified_probe_with_the_same_leoflow_view_passes_both_checks():
    key, aud = F.mint_findings(LOCAL, _reply("verified", leoflow=KUBE_VIEW))
    assert (key.status, aud.status) == (Status.OK, Status.OK)
    assert "urn:leoflow:exchange" in aud.detail and "tasks/leoflow-task" in aud.detail


def test_a_different_key_names_the_api_server_and_the_shared_secret_fix():
    key, aud = F.mint_findings(LOCAL, _reply("signature"))
    assert key.status is Status.FAIL
    assert key.detail.startswith(f"api-server at {URL} verifies with a different key")
    assert "[api_auth] jwt_secret" in key.fix and "every api-server" in key.fix
    assert aud.status is Status.SKIP


def test_an_execution_audience_mismatch_is_a_wrong_audience_naming_both():
    key, aud = F.mint_findings(LOCAL, _reply("audience", accepted_audiences=("urn:other",)))
    assert key.status is Status.OK  # pyjwt checks the signature before the claims
    assert aud.status is Status.FAIL and aud.detail.startswith("wrong audience")
    assert "urn:other" in aud.detail and "urn:airflow.apache.org:task" in aud.detail
    assert "[execution_api] jwt_audience" in aud.fix


def test_an_exchange_audience_mismatch_is_a_wrong_audience_too():
    theirs = {**KUBE_VIEW, "exchange_audience": "urn:elsewhere"}
    _, aud = F.mint_findings(LOCAL, _reply("verified", leoflow=theirs))
    assert aud.status is Status.FAIL and aud.detail.startswith("wrong audience")
    assert "'urn:elsewhere'" in aud.detail and "[leoflow] exchange_audience" in aud.fix


def test_an_api_server_on_lite_fails_audience_for_a_kubernetes_scheduler():
    _, aud = F.mint_findings(LOCAL, _reply("verified", leoflow={"runtime": "lite"}))
    assert aud.status is Status.FAIL and "token exchange is off" in aud.detail


def test_no_shared_key_fails_before_any_probe():
    key, aud = F.mint_findings(F.LocalMint(shared=False, error="", audience="a"), None)
    assert key.status is Status.FAIL and "makes up its own secret" in key.detail
    assert aud.status is Status.SKIP


def test_an_unreachable_api_server_skips_the_key_checks_and_fails_the_exchange_url():
    key, aud = F.mint_findings(LOCAL, F.VerifyReply(URL, error="unreachable"))
    assert (key.status, aud.status) == (Status.SKIP, Status.SKIP)
    url = F.exchange_url_finding(F.HealthReply(URL, error="ConnectError: refused"), "1.0",
                                 source="[leoflow] exchange_url")
    assert url.status is Status.FAIL and url.detail == f"{URL} is unreachable: ConnectError: refused"
    assert url.fix.startswith("set [leoflow] exchange_url to the URL")


def test_an_exchange_url_that_is_not_leoflow_fails_and_another_version_warns():
    not_ours = F.exchange_url_finding(F.HealthReply(URL, status=404), "1.0", source="[api] base_url")
    assert not_ours.status is Status.FAIL and "nothing serves /leoflow there" in not_ours.detail
    older = F.exchange_url_finding(F.HealthReply(URL, status=200, version="0.9"), "1.0", source="x")
    assert older.status is Status.WARN and "0.9" in older.detail
    same = F.exchange_url_finding(F.HealthReply(URL, status=200, version="1.0"), "1.0", source="x")
    assert same.status is Status.OK


def test_rbac_names_each_denied_rule_and_an_undecidable_review_is_cannot_check():
    results = [AccessResult(r, r.verb != "patch") for r in SCHEDULER_RULES]
    f = F.rbac_finding("scheduler_rbac", "the scheduler's identity", "tasks", results, grant="a Role")
    assert f.status is Status.FAIL and f.detail == "the scheduler's identity may not patch pods in namespace tasks"
    assert f.fix == "grant patch pods to the scheduler's identity (a Role)"
    undecided = [AccessResult(r, None, "the doctor's identity may not create subjectaccessreviews") for r in
                 EXCHANGE_RULES]
    g = F.rbac_finding("api_server_rbac", "the api-server's identity u", "tasks", undecided, grant="g")
    assert g.status is Status.WARN and g.detail.startswith("cannot check the api-server's identity u's permissions")
    ok = F.rbac_finding("scheduler_rbac", "s", "tasks", [AccessResult(r, True) for r in SCHEDULER_RULES], grant="")
    assert ok.status is Status.OK


@pytest.mark.parametrize("labels, status", [
    ({"pod-security.kubernetes.io/enforce": "restricted"}, Status.OK),
    ({"pod-security.kubernetes.io/enforce": "baseline"}, Status.WARN),
    ({"pod-security.kubernetes.io/enforce": "privileged"}, Status.WARN),
    ({}, Status.WARN),
    ({"pod-security.kubernetes.io/enforce": "strict"}, Status.FAIL),
])
def test_pod_security_warns_below_restricted(labels, status):
    f = F.pod_security_finding("tasks", labels)
    assert f.status is status
    if status is not Status.OK:
        assert f.fix.startswith("kubectl label namespace tasks pod-security.kubernetes.io/enforce=restricted")


def test_service_account_and_pull_secrets():
    missing = F.service_account_finding("tasks", "leoflow-task", False)
    assert missing.status is Status.FAIL and "kubectl -n tasks create serviceaccount leoflow-task" in missing.fix
    assert F.pull_secrets_finding("tasks", {"reg": False, "ok": True}).status is Status.FAIL
    assert F.pull_secrets_finding("tasks", {"reg": None}).status is Status.WARN
    assert F.pull_secrets_finding("tasks", {}).status is Status.OK


def test_ladder_finding_names_every_broken_rung():
    report = LadderReport(violations=(Rung("window_lower", "too low", {}), Rung("window_upper", "too high", {})),
                          warnings=())
    f = F.ladder_finding(report)
    assert f.status is Status.FAIL and f.detail.startswith("broken rungs: window_lower, window_upper")
    assert F.ladder_finding(LadderReport((), ())).status is Status.OK


def test_table_json_and_exit_code():
    rows = [Finding("ladder", Status.OK, "every rung holds"),
            Finding("mint_key", Status.FAIL, "api-server at U verifies with a different key", "share the secret"),
            F.skip("warm_pools", "no warm pools configured")]
    table = F.render_table(rows)
    assert table.splitlines() == [
        "STATUS  CHECK       DETAIL",
        "ok      ladder      every rung holds",
        "FAIL    mint_key    api-server at U verifies with a different key",
        "                    fix: share the secret",
        "skip    warm_pools  no warm pools configured",
        "1 ok, 0 warn, 1 fail, 1 skipped; exit 1",
    ]
    data = json.loads(F.render_json(rows))
    assert data["ok"] is False and data["exit_code"] == 1
    assert data["findings"][1] == {"name": "mint_key", "status": "fail",
                                   "detail": "api-server at U verifies with a different key", "fix": "share the secret"}
    assert F.exit_code(rows[:1] + rows[2:]) == 0
    assert F.exit_code([Finding("x", Status.WARN, "w")]) == 0


def test_service_account_users_get_their_groups():
    assert user_groups("system:serviceaccount:airflow:api") == [
        "system:serviceaccounts", "system:serviceaccounts:airflow", "system:authenticated"]
    assert user_groups("alice") == ["system:authenticated"]


# --------------------------------------------------------------------------- the probe token, with Airflow's JWT


def _generator(secret: str, audience: str):
    from airflow.api_fastapi.auth.tokens import JWTGenerator

    return JWTGenerator(secret_key=secret, audience=audience, valid_for=600)


def _validator(secret: str, audiences: list[str]):
    from airflow.api_fastapi.auth.tokens import JWTValidator

    return JWTValidator(secret_key=secret, audience=audiences, required_claims=frozenset({"aud", "exp", "iat"}),
                        issuer=None, leeway=10)


SECRET = "s" * 86


def test_the_probe_verifies_only_with_the_same_key_and_audience():
    token = probe_token.mint_probe(_generator(SECRET, "urn:task"))
    assert probe_token.verify_probe(token, _validator(SECRET, ["urn:task", "urn:x"])) == "verified"
    assert probe_token.verify_probe(token, _validator("t" * 86, ["urn:task"])) == "signature"
    assert probe_token.verify_probe(token, _validator(SECRET, ["urn:other"])) == "audience"
    assert probe_token.verify_probe("not.a.jwt", _validator(SECRET, ["urn:task"])) == "malformed"
    workload = _generator(SECRET, "urn:task").generate(extras={"sub": "x", "scope": "workload"})
    assert probe_token.verify_probe(workload, _validator(SECRET, ["urn:task"])) == "not_a_probe"


def test_the_probe_check_is_no_validity_oracle_for_task_tokens_and_verifies_none_of_them():
    """k8s review §16a: a valid task token, one signed with another key and an expired one all answer the same
    ``not_a_probe``, and none of them costs a signature verification (the validator is never called)."""
    import time

    import jwt

    class Counting:
        def __init__(self, real):
            self.real, self.calls = real, 0

        def validated_claims(self, token):
            self.calls += 1
            return self.real.validated_claims(token)

    validator = Counting(_validator(SECRET, ["urn:task"]))
    valid = _generator(SECRET, "urn:task").generate(extras={"sub": "ti-1", "scope": "execution"})
    forged = _generator("t" * 86, "urn:task").generate(extras={"sub": "ti-1", "scope": "execution"})
    now = int(time.time())
    expired = jwt.encode({"sub": "ti-1", "scope": "execution", "aud": "urn:task", "iat": now - 900,
                          "nbf": now - 900, "exp": now - 600}, SECRET, algorithm="HS512")
    answers = {probe_token.verify_probe(t, validator) for t in (valid, forged, expired)}
    assert answers == {"not_a_probe"} and validator.calls == 0
    assert probe_token.verify_probe("x.y", validator) == "malformed" and validator.calls == 0
    assert probe_token.verify_probe(probe_token.mint_probe(_generator(SECRET, "urn:task")), validator) == "verified"
    assert validator.calls == 1


def test_a_probe_token_is_refused_by_the_execution_apis_claims_model():
    """Its scope is none the Execution API knows, so a leaked probe token opens no route."""
    from pydantic import ValidationError

    from airflow.api_fastapi.execution_api.datamodels.token import TIClaims

    token = probe_token.mint_probe(_generator(SECRET, "urn:task"))
    claims = _validator(SECRET, ["urn:task"]).validated_claims(token)
    assert claims["exp"] - claims["iat"] == probe_token.PROBE_VALID_SECONDS
    with pytest.raises(ValidationError):
        TIClaims.model_validate(claims)


# --------------------------------------------------------------------------- the api-server's verify route


@pytest.fixture
def verify(monkeypatch):
    """POST a body to ``/v1/doctor/verify`` of leoflow's app (in-process, its lifespan with an exchange that
    is off); the api-server's config: secret ``SECRET``, Airflow's default execution audience, runtime lite."""
    from fastapi.testclient import TestClient

    from leoflow_airflow.api.app import create_app
    from leoflow_airflow.api.exchange import ExchangeService

    monkeypatch.setenv("AIRFLOW__API_AUTH__JWT_SECRET", SECRET)
    monkeypatch.delenv("AIRFLOW__EXECUTION_API__JWT_AUDIENCE", raising=False)
    monkeypatch.setenv("AIRFLOW__LEOFLOW__RUNTIME", "lite")
    with TestClient(create_app(exchange_factory=lambda: ExchangeService(None))) as http:
        yield lambda body: http.post(probe_token.VERIFY_PATH, json=body)


def test_the_verify_route_answers_only_a_reason(verify):
    good = probe_token.mint_probe(_generator(SECRET, "urn:airflow.apache.org:task"))
    r = verify({"token": good})
    assert r.status_code == 200 and r.headers["cache-control"] == "no-store"
    assert r.json()["reason"] == "verified" and r.json()["leoflow"] == {"runtime": "lite"}
    assert verify({"token": probe_token.mint_probe(_generator("t" * 86, "urn:airflow.apache.org:task"))}).json() \
        .keys() == {"reason", "version"}  # a stranger learns the reason, nothing of the config
    assert verify({"token": probe_token.mint_probe(_generator(SECRET, "urn:x"))}).json()["accepted_audiences"] == [
        "urn:airflow.apache.org:task"]
    assert verify({"nothing": 1}).json()["reason"] == "malformed"


def test_the_verify_route_answers_every_task_token_alike_without_building_a_validator(verify, monkeypatch):
    """k8s review §16a, over HTTP: a valid task token and a forged one answer the same body, and the route never
    reaches the key configuration for them (an anonymous call costs no verification)."""
    monkeypatch.setattr(probe_token, "cached_validator", lambda: pytest.fail("a non-probe token was verified"))
    valid = _generator(SECRET, "urn:airflow.apache.org:task").generate(extras={"sub": "ti", "scope": "execution"})
    forged = _generator("t" * 86, "urn:airflow.apache.org:task").generate(extras={"sub": "ti", "scope": "execution"})
    first, second = verify({"token": valid}).json(), verify({"token": forged}).json()
    assert first == second and first["reason"] == "not_a_probe"


def test_the_verify_route_says_no_key_when_the_api_server_has_none(verify, monkeypatch):
    monkeypatch.setenv("AIRFLOW__API_AUTH__JWT_SECRET", "")
    token = probe_token.mint_probe(_generator(SECRET, "urn:airflow.apache.org:task"))
    assert verify({"token": token}).json()["reason"] == "no_key"


def test_the_verify_route_builds_its_validator_once_until_the_config_changes(verify, monkeypatch):
    """One validator per process while the signing config stays (the route no longer builds one per request);
    a changed key or audience gets a fresh one at once, and the route answers by the new config."""
    built = []
    real = probe_token.airflow_validator
    monkeypatch.setattr(probe_token, "airflow_validator", lambda: built.append(1) or real())
    token = probe_token.mint_probe(_generator(SECRET, "urn:airflow.apache.org:task"))
    for _ in range(3):
        assert verify({"token": token}).json()["reason"] == "verified"
    assert probe_token.cached_validator() is probe_token.cached_validator()
    assert len(built) <= 1  # 0 when an earlier test of this process built it under the same config
    first = probe_token.cached_validator()
    monkeypatch.setenv("AIRFLOW__API_AUTH__JWT_SECRET", "t" * 86)
    assert verify({"token": token}).json()["reason"] == "signature"
    assert probe_token.cached_validator() is not first
    monkeypatch.setenv("AIRFLOW__API_AUTH__JWT_SECRET", SECRET)
    monkeypatch.setenv("AIRFLOW__EXECUTION_API__JWT_AUDIENCE", "urn:other")
    assert verify({"token": token}).json()["reason"] == "audience"


def test_warm_pools_are_counted_per_version_and_tenant_against_their_caps() -> None:
    """A version over its max_pool_size (a lagging cache, a second scheduler) or a tenant over warm_tenant_cap
    fails the check naming it; within the caps it is ok; configured with no warm pod running is ok; not
    configured is skipped; unreadable is a warning that names why."""
    pods = [{"leoflow.io/dag-version": "v1", "leoflow.io/tenant": "bundle-dags"}] * 3 + \
           [{"leoflow.io/dag-version": "v2", "leoflow.io/tenant": "bundle-dags"}]
    caps = {"v1": ("etl", 2), "v2": ("report", 4)}
    counts = F.warm_pool_counts(pods, caps.__getitem__, tenant_cap=3)
    assert counts == {"etl (version v1)": (3, 2), "report (version v2)": (1, 4), "tenant bundle-dags": (4, 3)}
    over = F.warm_pools_finding(counts)
    assert over.status is F.Status.FAIL and "etl (version v1) 3/2" in over.detail
    assert "tenant bundle-dags 4/3" in over.detail
    fine = F.warm_pools_finding(F.warm_pool_counts(pods[2:], caps.__getitem__, tenant_cap=0))
    assert fine.status is F.Status.OK and "2 warm pool(s)" in fine.detail
    assert F.warm_pools_finding({}).status is F.Status.OK
    assert F.warm_pools_finding(None).status is F.Status.SKIP
    unreadable = F.warm_pools_finding(None, error="HTTP 403: pods is forbidden")
    assert unreadable.status is F.Status.WARN and "403" in unreadable.detail
