"""Test DAG (tests/integration/test_kube_backpressure_e2e.py): ten independent short tasks, for backpressure.

Each of ``t0`` .. ``t9`` appends one line ``<run_id> <task_id> <try_number>`` to
``$AIRFLOW_HOME/traces/backpressure.txt`` when its body runs, so a test counts how many times each body ran per
DAG run. ``retries=2``: a try spent on a cluster that said "not now" would show as a try number above 1.
"""

from __future__ import annotations

from airflow.sdk import dag, task

TASKS = 10


@dag(dag_id="leoflow_test_backpressure", schedule=None, catchup=False, tags=["leoflow-test"],
     max_active_tasks=TASKS, default_args={"retries": 2})
def leoflow_test_backpressure():
    """``t0`` .. ``t9``, no dependencies between them."""
    for i in range(TASKS):

        @task(task_id=f"t{i}")
        def body(**context) -> None:
            """Record one run of this body."""
            import os

            ti = context["ti"]
            with open(os.path.join(os.environ["AIRFLOW_HOME"], "traces", "backpressure.txt"), "a") as fh:
                fh.write(f"{ti.run_id} {ti.task_id} {ti.try_number}\n")

        body()


leoflow_test_backpressure()
