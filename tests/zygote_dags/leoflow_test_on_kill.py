"""Test DAG (tests/integration/test_lite_zygote_faults.py, issue 8 hole 16): a task that runs until it is
killed and whose ``on_kill`` writes ``dag_run.conf["marker"]``, so a test can see that a kill gave the
operator its SIGTERM and grace first."""

from __future__ import annotations

import time

from airflow.sdk import BaseOperator, dag


class WaitsForKill(BaseOperator):
    """Sleeps up to ten minutes; ``on_kill`` writes "on_kill" to ``marker`` (templated)."""

    template_fields = ("marker",)

    def __init__(self, *, marker: str, **kwargs) -> None:
        super().__init__(**kwargs)
        self.marker = marker

    def execute(self, context) -> None:
        time.sleep(600)

    def on_kill(self) -> None:
        with open(self.marker, "w") as fh:
            fh.write("on_kill")


@dag(dag_id="leoflow_test_on_kill", schedule=None, catchup=False, tags=["leoflow-test"])
def leoflow_test_on_kill():
    """One task, killed by the test."""
    WaitsForKill(task_id="waits", marker="{{ dag_run.conf['marker'] }}", retries=0)


leoflow_test_on_kill()
