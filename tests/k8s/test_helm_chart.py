"""The Helm chart ``helm/leoflow`` against helm and the real kube-apiserver (issue 12 item 1, "Acceptance"):
``helm lint --strict`` and ``helm template`` pass (always with ``--kube-version``); the rendered objects are
admitted with ``dryRun=All`` (nothing persisted) and then created for real; a SubjectAccessReview matrix shows the
scheduler's and the api-server's ServiceAccounts may do exactly what leoflow needs
(``access.SCHEDULER_RULES``/``EXCHANGE_RULES``) and none of a list of things they must not; the pod leoflow's own
builder makes from the chart's values is admitted in the chart's restricted namespace and non-compliant variants
are refused with 403 ``violates PodSecurity``; the process the chart's task pod runs is the one the agent image
(``docker/Dockerfile``) declares.

helm comes from ``scripts/k8senv build`` (the Go module proxy); without it these tests skip, or fail under
``K8SENV_REQUIRED=1``. One control plane for the session, one rendered install per module.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
import uuid
from pathlib import Path

import pytest
import yaml
from kubernetes import client, dynamic
from kubernetes.client.rest import ApiException

from devtools import k8senv
from devtools.dockerfile import container_argv, image_process
from leoflow_airflow import settings as leoflow_settings
from leoflow_airflow.errors import PodRefused
from leoflow_airflow.runtime.kubernetes import access
from leoflow_airflow.runtime.kubernetes.access import Rule
from leoflow_airflow.runtime.kubernetes.pod import AGENT_ARGS, PodAttempt, build_pod
from leoflow_airflow.runtime.kubernetes.template import load_pod_template, parse_pod_template

from .conftest import release_leoflow_pods, wait_for

pytestmark = pytest.mark.k8s

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "leoflow"
RELEASE = "leoflow"


# --------------------------------------------------------------------------------------------------
# helm


class Helm:
    """The built helm binary, run with private config/cache/data directories and always ``--kube-version``."""

    def __init__(self, path: Path, home: Path):
        self.path = path
        self.env = {**os.environ, **{v: str(home / v.lower()) for v in
                                     ("HELM_CONFIG_HOME", "HELM_CACHE_HOME", "HELM_DATA_HOME")}}

    def __call__(self, *args: str) -> subprocess.CompletedProcess:
        """Run ``helm ARGS --kube-version <the control plane's>``; never raises on its exit status."""
        return subprocess.run([str(self.path), *args, "--kube-version", k8senv.HELM_KUBE_VERSION],
                              capture_output=True, text=True, timeout=120, env=self.env)


HELM_BUILD_WAIT = 1800.0
"""Seconds the ``helm`` fixture waits for ``run-tests``' helm build to end (a cold build took about 5 minutes)."""


@pytest.fixture(scope="module")
def helm(tmp_path_factory) -> Helm:
    """helm as ``scripts/k8senv build`` built it; skips, or fails under K8SENV_REQUIRED=1, when it is not built.

    ``LEOFLOW_HELM_BUILD_RC`` names the file ``scripts/run-tests all`` writes when its helm build (after the control
    plane's, beside the tests) ends: the fixture waits for it first, up to :data:`HELM_BUILD_WAIT` seconds."""
    rc_file = os.environ.get("LEOFLOW_HELM_BUILD_RC")
    if rc_file:
        deadline = time.monotonic() + HELM_BUILD_WAIT
        while not Path(rc_file).exists() and time.monotonic() < deadline:
            time.sleep(1.0)
    path = k8senv.helm()
    if path is None:
        msg = "helm is not built; run `scripts/k8senv build`"
        if os.environ.get("K8SENV_REQUIRED") == "1":
            pytest.fail(msg)
        pytest.skip(msg)
    return Helm(path, tmp_path_factory.mktemp("helm-home"))


def render(helm: Helm, values: dict, tmp: Path, *, namespace: str) -> list[dict]:
    """``helm template`` the chart with ``values`` as release RELEASE in ``namespace``: the rendered objects."""
    path = tmp / f"values-{uuid.uuid4().hex[:6]}.yaml"
    path.write_text(yaml.safe_dump(values))
    r = helm("template", RELEASE, str(CHART), "--namespace", namespace, "-f", str(path))
    assert r.returncode == 0, f"helm template failed:\n{r.stderr}"
    return [d for d in yaml.safe_load_all(r.stdout) if d]


def by_kind(objects: list[dict], kind: str) -> list[dict]:
    return [o for o in objects if o["kind"] == kind]


def test_helm_lint_strict_passes_with_the_default_values_and_with_values_beside_an_official_chart(helm, tmp_path):
    r = helm("lint", "--strict", str(CHART))
    assert r.returncode == 0, f"helm lint --strict:\n{r.stdout}{r.stderr}"
    values = tmp_path / "v.yaml"
    values.write_text(yaml.safe_dump({
        "airflow": {"fullname": "prod-airflow", "namespace": "data"},
        "taskNamespace": {"name": "data-tasks", "create": False},
        "image": {"repository": "registry.example/leoflow-agent", "tag": "0.1.0-dags.3"},
        "pod": {"imagePullSecrets": ["regcred"], "resources": {"requests": {"cpu": "100m"}},
                "env": [{"name": "TZ", "value": "UTC"}]},
        "leoflow": {"config": {"credential_ceiling_seconds": 86400, "in_cluster": True}}}))
    r = helm("lint", "--strict", str(CHART), "-f", str(values))
    assert r.returncode == 0, f"helm lint --strict -f:\n{r.stdout}{r.stderr}"


@pytest.mark.parametrize("setting, error", [
    ("pod.runAsUser=0", "at '/pod/runAsUser': minimum: got 0"),
    ("leoflow.config.namespace=elsewhere", "invalid propertyName 'namespace'"),
    ("taskNamespace.name=Not_A_Label", "at '/taskNamespace/name': 'Not_A_Label' does not match"),
    ("rbac.secrets=true", "additional properties 'rbac' not allowed"),
    ("taskNamespace.podSecurityVersion=latest", "at '/taskNamespace/podSecurityVersion': 'latest' does not match"),
])
def test_values_the_schema_refuses_fail_the_render_naming_the_value(helm, setting, error):
    r = helm("template", RELEASE, str(CHART), "--set", setting)
    assert r.returncode != 0, f"--set {setting} was accepted"
    assert "values don't meet the specifications of the schema" in r.stderr and error in r.stderr, r.stderr


def test_the_task_namespaces_pod_security_version_is_pinned_and_a_value(helm, tmp_path):
    """k8s review §16c: ``enforce-version: latest`` would let a Kubernetes upgrade change admission under running
    pools; the chart pins the version (default the cluster's v1.35) and lets the operator move it."""
    [ns] = by_kind(render(helm, {}, tmp_path, namespace="data"), "Namespace")
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce-version"] == "v1.35"
    [ns] = by_kind(render(helm, {"taskNamespace": {"name": "t", "create": True, "podSecurityVersion": "v1.34"}},
                          tmp_path, namespace="data"), "Namespace")
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce-version"] == "v1.34"


def test_an_existing_task_namespace_and_service_account_are_used_not_rendered(helm, tmp_path):
    objects = render(helm, {"taskNamespace": {"name": "team-tasks", "create": False},
                            "taskServiceAccount": {"name": "runner", "create": False}}, tmp_path, namespace="data")
    assert not by_kind(objects, "Namespace") and not by_kind(objects, "ServiceAccount")
    assert {o["metadata"]["namespace"] for o in objects if o["kind"] in ("Role", "RoleBinding")} == {"team-tasks"}
    [cm] = by_kind(objects, "ConfigMap")
    assert cm["metadata"]["namespace"] == "data"
    options = yaml.safe_load(cm["data"]["airflow-values.yaml"])["config"]["leoflow"]
    assert (options["namespace"], options["service_account"]) == ("team-tasks", "runner")
    bindings = [o for o in objects if o["kind"] in ("RoleBinding", "ClusterRoleBinding")]
    subjects = {(s["name"], s["namespace"]) for o in bindings for s in o["subjects"]}
    assert subjects == {("airflow-scheduler", "data"), ("airflow-api-server", "data")}


def test_leoflow_options_from_the_values_load_as_leoflow_reads_them(helm, tmp_path):
    config = {"credential_ceiling_seconds": 1000000, "pod_retention_success": 2.5, "in_cluster": False,
              "kube_config": "/etc/kube/config", "kube_api_workers": 8}
    [cm] = by_kind(render(helm, {"leoflow": {"config": config}}, tmp_path, namespace="airflow"), "ConfigMap")
    options = yaml.safe_load(cm["data"]["airflow-values.yaml"])["config"]["leoflow"]
    assert "credential_ceiling_seconds = 1000000" in cm["data"]["leoflow.cfg"].splitlines()
    settings = leoflow_settings.load_kubernetes(lambda section, key, fallback: options.get(key, fallback))
    assert (settings.credential_ceiling_seconds, settings.pod_retention_success, settings.in_cluster,
            settings.kube_config, settings.kube_api_workers) == (1000000, 2.5, False, "/etc/kube/config", 8)


def test_a_credential_in_the_charts_pod_env_is_refused_by_leoflows_builder(helm, tmp_path):
    """The chart passes ``pod.env`` through; the pod builder, which owns the rule, refuses Airflow's secrets."""
    secret = {"name": "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "value": "postgresql://x"}
    objects = render(helm, {"pod": {"env": [secret]}}, tmp_path, namespace="airflow")
    [cm] = by_kind(objects, "ConfigMap")
    template = parse_pod_template(cm["data"]["pod_template_file.yaml"])
    options = yaml.safe_load(cm["data"]["airflow-values.yaml"])["config"]["leoflow"]
    settings = leoflow_settings.load_kubernetes(lambda section, key, fallback: options.get(key, fallback))
    with pytest.raises(PodRefused, match="AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"):
        build_pod(_attempt(), settings, template=template)


# --------------------------------------------------------------------------------------------------
# one install, beside an "official chart" namespace with its two ServiceAccounts


class Install:
    """One rendered install: the official chart's namespace and ServiceAccounts (what that chart would have
    made), the chart's values and objects, and the task namespace."""

    def __init__(self, airflow_ns: str, task_ns: str, values: dict, objects: list[dict]):
        self.airflow_ns, self.task_ns, self.values, self.objects = airflow_ns, task_ns, values, objects
        self.scheduler = f"system:serviceaccount:{airflow_ns}:prod-airflow-scheduler"
        self.api_server = f"system:serviceaccount:{airflow_ns}:prod-airflow-api-server"
        self.task_sa = f"system:serviceaccount:{task_ns}:leoflow-task"

    def config_map(self) -> dict:
        [cm] = by_kind(self.objects, "ConfigMap")
        return cm["data"]


def _apply(dyn: dynamic.DynamicClient, obj: dict, *, dry_run: bool) -> dict:
    resource = dyn.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
    kw = {"dry_run": "All"} if dry_run else {}
    return resource.create(body=obj, namespace=obj["metadata"].get("namespace"), **kw).to_dict()


def _exists(dyn: dynamic.DynamicClient, obj: dict) -> bool:
    resource = dyn.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
    try:
        resource.get(name=obj["metadata"]["name"], namespace=obj["metadata"].get("namespace"))
        return True
    except ApiException as e:
        if e.status == 404:
            return False
        raise


@pytest.fixture(scope="module")
def install(helm, api, core, tmp_path_factory):
    """Render the chart for a fresh official-chart namespace and task namespace, then apply every object in
    order, each first with ``dryRun=All`` (asserting nothing was persisted) and then for real; remove it all at
    the end (cluster-scoped objects included, leoflow's pod finalizers released)."""
    suffix = uuid.uuid4().hex[:6]
    airflow_ns, task_ns = f"airflow-{suffix}", f"airflow-tasks-{suffix}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=airflow_ns)))
    for sa in ("prod-airflow-scheduler", "prod-airflow-api-server"):
        core.create_namespaced_service_account(airflow_ns, client.V1ServiceAccount(
            metadata=client.V1ObjectMeta(name=sa)))
    values = {"airflow": {"fullname": "prod-airflow"}, "taskNamespace": {"name": task_ns, "create": True},
              "image": {"repository": "registry.example/leoflow-agent", "tag": "0.1.0"},
              "pod": {"resources": {"requests": {"cpu": "50m", "memory": "64Mi"}},
                      "env": [{"name": "TZ", "value": "UTC"}, {"name": "BATCH", "value": 1000000}]}}
    objects = render(helm, values, tmp_path_factory.mktemp("chart"), namespace=airflow_ns)
    dyn = dynamic.DynamicClient(api)
    created: list[dict] = []
    try:
        for obj in objects:
            answer = _apply(dyn, obj, dry_run=True)
            assert answer["metadata"]["name"] == obj["metadata"]["name"]
            assert not _exists(dyn, obj), f"dryRun=All persisted {obj['kind']} {obj['metadata']['name']}"
            _apply(dyn, obj, dry_run=False)
            created.append(obj)
        yield Install(airflow_ns, task_ns, values, objects)
    finally:
        for obj in reversed(created):
            if "namespace" not in obj["metadata"] and obj["kind"] != "Namespace":
                dyn.resources.get(api_version=obj["apiVersion"], kind=obj["kind"]).delete(
                    name=obj["metadata"]["name"])
        for ns in (task_ns, airflow_ns):
            try:
                core.delete_namespace(ns)
            except ApiException as e:
                if e.status != 404:
                    raise
        release_leoflow_pods(core, task_ns)


def test_the_rendered_objects_are_what_the_chart_promises(install, core):
    kinds = sorted((o["kind"], o["metadata"]["name"]) for o in install.objects)
    assert kinds == sorted([
        ("Namespace", install.task_ns), ("ServiceAccount", "leoflow-task"), ("ConfigMap", "leoflow"),
        ("Role", "leoflow-scheduler"), ("RoleBinding", "leoflow-scheduler"),
        ("Role", "leoflow-api-server"), ("RoleBinding", "leoflow-api-server"),
        ("ClusterRole", f"leoflow-{install.airflow_ns}-tokenreview"),
        ("ClusterRoleBinding", f"leoflow-{install.airflow_ns}-tokenreview"),
        ("ValidatingAdmissionPolicy", f"leoflow-{install.airflow_ns}-task-namespace"),
        ("ValidatingAdmissionPolicyBinding", f"leoflow-{install.airflow_ns}-task-namespace")])
    assert not any(o["kind"] == "Secret" for o in install.objects)
    ns = core.read_namespace(install.task_ns)
    assert ns.metadata.labels["pod-security.kubernetes.io/enforce"] == "restricted"
    assert ns.metadata.labels["pod-security.kubernetes.io/enforce-version"] == "v1.35"
    sa = core.read_namespaced_service_account("leoflow-task", install.task_ns)
    assert sa.automount_service_account_token is False
    assert core.read_namespaced_config_map("leoflow", install.airflow_ns).data == install.config_map()


def _granted(objects: list[dict]) -> set[tuple[str, str, str, str]]:
    """(kind of role, group, resource[/subresource], verb) for every rule of the chart's Roles and ClusterRoles."""
    out = set()
    for o in objects:
        if o["kind"] in ("Role", "ClusterRole"):
            for rule in o["rules"]:
                for g in rule.get("apiGroups", []):
                    for r in rule["resources"]:
                        for v in rule["verbs"]:
                            out.add((o["metadata"]["name"], g, r, v))
    return out


def test_the_roles_grant_exactly_the_rules_leoflow_names(install):
    granted = _granted(install.objects)
    want = {("leoflow-scheduler", r.group, r.resource + (f"/{r.subresource}" if r.subresource else ""), r.verb)
            for r in access.SCHEDULER_RULES}
    want |= {((f"leoflow-{install.airflow_ns}-tokenreview" if r.group else "leoflow-api-server"), r.group,
              r.resource + (f"/{r.subresource}" if r.subresource else ""), r.verb) for r in access.EXCHANGE_RULES}
    assert granted == want
    assert all(not o.get("aggregationRule") and all("resourceNames" not in r and "*" not in r["verbs"]
                                                     for r in o.get("rules", []))
               for o in install.objects if o["kind"] in ("Role", "ClusterRole"))


def _allowed(api: client.ApiClient, user: str, rule: Rule, namespace: str) -> bool:
    """SubjectAccessReview for ``user`` (a ServiceAccount, with the groups its token carries) on ``rule``."""
    sa_ns = user.split(":")[2]
    review = client.AuthorizationV1Api(api).create_subject_access_review(client.V1SubjectAccessReview(
        spec=client.V1SubjectAccessReviewSpec(
            user=user, groups=["system:serviceaccounts", f"system:serviceaccounts:{sa_ns}", "system:authenticated"],
            resource_attributes=client.V1ResourceAttributes(
                namespace=namespace, verb=rule.verb, resource=rule.resource, group=rule.group,
                subresource=rule.subresource or None))))
    return bool(review.status.allowed)


def _denied_matrix(install: Install) -> list[tuple[str, Rule, str]]:
    """(who, rule, namespace) the chart must not grant; namespace "" is cluster-wide."""
    task, other = install.task_ns, install.airflow_ns
    everyone = [
        (Rule("get", "secrets", ""), task), (Rule("list", "secrets", ""), task), (Rule("watch", "secrets", ""), task),
        (Rule("get", "secrets", ""), other),
        (Rule("create", "pods", "", subresource="exec"), task), (Rule("get", "pods", "", subresource="exec"), task),
        (Rule("create", "pods", "", subresource="attach"), task),
        (Rule("create", "pods", "", subresource="portforward"), task),
        (Rule("update", "pods", ""), task), (Rule("deletecollection", "pods", ""), task),
        (Rule("list", "pods", ""), ""), (Rule("get", "pods", ""), ""), (Rule("get", "pods", ""), "kube-system"),
        (Rule("create", "pods", ""), other), (Rule("list", "pods", ""), other), (Rule("delete", "pods", ""), other),
        # create/delete configmaps in the task namespace are the warm pools' anchors (access.SCHEDULER_RULES)
        (Rule("delete", "configmaps", ""), other), (Rule("create", "configmaps", ""), other),
        (Rule("update", "configmaps", ""), task), (Rule("update", "configmaps", ""), other),
        (Rule("watch", "configmaps", ""), task),  # nothing watches the anchors (k8s review §16c)
        (Rule("create", "serviceaccounts", "", subresource="token"), task),
        (Rule("update", "serviceaccounts", ""), task), (Rule("create", "serviceaccounts", ""), task),
        (Rule("create", "roles", "", group="rbac.authorization.k8s.io"), task),
        (Rule("create", "rolebindings", "", group="rbac.authorization.k8s.io"), task),
        (Rule("escalate", "roles", "", group="rbac.authorization.k8s.io"), task),
        (Rule("patch", "namespaces", ""), ""), (Rule("delete", "namespaces", ""), ""),
        (Rule("create", "subjectaccessreviews", "", group="authorization.k8s.io"), ""),
        (Rule("impersonate", "serviceaccounts", ""), task),
    ]
    scheduler_only = [(Rule("create", "tokenreviews", "", group="authentication.k8s.io"), "")]
    api_server_only = [(Rule("create", "pods", ""), task), (Rule("list", "pods", ""), task),
                       (Rule("watch", "pods", ""), task), (Rule("delete", "pods", ""), task),
                       (Rule("patch", "pods", ""), task), (Rule("get", "serviceaccounts", ""), task)]
    task_sa = [(Rule("get", "pods", ""), task), (Rule("create", "tokenreviews", "", group="authentication.k8s.io"), ""),
               (Rule("get", "serviceaccounts", ""), task)]
    return ([(install.scheduler, r, ns) for r, ns in everyone + scheduler_only]
            + [(install.api_server, r, ns) for r, ns in everyone + api_server_only]
            + [(install.task_sa, r, ns) for r, ns in everyone + task_sa])


def test_each_service_account_may_do_what_leoflow_needs_and_nothing_on_the_deny_list(install, api):
    need = [(install.scheduler, r, install.task_ns) for r in access.SCHEDULER_RULES]
    need += [(install.api_server, r, "" if r.group == "authentication.k8s.io" else install.task_ns)
             for r in access.EXCHANGE_RULES]
    wait_for(lambda: _allowed(api, install.scheduler, access.SCHEDULER_RULES[0], install.task_ns), 15,
             what="the RoleBindings to take effect")
    missing = [(who, str(r), ns) for who, r, ns in need if not _allowed(api, who, r, ns)]
    assert not missing, f"not allowed: {missing}"
    granted = [(who, str(r), ns or "<cluster>") for who, r, ns in _denied_matrix(install) if _allowed(api, who, r, ns)]
    assert not granted, f"allowed but must not be: {granted}"


def _client_as(k8s_env, core: client.CoreV1Api, user: str) -> client.ApiClient:
    """An ApiClient authenticated with a fresh TokenRequest token of ServiceAccount ``user``."""
    _, _, ns, name = user.split(":")
    token = core.create_namespaced_service_account_token(name, ns, client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=600))).status.token
    cfg = client.Configuration()
    cfg.host, cfg.ssl_ca_cert = k8s_env.server, k8s_env.raw["ca"]
    cfg.api_key = {"authorization": f"Bearer {token}"}
    return client.ApiClient(cfg)


def test_leoflow_check_passes_as_the_schedulers_real_identity(install, k8s_env, core):
    """``airflow leoflow check``'s own review (SelfSubjectAccessReview per rule), made with a real token of the
    scheduler's ServiceAccount: the subjects the chart binds are the identities the pods really have."""
    with _client_as(k8s_env, core, install.scheduler) as as_scheduler:
        results = access.review_access(as_scheduler, install.task_ns)
    assert access.denied(results) == [], access.denied(results)
    with _client_as(k8s_env, core, install.api_server) as as_api_server:
        results = access.review_access(as_api_server, install.task_ns, access.EXCHANGE_RULES)
        assert access.denied(results) == [], access.denied(results)
        assert access.denied(access.review_access(as_api_server, install.task_ns, access.SCHEDULER_RULES[:1])) != []


# --------------------------------------------------------------------------------------------------
# the task pod, built by leoflow from the chart's values


def _settings_and_template(install: Install, tmp_path: Path):
    """The ``[leoflow]`` options the chart renders for the official chart (``airflow-values.yaml``
    ``config.leoflow``), loaded by leoflow's own settings loader, and its pod template; the template is read from a
    local copy (in a cluster it is the ConfigMap mounted at ``pod_template_file``)."""
    data = install.config_map()
    wiring = yaml.safe_load(data["airflow-values.yaml"])
    options = dict(wiring["config"]["leoflow"])
    mounted = options["pod_template_file"]
    local = tmp_path / Path(mounted).name
    local.write_text(data["pod_template_file.yaml"])
    options["pod_template_file"] = str(local)
    settings = leoflow_settings.load_kubernetes(lambda section, key, fallback: options.get(key, fallback))
    return wiring, mounted, settings, load_pod_template(settings.pod_template_file)


def test_the_official_charts_values_wire_leoflow_in(install, tmp_path):
    wiring, mounted, settings, _ = _settings_and_template(install, tmp_path)
    assert wiring["executor"] == "leoflow_airflow.executor.LeoflowExecutor"
    for component in ("scheduler", "apiServer"):
        [volume] = wiring[component]["extraVolumes"]
        [mount] = wiring[component]["extraVolumeMounts"]
        assert volume == {"name": "leoflow", "configMap": {"name": "leoflow"}}
        assert mount["name"] == "leoflow" and mount["readOnly"] is True
        assert mounted == f"{mount['mountPath']}/pod_template_file.yaml"
    assert (settings.namespace, settings.service_account) == (install.task_ns, "leoflow-task")
    assert settings.image == "registry.example/leoflow-agent:0.1.0"
    service = f"http://prod-airflow-api-server.{install.airflow_ns}.svc.cluster.local:8080"
    assert settings.exchange_url == f"{service}/leoflow"
    cfg = install.config_map()["leoflow.cfg"].splitlines()
    assert cfg[0] == "[leoflow]" and f"namespace = {install.task_ns}" in cfg and "runtime = kubernetes" in cfg
    known = {o.name for o in leoflow_settings.OPTIONS}
    assert set(wiring["config"]["leoflow"]) <= known


def _attempt() -> PodAttempt:
    return PodAttempt(ti_id=str(uuid.uuid4()), try_number=1, attempt_epoch=1, dag_id="etl", task_id="load",
                      run_id="manual__2026-01-01T00:00:00+00:00")


def _as_scheduler(install: Install, k8s_env, core: client.CoreV1Api, pod: client.V1Pod) -> client.V1Pod:
    """Create ``pod`` in the task namespace as the scheduler's ServiceAccount (the chart's admission policy lets
    only that identity create leoflow's pods), once the policy and the RoleBinding are in force."""
    with _client_as(k8s_env, core, install.scheduler) as api:
        as_scheduler = client.CoreV1Api(api)
        return wait_for(lambda: _created_or_none(as_scheduler, install.task_ns, pod), 15,
                        what="the scheduler's RoleBinding to take effect")


def _created_or_none(core: client.CoreV1Api, ns: str, pod: client.V1Pod) -> client.V1Pod | None:
    try:
        return core.create_namespaced_pod(ns, pod)
    except ApiException as e:
        if e.status == 403 and "is forbidden: User" in (e.body or ""):
            return None  # RBAC not in force yet
        raise


def test_only_the_scheduler_may_create_leoflows_pods_in_the_task_namespace(install, k8s_env, core, tmp_path):
    """k8s review §8: whoever else can create pods there (a KubernetesPodOperator's identity, CI, a namespace
    admin) cannot pre-create an attempt's pod or pose as a warm worker: the chart's ValidatingAdmissionPolicy
    refuses any pod that carries leoflow's labels or annotations or runs as the task ServiceAccount, unless the
    scheduler creates it. A pod of another kind is not judged."""
    _, _, settings, template = _settings_and_template(install, tmp_path)
    pod = build_pod(_attempt(), settings, template=template)
    refused = wait_for(lambda: _refused_by_policy(core, install.task_ns, pod), 20,
                       what="the admission policy to take effect")
    assert "only the scheduler may create pods with leoflow labels" in refused, refused
    disguised = client.V1Pod(metadata=client.V1ObjectMeta(name="not-leoflow", labels={"leoflow.io/warm": "true"}),
                             spec=pod.spec)
    disguised.spec.service_account_name = "default"
    assert _refused_by_policy(core, install.task_ns, disguised)
    assert _as_scheduler(install, k8s_env, core, pod).metadata.uid
    other = client.V1Pod(metadata=client.V1ObjectMeta(name="kpo-pod"), spec=client.V1PodSpec(
        automount_service_account_token=False, security_context=pod.spec.security_context,
        containers=[client.V1Container(name="c", image="busybox",
                                       security_context=pod.spec.containers[0].security_context)]))
    assert core.create_namespaced_pod(install.task_ns, other, dry_run="All").metadata.name == "kpo-pod"


def test_only_a_kubelet_may_request_tokens_of_the_task_service_account(install, core):
    """k8s review §8, the second route: a token of the task ServiceAccount with the exchange's audience, bound to a
    victim pod, would let its holder exchange first. Only a kubelet (system:node:*) may request one there."""
    request = client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(
        audiences=["leoflow"], expiration_seconds=600))
    with pytest.raises(ApiException) as err:
        wait_for(lambda: core.create_namespaced_service_account_token("leoflow-task", install.task_ns, request)
                 and None, 20, what="the admission policy to refuse the token request")
    assert err.value.status in (403, 422) and "only a kubelet may request tokens" in err.value.body, err.value.body


def _refused_by_policy(core: client.CoreV1Api, ns: str, pod: client.V1Pod) -> str | None:
    """The refusal's body when the admission policy refuses ``pod`` (a dry run, nothing persisted), else None
    (also None while the policy is not in force yet: the dry run then passes)."""
    try:
        core.create_namespaced_pod(ns, pod, dry_run="All")
    except ApiException as e:
        if e.status == 403 and "ValidatingAdmissionPolicy" in (e.body or ""):
            return e.body
        raise
    return None


def test_the_pod_leoflow_builds_from_the_chart_is_admitted_and_runs_the_images_agent(install, k8s_env, core,
                                                                                    tmp_path):
    _, _, settings, template = _settings_and_template(install, tmp_path)
    pod = build_pod(_attempt(), settings, template=template)
    created = _as_scheduler(install, k8s_env, core, pod)
    assert created.metadata.uid and created.spec.service_account_name == "leoflow-task"
    assert created.spec.security_context.run_as_user == 50000
    base = created.spec.containers[0]
    assert base.resources.requests == {"cpu": "50m", "memory": "64Mi"}
    env = {e.name: e.value for e in base.env}
    assert env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"] == \
        f"http://prod-airflow-api-server.{install.airflow_ns}.svc.cluster.local:8080/execution/"
    assert (env["TZ"], env["BATCH"]) == ("UTC", "1000000")
    image = image_process(ROOT / "docker" / "Dockerfile")
    assert base.command is None, "the chart's template must leave the command to the image's entrypoint"
    assert container_argv(image, base.command, base.args) == (*image.entrypoint, *AGENT_ARGS)
    assert container_argv(image, base.command, base.args) == container_argv(image, None, None)


def _with_template_change(install: Install, tmp_path: Path, change) -> client.V1Pod:
    """The chart's pod template changed by ``change(dict)``, then built by leoflow's builder."""
    _, _, settings, _ = _settings_and_template(install, tmp_path)
    data = yaml.safe_load(install.config_map()["pod_template_file.yaml"])
    change(data)
    return build_pod(_attempt(), settings, template=parse_pod_template(yaml.safe_dump(data)))


def _root(data: dict) -> None:
    data["spec"]["securityContext"]["runAsUser"] = 0


def _host_path(data: dict) -> None:
    data["spec"]["volumes"] = [{"name": "host", "hostPath": {"path": "/var/run"}}]
    data["spec"]["containers"][0]["volumeMounts"] = [{"name": "host", "mountPath": "/host"}]


@pytest.mark.parametrize("variant", ["runAsUser 0", "hostPath", "privileged"])
def test_a_non_compliant_pod_is_refused_in_the_charts_namespace(install, core, tmp_path, variant):
    if variant == "privileged":  # the builder pins privileged: false, so only a pod changed after it can be
        pod = _with_template_change(install, tmp_path, lambda d: None)
        pod.spec.containers[0].security_context.privileged = True
        pod.spec.containers[0].security_context.allow_privilege_escalation = True
    else:
        pod = _with_template_change(install, tmp_path, _root if variant == "runAsUser 0" else _host_path)
    with pytest.raises(ApiException) as err:
        core.create_namespaced_pod(install.task_ns, pod)
    assert err.value.status == 403 and "violates PodSecurity" in err.value.body, err.value.body
    word = {"runAsUser 0": "runAsUser=0", "hostPath": "hostPath", "privileged": "privileged"}[variant]
    assert word in err.value.body, err.value.body


def test_helm_is_the_pinned_one_and_is_told_the_control_planes_kubernetes_version(helm, k8s_env):
    gomod = (ROOT / "scripts" / "k8senv.d" / "go" / "helm" / "go.mod").read_text()
    pinned = re.search(r"^\s*helm\.sh/helm/v3 (v\S+)", gomod, re.M).group(1)
    r = subprocess.run([str(helm.path), "version", "--template", "{{.Version}}"], capture_output=True, text=True,
                       timeout=60, env=helm.env)
    assert r.stdout.strip() == pinned == "v3.22.0"
    assert k8s_env.raw["versions"]["kubernetes"] == f"v{k8senv.HELM_KUBE_VERSION}"
