"""Test DAG (tests/integration/test_kube_task_logs.py): ``talk`` prints a first marker, waits for the test to
create ``$AIRFLOW_HOME/traces/task_log_gate`` (at most 180 s, so the test can read its log while it runs), then
prints a second marker and succeeds. ``lost_upload``, beside it, prints a third marker and fails (no retry): the
test's remote store loses its own upload (``tests/local_remote_log.py`` ``DROP_UPLOADS_OF``)."""

from __future__ import annotations

from airflow.sdk import dag, task

FIRST = "leoflow-task-log-first-marker"
SECOND = "leoflow-task-log-second-marker"
THIRD = "leoflow-task-log-lost-upload-marker"


@dag(dag_id="leoflow_test_task_log", schedule=None, catchup=False, tags=["leoflow-test"])
def leoflow_test_task_log():
    """A task logging before and after the test's gate, and one whose own log upload is lost."""

    @task
    def talk() -> None:
        """Print FIRST, wait for the gate file, print SECOND."""
        import os
        import time

        print(FIRST, flush=True)
        gate = os.path.join(os.environ["AIRFLOW_HOME"], "traces", "task_log_gate")
        deadline = time.monotonic() + 180
        while not os.path.exists(gate):
            if time.monotonic() > deadline:
                raise RuntimeError("the test never opened the gate")
            time.sleep(0.2)
        print(SECOND, flush=True)

    @task(retries=0)
    def lost_upload() -> None:
        """Print THIRD, then fail."""
        print(THIRD, flush=True)
        raise RuntimeError("lost_upload fails on purpose")

    talk()
    lost_upload()


leoflow_test_task_log()
