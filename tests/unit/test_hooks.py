"""leoflow's extension hooks (issue 12 item 6) with the real test plugin (``tests/plugin_pkg``, installed into
the venv by ``make venv`` and found through its ``leoflow`` entry point): a pod hook cannot weaken what leoflow
pins; an exchange hook can veto (403, nothing consumed) or annotate, and one that raises makes the exchange
undecided (fail-closed). The exchange here runs over a real ledger with a fake Kubernetes (``test_exchange``'s
``World``); the observe hooks are exercised on a real Airflow in ``tests/integration/test_hooks_metrics.py``.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from kubernetes.client import models as k8s

from leoflow_airflow import hooks, metrics
from leoflow_airflow.errors import PodRefused
from leoflow_airflow.hookspecs import AttemptInfo, hookimpl
from leoflow_airflow.runtime.kubernetes import pod as pods
from leoflow_airflow.runtime.kubernetes.identity import IDENTITY_ANNOTATION, identity_annotation
from leoflow_airflow.runtime.kubernetes.pod import PodAttempt, build_pod
from leoflow_airflow.runtime.kubernetes.runtime import _plugin_hook
from test_exchange import NS, TOKEN, World, refused_reason
from test_kube_pod import attempt, env_of, kube

README = Path(__file__).resolve().parents[2] / "README.md"


@pytest.fixture
def plugin_on(tmp_path, monkeypatch) -> Path:
    """Switch the installed test plugin on (it is inert without ``LEOFLOW_TEST_PLUGIN_DIR``)."""
    monkeypatch.setenv("LEOFLOW_TEST_PLUGIN_DIR", str(tmp_path))
    return tmp_path


@pytest.fixture
def world(tmp_path):
    w = World(tmp_path)
    yield w
    w.engine.dispose()


def test_the_installed_plugin_is_found_through_its_entry_point():
    """``make venv`` installed ``tests/plugin_pkg``; the one plugin manager holds it under its entry point's name
    and it implements every spec."""
    pm = hooks.plugin_manager()
    assert "test_plugin" in dict(pm.list_name_plugin())
    for name in ("leoflow_mutate_pod", "leoflow_exchange", "leoflow_attempt_settled", "leoflow_warm_pool_resized"):
        assert hooks.has_implementations(name), name


# --- leoflow_mutate_pod ------------------------------------------------------------------------------------

def test_a_plugin_changes_the_pod_but_every_pinned_field_comes_back(plugin_on):
    """The plugin's label and annotation stay; what it changed of the pins (ServiceAccount, token automount,
    runAsNonRoot, identity annotation, finalizers, restart policy, the agent's arguments and termination
    message path) is leoflow's again."""
    a = attempt()
    settings = kube()
    pod = build_pod(a, settings, plugin_hook=_plugin_hook())
    meta, spec, agent = pod.metadata, pod.spec, pod.spec.containers[0]
    assert meta.labels["leoflow-test-plugin"] == "mutated"
    assert meta.annotations["leoflow-test-plugin/attempt"] == f"{a.ti_id}/1/1"
    assert meta.annotations[IDENTITY_ANNOTATION] == identity_annotation(a.ref)
    assert meta.finalizers == [pods.OUTCOME_FINALIZER]
    assert spec.service_account_name == settings.service_account and spec.automount_service_account_token is False
    assert spec.restart_policy == "Never" and spec.security_context.run_as_non_root is True
    assert agent.args == list(pods.AGENT_ARGS)
    assert agent.termination_message_path == pods.TERMINATION_MESSAGE_PATH
    assert env_of(agent)[pods.ENV_TOKEN_FILE] == pods.TOKEN_FILE


def test_a_plugin_that_puts_an_airflow_secret_in_the_pod_gets_it_refused(plugin_on, monkeypatch):
    """No pin can mend a secret in the environment: the pod is refused, naming the variable."""
    monkeypatch.setenv("LEOFLOW_TEST_PLUGIN_SECRET", "1")
    with pytest.raises(PodRefused, match="AIRFLOW__CORE__FERNET_KEY"):
        build_pod(attempt(), kube(), plugin_hook=_plugin_hook())


def test_a_pod_hook_that_raises_refuses_the_pod():
    """Fail-closed: a pod policy that could not run never lets its pod through."""

    class Broken:
        @hookimpl
        def leoflow_mutate_pod(self, pod: k8s.V1Pod, attempt: AttemptInfo) -> None:
            raise LookupError("policy store unreachable")

    pm = hooks.plugin_manager()
    pm.register(Broken(), name="broken")
    try:
        with pytest.raises(PodRefused, match="leoflow_mutate_pod.*LookupError: policy store unreachable"):
            build_pod(attempt(), kube(), plugin_hook=_plugin_hook())
    finally:
        pm.unregister(name="broken")


def test_the_plugin_sees_the_attempt_after_airflows_pod_mutation_hook():
    """Order: Airflow's ``pod_mutation_hook`` first, then the plugins (each sees what the one before did)."""
    seen: list[str] = []

    class Watcher:
        @hookimpl
        def leoflow_mutate_pod(self, pod: k8s.V1Pod, attempt: AttemptInfo) -> None:
            seen.append((pod.metadata.labels or {}).get("policy", "-") + f"@{attempt.dag_id}")

    def airflow_hook(pod: k8s.V1Pod) -> None:
        pod.metadata.labels["policy"] = "cluster"

    pm = hooks.plugin_manager()
    pm.register(Watcher(), name="watcher")
    try:
        build_pod(PodAttempt(ti_id=attempt().ti_id, try_number=1, attempt_epoch=1, dag_id="etl", task_id="t",
                             run_id="r"), kube(), mutation_hook=airflow_hook, plugin_hook=_plugin_hook())
    finally:
        pm.unregister(name="watcher")
    assert seen == ["cluster@etl"]


# --- leoflow_exchange --------------------------------------------------------------------------------------

def test_a_plugin_vetoes_an_exchange_and_nothing_is_consumed(world, plugin_on, monkeypatch, caplog):
    """A veto answers 403 (reason ``vetoed``, the plugin's text in the log only) before anything is minted or
    recorded; once the policy allows it, the same token is exchanged."""
    monkeypatch.setenv("LEOFLOW_TEST_PLUGIN_VETO_DAGS", "dag")
    ref, name, _ = world.attempt()
    answer = world.post(b'{"token": "%s"}' % TOKEN.encode())
    assert refused_reason(caplog, answer) == "vetoed"
    assert "plugin test_plugin: the test plugin denies this DAG" in caplog.text
    assert world.store.get(ref).exchanged_at is None
    assert world.ledger.calls == ["current"]  # no record_exchange
    monkeypatch.setenv("LEOFLOW_TEST_PLUGIN_VETO_DAGS", "another_dag")
    answer = world.post(b'{"token": "%s"}' % TOKEN.encode())
    assert answer.status == 200, answer
    assert world.store.get(ref).exchanged_at is not None
    granted = [r.getMessage() for r in caplog.records if "exchanged by pod" in r.getMessage()]
    assert len(granted) == 1 and f"test_plugin='{NS}/{name}'" in granted[0], granted


def test_an_exchange_hook_that_raises_makes_the_exchange_undecided(world, plugin_on, monkeypatch, caplog):
    """Fail-closed but retryable: 503 (reason ``plugin_error``, naming the plugin), nothing minted or recorded."""
    monkeypatch.setenv("LEOFLOW_TEST_PLUGIN_RAISE_DAGS", "dag")
    ref, _, _ = world.attempt()
    answer = world.post(b'{"token": "%s"}' % TOKEN.encode())
    assert answer.status == 503 and "Retry-After" in answer.headers, answer
    assert re.search(r"reason=plugin_error .*RuntimeError: the test plugin's policy back end is down "
                     r"\(in leoflow_exchange of plugin test_plugin\)", caplog.text), caplog.text
    assert world.store.get(ref).exchanged_at is None


def test_the_plugin_is_inert_when_not_switched_on(world):
    """Installed in every test venv, the test plugin changes nothing unless its folder is named."""
    world.attempt()
    assert world.post(b'{"token": "%s"}' % TOKEN.encode()).status == 200
    pod = build_pod(attempt(), kube(), plugin_hook=_plugin_hook())
    assert "leoflow-test-plugin" not in (pod.metadata.labels or {})


# --- observe hooks never raise -----------------------------------------------------------------------------

def test_observe_hooks_swallow_and_log_a_plugins_exception(plugin_on, monkeypatch, caplog):
    """``attempt_settled`` and ``warm_pool_resized`` call the plugin (it writes its line), log its exception
    and return normally."""
    monkeypatch.setenv("LEOFLOW_TEST_PLUGIN_RAISE", "1")
    info = AttemptInfo("0190b6c2-7a1e-7000-8000-00000000abcd", 1, 2, "d", "t", "r", -1, "lite")
    hooks.attempt_settled(info, evidence={"record_state": None}, resolution="infra_redrive", detail="x")
    hooks.warm_pool_resized("lite:file_workers", before=0, after=1)
    assert (plugin_on / "settled.jsonl").read_text().count("infra_redrive") == 1
    assert '"after": 1' in (plugin_on / "warm.jsonl").read_text()
    assert "a leoflow_attempt_settled hook raised" in caplog.text
    assert "a leoflow_warm_pool_resized hook raised" in caplog.text


# --- metrics -----------------------------------------------------------------------------------------------

def test_the_readme_metrics_table_is_the_metrics_module():
    """README "Metrics" holds exactly :func:`leoflow_airflow.metrics.markdown_table` (one source, no drift)."""
    assert metrics.markdown_table() in README.read_text()


def test_an_undocumented_metric_is_never_sent_and_never_raises(caplog):
    """A name outside :data:`METRICS` is a defect: logged, not emitted, and the caller goes on."""
    metrics.incr("leoflow.not.documented")
    assert "leoflow.not.documented could not be emitted" in caplog.text
    assert metrics.METRICS[1].matches("leoflow.dispatch.dispatched")
    assert not metrics.METRICS[1].matches("leoflow.dispatch")
