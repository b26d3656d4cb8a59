"""Issue 12 item 7, end to end: a task's log is in the Airflow UI while its pod runs and after its pod is gone,
through Airflow's remote-logging conventions, on a real Airflow with ``[leoflow] runtime = kubernetes`` on the
k8senv control plane: the real node with ``--real-node`` (a kubelet and containerd running leoflow's agent image;
the live log comes from the kubelet through the API server's ``pods/log``), else the node harness, which runs the pod
as a local process (devtools/kube.py).

The stack turns ``[logging] remote_logging`` on with ``logging_config_class`` ``tests.local_remote_log``:
Airflow's default logging config, and a ``RemoteLogIO`` whose "remote" store is a local directory
(``remote_base_log_folder``). The pod-side ``airflow.cfg`` says nothing about remote logging: what the pod knows
of it is what leoflow forwarded (``leoflow_airflow.runtime.kubernetes.logenv``); its template adds only what an
image and a shared volume would give it: the module on its ``PYTHONPATH`` and the "remote" directory
(:func:`_ship_logging_module`). One task of ``leoflow_test_task_log`` prints a
marker, waits for the test's gate, prints another:

* while it runs, the task log read through Airflow's public REST API (what the UI's Logs tab reads) is the
  pod's log (the source names the pod) and holds the first marker;
* once it succeeded and its pod was deleted (``pod_retention_success = 0``), the local log file the pod wrote
  is deleted too, and the same REST call returns both markers, read from the remote directory.

Beside it, ``lost_upload`` prints a third marker and fails, and its own upload is lost with its log file (the
pod's template sets ``LEOFLOW_TEST_DROP_UPLOADS_OF``: a supervisor that never reached its upload, a disk that went
with the pod). Its retained pod's log is kept in the remote directory before leoflow releases the pod (issue 33
item 11, ``runtime/kubernetes/logsalvage.py``): the REST call for that ended try returns the third marker, after
leoflow's line naming the pod, from the remote directory.

Wall time about 2 min on 2 cores, most of it bringing the stack up.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from devtools.kube import KubeStack, require_binaries
from devtools.stack import REPO_ROOT
from tests.integration.lite_procs import wait_for
from tests.local_remote_log import DROP_UPLOADS_OF

pytestmark = [pytest.mark.k8s, pytest.mark.airflow, pytest.mark.either_node, pytest.mark.timeout(900)]

DAG = "leoflow_test_task_log"
DAG_FILE = REPO_ROOT / "tests" / "dags" / f"{DAG}.py"
FIRST = "leoflow-task-log-first-marker"
SECOND = "leoflow-task-log-second-marker"
THIRD = "leoflow-task-log-lost-upload-marker"
LEOFLOW = "leoflow_airflow.executor.LeoflowExecutor"
REMOTE_SOURCE = "leoflow test remote-log directory: "  # tests/local_remote_log.py SOURCE_PREFIX
LOGGING_MODULE = REPO_ROOT / "tests" / "local_remote_log.py"
LOGGING_CONFIG_MAP = "leoflow-test-logging"


def _log(stack, run_id: str, task_id: str = "talk") -> tuple[list[str], str]:
    """``(sources, text)`` of try 1 of ``task_id`` through ``GET .../taskInstances/<task_id>/logs/1`` (JSON): the
    source lines of Airflow's "Log message source details" group, and every event joined by newlines."""
    body = stack._call("GET", f"/dags/{DAG}/dagRuns/{run_id}/taskInstances/{task_id}/logs/1",
                       headers={"accept": "application/json"})
    events = [c.get("event", "") if isinstance(c, dict) else str(c) for c in body["content"]]
    try:
        start, end = events.index("::group::Log message source details"), events.index("::endgroup::")
        sources, rest = events[start + 1:end], events[:start] + events[end + 1:]
    except ValueError:
        sources, rest = [], events
    return sources, "\n".join(rest)


def _ship_logging_module(kube: KubeStack, template: dict, home: Path, remote: Path) -> None:
    """Give the pods of ``template`` (a pod template, changed in place) what an image and a shared volume would give
    them: the logging module and the "remote" directory at ``remote`` (under ``home``, the stack's home), the path the
    scheduler side uses.

    Harness: the pods are processes of this machine, ``PYTHONPATH`` the repository root. Real node: the module as a
    ConfigMap mounted at ``/opt/leoflow-test/tests`` (``PYTHONPATH`` ``/opt/leoflow-test``), and ``remote``, which
    is under ``home``, mounted from the stack's shared claim (:meth:`KubeStack.real_pod_template_for`) at
    the same path, writable for the pods' uid."""
    container = template["spec"]["containers"][0]
    if kube.node != "real":
        container["env"].append({"name": "PYTHONPATH", "value": str(REPO_ROOT)})
        return
    from kubernetes import client

    client.CoreV1Api(kube.api).create_namespaced_config_map(kube.namespace, client.V1ConfigMap(
        metadata=client.V1ObjectMeta(name=LOGGING_CONFIG_MAP),
        data={LOGGING_MODULE.name: LOGGING_MODULE.read_text()}))
    remote.mkdir(parents=True, exist_ok=True)
    os.chmod(remote, 0o777)
    template["spec"]["volumes"].append({"name": "logging-module", "configMap": {"name": LOGGING_CONFIG_MAP}})
    container["env"].append({"name": "PYTHONPATH", "value": "/opt/leoflow-test"})
    container["volumeMounts"] += [
        {"name": "logging-module", "mountPath": "/opt/leoflow-test/tests", "readOnly": True},
        {"name": "shared", "mountPath": str(remote), "subPath": remote.relative_to(home).as_posix()}]


def test_the_task_log_is_the_pod_log_while_it_runs_and_the_remote_copy_after_its_pod_is_gone(
        tmp_path_factory: pytest.TempPathFactory, airflow_stack_factory, kube_node: str) -> None:
    require_binaries()
    work = tmp_path_factory.mktemp("kube-logs")
    dags = work / "dags"
    dags.mkdir()
    shutil.copyfile(DAG_FILE, dags / DAG_FILE.name)
    reuse = os.environ.get("K8SENV_DIR")
    kube = KubeStack(work / "kube", reuse_dir=Path(reuse) if reuse else None, build=False, node=kube_node)
    with kube:
        stack = airflow_stack_factory("kube-logs", executor=LEOFLOW, dags_folder=dags, api_host=kube.api_host,
                                      extra_env={
                                          "AIRFLOW__LOGGING__REMOTE_LOGGING": "True",
                                          "AIRFLOW__LOGGING__LOGGING_CONFIG_CLASS": "tests.local_remote_log.LOGGING_CONFIG",
                                          "AIRFLOW__LEOFLOW__POD_RETENTION_SUCCESS": "0",
                                      })
        # under the stack's home: the real node's pods reach it through the stack's shared claim
        remote = stack.home / "remote-logs"
        stack.extra_env["AIRFLOW__LOGGING__REMOTE_BASE_LOG_FOLDER"] = str(remote)
        kube.configure(stack)
        template = json.loads(kube.pod_template_file.read_text())
        _ship_logging_module(kube, template, stack.home, remote)
        template["spec"]["containers"][0]["env"].append({"name": DROP_UPLOADS_OF, "value": "lost_upload"})
        kube.pod_template_file.write_text(json.dumps(template, indent=2) + "\n")
        assert "remote" not in (kube.pod_home / "airflow.cfg").read_text()
        from kubernetes import client

        core = client.CoreV1Api(kube.api)
        try:
            stack.migrate()
            stack.start(wait_for_dags=[DAG])
            stack.unpause(DAG)
            run_id = stack.trigger(DAG)

            # while it runs: the log view is the pod's log, read through the Kubernetes API
            def live() -> tuple[list[str], str] | None:
                if stack.task_states(DAG, run_id).get("talk") != "running":
                    return None
                sources, text = _log(stack, run_id)
                return (sources, text) if FIRST in text else None

            sources, text = wait_for(live, 180, "the first marker in the running task's log")
            assert [s for s in sources if s.startswith("pod ") and "agent container" in s], sources
            assert SECOND not in text
            [pod] = core.list_namespaced_pod(kube.namespace,
                                             label_selector=f"leoflow.io/dag-id={DAG},leoflow.io/task-id=talk").items
            env = {e.name: e.value for e in pod.spec.containers[0].env}
            assert env["AIRFLOW__LOGGING__REMOTE_LOGGING"] == "True"
            assert env["AIRFLOW__LOGGING__REMOTE_BASE_LOG_FOLDER"] == str(remote)
            assert env["AIRFLOW__LOGGING__LOGGING_CONFIG_CLASS"] == "tests.local_remote_log.LOGGING_CONFIG"

            (stack.traces_dir / "task_log_gate").touch()
            assert stack.wait_for_run(DAG, run_id, timeout=180) == "failed"  # lost_upload failed on purpose
            assert stack.task_states(DAG, run_id) == {"talk": "success", "lost_upload": "failed"}
            wait_for(lambda: not core.list_namespaced_pod(
                kube.namespace, label_selector=f"leoflow.io/dag-id={DAG},leoflow.io/task-id=talk").items, 120,
                "the task's pod to be gone")

            # the pod is gone: delete the log file it wrote; the log view reads the remote copy
            [local] = (stack.home / "logs").glob(f"dag_id={DAG}/**/task_id=talk/**/attempt=1.log")
            kept = remote / local.relative_to(stack.home / "logs")
            assert kept.is_file(), f"the pod uploaded nothing to {remote}: {sorted(remote.rglob('*'))}"
            local.unlink()
            sources, text = _log(stack, run_id)
            assert FIRST in text and SECOND in text, text
            assert [s for s in sources if s == REMOTE_SOURCE + str(kept)], sources
            assert not local.exists(), "the log view must not need the local file"

            # lost_upload: its own upload and log file are lost; its pod's log was kept before leoflow released
            # the pod (a user failure ends the agent with exit 0: pod_retention_success = 0 then deletes it)
            lost_log = f"dag_id={DAG}/**/task_id=lost_upload/**/attempt=1.log"
            kept_lost = wait_for(lambda: next(iter(remote.glob(lost_log)), None), 60,
                                 "lost_upload's pod log kept in the remote directory")
            assert not list((stack.home / "logs").glob(lost_log)), "only the remote copy is left"
            sources, text = _log(stack, run_id, "lost_upload")
            assert THIRD in text, text
            assert f"leoflow: this log was kept from pod {kube.namespace}/leoflow-test-task-log-lost-u" in text, text
            assert [s for s in sources if s == REMOTE_SOURCE + str(kept_lost)], sources
        except BaseException:
            print("task pods:\n  " + "\n  ".join(kube.describe_pods()))
            raise
        finally:
            left = stack.stop()
        assert not left, f"processes left after stopping the stack: {left}"
