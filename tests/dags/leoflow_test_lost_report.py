"""Test DAG (tests/integration/test_kube_runtime_e2e.py): a success whose report is lost.

``body`` asks leoflow's TEST-ONLY fault injection (``executor_config={"leoflow": {"fault": "after_record"}}``,
honoured only with ``[leoflow] test_fault_injection``) to SIGKILL its agent after the outcome record is written
and before the terminal PATCH leaves: Airflow never hears of the success. Each run of the body appends one line
to ``$AIRFLOW_HOME/traces/lost_report_body.txt``; ``downstream`` appends one to ``lost_report_downstream.txt``.
"""

from __future__ import annotations

from airflow.sdk import dag, task


def _trace(name: str) -> None:
    import os

    with open(os.path.join(os.environ["AIRFLOW_HOME"], "traces", name), "a") as fh:
        fh.write(f"ran pid={os.getpid()}\n")


@dag(dag_id="leoflow_test_lost_report", schedule=None, catchup=False, tags=["leoflow-test"])
def leoflow_test_lost_report():
    """``body`` (its report lost) >> ``downstream``."""

    @task(executor_config={"leoflow": {"fault": "after_record"}})
    def body() -> None:
        """Record one run."""
        _trace("lost_report_body.txt")

    @task
    def downstream() -> None:
        """Record one run (it runs only once ``body`` is SUCCESS)."""
        _trace("lost_report_downstream.txt")

    body() >> downstream()


leoflow_test_lost_report()
