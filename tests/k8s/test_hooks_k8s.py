"""leoflow's pod and exchange hooks, and the Kubernetes runtime's metrics, against the real kube-apiserver (issue 12
items 4 and 6), with the test plugin (``tests/plugin_pkg``, installed by ``make venv``) switched on.

Real parts as in ``test_exchange.py`` (whose ``xenv`` fixture is reused): the kube-apiserver, tokens minted by
the TokenRequest API bound to real pods, the ledger, leoflow's FastAPI app with its lifespan. Metrics go
through Airflow's own Stats, initialized with Airflow's StatsD factory pointed at a UDP listener of the test (the
``statsd`` fixture of ``conftest.py``).
"""

from __future__ import annotations

import pytest

from leoflow_agent.exchange import decode_grant, request_body
from leoflow_airflow.runtime.kubernetes import pod as pods
from leoflow_airflow.runtime.kubernetes.identity import IDENTITY_ANNOTATION, identity_annotation
from leoflow_airflow.runtime.kubernetes.runtime import _plugin_hook

from .exchange_wiring import AUDIENCE, TASK_SA
from .test_exchange import refused, xenv  # noqa: F401 - xenv is a fixture
from .test_kube_runtime import make_runtime, new_ref  # noqa: F401 - make_runtime is a fixture

pytestmark = pytest.mark.k8s


def test_a_mutated_pod_keeps_leoflows_pins_on_the_apiserver_and_is_exchanged(xenv, tmp_path, monkeypatch,
                                                                              statsd, caplog):
    """The plugin's label reaches the pod the apiserver stored; its attempts to change the ServiceAccount, the
    token automount, runAsNonRoot, the identity annotation and the agent's arguments did not; the pod's token
    is exchanged (200, the plugin's log field on the grant's line) and ``leoflow.exchange.ok`` is counted."""
    monkeypatch.setenv("LEOFLOW_TEST_PLUGIN_DIR", str(tmp_path))
    ref = xenv.attempt()
    created = xenv.built_pod(ref, plugin_hook=_plugin_hook())
    meta, spec = created.metadata, created.spec
    assert meta.labels["leoflow-test-plugin"] == "mutated"
    assert meta.annotations[IDENTITY_ANNOTATION] == identity_annotation(ref)
    assert spec.service_account_name == TASK_SA and spec.automount_service_account_token is False
    assert spec.security_context.run_as_non_root is True and spec.restart_policy == "Never"
    assert spec.containers[0].args == list(pods.AGENT_ARGS)
    assert pods.OUTCOME_FINALIZER in meta.finalizers
    token = xenv.token(created, audiences=[AUDIENCE], sa_name=TASK_SA)
    r = xenv.exchange(request_body(token))
    assert r.status_code == 200, r.text
    assert decode_grant(r.content).ti_id == ref.ti_id
    assert f"test_plugin='{xenv.namespace}/{created.metadata.name}'" in caplog.text
    assert "leoflow.exchange.ok" in statsd.wait_names({"leoflow.exchange.ok"})


def test_a_vetoed_exchange_answers_403_and_a_raising_hook_503(xenv, tmp_path, monkeypatch, statsd, caplog):
    """Through the real endpoint: the plugin's veto is a 403 whose logged reason is ``vetoed`` and the attempt
    stays unexchanged; a hook that raises answers 503 (``plugin_error``). Both are counted by reason."""
    monkeypatch.setenv("LEOFLOW_TEST_PLUGIN_DIR", str(tmp_path))
    monkeypatch.setenv("LEOFLOW_TEST_PLUGIN_VETO_DAGS", "dag")
    ref = xenv.attempt()
    token = xenv.token(xenv.pod(ref))
    assert refused(caplog, xenv.exchange(request_body(token))) == "vetoed"
    assert "plugin test_plugin: the test plugin denies this DAG" in caplog.text
    assert xenv.store.get(ref).exchanged_at is None

    monkeypatch.setenv("LEOFLOW_TEST_PLUGIN_VETO_DAGS", "")
    monkeypatch.setenv("LEOFLOW_TEST_PLUGIN_RAISE_DAGS", "dag")
    r = xenv.exchange(request_body(token))
    assert r.status_code == 503 and "retry-after" in r.headers, r.text
    assert "reason=plugin_error" in caplog.text

    monkeypatch.setenv("LEOFLOW_TEST_PLUGIN_RAISE_DAGS", "")
    assert xenv.exchange(request_body(token)).status_code == 200  # the same token, once the policy allows
    want = {"leoflow.exchange.denied.vetoed", "leoflow.exchange.undecided.plugin_error", "leoflow.exchange.ok"}
    assert want <= statsd.wait_names(want)


def test_the_runtime_creates_the_plugins_pod_and_times_the_create(make_runtime, namespace, core, tmp_path,
                                                                 monkeypatch, statsd):
    """``KubernetesRuntime.launch`` (its real create path, in its worker pool) creates the pod the plugin mutated,
    with leoflow's pins as they were, and sends ``leoflow.pod.create`` (a timer) through Airflow's Stats."""
    monkeypatch.setenv("LEOFLOW_TEST_PLUGIN_DIR", str(tmp_path))
    d = make_runtime(namespace)
    ref = new_ref()
    d.launch(ref)
    started = d.started(ref)
    created = core.read_namespaced_pod(started.facts["pod_name"], namespace)
    assert created.metadata.labels["leoflow-test-plugin"] == "mutated"
    assert created.metadata.annotations["leoflow-test-plugin/attempt"] == f"{ref.ti_id}/1/1"
    assert created.metadata.annotations[IDENTITY_ANNOTATION] == identity_annotation(ref)
    assert created.spec.service_account_name == d.rt.kube.service_account
    assert created.spec.containers[0].termination_message_path == pods.TERMINATION_MESSAGE_PATH
    assert "leoflow.pod.create" in statsd.wait_names({"leoflow.pod.create"})
    assert any(x.name == "airflow.leoflow.pod.create" and x.kind == "ms" for x in statsd.samples())
