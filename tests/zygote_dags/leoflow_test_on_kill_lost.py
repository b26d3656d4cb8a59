"""Test DAG (tests/integration/test_hole16_kill_grace.py, issue 8 hole 16): a task whose first try runs until it
is killed and whose ``on_kill`` writes ``dag_run.conf["marker"]`` and stops the work, so that try then fails (as a
``BashOperator`` whose ``on_kill`` ended its command does). Later tries succeed at once."""

from __future__ import annotations

import time
from datetime import timedelta

from airflow.sdk import BaseOperator, dag

_KILLED: list[bool] = []  # set by on_kill, which runs in the task process's SIGTERM handler


class StopsOnKill(BaseOperator):
    """Try 1 waits (up to ten minutes) until ``on_kill`` has run, then fails; ``on_kill`` writes "on_kill" to
    ``marker`` (templated). Try 2 and later return at once."""

    template_fields = ("marker",)

    def __init__(self, *, marker: str, **kwargs) -> None:
        super().__init__(**kwargs)
        self.marker = marker

    def execute(self, context) -> str:
        if context["ti"].try_number > 1:
            return "done"
        deadline = time.monotonic() + 600
        while not _KILLED and time.monotonic() < deadline:
            time.sleep(0.1)
        raise RuntimeError("on_kill stopped the work")

    def on_kill(self) -> None:
        with open(self.marker, "w") as fh:
            fh.write("on_kill")
        _KILLED.append(True)


@dag(dag_id="leoflow_test_on_kill_lost", schedule=None, catchup=False, tags=["leoflow-test"])
def leoflow_test_on_kill_lost():
    """One task with a user retry (so a spent one shows in ``max_tries``)."""
    StopsOnKill(task_id="stops", marker="{{ dag_run.conf['marker'] }}", retries=1,
                retry_delay=timedelta(seconds=1))


leoflow_test_on_kill_lost()
