"""Test DAG (tests/integration/test_lite_credentials.py): dump what a task can see of its environment.

``bash_env`` writes ``env`` and ``python_env`` writes ``os.environ`` (as JSON) under
``$AIRFLOW_HOME/traces/``; both then stay alive a few seconds so the test can scan every process's command
line and environment while they run.
"""

from __future__ import annotations

from airflow.providers.standard.operators.bash import BashOperator
from airflow.sdk import dag, task

HOLD_SECONDS = 8


@dag(dag_id="leoflow_test_creds", schedule=None, catchup=False, tags=["leoflow-test"])
def leoflow_test_creds():
    """Two independent tasks: a BashOperator and a Python task, each dumping its environment."""
    BashOperator(
        task_id="bash_env",
        bash_command=f'env > "$AIRFLOW_HOME/traces/bash_env.txt" && sleep {HOLD_SECONDS} && echo held',
    )

    @task
    def python_env() -> None:
        """Write ``os.environ`` as JSON, then hold."""
        import json
        import os
        import time

        path = os.path.join(os.environ["AIRFLOW_HOME"], "traces", "python_env.json")
        with open(path + ".tmp", "w") as fh:
            json.dump(dict(os.environ), fh)
        os.replace(path + ".tmp", path)
        time.sleep(HOLD_SECONDS)

    python_env()


leoflow_test_creds()
