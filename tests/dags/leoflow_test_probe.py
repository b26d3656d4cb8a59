"""Test DAG (tests/integration/test_lite_bad_input.py): one quick Python task and one quick bash task."""

from __future__ import annotations

from airflow.providers.standard.operators.bash import BashOperator
from airflow.sdk import dag, task


@dag(dag_id="leoflow_test_probe", schedule=None, catchup=False, tags=["leoflow-test"])
def leoflow_test_probe():
    """``hello`` (Python) then ``echo`` (bash)."""

    @task
    def hello() -> str:
        """Return a constant."""
        return "hello"

    hello() >> BashOperator(task_id="echo", bash_command="echo probe")


leoflow_test_probe()
