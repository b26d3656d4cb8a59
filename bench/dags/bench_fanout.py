"""Benchmark: a fan-out of 50 independent trivial Python tasks (no join, so exactly 50 task instances)."""

from __future__ import annotations

from airflow.sdk import dag, task

WIDTH = 50


@dag(dag_id="bench_fanout", schedule=None, catchup=False, max_active_tasks=64, tags=["leoflow-bench"])
def bench_fanout():
    """50 parallel tasks that do nothing; measures per-task executor overhead."""

    @task
    def noop() -> None:
        """Do nothing (returns None, so no XCom is pushed)."""
        return None

    for i in range(WIDTH):
        noop.override(task_id=f"noop_{i:02d}")()


bench_fanout()
