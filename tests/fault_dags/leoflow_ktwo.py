"""Two-scheduler test DAGs (issue 10 item 5, ``tests/integration/test_kube_two_schedulers.py``).

:data:`DAGS` (four DAGs) of :data:`TASKS` (50 independent tasks each, retries 1; fewer at the test's CI size): one run
of each is 200 task instances, so 200 cold pods under ``[leoflow] runtime = kubernetes``. Each body appends ``<run_id> <try> start
<unix time> <pid>``, works :data:`BODY_SECONDS`, then appends the ``end`` line, to
``$AIRFLOW_HOME/traces/<dag>.<task>.body`` (:func:`fault_trace.body_line`; the pods see the scheduler's ``traces``
through their Airflow home's link): how often each body ran, and whether it ran to its end, is read from there.
"""

from __future__ import annotations

import os
import time
from datetime import datetime, timedelta

from airflow.sdk import DAG, task
from fault_trace import body_line

START = datetime(2026, 1, 1)
DAGS = [f"lf_ktwo_{i}" for i in range(4)]
TASKS = [f"t{i:02d}" for i in range(int(os.environ.get("LEOFLOW_KTWO_TASKS", "50")))]
"""50 tasks a DAG; the test's CI size sets ``LEOFLOW_KTWO_TASKS`` in the stack's environment (its dag-processor's)
to fewer (a pod parses the file without it: the same task ids, and more)."""
BODY_SECONDS = 2.0


@task
def work(ti=None) -> None:
    """The body: a start line, :data:`BODY_SECONDS` of work, an end line."""
    body_line(ti, "start")
    time.sleep(BODY_SECONDS)  # the task's work, not a synchronisation
    body_line(ti, "end")


for _dag_id in DAGS:
    with DAG(dag_id=_dag_id, schedule=None, start_date=START, catchup=False, is_paused_upon_creation=False,
             max_active_runs=1, max_active_tasks=len(TASKS),
             default_args={"retries": 1, "retry_delay": timedelta(seconds=1)}):
        for _task_id in TASKS:
            work.override(task_id=_task_id)()
