"""Test DAG for leoflow's failure paths (issue 3): every task counts how often its body ran.

``body`` appends one line per execution of its body to ``$AIRFLOW_HOME/traces/<dag>.<task>.runs`` and, when
the agent armed the ``mid_task`` fault point, touches the marker and sleeps so the agent is killed mid-task.
Callbacks append to ``$AIRFLOW_HOME/traces/callbacks.log``. Faults are chosen by the test through
``[leoflow] test_fault_plan``.
"""

from __future__ import annotations

import os
import time
from datetime import datetime, timedelta
from pathlib import Path

from airflow.sdk import DAG, task
from fault_trace import callback, traces_dir


_traces = traces_dir
_cb = callback


def _body(name: str, fail_on_try: int | None = None, ti=None) -> str:
    with open(_traces() / f"{ti.dag_id}.{name}.runs", "a") as fh:
        fh.write(f"{ti.run_id} {ti.try_number}\n")
    marker = os.environ.get("LEOFLOW_FAULT_MARKER")
    if marker:
        Path(marker).touch()
        time.sleep(30)
    if fail_on_try is not None and ti.try_number <= fail_on_try:
        raise RuntimeError(f"planned failure on try {ti.try_number}")
    return name


for retries in (0, 1):
    with DAG(
        dag_id=f"leoflow_faulty_r{retries}",
        schedule=None,
        start_date=datetime(2026, 1, 1),
        catchup=False,
        is_paused_upon_creation=False,
        default_args={
            "retries": retries,
            "retry_delay": timedelta(seconds=1),
            "on_success_callback": _cb("success"),
            "on_failure_callback": _cb("failure"),
            "on_retry_callback": _cb("retry"),
        },
    ):

        @task
        def work(ti=None) -> str:
            return _body("work", ti=ti)

        @task
        def fails_first(ti=None) -> str:
            return _body("fails_first", fail_on_try=1, ti=ti)

        @task
        def downstream(value: str, ti=None) -> str:
            return _body("downstream", ti=ti)

        downstream(work())
        if retries:
            fails_first()
