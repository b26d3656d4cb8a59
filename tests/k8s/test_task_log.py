"""``LeoflowExecutor.get_task_log`` on pods (issue 9 item 6), against the real kube-apiserver: the log of a
running attempt's pod comes through ``pods/log``, which the API server proxies to the node harness's kubelet
endpoint (tests/k8s/README.md "Pods on the harness node"); once the pod is gone the answer says where the log
went; an API server that does not answer gives a source line, never an exception.

The executor is an un-started ``LeoflowExecutor`` as in the api-server, its ledger a SQLite file holding the
attempt, its ``[leoflow]`` settings those of a Kubernetes runtime on this control plane.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest
import sqlalchemy as sa
from kubernetes import client

from devtools.stack import free_port
from leoflow_airflow import settings as leoflow_settings
from leoflow_airflow.executor import LeoflowExecutor
from leoflow_airflow.ledger.models import metadata
from leoflow_airflow.ledger.states import AttemptRef, AttemptState
from leoflow_airflow.ledger.store import LedgerStore
from leoflow_airflow.runtime.kubernetes.finalizer import release_finalizer
from leoflow_airflow.runtime.kubernetes.pod import PodAttempt, build_pod

from .conftest import HARNESS_NODE, wait_for

pytestmark = pytest.mark.k8s

LOG_PATH = "dag_id=dag/run_id=run/task_id=task/attempt=1.log"


def _workload_json(ti_id: str) -> str:
    """An ``ExecuteTask`` of ``ti_id`` as the ledger stores it (token stripped), with :data:`LOG_PATH`."""
    from airflow.executors.workloads import BundleInfo, ExecuteTask
    from airflow.executors.workloads.task import TaskInstanceDTO

    ti = TaskInstanceDTO(id=uuid.UUID(ti_id), task_id="task", dag_id="dag", run_id="run", try_number=1,
                         dag_version_id=uuid.uuid4(), map_index=-1, pool_slots=1, priority_weight=1, queue="default")
    return ExecuteTask(token="", dag_rel_path="dag.py", bundle_info=BundleInfo(name="dags"), log_path=LOG_PATH,
                       ti=ti).model_dump_json(exclude={"token"})


class Setup:
    """An un-started executor on a ledger with one claimed attempt, and the means to give it a pod."""

    def __init__(self, core: client.CoreV1Api, harness, namespace: str, store: LedgerStore, options: dict) -> None:
        self.core, self.harness, self.namespace, self.store, self.options = core, harness, namespace, store, options
        self.executor = self.make_executor(options)
        self.ti_id = str(uuid.uuid4())
        self.ref: AttemptRef = store.claim_epoch(
            ti_id=self.ti_id, try_number=1, dag_id="dag", task_id="task", run_id="run", map_index=-1,
            runtime="kubernetes", workload_json=_workload_json(self.ti_id), scheduler_job_id=1).ref

    def make_executor(self, options: dict) -> LeoflowExecutor:
        ex = LeoflowExecutor()
        ex._settings = leoflow_settings.load(lambda section, key, fallback: options.get(key, fallback))
        ex._ledger = self.store
        return ex

    def get_task_log(self, executor: LeoflowExecutor | None = None) -> tuple[list[str], list[str]]:
        return (executor or self.executor).get_task_log(SimpleNamespace(id=uuid.UUID(self.ti_id)), 1)

    def create_pod(self, script: str) -> client.V1Pod:
        """The attempt's pod (``build_pod``) on the harness node, its agent container running ``sh -c script``."""
        kube = self.executor.settings.kubernetes
        attempt = PodAttempt(ti_id=self.ref.ti_id, try_number=1, attempt_epoch=self.ref.attempt_epoch,
                             dag_id="dag", task_id="task", run_id="run")
        template = client.V1Pod(
            metadata=client.V1ObjectMeta(labels=self.harness.pod_labels),
            spec=client.V1PodSpec(node_name=HARNESS_NODE, containers=[client.V1Container(
                name="base", command=["/bin/sh", "-c", script])]))
        return self.core.create_namespaced_pod(self.namespace, build_pod(attempt, kube, template=template))

    def record(self, pod: client.V1Pod) -> None:
        """What the lifecycle records at ``Started``: the pod's name and UID."""
        assert self.store.transition(self.ref, expected=[AttemptState.CLAIMED], to=AttemptState.DISPATCHED,
                                     pod_name=pod.metadata.name, pod_uid=pod.metadata.uid)

    def delete(self, pod: client.V1Pod) -> None:
        """Delete the pod and, as the runtime does once its attempt is settled, release leoflow's finalizer."""
        self.core.delete_namespaced_pod(pod.metadata.name, self.namespace, grace_period_seconds=0)
        assert release_finalizer(self.core, self.namespace, pod.metadata.name, pod.metadata.uid).done
        wait_for(lambda: not [p for p in self.core.list_namespaced_pod(self.namespace).items
                              if p.metadata.uid == pod.metadata.uid], 30, what="the pod to be gone")


@pytest.fixture
def setup(core, namespace, harness, k8s_env, tmp_path):
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'ledger.db'}")
    metadata.create_all(engine)
    options = {"runtime": "kubernetes", "image": "leoflow.test/none:0", "namespace": namespace,
               "exchange_url": "http://127.0.0.1:9/leoflow", "in_cluster": "False",
               "kube_config": str(k8s_env.kubeconfig)}
    try:
        yield Setup(core, harness, namespace, LedgerStore(engine), options)
    finally:
        engine.dispose()


def test_a_running_pods_log_comes_through_the_kubernetes_api(setup):
    marker = f"leoflow-log-line-{uuid.uuid4().hex}"
    pod = setup.create_pod(f"echo first; echo {marker}; exec sleep 600")
    name = pod.metadata.name
    # before the lifecycle recorded the pod: found by its deterministic name and identity annotation
    sources, texts = wait_for(lambda: (lambda r: r if r[1] and marker in r[1][0] else None)(setup.get_task_log()),
                              60, what="the marker in the pod's log")
    assert sources == [f"pod {setup.namespace}/{name}: log of its agent container through the Kubernetes API "
                       f"(pods/log; the last 10000 lines, at most 4 MiB)"]
    assert texts == [f"first\n{marker}\n"]
    setup.record(pod)  # and by the UID the ledger holds
    assert setup.get_task_log() == (sources, texts)


def test_a_pods_log_is_cut_to_its_last_lines_then_its_byte_limit(setup):
    """``tailLines`` and ``limitBytes`` reach the kubelet endpoint through the API server's proxy."""
    from leoflow_airflow.runtime.kubernetes import podlog

    pod = setup.create_pod("for i in 1 2 3 4 5; do echo line-$i; done; exec sleep 600")
    read = wait_for(lambda: (lambda r: r if r.text.count("\n") == 5 else None)(podlog.read_pod_log(
        setup.core, setup.namespace, pod.metadata.name, uid=pod.metadata.uid, ref=setup.ref)), 60,
        what="five lines in the log")
    assert read.seen is podlog.Seen.LOG
    tail = podlog.read_pod_log(setup.core, setup.namespace, pod.metadata.name, uid=pod.metadata.uid,
                               ref=setup.ref, tail_lines=2, limit_bytes=10)
    assert tail.text == "line-4\nlin"  # the last 2 lines, then their first 10 bytes


def test_a_deleted_pod_says_where_its_log_went(setup, monkeypatch):
    pod = setup.create_pod("echo hello; exec sleep 600")
    setup.record(pod)
    wait_for(lambda: setup.get_task_log()[1], 60, what="the pod's log")
    setup.delete(pod)

    monkeypatch.setenv("AIRFLOW__LOGGING__REMOTE_LOGGING", "False")
    monkeypatch.setenv("AIRFLOW__LOGGING__BASE_LOG_FOLDER", "/opt/airflow/logs")
    assert setup.get_task_log() == (
        [f"pod {setup.namespace}/{pod.metadata.name} is gone; its log file lived in the pod at "
         f"/opt/airflow/logs/{LOG_PATH} and left with the pod, as did its container's stdout. Set [logging] "
         f"remote_logging (with remote_base_log_folder) to keep task logs after their pods"], [])

    monkeypatch.setenv("AIRFLOW__LOGGING__REMOTE_LOGGING", "True")
    monkeypatch.setenv("AIRFLOW__LOGGING__REMOTE_BASE_LOG_FOLDER", "s3://bucket/airflow/logs/")
    assert setup.get_task_log() == (
        [f"pod {setup.namespace}/{pod.metadata.name} is gone; its log was uploaded by [logging] remote_logging "
         f"to s3://bucket/airflow/logs/{LOG_PATH}"], [])


def test_another_pod_under_the_name_is_not_the_attempts(setup):
    first = setup.create_pod("exec sleep 600")
    setup.record(first)
    setup.delete(first)
    second = setup.create_pod("echo not-the-attempts-log; exec sleep 600")
    sources, texts = setup.get_task_log()
    assert texts == []
    assert sources[0].startswith(f"pod {setup.namespace}/{first.metadata.name} is gone (the name now holds "
                                 f"another pod, uid {second.metadata.uid});")


def test_an_unreachable_api_server_is_a_source_line_not_an_exception(setup, tmp_path):
    kubeconfig = json.loads(Path(setup.options["kube_config"]).read_text())  # scripts/k8senv writes JSON
    port = free_port()  # a port nothing listens on once closed
    kubeconfig["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{port}"
    dead = tmp_path / "dead.kubeconfig"
    dead.write_text(json.dumps(kubeconfig))
    executor = setup.make_executor({**setup.options, "kube_config": str(dead)})
    sources, texts = setup.get_task_log(executor)
    assert texts == []
    assert len(sources) == 1
    assert sources[0].startswith(f"pod {setup.namespace}/") and \
        "its log could not be read through the Kubernetes API: pod GET: MaxRetryError" in sources[0], sources


def test_a_missing_kube_config_is_a_source_line_not_an_exception(setup, tmp_path):
    executor = setup.make_executor({**setup.options, "kube_config": str(tmp_path / "missing.kubeconfig")})
    sources, texts = setup.get_task_log(executor)
    assert texts == []
    assert "the Kubernetes client configuration cannot be loaded ([leoflow] in_cluster / kube_config)" in sources[0]


def test_the_api_server_answers_with_the_kubelet_endpoint_of_the_harness_node(core, harness):
    """The harness registers its kubelet endpoint as a kubelet does (what pods/log is proxied to)."""
    node = core.read_node(HARNESS_NODE)
    assert node.status.daemon_endpoints.kubelet_endpoint.port == harness.kubelet_port > 0
    assert {"type": "InternalIP", "address": harness.kubelet_host} in \
        [{"type": a.type, "address": a.address} for a in node.status.addresses]
