"""Test DAG (tests/integration/test_lite_process_control.py): long-running attempts to revoke, terminate and
leave running across ``end()``, plus one short one that must still finish after the scheduler has gone.

``bash_forever`` and ``bash_forever_2`` are BashOperators whose ``bash`` (in a session of its own) runs
``sleep 600``; ``python_forever`` sleeps in Python; ``short`` waits, in Python, for the test's release file
``$AIRFLOW_HOME/traces/release.<run_id>`` (at most ``conf["short_seconds"]``, default 25) and succeeds.
"""

from __future__ import annotations

from airflow.providers.standard.operators.bash import BashOperator
from airflow.sdk import dag, task


@dag(dag_id="leoflow_test_sleepy", schedule=None, catchup=False, tags=["leoflow-test"], max_active_tasks=8)
def leoflow_test_sleepy():
    """Four independent tasks."""
    for name in ("bash_forever", "bash_forever_2"):
        # two commands, so bash stays as the parent of sleep instead of exec-ing it
        BashOperator(task_id=name, bash_command="echo started; sleep 600; echo never")

    @task
    def short(dag_run=None, run_id=None) -> None:
        """Wait for the release file (polled every 0.2 s), at most ``conf["short_seconds"]`` seconds."""
        import os
        import time

        release = os.path.join(os.environ["AIRFLOW_HOME"], "traces", f"release.{run_id}")
        deadline = time.monotonic() + float((dag_run.conf or {}).get("short_seconds", 25))
        while not os.path.exists(release) and time.monotonic() < deadline:
            time.sleep(0.2)

    @task
    def python_forever() -> None:
        """Sleep ten minutes."""
        import time

        time.sleep(600)

    python_forever()
    short()


leoflow_test_sleepy()
