"""Test DAGs for the agent's outcome records (issue 8 holes 5, 12 and 16h): a report that leaves during an
api-server outage, a record directory that cannot be written, a record too large for its asset events.

Bodies append ``<run_id> <try_number> <event> <unix time> <pid>`` lines to
``$AIRFLOW_HOME/traces/<dag>.<task>.body`` (the format ``tests/integration/fault_helpers.executions`` reads),
``event`` one of ``start`` and ``end``. ``lf_rec.work`` waits, after its start line, for the file
``traces/release.<run_id>`` a test writes (at most 300 s), then ends: the test decides when the task ends.
"""

from __future__ import annotations

import os
import time
from datetime import datetime
from pathlib import Path

from airflow.sdk import DAG, Asset, task

START = datetime(2026, 1, 1)
BIG_ASSETS = [Asset(f"lf_rec_big_{i}") for i in range(8)]
BIG_EXTRA_BYTES = 150_000
"""Per asset event; 8 of them make a success body over the record's 1 MiB."""


def _line(ti, event: str) -> None:
    traces = Path(os.environ["AIRFLOW_HOME"]) / "traces"
    traces.mkdir(parents=True, exist_ok=True)
    with open(traces / f"{ti.dag_id}.{ti.task_id}.body", "a") as fh:
        fh.write(f"{ti.run_id} {ti.try_number} {event} {time.time():.6f} {os.getpid()}\n")


with DAG(dag_id="lf_rec", schedule=None, start_date=START, catchup=False, is_paused_upon_creation=False,
         default_args={"retries": 1}):

    @task
    def work(ti=None) -> None:
        _line(ti, "start")
        release = Path(os.environ["AIRFLOW_HOME"]) / "traces" / f"release.{ti.run_id}"
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not release.exists():
            time.sleep(0.2)
        _line(ti, "end")

    work()


with DAG(dag_id="lf_rec_assets", schedule=None, start_date=START, catchup=False, is_paused_upon_creation=False,
         default_args={"retries": 0}):

    @task(outlets=BIG_ASSETS)
    def emit(ti=None, outlet_events=None) -> None:
        _line(ti, "start")
        for asset in BIG_ASSETS:
            outlet_events[asset].extra = {"blob": "x" * BIG_EXTRA_BYTES}
        _line(ti, "end")

    emit()
