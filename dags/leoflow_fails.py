"""A DAG that fails for real: its task raises with no retries, so the run ends ``failed``."""

from __future__ import annotations

from airflow.sdk import dag, task


@dag(dag_id="leoflow_fails", schedule=None, catchup=False, tags=["leoflow"], default_args={"retries": 0})
def leoflow_fails():
    """fine -> boom (raises) -> never_runs (upstream_failed)."""

    @task
    def fine() -> None:
        """Succeeds."""

    @task
    def boom() -> None:
        """Always raises ``RuntimeError``."""
        raise RuntimeError("this task fails on purpose")

    @task
    def never_runs() -> None:
        """Downstream of ``boom``: ends ``upstream_failed``."""

    fine() >> boom() >> never_runs()


leoflow_fails()
