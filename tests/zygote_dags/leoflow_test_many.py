"""Test DAG (tests/integration/test_lite_zygote_faults.py, issue 8 hole 8): twenty short independent tasks
with no retries, so a task failed through Airflow's killed-externally path shows as ``failed`` at once."""

from __future__ import annotations

from airflow.sdk import dag, task


@dag(dag_id="leoflow_test_many", schedule=None, catchup=False, tags=["leoflow-test"], max_active_tasks=32,
     default_args={"retries": 0})
def leoflow_test_many():
    """``t00`` .. ``t19``: each sleeps one second."""
    for n in range(20):

        @task(task_id=f"t{n:02d}")
        def short() -> None:
            import time

            time.sleep(1)

        short()


leoflow_test_many()
