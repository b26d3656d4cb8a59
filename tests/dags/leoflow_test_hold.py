"""Test DAG (tests/integration/test_lite_bad_input.py): one task that holds ``conf["seconds"]`` (default 20)
in Python, so the test can kill the zygote while an agent runs."""

from __future__ import annotations

from airflow.sdk import dag, task


@dag(dag_id="leoflow_test_hold", schedule=None, catchup=False, tags=["leoflow-test"])
def leoflow_test_hold():
    """A single holding task."""

    @task
    def hold(**context) -> None:
        """Sleep for the run's ``seconds``."""
        import time

        time.sleep(float(context["dag_run"].conf.get("seconds", 20)))

    hold()


leoflow_test_hold()
