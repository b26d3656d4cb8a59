"""``airflow leoflow check``'s Kubernetes part against an API server that does not answer (no control plane
needed: a kubeconfig naming the discard port). What it checks against a real one is in
tests/integration/test_kube_runtime_e2e.py and tests/k8s/test_kube_access.py."""

from __future__ import annotations

from types import SimpleNamespace

from leoflow_airflow import cli
from leoflow_airflow.runtime.kubernetes import access

KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:9", insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: not-a-real-token}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"""


def test_an_api_server_that_does_not_answer_fails_the_check_and_says_so(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("AIRFLOW__API_AUTH__JWT_SECRET", "a-shared-secret-for-the-test")
    path = tmp_path / "kubeconfig"
    path.write_text(KUBECONFIG)
    kube = SimpleNamespace(namespace="tasks", image="registry/agent:1", service_account="leoflow-task",
                           exchange_url="http://airflow:8080/leoflow", exchange_audience="urn:leoflow:exchange",
                           in_cluster=False, kube_config=str(path))
    assert cli._check_kubernetes(SimpleNamespace(kubernetes=kube)) is False
    out, err = capsys.readouterr()
    assert "namespace tasks, image registry/agent:1, service account leoflow-task" in out
    assert "exchange URL http://airflow:8080/leoflow/v1/exchange, audience urn:leoflow:exchange" in out
    for rule in access.SCHEDULER_RULES:
        assert f"??   {str(rule):<22} {rule.why}\n" in out
    n = len(access.SCHEDULER_RULES)
    assert f"FAIL could not ask the API server https://127.0.0.1:9 about {n} of {n} permissions" in err
    assert "lacks" not in err  # nothing was denied: nothing was asked


def test_a_kubeconfig_that_cannot_be_loaded_fails_the_check_naming_it(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("AIRFLOW__API_AUTH__JWT_SECRET", "a-shared-secret-for-the-test")
    kube = SimpleNamespace(namespace="tasks", image="i", service_account="sa", exchange_url="http://a/leoflow",
                           exchange_audience="aud", in_cluster=False, kube_config=str(tmp_path / "missing"))
    assert cli._check_kubernetes(SimpleNamespace(kubernetes=kube)) is False
    assert f"FAIL kubernetes API access (kubeconfig {tmp_path / 'missing'})" in capsys.readouterr().err
