"""Benchmark: 50 independent Python tasks that each sleep 2 seconds (slot-bound at low parallelism)."""

from __future__ import annotations

import time

from airflow.sdk import dag, task

WIDTH = 50
SLEEP_SECONDS = 2.0


@dag(dag_id="bench_sleep", schedule=None, catchup=False, max_active_tasks=64, tags=["leoflow-bench"])
def bench_sleep():
    """50 parallel tasks of 2 s each; at parallelism 4 the time a slot stays taken after a task dominates."""

    @task
    def nap() -> None:
        """Sleep ``SLEEP_SECONDS`` (2 s) and return None."""
        time.sleep(SLEEP_SECONDS)

    for i in range(WIDTH):
        nap.override(task_id=f"nap_{i:02d}")()


bench_sleep()
