"""Test DAG (tests/integration/test_kube_pod_ends_e2e.py, "finalizer"): a success whose pod is force-deleted after it ended,
before any scheduler read it.

``body`` appends ``started`` to ``$AIRFLOW_HOME/traces/finalizer_body.txt``, waits (at most 10 min) for the file
``traces/finalizer_go.<run_id>`` the test writes once it has frozen the scheduler, appends ``ran``, and returns;
leoflow's TEST-ONLY fault injection (``executor_config={"leoflow": {"fault": "after_record"}}``, honoured only
with ``[leoflow] test_fault_injection``) then SIGKILLs its agent after the outcome record is written and before
the terminal PATCH leaves, so only the record in the pod's termination message says it succeeded.
``downstream`` appends one line to ``finalizer_downstream.txt`` (it runs only once ``body`` is SUCCESS).
"""

from __future__ import annotations

from airflow.sdk import dag, get_current_context, task


def _trace(name: str, text: str) -> None:
    import os

    with open(os.path.join(os.environ["AIRFLOW_HOME"], "traces", name), "a") as fh:
        fh.write(f"{text} pid={os.getpid()}\n")


@dag(dag_id="leoflow_test_finalizer", schedule=None, catchup=False, tags=["leoflow-test"])
def leoflow_test_finalizer():
    """``body`` (held, then its report lost) >> ``downstream``."""

    @task(executor_config={"leoflow": {"fault": "after_record"}})
    def body() -> None:
        """Record its start, wait for the test's go, record its run."""
        import os
        import time

        _trace("finalizer_body.txt", "started")
        go = os.path.join(os.environ["AIRFLOW_HOME"], "traces", f"finalizer_go.{get_current_context()['run_id']}")
        deadline = time.monotonic() + 600
        while not os.path.exists(go) and time.monotonic() < deadline:
            time.sleep(0.2)
        _trace("finalizer_body.txt", "ran")

    @task
    def downstream() -> None:
        """Record one run."""
        _trace("finalizer_downstream.txt", "ran")

    body() >> downstream()


leoflow_test_finalizer()
