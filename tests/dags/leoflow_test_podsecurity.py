"""Test DAG (tests/integration/test_kube_backpressure_e2e.py): a pod_override Pod Security refuses.

``as_root`` asks, through ``executor_config={"pod_override": ...}``, for its container to run as uid 0, which the
task namespace's Pod Security level ``restricted`` forbids (``runAsUser=0``); the stack's ``[leoflow]
pod_override_allow`` lets that field through, so the API server is the one that refuses the pod. If its body
ever ran it would append a line to ``$AIRFLOW_HOME/traces/podsecurity.txt``.
"""

from __future__ import annotations

from kubernetes.client import models as k8s

from airflow.sdk import dag, task

AS_ROOT = k8s.V1Pod(spec=k8s.V1PodSpec(containers=[
    k8s.V1Container(name="base", security_context=k8s.V1SecurityContext(run_as_user=0))]))


@dag(dag_id="leoflow_test_podsecurity", schedule=None, catchup=False, tags=["leoflow-test"])
def leoflow_test_podsecurity():
    """One task whose pod Pod Security forbids."""

    @task(executor_config={"pod_override": AS_ROOT}, retries=0)
    def as_root() -> None:
        """Record a run (it must never happen)."""
        import os

        with open(os.path.join(os.environ["AIRFLOW_HOME"], "traces", "podsecurity.txt"), "a") as fh:
            fh.write("ran\n")

    as_root()


leoflow_test_podsecurity()
