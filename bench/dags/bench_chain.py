"""Benchmark: a chain of 20 trivial Python tasks, each waiting for the previous one (latency-bound)."""

from __future__ import annotations

from airflow.sdk import chain, dag, task

LENGTH = 20


@dag(dag_id="bench_chain", schedule=None, catchup=False, max_active_tasks=64, tags=["leoflow-bench"])
def bench_chain():
    """link_00 >> ... >> link_19; measures schedule -> run -> report -> next-schedule latency."""

    @task
    def link() -> None:
        """Do nothing (returns None, so no XCom is pushed)."""
        return None

    chain(*[link.override(task_id=f"link_{i:02d}")() for i in range(LENGTH)])


bench_chain()
