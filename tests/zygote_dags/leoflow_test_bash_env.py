"""Test DAG (tests/integration/test_lite_zygote_faults.py, issue 8 hole 13): a BashOperator with its own
``env`` (Airflow's default ``append_env=False`` replaces the environment entirely) whose ``bash`` runs in a
session of its own (SubprocessHook's ``start_new_session=True``): no session link and no environment marker
lead back to the attempt."""

from __future__ import annotations

from airflow.providers.standard.operators.bash import BashOperator
from airflow.sdk import dag


@dag(dag_id="leoflow_test_bash_env", schedule=None, catchup=False, tags=["leoflow-test"],
     default_args={"retries": 0})
def leoflow_test_bash_env():
    """One task: two commands, so ``bash`` stays the parent of ``sleep`` instead of exec-ing it."""
    BashOperator(task_id="bash_env", env={"LEOFLOW_TEST_ONLY": "this"},
                 bash_command="echo started; sleep 600; echo never")


leoflow_test_bash_env()
