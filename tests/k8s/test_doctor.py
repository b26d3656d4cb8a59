"""``airflow leoflow doctor`` against a real kube-apiserver and a real Airflow api-server (issue 12 item 3,
acceptance: "reports each of these broken setups by name with its fix, and passes on a good one").

Real parts: the kube-apiserver of ``scripts/k8senv`` (RBAC, SelfSubjectAccessReview and SubjectAccessReview,
Pod Security admission, a ``dryRun=All`` create), the doctor reaching it with the token of a ServiceAccount
minted through TokenRequest (so every permission is RBAC's real answer), and one Airflow api-server
(``devtools.stack``, leoflow's plugin mounted, ``[leoflow] runtime = kubernetes``) that verifies the probe token.
The good setup runs the doctor as the CLI (``airflow leoflow doctor --json``, a subprocess with the stack's
environment); each broken setup runs :func:`leoflow_airflow.doctor.probes.run` in this process with one
setting changed (Airflow reads ``AIRFLOW__…`` variables at each lookup), against the same api-server and
cluster. One control plane (the session's), one api-server and two namespaces for the module.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from devtools.stack import free_port
from leoflow_airflow.doctor.findings import Status
from leoflow_airflow.doctor.probes import DoctorOptions, run

from .conftest import PSA_RESTRICTED, wait_for
from .exchange_wiring import sa_kubeconfig

pytestmark = [pytest.mark.k8s, pytest.mark.airflow]

TASK_SA = "leoflow-task"
SCHEDULER_SA = "leoflow-scheduler"
"""The scheduler's identity: exactly leoflow's Role, plus what the doctor needs to check more."""
NO_PATCH_SA = "scheduler-no-patch"
"""A scheduler identity whose Role lacks ``patch pods`` and that has none of the doctor's extras."""
API_SA = "leoflow-api"
"""The api-server's identity: create tokenreviews, get pods and pods/log."""
AUDIENCE = "leoflow-doctor-test"
CLUSTER_ISSUER = "https://kubernetes.default.svc.cluster.local"
"""The k8senv kube-apiserver's ``--service-account-issuer`` (scripts/k8senv)."""
RBAC = "rbac.authorization.k8s.io"


def _role(rbac, ns: str, name: str, rules: list[client.V1PolicyRule], sa_ns: str, sa: str) -> None:
    rbac.create_namespaced_role(ns, client.V1Role(metadata=client.V1ObjectMeta(name=name), rules=rules))
    rbac.create_namespaced_role_binding(ns, client.V1RoleBinding(
        metadata=client.V1ObjectMeta(name=name),
        subjects=[client.RbacV1Subject(kind="ServiceAccount", name=sa, namespace=sa_ns)],
        role_ref=client.V1RoleRef(api_group=RBAC, kind="Role", name=name)))


def _cluster_role(rbac, name: str, rules: list[client.V1PolicyRule], sa_ns: str, sa: str) -> None:
    rbac.create_cluster_role(client.V1ClusterRole(metadata=client.V1ObjectMeta(name=name), rules=rules))
    rbac.create_cluster_role_binding(client.V1ClusterRoleBinding(
        metadata=client.V1ObjectMeta(name=name),
        subjects=[client.RbacV1Subject(kind="ServiceAccount", name=sa, namespace=sa_ns)],
        role_ref=client.V1RoleRef(api_group=RBAC, kind="ClusterRole", name=name)))


def _scheduler_rules(*, patch: bool = True) -> list[client.V1PolicyRule]:
    verbs = ["create", "get", "list", "watch", "delete"] + (["patch"] if patch else [])
    return [client.V1PolicyRule(api_groups=[""], resources=["pods"], verbs=verbs),
            client.V1PolicyRule(api_groups=[""], resources=["serviceaccounts"], verbs=["get"]),
            # an ended pod's log is kept before its finalizer is released (access.SCHEDULER_RULES)
            client.V1PolicyRule(api_groups=[""], resources=["pods/log"], verbs=["get"]),
            # the warm pools' anchor ConfigMaps (access.SCHEDULER_RULES)
            client.V1PolicyRule(api_groups=[""], resources=["configmaps"], verbs=["create", "get", "list",
                                                                                  "delete"])]


def _allowed(api, ns: str, sa: str, verb: str, resource: str, group: str = "", *, where: str = "") -> bool:
    """May ServiceAccount ``ns/sa`` do ``verb resource`` in namespace ``where`` (default ``ns``)?"""
    spec = client.V1SubjectAccessReviewSpec(
        user=f"system:serviceaccount:{ns}:{sa}", groups=["system:serviceaccounts", f"system:serviceaccounts:{ns}"],
        resource_attributes=client.V1ResourceAttributes(namespace=where or ns, verb=verb, resource=resource,
                                                        group=group))
    return bool(client.AuthorizationV1Api(api).create_subject_access_review(
        client.V1SubjectAccessReview(spec=spec)).status.allowed)


@pytest.fixture(scope="module")
def cluster(api, core, k8s_env, tmp_path_factory):
    """Two namespaces (``ns`` restricted, ``loose`` baseline), the ServiceAccounts and their RBAC, and the
    kubeconfigs of the scheduler (good), the scheduler without ``patch pods`` and the api-server."""
    rbac = client.RbacAuthorizationV1Api(api)
    tag = uuid.uuid4().hex[:6]
    ns, loose = f"doctor-{tag}", f"doctor-loose-{tag}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns, labels=PSA_RESTRICTED)))
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(
        name=loose, labels={"pod-security.kubernetes.io/enforce": "baseline"})))
    cluster_objects = [f"leoflow-doctor-{tag}", f"leoflow-doctor-api-{tag}"]
    try:
        for target in (ns, loose):
            wait_for(lambda t=target: _exists(core, t), 30, what=f"default ServiceAccount of {target}")
            core.create_namespaced_service_account(target, client.V1ServiceAccount(
                metadata=client.V1ObjectMeta(name=TASK_SA)))
            _role(rbac, target, "leoflow-scheduler", _scheduler_rules(), ns, SCHEDULER_SA)
        for sa in (SCHEDULER_SA, NO_PATCH_SA, API_SA):
            core.create_namespaced_service_account(ns, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name=sa)))
        _role(rbac, ns, "scheduler-no-patch", _scheduler_rules(patch=False), ns, NO_PATCH_SA)
        # what the doctor needs beyond the scheduler's Role: read the task namespaces, ask SubjectAccessReview
        _cluster_role(rbac, cluster_objects[0], [
            client.V1PolicyRule(api_groups=[""], resources=["namespaces"], verbs=["get"], resource_names=[ns, loose]),
            client.V1PolicyRule(api_groups=["authorization.k8s.io"], resources=["subjectaccessreviews"],
                                verbs=["create"])], ns, SCHEDULER_SA)
        # the api-server's least privilege (DESIGN §3 "The token exchange, as built")
        _cluster_role(rbac, cluster_objects[1], [client.V1PolicyRule(
            api_groups=["authentication.k8s.io"], resources=["tokenreviews"], verbs=["create"])], ns, API_SA)
        _role(rbac, ns, "leoflow-exchange", [client.V1PolicyRule(api_groups=[""], resources=["pods", "pods/log"],
                                                                 verbs=["get"])], ns, API_SA)
        wait_for(lambda: _allowed(api, ns, SCHEDULER_SA, "patch", "pods")
                 and _allowed(api, ns, SCHEDULER_SA, "create", "pods", where=loose)
                 and _allowed(api, ns, SCHEDULER_SA, "create", "subjectaccessreviews", "authorization.k8s.io")
                 and _allowed(api, ns, NO_PATCH_SA, "create", "pods")
                 and _allowed(api, ns, API_SA, "create", "tokenreviews", "authentication.k8s.io")
                 and _allowed(api, ns, API_SA, "get", "pods"), 30, what="RBAC grants")
        d = tmp_path_factory.mktemp("doctor-kube")
        yield {
            "ns": ns, "loose": loose,
            "scheduler": sa_kubeconfig(core, k8s_env, ns, SCHEDULER_SA, d / "scheduler.kubeconfig"),
            "no_patch": sa_kubeconfig(core, k8s_env, ns, NO_PATCH_SA, d / "no-patch.kubeconfig"),
            "api": sa_kubeconfig(core, k8s_env, ns, API_SA, d / "api.kubeconfig"),
            "api_user": f"system:serviceaccount:{ns}:{API_SA}",
        }
    finally:
        for name in cluster_objects:
            for delete in (rbac.delete_cluster_role_binding, rbac.delete_cluster_role):
                try:
                    delete(name)
                except ApiException as exc:
                    if exc.status != 404:
                        raise
        for target in (ns, loose):
            core.delete_namespace(target)


def _exists(core, ns: str) -> bool:
    try:
        core.read_namespaced_service_account("default", ns)
        return True
    except ApiException as exc:
        if exc.status != 404:
            raise
        return False


@pytest.fixture(scope="module")
def stack(airflow_stack_factory, cluster):
    """One api-server (no scheduler: only the api-server's side is probed) with ``[leoflow] runtime =
    kubernetes`` and the api-server's kubeconfig."""
    s = airflow_stack_factory("doctor", executor="LocalExecutor", extra_env={
        "AIRFLOW__LEOFLOW__RUNTIME": "kubernetes",
        "AIRFLOW__LEOFLOW__NAMESPACE": cluster["ns"],
        "AIRFLOW__LEOFLOW__SERVICE_ACCOUNT": TASK_SA,
        "AIRFLOW__LEOFLOW__EXCHANGE_AUDIENCE": AUDIENCE,
        "AIRFLOW__LEOFLOW__IN_CLUSTER": "False",
        "AIRFLOW__LEOFLOW__KUBE_CONFIG": str(cluster["api"]),
    })
    s.migrate()
    s.start(scheduler=False)
    try:
        yield s
    finally:
        s.stop()


def _scheduler_env(stack, cluster) -> dict[str, str]:
    """The scheduler's environment: the stack's, with the scheduler's kubeconfig and an agent image."""
    return {**stack.env(), "AIRFLOW__LEOFLOW__KUBE_CONFIG": str(cluster["scheduler"]),
            "AIRFLOW__LEOFLOW__IMAGE": "leoflow.test/agent:1"}


@pytest.fixture
def doctor(stack, cluster, monkeypatch):
    """``doctor(**changes)``: run the doctor in this process with the scheduler's ``AIRFLOW__…`` settings
    changed by ``changes`` (``AIRFLOW__`` prefix added; each call starts from the good setup again); returns
    ``{name: Finding}``."""
    base = {k: v for k, v in _scheduler_env(stack, cluster).items()
            if k.startswith(("AIRFLOW__LEOFLOW__", "AIRFLOW__API_AUTH__", "AIRFLOW__API__BASE_URL"))}
    changed: set[str] = set()

    def call(api_server_user: str = cluster["api_user"], **changes: str):
        for key in changed - base.keys():
            monkeypatch.delenv(key, raising=False)
        wanted = {**base, **{f"AIRFLOW__{k}": v for k, v in changes.items()}}
        changed.update(wanted)
        for key, value in wanted.items():
            monkeypatch.setenv(key, value)
        found = run(DoctorOptions(api_server_user=api_server_user, timeout=15))
        return {f.name: f for f in found}

    return call


def test_a_good_setup_passes_as_the_cli(stack, cluster):
    """``airflow leoflow doctor --json`` exits 0 and every check is ok, but warm pools (none configured)."""
    env = _scheduler_env(stack, cluster)
    airflow = str(Path(sys.executable).parent / "airflow")
    r = subprocess.run([airflow, "leoflow", "doctor", "--json", "--api-server-user", cluster["api_user"]],
                       env=env, capture_output=True, text=True, timeout=180, cwd=stack.home)
    assert r.returncode == 0, r.stdout + r.stderr
    data = json.loads(r.stdout[r.stdout.index("{"):])
    statuses = {f["name"]: f["status"] for f in data["findings"]}
    assert statuses == {
        "config": "ok", "ladder": "ok", "mint_key": "ok", "audience": "ok", "exchange_url": "ok",
        "scheduler_rbac": "ok", "api_server_rbac": "ok", "task_service_account": "ok", "pull_secrets": "ok",
        "pod_security": "ok", "dry_run_pod": "ok", "finalizers": "ok", "exchange_issuer": "ok", "warm_pools": "skip",
    }, data
    assert data["ok"] is True and data["exit_code"] == 0
    by_name = {f["name"]: f for f in data["findings"]}
    assert by_name["exchange_url"]["detail"].startswith(f"{stack.base_url}/leoflow serves leoflow")
    assert by_name["warm_pools"]["detail"] == "no warm pools configured"
    assert stack.env()["AIRFLOW__API_AUTH__JWT_SECRET"] not in r.stdout + r.stderr


def test_a_missing_rbac_verb_is_named_for_the_scheduler_and_the_api_server(doctor, cluster):
    found = doctor(LEOFLOW__KUBE_CONFIG=str(cluster["no_patch"]))
    rbac = found["scheduler_rbac"]
    assert rbac.status is Status.FAIL
    assert rbac.detail == f"the scheduler's identity may not patch pods in namespace {cluster['ns']}"
    assert rbac.fix.startswith("grant patch pods to the scheduler's identity")
    # this identity may not ask SubjectAccessReview nor read the namespace: said, never passed silently
    assert found["api_server_rbac"].status is Status.WARN
    assert "may not create subjectaccessreviews" in found["api_server_rbac"].detail
    assert found["pod_security"].status is Status.WARN and "cannot check" in found["pod_security"].detail

    other = doctor(api_server_user=f"system:serviceaccount:{cluster['ns']}:{TASK_SA}")["api_server_rbac"]
    assert other.status is Status.FAIL
    assert "may not create tokenreviews.authentication.k8s.io, get pods, get pods/log" in other.detail


def test_a_missing_service_account_is_named_with_its_fix(doctor, cluster):
    found = doctor(LEOFLOW__SERVICE_ACCOUNT="no-such-sa")
    sa = found["task_service_account"]
    assert sa.status is Status.FAIL and sa.detail == f"ServiceAccount {cluster['ns']}/no-such-sa does not exist: " \
                                                     "no task pod can be created"
    assert f"kubectl -n {cluster['ns']} create serviceaccount no-such-sa" in sa.fix


def test_an_api_server_with_a_different_mint_key_is_named(doctor, stack):
    found = doctor(API_AUTH__JWT_SECRET="another-secret-" + "x" * 80)
    key = found["mint_key"]
    assert key.status is Status.FAIL
    assert key.detail.startswith(f"api-server at {stack.base_url}/leoflow verifies with a different key")
    assert "[api_auth] jwt_secret" in key.fix
    assert found["exchange_url"].status is Status.OK


def test_a_wrong_audience_is_named_for_tokens_and_for_the_exchange(doctor):
    execution = doctor(EXECUTION_API__JWT_AUDIENCE="urn:somewhere-else")
    assert execution["mint_key"].status is Status.OK
    aud = execution["audience"]
    assert aud.status is Status.FAIL and aud.detail.startswith("wrong audience")
    assert "urn:airflow.apache.org:task" in aud.detail and "urn:somewhere-else" in aud.detail
    assert "[execution_api] jwt_audience" in aud.fix

    exchange = doctor(LEOFLOW__EXCHANGE_AUDIENCE="urn:not-the-api-servers")["audience"]
    assert exchange.status is Status.FAIL and exchange.detail.startswith("wrong audience")
    assert f"api-server {AUDIENCE!r}, scheduler 'urn:not-the-api-servers'" in exchange.detail


def test_an_unreachable_exchange_url_is_named(doctor):
    url = f"http://127.0.0.1:{free_port()}/leoflow"
    found = doctor(LEOFLOW__EXCHANGE_URL=url)
    f = found["exchange_url"]
    assert f.status is Status.FAIL and f.detail.startswith(f"{url} is unreachable")
    assert f.fix.startswith("set [leoflow] exchange_url to the URL")
    assert found["mint_key"].status is Status.SKIP


def test_a_namespace_without_restricted_pod_security_is_named(doctor, cluster):
    found = doctor(LEOFLOW__NAMESPACE=cluster["loose"])
    psa = found["pod_security"]
    assert psa.status is Status.WARN
    assert psa.detail == f"namespace {cluster['loose']} enforces Pod Security baseline, below restricted"
    assert psa.fix.startswith(f"kubectl label namespace {cluster['loose']} "
                              "pod-security.kubernetes.io/enforce=restricted")
    assert found["dry_run_pod"].status is Status.OK  # leoflow's pods meet restricted, so baseline admits them


def test_exchange_issuers_are_compared_with_the_issuer_the_cluster_publishes(doctor):
    """Issue 33 item 4: ``[leoflow] exchange_issuers`` without the issuer the kube-apiserver publishes (its OIDC
    discovery document, read as the scheduler's ServiceAccount) would refuse every exchange: a failure naming
    both; listing it (beside an old one, as in a rotation) passes; unset, the cluster is not asked."""
    assert doctor()["exchange_issuer"].status is Status.OK
    wrong = doctor(LEOFLOW__EXCHANGE_ISSUERS="https://other-cluster.example")["exchange_issuer"]
    assert wrong.status is Status.FAIL, wrong
    assert CLUSTER_ISSUER in wrong.detail and "https://other-cluster.example" in wrong.detail
    good = doctor(LEOFLOW__EXCHANGE_ISSUERS=f"https://old.example,{CLUSTER_ISSUER}")["exchange_issuer"]
    assert (good.status, good.detail) == (Status.OK, f"the cluster's issuer {CLUSTER_ISSUER} is in [leoflow] "
                                                     "exchange_issuers")


def test_on_lite_the_kubernetes_checks_are_skipped_by_name_and_the_rest_run(doctor, stack):
    found = doctor(LEOFLOW__RUNTIME="lite")
    for name in ("scheduler_rbac", "api_server_rbac", "task_service_account", "pull_secrets", "pod_security",
                 "dry_run_pod", "finalizers", "exchange_issuer"):
        assert found[name].status is Status.SKIP and found[name].detail == "runtime = lite: no Kubernetes"
    assert {n: found[n].status for n in ("config", "ladder", "mint_key", "audience", "exchange_url")} == dict.fromkeys(
        ("config", "ladder", "mint_key", "audience", "exchange_url"), Status.OK)
    assert found["exchange_url"].detail.startswith(f"{stack.base_url}/leoflow serves leoflow")  # [api] base_url


def test_a_leftover_finalizer_is_named_in_the_cli_table(stack, cluster, core):
    """A deleting task pod that still holds leoflow's finalizer and whose attempt has no ledger row: the table
    (no ``--json``) warns naming it, and the doctor still exits 0 (a warning)."""
    from leoflow_airflow.runtime.kubernetes.pod import PodAttempt, build_pod
    from leoflow_airflow.settings import load_kubernetes

    from .conftest import release_leoflow_pods

    env = _scheduler_env(stack, cluster)
    kube = load_kubernetes(lambda s, k, f: env.get(f"AIRFLOW__{s.upper()}__{k.upper()}", f))
    pod = build_pod(PodAttempt(ti_id=str(uuid.uuid4()), try_number=1, attempt_epoch=1, dag_id="d", task_id="t",
                               run_id="r"), kube)
    name = core.create_namespaced_pod(cluster["ns"], pod).metadata.name
    try:
        core.delete_namespaced_pod(name, cluster["ns"])
        wait_for(lambda: core.read_namespaced_pod(name, cluster["ns"]).metadata.deletion_timestamp, 30,
                 what="the pod deleting")
        r = subprocess.run([str(Path(sys.executable).parent / "airflow"), "leoflow", "doctor"], env=env,
                           capture_output=True, text=True, timeout=180, cwd=stack.home)
        assert r.returncode == 0, r.stdout + r.stderr
        line = next(ln for ln in r.stdout.splitlines() if ln.startswith("WARN    finalizers"))
        assert f"1 pod(s) in {cluster['ns']} hold leoflow's finalizer though their attempt is settled: " \
               f"{name} (no ledger row)" in line
        assert "fix: a running leoflow scheduler releases them" in r.stdout
        assert r.stdout.rstrip().endswith("exit 0")
    finally:
        release_leoflow_pods(core, cluster["ns"])
