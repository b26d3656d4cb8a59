"""A DAG whose run misses a 2-second deadline: Airflow routes the SyncCallback to the executor as an
``ExecuteCallback`` workload, which LeoflowExecutor must actually run."""

from __future__ import annotations

import time
from datetime import datetime, timedelta

from airflow.sdk import DAG, task
from airflow.sdk.definitions.callback import SyncCallback
from airflow.sdk.definitions.deadline import DeadlineAlert, DeadlineReference

with DAG(
    dag_id="leoflow_deadline",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    is_paused_upon_creation=False,
    deadline=DeadlineAlert(
        reference=DeadlineReference.DAGRUN_QUEUED_AT,
        interval=timedelta(seconds=2),
        callback=SyncCallback("deadline_cb.record_missed", kwargs={"note": "leoflow"}),
    ),
):

    @task
    def slow() -> None:
        print("leoflow-live-log-marker", flush=True)
        time.sleep(20)

    slow()
