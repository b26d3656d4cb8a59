"""Chaos-loop test DAG (issue 3): ``a >> b``, short bodies, one retry each.

Bodies write the same timestamped trace lines as ``leoflow_more.py`` (``<run> <try> <event> <time> <pid>`` in
``$AIRFLOW_HOME/traces/lf_chaos.<task>.body``), touch the ``mid_task`` marker when the agent armed it and then
tick until killed. Kept in its own small file so each task child parses little.
"""

from __future__ import annotations

import os
import time
from datetime import datetime, timedelta
from pathlib import Path

from airflow.sdk import DAG, task


def _line(ti, event: str) -> None:
    traces = Path(os.environ["AIRFLOW_HOME"]) / "traces"
    traces.mkdir(parents=True, exist_ok=True)
    with open(traces / f"{ti.dag_id}.{ti.task_id}.body", "a") as fh:
        fh.write(f"{ti.run_id} {ti.try_number} {event} {time.time():.6f} {os.getpid()}\n")


def _body(ti) -> None:
    _line(ti, "start")
    marker = os.environ.get("LEOFLOW_FAULT_MARKER")
    ticks = 300 if marker else 3
    if marker:
        Path(marker).touch()
    for _ in range(ticks):
        _line(ti, "tick")
        time.sleep(0.2)
    _line(ti, "end")


with DAG(dag_id="lf_chaos", schedule=None, start_date=datetime(2026, 1, 1), catchup=False,
         is_paused_upon_creation=False, max_active_runs=32,
         default_args={"retries": 1, "retry_delay": timedelta(seconds=1)}):

    @task
    def a(ti=None) -> None:
        _body(ti)

    @task
    def b(ti=None) -> None:
        _body(ti)

    a() >> b()
