"""Issue 10 acceptance, end to end: "a success whose pod is force-deleted after termination: with the finalizer,
settled SUCCESS from the record; the body ran once".

A real Airflow (scheduler, dag-processor, api-server on SQLite) with ``[leoflow] runtime = kubernetes`` on the
k8senv control plane, the task pod run by the node harness (devtools/kube.py). ``leoflow_test_finalizer``'s
``body`` (tests/dags) waits for the test's go; the test freezes the scheduler (SIGSTOP), lets the body finish:
its agent writes the outcome record into the termination message and is SIGKILLed before its terminal PATCH
(TEST-ONLY fault ``after_record``), so the record is the only evidence of the success. The pod ends; the test
deletes it with grace 0 (``kubectl delete --force --grace-period=0``, what PodGC does), kills the frozen
scheduler (it never read the pod) and starts a new one. The finalizer kept the pod, terminal and deleting, so
the successor reads the record, settles the body SUCCESS from it (the ledger says ``replayed``), releases the
finalizer and the pod goes; the body ran once and ``downstream`` ran once. Without the finalizer the delete
would take the record with the pod, and the successor would re-run the body on the infra budget.
"""

from __future__ import annotations

import os
import shutil
import signal
import sqlite3
from pathlib import Path

import pytest

from devtools.kube import KubeStack, require_binaries
from devtools.stack import REPO_ROOT, AirflowStack

from fault_helpers import FaultStack, wait_until

pytestmark = [pytest.mark.k8s, pytest.mark.airflow, pytest.mark.timeout(1500)]

DAG = "leoflow_test_finalizer"
DAG_FILE = REPO_ROOT / "tests" / "dags" / f"{DAG}.py"
LEOFLOW = "leoflow_airflow.executor.LeoflowExecutor"


class KubeFaultStack(AirflowStack):
    """An :class:`AirflowStack` whose components can be frozen, killed and started again (FaultStack's
    component control, on any DAG folder)."""

    _index = FaultStack._index
    pid_of = FaultStack.pid_of
    kill_component = FaultStack.kill_component
    stop_component = FaultStack.stop_component
    start_component = FaultStack.start_component


def _lines(path: Path) -> list[str]:
    return [line.split(" pid=")[0] for line in path.read_text().splitlines()] if path.exists() else []


def test_a_success_force_deleted_after_termination_is_settled_from_its_record_and_ran_once(tmp_path):
    require_binaries()
    from kubernetes import client

    dags = tmp_path / "dags"
    dags.mkdir()
    shutil.copyfile(DAG_FILE, dags / DAG_FILE.name)
    reuse = os.environ.get("K8SENV_DIR")
    kube = KubeStack(tmp_path / "kube", reuse_dir=Path(reuse) if reuse else None, build=False)
    stack = KubeFaultStack(tmp_path / "airflow", executor=LEOFLOW, parallelism=4, dags_folder=dags,
                           extra_env={"AIRFLOW__LEOFLOW__TEST_FAULT_INJECTION": "True"})
    with kube:
        kube.configure(stack)
        core = client.CoreV1Api(kube.api)
        ns = kube.namespace
        body_trace = stack.traces_dir / "finalizer_body.txt"
        try:
            stack.migrate()
            stack.start(wait_for_dags=[DAG])
            stack.unpause(DAG)
            run_id = stack.trigger(DAG)
            wait_until(lambda: _lines(body_trace) == ["started"], 300, "the body to start in its pod")
            [pod] = [p for p in core.list_namespaced_pod(ns).items if p.metadata.labels.get("leoflow.io/task-id")
                     == "body"]
            name, uid = pod.metadata.name, pod.metadata.uid
            stack.stop_component("scheduler")  # from here on no scheduler reads the pod
            (stack.traces_dir / f"finalizer_go.{run_id}").write_text("go\n")

            def ended():
                p = core.read_namespaced_pod(name, ns)
                return p if p.status.phase in ("Succeeded", "Failed") else None

            ended_pod = wait_until(ended, 120, "the body's pod to end")
            message = ended_pod.status.container_statuses[0].state.terminated.message
            assert message and '"state":"success"' in message.replace(" ", ""), message
            core.delete_namespaced_pod(name, ns, body=client.V1DeleteOptions(
                grace_period_seconds=0, preconditions=client.V1Preconditions(uid=uid)))
            kept = core.read_namespaced_pod(name, ns)  # the finalizer keeps it, record and all
            assert kept.metadata.uid == uid and kept.metadata.deletion_timestamp is not None
            assert kept.status.container_statuses[0].state.terminated.message == message
            stack.kill_component("scheduler", signal.SIGKILL, resume=True)  # it never read the pod
            stack.start_component("scheduler")
            state = stack.wait_for_run(DAG, run_id, timeout=600)
            wait_until(lambda: uid not in {p.metadata.uid for p in core.list_namespaced_pod(ns).items}, 120,
                       "the successor to release the settled pod")
            tasks = stack.task_states(DAG, run_id)
        except BaseException:
            print("task pods:\n  " + "\n  ".join(kube.describe_pods()))
            raise
        finally:
            left = stack.stop()
        assert not left, f"processes left after stopping the stack: {left}"
    assert state == "success" and tasks == {"body": "success", "downstream": "success"}, (state, tasks)
    assert _lines(body_trace) == ["started", "ran"]  # the body ran once
    assert _lines(stack.traces_dir / "finalizer_downstream.txt") == ["ran"]
    with sqlite3.connect(stack.home / "airflow.db", timeout=60) as conn:
        rows = conn.execute("select try_number, attempt_epoch, state, resolution from leoflow_attempt "
                            "where dag_id=? and run_id=? and task_id='body' order by id", (DAG, run_id)).fetchall()
    assert [tuple(r) for r in rows] == [(1, 1, "closed", "replayed")]  # settled SUCCESS from the record
