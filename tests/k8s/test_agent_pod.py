"""The task pod's agent, ``python -m leoflow_agent pod``, in a real pod (issue 9 item 4).

Real parts: the kube-apiserver of ``scripts/k8senv``; the pod built by ``build_pod`` from ``[leoflow]`` values,
with a pod template placing it on the node harness (``nodeName`` and the harness label, as a user's template
would); the harness running it as the kubelet would (the projected ServiceAccount token minted by TokenRequest and
bound to the pod, the termination message cut as the kubelet cuts it); leoflow's exchange app served over HTTP by
uvicorn, built from Airflow's config by its own lifespan, talking to Kubernetes as a least-privilege ServiceAccount
(``exchange_wiring``), its ledger on SQLite. The container's command is ``/usr/bin/env`` with ``PATH`` leading to
this checkout's venv, so the pinned arguments ``python -m leoflow_agent pod`` run this checkout's agent.

The success path (the workload run by the Task SDK supervisor against an Execution API) needs a real Airflow
api-server and is tested in the integration tier.
"""

from __future__ import annotations

import logging
import sys
import threading
import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa
from kubernetes import client

from devtools.stack import free_port
from leoflow_agent import outcome
from leoflow_agent.podmain import EXIT_REFUSED
from leoflow_airflow.api.app import create_app
from leoflow_airflow.api.exchange import from_airflow
from leoflow_airflow.ledger.models import metadata
from leoflow_airflow.ledger.states import AttemptRef, AttemptState, Resolution
from leoflow_airflow.ledger.store import LedgerStore

from .conftest import HARNESS_NODE, wait_for
from .exchange_wiring import AUDIENCE, TASK_SA, wire_namespace, workload_json

pytestmark = pytest.mark.k8s

SECRET = "agent-pod-test-secret-" + "k" * 64
VENV_BIN = str(Path(sys.executable).parent)


class ServedExchange:
    """leoflow's app (the exchange) served over HTTP on 127.0.0.1:``port`` by uvicorn in a thread, from
    :meth:`start` to :meth:`stop`."""

    def __init__(self, app, port: int) -> None:
        import uvicorn

        self.port = port
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, log_level="warning",
                                                    lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, name="served-exchange", daemon=True)

    def start(self) -> None:
        self.thread.start()
        wait_for(lambda: self.server.started, 60, what="the exchange app serving")

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(15)


class AgentPods:
    """One namespace wired for the exchange, a ledger, the exchange app (not yet served) and a pod maker."""

    def __init__(self, core: client.CoreV1Api, harness, namespace: str, store: LedgerStore, options: dict,
                 port: int) -> None:
        self.core, self.harness, self.namespace, self.store = core, harness, namespace, store
        self.options, self.port = options, port
        self.exchange = ServedExchange(
            create_app(exchange_factory=lambda: from_airflow(ledger=store, get=lambda s, k, f: options.get(k, f))),
            port)

    def attempt(self) -> AttemptRef:
        """A claimed Kubernetes attempt in the ledger (the test moves it on)."""
        ti_id = str(uuid.uuid4())
        return self.store.claim_epoch(ti_id=ti_id, try_number=1, dag_id="dag", task_id="task", run_id="run",
                                      map_index=-1, runtime="kubernetes", workload_json=workload_json(ti_id),
                                      scheduler_job_id=1).ref

    def create_pod(self, ref: AttemptRef) -> client.V1Pod:
        """``build_pod`` of ``ref`` with a pod template that places it on the harness node and runs this
        checkout's venv; created for real."""
        from leoflow_airflow import settings
        from leoflow_airflow.runtime.kubernetes.pod import PodAttempt, build_pod

        values = {**self.options, "image": "leoflow.test/none:0", "exchange_url": f"http://127.0.0.1:{self.port}",
                  "credential_ceiling_seconds": "600"}
        kube = settings.load_kubernetes(lambda section, key, fallback: values.get(key, fallback))
        attempt = PodAttempt(ti_id=ref.ti_id, try_number=ref.try_number, attempt_epoch=ref.attempt_epoch,
                             dag_id="dag", task_id="task", run_id="run")
        template = client.V1Pod(
            metadata=client.V1ObjectMeta(labels=self.harness.pod_labels),
            spec=client.V1PodSpec(node_name=HARNESS_NODE, containers=[client.V1Container(
                name="base", command=["/usr/bin/env"],
                env=[client.V1EnvVar(name="PATH", value=f"{VENV_BIN}:/usr/bin:/bin")])]))
        pod = build_pod(attempt, kube, template=template)
        assert pod.spec.containers[0].args == ["python", "-m", "leoflow_agent", "pod"]
        return self.core.create_namespaced_pod(self.namespace, pod)

    def agent_log(self, pod: client.V1Pod) -> str:
        """What the agent wrote to stderr/stdout so far (the harness keeps each container's log)."""
        run = self.harness.runs.get(pod.metadata.uid)
        path = run.dir / "base.log" if run is not None else None
        return path.read_text(errors="replace") if path is not None and path.exists() else ""

    def terminated(self, pod: client.V1Pod, timeout: float = 120) -> client.V1ContainerStateTerminated:
        """Wait until the pod ended; return its agent container's terminated state."""
        name = pod.metadata.name
        done = wait_for(lambda: (p := self.core.read_namespaced_pod(name, self.namespace)).status.phase
                        in ("Succeeded", "Failed") and p, timeout, what=f"pod {name} to end")
        [status] = done.status.container_statuses
        return status.state.terminated


class Lines(logging.Handler):
    """Keeps the messages of the records it handles (the exchange's log: Airflow's logging config, which the app's
    lifespan sets up in this process, takes them away from pytest's caplog)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture
def exchange_lines():
    handler = Lines()
    logger = logging.getLogger("leoflow_airflow.api.exchange")
    logger.addHandler(handler)
    try:
        yield handler.lines
    finally:
        logger.removeHandler(handler)


@pytest.fixture
def pods(api, core, namespace, harness, k8s_env, tmp_path, monkeypatch):
    kubeconfig, unwire = wire_namespace(api, core, namespace, k8s_env, tmp_path / "api-server.kubeconfig")
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'ledger.db'}")
    metadata.create_all(engine)
    monkeypatch.setenv("AIRFLOW__API_AUTH__JWT_SECRET", SECRET)
    options = {"runtime": "kubernetes", "namespace": namespace, "service_account": TASK_SA,
               "exchange_audience": AUDIENCE, "in_cluster": "False", "kube_config": str(kubeconfig),
               "exchange_timeout_seconds": "10"}
    made = AgentPods(core, harness, namespace, LedgerStore(engine), options, free_port())
    try:
        yield made
    finally:
        made.exchange.stop()
        engine.dispose()
        unwire()


def exchange_log(lines: list[str], reason: str) -> list[str]:
    """The exchange's log lines that name ``reason``."""
    return [line for line in lines if f"reason={reason}" in line]


def test_a_refused_exchange_ends_the_pod_with_its_classified_record(pods, exchange_lines):
    """A pod whose attempt was exchanged already by an earlier pod of its name (a replayed pod: the ledger
    recorded the earlier pod's UID) is refused: the agent exits 3 and its termination message, as the kubelet
    reports it, is the ``exchange_refused`` record ``outcome.decode`` reads; neither the pod's spec nor the
    agent's log carries a token."""
    ref = pods.attempt()
    pods.exchange.start()
    pod = pods.create_pod(ref)
    earlier_uid = str(uuid.uuid4())
    assert pods.store.transition(ref, expected=[AttemptState.CLAIMED], to=AttemptState.DISPATCHED,
                                 pod_name=pod.metadata.name, pod_uid=earlier_uid)
    assert pods.store.record_exchange(ref, credential_id="JTI=an-earlier-pod")
    term = pods.terminated(pod)
    assert (term.exit_code, term.reason) == (EXIT_REFUSED, "Error"), pods.agent_log(pod)
    record = outcome.decode(term.message, expect=outcome.AttemptIdentity(ref.ti_id, 1, 1))
    assert record == outcome.exchange_refused(), term.message
    assert len(exchange_log(exchange_lines, "already_exchanged")) == 1
    log = pods.agent_log(pod)
    assert "HTTP 403" in log and "exchange_refused" in log and "eyJ" not in log
    assert "eyJ" not in str(pods.core.read_namespaced_pod(pod.metadata.name, pods.namespace).to_dict())


def test_an_unreachable_exchange_is_retried_until_it_answers(pods, exchange_lines):
    """The pod starts before the exchange serves: the agent retries on connection refused; once the app serves,
    the attempt is still CLAIMED (the scheduler has not recorded the create yet: 503, Retry-After), and it asks
    again; the scheduler then closes the attempt instead, and the next answer, a 403, ends the pod with its
    ``exchange_refused`` record."""
    ref = pods.attempt()
    pod = pods.create_pod(ref)
    wait_for(lambda: "ConnectError" in pods.agent_log(pod), 60, what="the agent's first refused connection")
    pods.exchange.start()
    wait_for(lambda: exchange_log(exchange_lines, "not_yet_dispatched"), 60, what="the agent asking while CLAIMED")
    assert pods.core.read_namespaced_pod(pod.metadata.name, pods.namespace).status.phase == "Running"
    assert pods.store.transition(ref, expected=[AttemptState.CLAIMED], to=AttemptState.CLOSED,
                                 resolution=Resolution.ABANDONED)
    term = pods.terminated(pod)
    assert term.exit_code == EXIT_REFUSED, pods.agent_log(pod)
    assert outcome.decode(term.message) == outcome.exchange_refused()
    assert exchange_log(exchange_lines, "not_dispatched")
    log = pods.agent_log(pod)
    assert "no answer (ConnectError)" in log and "HTTP 503" in log and "trying again in" in log
    assert pods.store.get(ref).exchanged_at is None
